#include "worker_runtime/tcp_mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include "base/errors.h"

namespace ddprun::runtime {
namespace {

using Clock = TcpMesh::Clock;
constexpr uint32_t kHello = 0xDD9A11ED;

int remainingMs(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(ms.count(), 0, 1 << 30));
}

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Blocking-style exact I/O on a non-blocking socket during set-up, bounded by the deadline.
void exchange(int fd, void* buf, size_t n, bool write, Clock::time_point deadline,
              const std::string& who) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) throw NetworkError("mesh set-up: " + who + " closed the connection");
    if (errno != EAGAIN && errno != EINTR) {
      throw NetworkError("mesh set-up with " + who + ": " + std::strerror(errno));
    }
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    if (::poll(&pfd, 1, remainingMs(deadline)) == 0) {
      throw TimeoutError("mesh set-up: no answer from " + who);
    }
  }
}

}  // namespace

TcpMesh::TcpMesh(rendezvous::Store& store, const std::string& prefix, int rank, int size,
                 const std::string& host, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), peers_(size) {
  const auto deadline = Clock::now() + timeout;
  // Listen on a free port of `host`.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* local = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "0", &hints, &local); rc != 0) {
    throw ConfigError("mesh: cannot resolve this rank's address '" + host + "': " + gai_strerror(rc));
  }
  const int listener = ::socket(local->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (listener < 0 || ::bind(listener, local->ai_addr, local->ai_addrlen) != 0 ||
      ::listen(listener, size) != 0) {
    const std::string err = std::strerror(errno);
    ::freeaddrinfo(local);
    if (listener >= 0) ::close(listener);
    throw NetworkError("mesh: cannot listen on " + host + ": " + err);
  }
  ::freeaddrinfo(local);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&bound), &len);
  const uint16_t port = ntohs(bound.ss_family == AF_INET6
                                  ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                  : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  store.set(prefix + "/" + std::to_string(rank), host + " " + std::to_string(port));
  setNonBlocking(listener);
  try {
    // Connect to every lower rank; announce who we are.
    for (int q = 0; q < rank; ++q) {
      const std::string who = "rank " + std::to_string(q);
      std::istringstream addr(store.get(prefix + "/" + std::to_string(q)));
      std::string qhost, qport;
      addr >> qhost >> qport;
      addrinfo h{};
      h.ai_socktype = SOCK_STREAM;
      addrinfo* res = nullptr;
      if (int rc = ::getaddrinfo(qhost.c_str(), qport.c_str(), &h, &res); rc != 0) {
        throw NetworkError("mesh: cannot resolve " + who + " at " + qhost + ": " + gai_strerror(rc));
      }
      int fd = -1;
      while (fd < 0) {  // the peer listens before publishing, so refusals are not expected
        fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (::connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
          const int err = errno;
          ::close(fd);
          fd = -1;
          if (Clock::now() > deadline) {
            ::freeaddrinfo(res);
            throw NetworkError("mesh: cannot connect to " + who + " at " + qhost + ":" + qport +
                               ": " + std::strerror(err));
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      ::freeaddrinfo(res);
      setNonBlocking(fd);
      tune(fd);
      peers_[q].fd = fd;
      uint32_t hello[2] = {kHello, static_cast<uint32_t>(rank)};
      exchange(fd, hello, sizeof(hello), true, deadline, who);
    }
    // Accept every higher rank.
    for (int accepted = 0; accepted < size - 1 - rank;) {
      pollfd pfd{listener, POLLIN, 0};
      if (::poll(&pfd, 1, remainingMs(deadline)) == 0) {
        throw TimeoutError("mesh: rank " + std::to_string(rank) + " waited in vain for " +
                           std::to_string(size - 1 - rank - accepted) + " higher rank(s) to connect");
      }
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) continue;
      tune(fd);
      uint32_t hello[2] = {0, 0};
      exchange(fd, hello, sizeof(hello), false, deadline, "a connecting rank");
      const int q = static_cast<int>(hello[1]);
      if (hello[0] != kHello || q <= rank || q >= size || peers_[q].fd >= 0) {
        ::close(fd);  // not one of ours: ignore it
        continue;
      }
      peers_[q].fd = fd;
      ++accepted;
    }
  } catch (...) {
    ::close(listener);
    for (auto& p : peers_) {
      if (p.fd >= 0) ::close(p.fd);
    }
    throw;
  }
  ::close(listener);
}

TcpMesh::~TcpMesh() {
  for (auto& p : peers_) {
    if (p.fd >= 0) ::close(p.fd);
  }
}

void TcpMesh::postSend(int peer, const void* data, size_t bytes) {
  if (bytes == 0) return;
  peers_[peer].sends.push_back({static_cast<const char*>(data), bytes});
  ++pending_;
}

void TcpMesh::postRecv(int peer, void* data, size_t bytes, std::function<void()> done) {
  if (bytes == 0) {
    if (done) done();
    return;
  }
  peers_[peer].recvs.push_back({static_cast<char*>(data), bytes, std::move(done)});
  ++pending_;
}

void TcpMesh::fail(int peer, const std::string& what) {
  throw BackendError("connection to rank " + std::to_string(peer) + " " + what +
                     " (did that rank exit?)");
}

bool TcpMesh::pump(int q) {
  Peer& p = peers_[q];
  bool moved = false;
  while (!p.sends.empty()) {
    Send& s = p.sends.front();
    const ssize_t k = ::send(p.fd, s.p, s.left, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EAGAIN || errno == EINTR) break;
      fail(q, std::string("failed while sending: ") + std::strerror(errno));
    }
    moved = true;
    s.p += k;
    s.left -= static_cast<size_t>(k);
    if (s.left == 0) {
      p.sends.pop_front();
      --pending_;
    }
  }
  while (!p.recvs.empty()) {
    Recv& r = p.recvs.front();
    const ssize_t k = ::recv(p.fd, r.p, r.left, MSG_DONTWAIT);
    if (k == 0) fail(q, "was closed");
    if (k < 0) {
      if (errno == EAGAIN || errno == EINTR) break;
      fail(q, std::string("failed while receiving: ") + std::strerror(errno));
    }
    moved = true;
    r.p += k;
    r.left -= static_cast<size_t>(k);
    if (r.left == 0) {
      auto done = std::move(r.done);
      p.recvs.pop_front();
      --pending_;
      if (done) done();  // may post more work (to this or another peer)
    }
  }
  return moved;
}

void TcpMesh::progress(Clock::time_point deadline) {
  std::vector<pollfd> fds;
  std::vector<int> owners;
  while (pending_ > 0) {
    bool moved = false;
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) moved |= pump(q);
    }
    if (pending_ == 0) return;
    if (moved) continue;  // try again before sleeping in poll
    fds.clear();
    owners.clear();
    for (int q = 0; q < size_; ++q) {
      const Peer& p = peers_[q];
      if (q == rank_ || (p.sends.empty() && p.recvs.empty())) continue;
      short events = 0;
      if (!p.sends.empty()) events |= POLLOUT;
      if (!p.recvs.empty()) events |= POLLIN;
      fds.push_back({p.fd, events, 0});
      owners.push_back(q);
    }
    const int ms = remainingMs(deadline);
    if (ms == 0) throw TimeoutError("collective did not finish before its deadline");
    const int n = ::poll(fds.data(), fds.size(), ms);
    if (n < 0 && errno != EINTR) throw BackendError(std::string("poll failed: ") + std::strerror(errno));
    if (n == 0) throw TimeoutError("collective did not finish before its deadline");
    for (size_t i = 0; i < fds.size(); ++i) {
      // POLLHUP/POLLERR are diagnosed by the next send/recv in pump().
      if ((fds[i].revents & (POLLERR | POLLHUP)) && peers_[owners[i]].recvs.empty()) {
        fail(owners[i], "was closed or reset");
      }
    }
  }
}

}  // namespace ddprun::runtime
