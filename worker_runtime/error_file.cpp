#include "worker_runtime/error_file.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <typeinfo>

#include "base/errors.h"
#include "base/log.h"
#include "worker_runtime/checkpoint.h"

namespace ddprun::runtime {

bool isRetryable(const std::exception& e) {
  return dynamic_cast<const ConfigError*>(&e) == nullptr &&
         dynamic_cast<const IncompatibleCheckpoint*>(&e) == nullptr;
}

std::string exceptionTypeName(const std::exception& e, bool qualified) {
  const char* mangled = typeid(e).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string name = status == 0 && demangled ? demangled.get() : mangled;
  if (!qualified) {
    const size_t colon = name.rfind("::");
    if (colon != std::string::npos) name = name.substr(colon + 2);
  }
  return name;
}

bool writeErrorFile(const std::string& message, const std::string& exceptionType, bool retryable,
                    const EnvLookup& env) {
  const auto path = env("TORCHELASTIC_ERROR_FILE");
  if (!path || path->empty()) return false;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const nlohmann::json record = {
      {"message",
       {{"message", message},
        {"extraInfo",
         {{"timestamp", std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count())},
          {"exceptionType", exceptionType},
          {"retryable", retryable}}}}}};
  // Invalid UTF-8 in an exception's text must not stop the file from being written.
  const std::string text = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::string tmp = *path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  size_t done = 0;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  const int err = errno;
  if (fd >= 0 && ::close(fd) != 0) ok = false;
  if (ok && ::rename(tmp.c_str(), path->c_str()) != 0) ok = false;
  if (!ok) {
    ::unlink(tmp.c_str());
    DDPRUN_LOG(WARN, "runtime") << "cannot write the error file " << *path << ": "
                                << std::strerror(err ? err : errno);
  }
  return ok;
}

bool recordError(const std::exception& e, std::optional<bool> retryable, const EnvLookup& env) {
  return writeErrorFile(exceptionTypeName(e, false) + ": " + e.what(), exceptionTypeName(e),
                        retryable.value_or(isRetryable(e)), env);
}

int recordErrors(const std::string& program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    const bool retryable = isRetryable(e);
    recordError(e, retryable);
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return retryable ? 1 : 2;
  }
}

}  // namespace ddprun::runtime
