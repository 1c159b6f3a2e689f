#pragma once
// Internal to TcpStore: the socket of one store connection, with its receive buffer and
// deadlines, and the helper that opens it. Everything here reports failures as IoFailure,
// which TcpStore::call() turns into a typed error naming the store, the operation and the key.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "base/errors.h"
#include "base/resolve.h"
#include "rendezvous/blocking.h"
#include "rendezvous/tcp_store.h"

namespace ddprun::rendezvous {

// An I/O failure inside a call; `call` turns it into a typed error with the context (which
// this message lacks), so it never leaves TcpStore: every path that can throw it catches it.
// An Error, not a NetworkError, so that no handler of network errors takes it for one.
class IoFailure : public Error {
 public:
  IoFailure(bool timedOut, const std::string& what) : Error(what), timeout(timedOut) {}
  bool timeout;  // the deadline passed (else the connection failed)
};

// One socket with a receive buffer. Every read and write honours an absolute deadline
// (SO_RCVTIMEO/SO_SNDTIMEO, updated only when the remaining time shrinks below them, so the
// common round trip costs one send and one recv). On a thread with a Blocking installed (the
// simulated agents' fibers, rendezvous/blocking.h) reads and writes do not block: on EAGAIN
// the fiber waits for the socket through the Blocking until the deadline.
class TcpStore::Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  ~Connection() { ::close(fd_); }

  void setDeadline(Clock::time_point d) { deadline_ = d; }
  int fd() const { return fd_; }

  void write(const std::string& bytes) {
    size_t off = 0;
    Blocking* const coop = Blocking::current();
    while (off < bytes.size()) {
      if (coop) {
        ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) off += static_cast<size_t>(n);
        else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) cooperativeWait(coop, POLLOUT, "send timed out");
        else if (n < 0 && errno != EINTR) throw IoFailure{false, std::string("send failed: ") + std::strerror(errno)};
        continue;
      }
      const bool late = !applyTimeout(SO_SNDTIMEO, sndTimeout_);
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off,
                         MSG_NOSIGNAL | (late ? MSG_DONTWAIT : 0));
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (late) throw IoFailure{true, "send timed out"};
        retryOrThrow(sndTimeout_, "send timed out");
        continue;
      }
      throw IoFailure{false, std::string("send failed: ") + std::strerror(errno)};
    }
  }

  // Makes at least n bytes available in the buffer.
  void fill(size_t n) {
    while (end_ - start_ < n) {
      if (start_ > 0 && (buf_.size() - end_ < 4096 || start_ == end_)) {
        std::memmove(buf_.data(), buf_.data() + start_, end_ - start_);
        end_ -= start_;
        start_ = 0;
      }
      if (buf_.size() - end_ < n - (end_ - start_) || buf_.size() - end_ < 4096)
        buf_.resize(std::max(buf_.size() * 2, end_ + n + 4096));
      Blocking* const coop = Blocking::current();
      const bool late = !coop && !applyTimeout(SO_RCVTIMEO, rcvTimeout_);
      ssize_t r = ::recv(fd_, buf_.data() + end_, buf_.size() - end_,
                         late || coop ? MSG_DONTWAIT : 0);
      if (r > 0) {
        end_ += static_cast<size_t>(r);
        continue;
      }
      if (r == 0) throw IoFailure{false, "the server closed the connection"};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (coop) {
          cooperativeWait(coop, POLLIN, "no reply in time");
          continue;
        }
        if (late) throw IoFailure{true, "no reply in time"};
        retryOrThrow(rcvTimeout_, "no reply in time");
        continue;
      }
      throw IoFailure{false, std::string("recv failed: ") + std::strerror(errno)};
    }
  }

  // Blocks until a byte can be read or the deadline passes (then throws a timeout), with
  // poll()'s precise timer: a socket timeout (SO_RCVTIMEO) runs on the kernel's coarse timer
  // wheel and fires up to ~12% late on waits of seconds. Used before long waits (WAIT).
  // The socket is always polled once, even past the deadline: when this process was paused
  // (stopped, descheduled) until after it, a reply that arrived meanwhile is still taken.
  void awaitReadable() {
    while (end_ == start_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline_ - Clock::now() + std::chrono::microseconds(999));
      const int rc = pollFd(fd_, POLLIN, Millis(std::clamp<int64_t>(left.count(), 0, INT32_MAX)));
      if (rc > 0) return;  // readable, or an error/hang-up that the next recv reports
      if (rc == 0 && left.count() <= 0) throw IoFailure{true, "no reply in time"};
      if (rc < 0 && errno != EINTR) {
        throw IoFailure{false, std::string("poll failed: ") + std::strerror(errno)};
      }
    }
  }
  uint8_t u8() { fill(1); return static_cast<uint8_t>(buf_[start_++]); }
  uint32_t u32() { uint32_t v; take(&v, 4); return v; }
  int64_t i64() { int64_t v; take(&v, 8); return v; }
  std::string str(uint64_t maxLen) {
    uint64_t len;
    take(&len, 8);
    if (len > maxLen) throw IoFailure{false, "reply string of " + std::to_string(len) + " bytes exceeds " + std::to_string(maxLen)};
    fill(static_cast<size_t>(len));
    std::string s(buf_.data() + start_, static_cast<size_t>(len));
    start_ += static_cast<size_t>(len);
    return s;
  }

 private:
  void take(void* p, size_t n) {
    fill(n);
    std::memcpy(p, buf_.data() + start_, n);
    start_ += n;
  }
  // Sets the socket timeout to the time left until the deadline, unless the current setting
  // is already within a small slack of it: then the common round trip costs no setsockopt.
  // A recv that times out before the deadline re-arms and retries (see retryOrThrow).
  // Returns false when the deadline has already passed: the caller then makes one
  // non-blocking attempt (what already arrived is taken; nothing more is waited for).
  bool applyTimeout(int which, std::chrono::microseconds& current) {
    using std::chrono::microseconds;
    auto left = std::chrono::duration_cast<microseconds>(deadline_ - Clock::now());
    if (left.count() <= 0) return false;
    const microseconds slack = current / 64 + microseconds(1000);
    if (current.count() != 0 && left > current - slack && left < current + slack) return true;
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(left.count() / 1'000'000);
    tv.tv_usec = static_cast<suseconds_t>(left.count() % 1'000'000);
    ::setsockopt(fd_, SOL_SOCKET, which, &tv, sizeof tv);
    current = left;
    return true;
  }
  // After EAGAIN on a fiber: waits for the socket until the deadline, then throws a timeout.
  void cooperativeWait(Blocking* coop, short events, const char* what) {
    if (coop->poll(fd_, events, deadline_) == 0) throw IoFailure{true, what};
  }
  // After EAGAIN: retry when the deadline is still ahead (the setting was stale), else throw.
  void retryOrThrow(std::chrono::microseconds& current, const char* what) {
    if (Clock::now() + std::chrono::milliseconds(1) < deadline_) {
      current = std::chrono::microseconds(0);
      return;
    }
    throw IoFailure{true, what};
  }

  int fd_;
  std::vector<char> buf_;  // grown by fill() as replies need it (about 4 KiB at first)
  size_t start_ = 0, end_ = 0;
  Clock::time_point deadline_{};
  std::chrono::microseconds rcvTimeout_{0}, sndTimeout_{0};
};

// One non-blocking connect attempt bounded by `timeout`; returns a blocking, TCP_NODELAY fd, or
// -1 with errno set.
int tryConnect(const SocketAddress& a, std::chrono::milliseconds timeout);

}  // namespace ddprun::rendezvous
