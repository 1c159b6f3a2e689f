#pragma once
// UniqueFd: the one owner of a file descriptor, which closes it exactly once -- when the owner
// is destroyed or reset, or through close() where close's result matters (a file just written).
// Error paths then need no hand-written close: a descriptor handed on is release()d, everything
// else closes itself. Closing preserves errno, so a caller may still report the errno of the
// failure that made it give up. Only close(2) is called: safe between fork and exec.
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace ddprun {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }

  // Gives the descriptor up: the caller owns (and closes) what is returned; this owns nothing.
  [[nodiscard]] int release() { return std::exchange(fd_, -1); }

  // Closes the descriptor owned (if any) and owns `fd` instead; errno is left as it was.
  void reset(int fd = -1) noexcept {
    const int old = std::exchange(fd_, fd);
    if (old >= 0 && old != fd) {
      const int saved = errno;
      ::close(old);
      errno = saved;
    }
  }

  // Closes now and returns close(2)'s result (0, or -1 with errno set). The descriptor is
  // given up even when close fails: Linux has released it then, so closing it again could
  // close one that another thread has opened since. Nothing owned: returns 0.
  int close() {
    const int old = std::exchange(fd_, -1);
    return old >= 0 ? ::close(old) : 0;
  }

 private:
  int fd_ = -1;
};

}  // namespace ddprun
