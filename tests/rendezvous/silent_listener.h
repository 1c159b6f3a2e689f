#pragma once
// Test helpers for a store that stops answering: a loopback listener that never accepts, and the
// InterruptibleStore (liveness.h) of a TcpStore, as the agent's liveness connects them.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <memory>

#include "rendezvous/liveness.h"
#include "rendezvous/tcp_store.h"

namespace rdzvtest {

// A listener on 127.0.0.1 (a free port) that never accepts: the kernel completes the TCP
// handshake (its backlog) and nothing answers, as a store whose process is stopped. The test
// fails at construction if it cannot listen; the socket is closed on destruction.
class SilentListener {
 public:
  SilentListener() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { ::close(fd_); }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;

  uint16_t port() const { return port_; }

  // Store options for it with per call and connect bounds of 20 s: far above any bound a test
  // checks, so that only the caller's own (a keep-alive, a liveness deadline) can end a call.
  ddprun::rendezvous::TcpStoreOptions storeOptions() const {
    return {.host = "127.0.0.1", .port = port_, .timeout = ddprun::rendezvous::Millis(20'000),
            .connectTimeout = ddprun::rendezvous::Millis(20'000)};
  }

 private:
  int fd_;
  uint16_t port_ = 0;
};

// `tcp` as the liveness uses a store: interrupt, cancel a call, cancel waits (liveness.h).
inline ddprun::rendezvous::InterruptibleStore interruptible(
    std::shared_ptr<ddprun::rendezvous::TcpStore> tcp) {
  return {tcp, [tcp] { tcp->interrupt(); }, [tcp] { tcp->cancelCall(); },
          [tcp](bool on) { tcp->setWaitsCancelled(on); }};
}

}  // namespace rdzvtest
