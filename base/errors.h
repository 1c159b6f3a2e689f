#pragma once
// Errors shared by every ddprun component.
//
// Recoverable failures are typed exceptions derived from ddprun::Error, so callers can
// catch exactly what they can handle (a TimeoutError is retried, a ProtocolError is not).
// Broken invariants -- bugs, not bad input -- use DDPRUN_CHECK, which throws
// InternalError carrying file:line and the failed condition.
#include <sstream>
#include <stdexcept>
#include <string>

namespace ddprun {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A store operation failed (bad reply, key missing where it must exist, server error).
class StoreError : public Error {
 public:
  using Error::Error;
};

// A socket-level failure: connect refused, connection reset, peer closed.
class NetworkError : public Error {
 public:
  using Error::Error;
};

// An operation did not finish within its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer sent bytes that are not a valid frame of the protocol it speaks.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// The store refused our credentials, or wanted some we do not have.
class AuthError : public Error {
 public:
  using Error::Error;
};

// User input (a flag, a config file, an environment variable) is invalid.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A collective or communicator failed (peer gone, mismatch between ranks).
class BackendError : public Error {
 public:
  using Error::Error;
};

// An invariant of ddprun itself does not hold: a bug. Thrown by DDPRUN_CHECK.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] inline void checkFailed(const char* file, int line, const char* cond,
                                     const std::string& msg) {
  std::ostringstream os;
  os << "internal error at " << file << ":" << line << ": check `" << cond << "` failed";
  if (!msg.empty()) os << ": " << msg;
  throw InternalError(os.str());
}
}  // namespace detail

}  // namespace ddprun

// DDPRUN_CHECK(cond) or DDPRUN_CHECK(cond, "what" << value): the one macro for invariants.
#define DDPRUN_CHECK(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::ostringstream ddprun_check_os_;                                              \
      ddprun_check_os_ << "" __VA_OPT__(<< __VA_ARGS__);                                \
      ::ddprun::detail::checkFailed(__FILE__, __LINE__, #cond, ddprun_check_os_.str()); \
    }                                                                                   \
  } while (0)
