#pragma once
// Relay: a TCP relay on 127.0.0.1 between clients and a server (127.0.0.1:targetPort) that keeps
// a copy of every byte that passes, each direction apart, for tests that must show what
// crosses the wire. Each accepted connection gets its own upstream connection and a thread that
// forwards both ways until either side closes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ddprun::test {

class Relay {
 public:
  // What one relayed connection carried.
  struct Capture {
    std::string up;    // client -> server
    std::string down;  // server -> client
  };

  explicit Relay(uint16_t targetPort) : target_(targetPort) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("Relay: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  ~Relay() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    for (auto& t : connections_) t.join();
    ::close(listener_);
  }
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  uint16_t port() const { return port_; }

  // Every connection so far, in the order they were accepted (bytes still in flight may be
  // missing: call after the client is done).
  std::vector<Capture> captures() const {
    std::lock_guard<std::mutex> g(mu_);
    return captures_;
  }

 private:
  static sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }

  void acceptLoop() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) != 1) continue;
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a = loopback(target_);
      if (server < 0 || ::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(client);
        if (server >= 0) ::close(server);
        continue;
      }
      size_t index;
      {
        std::lock_guard<std::mutex> g(mu_);
        index = captures_.size();
        captures_.emplace_back();
      }
      connections_.emplace_back([this, client, server, index] { pump(client, server, index); });
    }
  }

  // Forwards both ways until one side closes (or the relay stops), recording the bytes.
  void pump(int client, int server, size_t index) {
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    char buf[65536];
    bool open = true;
    while (open && !stop_) {
      if (::poll(fds, 2, 50) <= 0) continue;
      for (int i = 0; i < 2 && open; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::recv(fds[i].fd, buf, sizeof buf, 0);
        if (n <= 0) {
          open = false;
          break;
        }
        {
          std::lock_guard<std::mutex> g(mu_);
          (i == 0 ? captures_[index].up : captures_[index].down).append(buf, static_cast<size_t>(n));
        }
        for (ssize_t off = 0; off < n;) {
          const ssize_t w = ::send(fds[1 - i].fd, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
          if (w <= 0) {
            open = false;
            break;
          }
          off += w;
        }
      }
    }
    ::close(client);
    ::close(server);
  }

  uint16_t target_;
  uint16_t port_ = 0;
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> connections_;  // touched by the acceptor thread only, until joined
  mutable std::mutex mu_;
  std::vector<Capture> captures_;
};

}  // namespace ddprun::test
