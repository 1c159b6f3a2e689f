#include "launcher/launcher_error_file.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "launcher/option_values.h"

namespace ddprun::launcher {
namespace {

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string generatedErrorRecord(const std::string& message, int errorCode) {
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  return dump({{"message",
                {{"message", message},
                 {"extraInfo", {{"timestamp", std::to_string(secs)}}},
                 {"errorCode", errorCode}}}});
}

std::string workerErrorRecord(const ErrorFile& ef, const WorkerResult& w) {
  if (!ef.json.empty()) {
    auto j = nlohmann::json::parse(ef.json, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("message")) {
      // torch overrides the code only in the object form of "message" (its current format).
      if (j["message"].is_object()) j["message"]["errorCode"] = w.exitCode();
      return dump(j);
    }
  }
  std::string message;
  if (w.ended && WIFSIGNALED(w.waitStatus)) {
    // torch's ProcessFailure wording for a worker that died by a signal.
    const int sig = WTERMSIG(w.waitStatus);
    message = "Signal " + std::to_string(sig) + " (" + signalName(sig) + ") received by PID " +
              std::to_string(w.pid);
  } else {
    message = "rank " + std::to_string(w.globalRank) + " (pid " + std::to_string(w.pid) +
              ") failed: " + w.describe() + "; it wrote no error file";
  }
  return generatedErrorRecord(message, w.exitCode());
}

bool writeLauncherErrorFile(const std::string& path, const std::string& record) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  size_t done = 0;
  while (ok && done < record.size()) {
    const ssize_t n = ::write(fd, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  int err = errno;
  if (fd >= 0 && ::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    DDPRUN_LOG(WARN, "launcher") << "cannot write TORCHELASTIC_ERROR_FILE=" << path << ": "
                                 << std::strerror(err);
  }
  return ok;
}

}  // namespace ddprun::launcher
