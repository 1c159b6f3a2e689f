#include "launcher/failure_report.h"

#include "base/log.h"
#include "launcher/guarded_process.h"
#include "launcher/option_values.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddprun::launcher {
namespace {

constexpr size_t kMaxRawErrorFile = 4096;

std::string asText(const nlohmann::json& j) {
  return j.is_string() ? j.get<std::string>() : j.dump();
}

// Worker-controlled text, one line: control characters made visible.
std::string esc(const std::string& text) { return log::escaped(text); }

void indented(std::ostringstream& os, const std::string& text, const char* indent) {
  std::istringstream in(log::escaped(text, /*keepNewlines=*/true));
  std::string line;
  while (std::getline(in, line)) os << indent << line << "\n";
}

}  // namespace

ErrorFile readErrorFile(const std::string& path) {
  ErrorFile ef;
  if (path.empty()) return ef;
  // O_NONBLOCK: opening a FIFO nobody writes must not block (reads then return EAGAIN or 0).
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (!fd) {
    if (errno != ENOENT) {
      ef.present = true;
      ef.unreadable = std::string("cannot open it: ") + std::strerror(errno);
    }
    return ef;
  }
  ef.present = true;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    ef.unreadable = std::string("cannot stat it: ") + std::strerror(errno);
    return ef;
  }
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode)  ? "FIFO"
                       : S_ISCHR(st.st_mode) ? "character device"
                       : S_ISBLK(st.st_mode) ? "block device"
                       : S_ISSOCK(st.st_mode) ? "socket"
                       : S_ISDIR(st.st_mode)  ? "directory"
                                              : "special file";
    ef.unreadable = std::string("not a regular file (") + kind + "): not read";
    return ef;
  }
  ef.size = static_cast<uint64_t>(st.st_size);
  std::string content(kMaxErrorFileBytes + 1, '\0');
  size_t have = 0;
  while (have < content.size()) {
    const ssize_t n = ::read(fd.get(), content.data() + have, content.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<size_t>(n);
  }
  if (have > kMaxErrorFileBytes) {
    have = kMaxErrorFileBytes;
    ef.cut = true;
  }
  content.resize(have);
  try {
    auto j = nlohmann::json::parse(content);
    const auto& m = j.at("message");
    if (j.is_object()) ef.json = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (m.is_object()) {
      ef.message = asText(m.at("message"));
      if (m.contains("extraInfo")) {
        const auto& extra = m.at("extraInfo");
        if (extra.contains("py_callstack")) ef.traceback = asText(extra.at("py_callstack"));
        if (extra.contains("timestamp")) ef.timestamp = asText(extra.at("timestamp"));
        if (extra.contains("exceptionType")) ef.exceptionType = asText(extra.at("exceptionType"));
        if (extra.contains("retryable") && extra.at("retryable").is_boolean()) {
          ef.retryable = extra.at("retryable").get<bool>();
        }
      }
    } else {
      ef.message = asText(m);
    }
  } catch (const nlohmann::json::exception&) {
    ef.raw = content.substr(0, kMaxRawErrorFile);
    if (content.size() > kMaxRawErrorFile || ef.cut) {
      ef.raw += "\n... (" + std::to_string(std::max<uint64_t>(ef.size, content.size())) +
                " bytes in all)";
    }
  }
  return ef;
}

std::string formatTime(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const std::time_t secs = system_clock::to_time_t(t);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  const auto ms = duration_cast<milliseconds>(t.time_since_epoch()).count() % 1000;
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03d", buf, static_cast<int>(ms));
  return out;
}

std::string formatFailureReport(const FailureReport& r) {
  const std::string rule(72, '=');
  const WorkerResult& w = r.rootCause;
  std::ostringstream os;
  os << rule << "\n";
  os << "ddprun: " << esc(r.program) << " FAILED (attempt " << r.restartCount;
  if (r.round != static_cast<uint64_t>(r.restartCount)) os << ", round " << r.round;
  os << ", " << r.restartCount << " of " << r.maxRestarts << " restarts used)\n";
  os << "Root cause (first observed failure):\n";
  os << "  time       : " << formatTime(w.endTime) << "\n";
  os << "  host       : " << r.host << "\n";
  os << "  rank       : " << w.globalRank << " (local rank " << w.localRank << ")\n";
  os << "  pid        : " << w.pid << "\n";
  os << "  exit       : " << w.describe() << " -> ddprun exits with " << w.exitCode() << "\n";
  const ErrorFile ef = readErrorFile(w.errorFile);
  if (!ef.present) {
    os << "  error file : " << (w.errorFile.empty() ? "<none>" : esc(w.errorFile)) << " (not written";
    if (w.ended && WIFSIGNALED(w.waitStatus)) {
      os << ": the worker was killed by " << signalName(WTERMSIG(w.waitStatus));
    } else if (r.pythonWorker) {
      os << "; decorate main with torch.distributed.elastic.multiprocessing.errors.record to get "
            "the traceback here";
    } else {
      os << "; a C++ program writes it with ddprun::runtime::recordError, see "
            "docs/worker_runtime.md";
    }
    os << ")\n";
  } else if (!ef.unreadable.empty()) {
    os << "  error file : " << esc(w.errorFile) << " (" << ef.unreadable << ")\n";
  } else {
    os << "  error file : " << esc(w.errorFile);
    if (ef.cut) {
      os << " (" << ef.size << " bytes: only the first " << kMaxErrorFileBytes << " were read)";
    }
    os << "\n";
    if (!ef.message.empty()) os << "  message    : " << esc(ef.message) << "\n";
    if (!ef.exceptionType.empty()) os << "  type       : " << esc(ef.exceptionType) << "\n";
    if (ef.retryable.has_value()) {
      os << "  retryable  : "
         << (*ef.retryable ? "yes" : "no (a restart cannot fix it: the job ended without one)")
         << "\n";
    }
    if (!ef.timestamp.empty()) os << "  timestamp  : " << esc(ef.timestamp) << "\n";
    if (!ef.traceback.empty()) {
      os << "  traceback  :\n";
      indented(os, ef.traceback, "    ");
    }
    if (!ef.raw.empty()) {
      os << "  contents   :\n";
      indented(os, ef.raw, "    ");
    }
  }
  if (!w.stderrTail.empty()) {
    os << "  last " << w.stderrTail.size() << " lines of its stderr:\n";
    for (const auto& line : w.stderrTail) os << "    " << esc(line) << "\n";
  }
  if (!r.others.empty()) {
    os << "Other workers:\n";
    for (const auto& o : r.others) {
      os << "  rank " << o.globalRank << " (local rank " << o.localRank << ", pid " << o.pid
         << "): " << o.describe();
      if (o.stopSignal != 0) os << " (ended after ddprun sent " << signalName(o.stopSignal) << ")";
      os << "\n";
    }
  }
  if (!r.keptDirectory.empty()) {
    os << "Worker logs and error files are kept in " << r.keptDirectory
       << " (ddprun deletes its run directory only after a success)\n";
  }
  os << rule << "\n";
  return os.str();
}

}  // namespace ddprun::launcher
