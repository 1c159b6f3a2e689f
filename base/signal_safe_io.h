#pragma once
// File reads a forked child of a threaded process can do between fork and exit: open/read/close
// only, no allocation, so they are async-signal-safe (the launcher's guard, its cgroup checks,
// base/sweep's /proc walk).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace ddprun {

// Reads up to size - 1 bytes of `path` into buf and NUL-terminates them. Returns the count,
// or -1 when the file cannot be opened or read (errno kept from the failing call).
inline ssize_t readSmallFile(const char* path, char* buf, size_t size) noexcept {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n;
  do {
    n = ::read(fd, buf, size - 1);
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  errno = err;
  if (n >= 0) buf[n] = '\0';
  return n;
}

}  // namespace ddprun
