#include "rendezvous/tcp_connection.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "base/unique_fd.h"

namespace ddprun::rendezvous {

// One non-blocking connect attempt bounded by `timeout`; returns the fd or -1 with errno set.
int tryConnect(const SocketAddress& a, std::chrono::milliseconds timeout) {
  UniqueFd fd(::socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return -1;
  int rc = ::connect(fd.get(), a.get(), a.length);
  if (rc != 0 && errno == EINPROGRESS) {
    rc = pollFd(fd.get(), POLLOUT, std::max(Millis(1), timeout));
    if (rc == 1) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    } else {
      if (rc == 0) errno = ETIMEDOUT;  // poll timed out; rc < 0 keeps poll's errno
      rc = -1;
    }
  }
  if (rc != 0) return -1;  // the socket closes itself, errno stays
  int flags = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &flags, sizeof flags);
  // Back to blocking: reads and writes are bounded by SO_RCVTIMEO/SO_SNDTIMEO.
  int fl = ::fcntl(fd.get(), F_GETFL);
  ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK);
  return fd.release();
}

}  // namespace ddprun::rendezvous
