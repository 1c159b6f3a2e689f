#include "rendezvous/tcp_connection.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "base/errors.h"

namespace ddprun::rendezvous {

// Resolves host:port; returns the addresses to try, or throws NetworkError.
std::vector<addrinfo> resolve(const std::string& host, uint16_t port, addrinfo** list) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, list);
  if (rc != 0) {
    throw NetworkError("store at " + host + ":" + service + ": cannot resolve '" + host +
                       "': " + gai_strerror(rc));
  }
  std::vector<addrinfo> out;
  for (addrinfo* a = *list; a; a = a->ai_next) out.push_back(*a);
  return out;
}

// One non-blocking connect attempt bounded by `timeout`; returns the fd or -1 with errno set.
int tryConnect(const addrinfo& a, std::chrono::milliseconds timeout) {
  int fd = ::socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.ai_protocol);
  if (fd < 0) return -1;
  int rc = ::connect(fd, a.ai_addr, a.ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, timeout.count())));
    if (rc == 1) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    } else {
      if (rc == 0) errno = ETIMEDOUT;  // poll timed out; rc < 0 keeps poll's errno
      rc = -1;
    }
  }
  if (rc != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  int flags = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &flags, sizeof flags);
  // Back to blocking: reads and writes are bounded by SO_RCVTIMEO/SO_SNDTIMEO.
  int fl = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

}  // namespace ddprun::rendezvous
