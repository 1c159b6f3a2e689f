#include "launcher/local_rendezvous.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cstring>

#include "base/errors.h"
#include "rendezvous/store_server.h"

namespace ddprun::launcher {

namespace asio = boost::asio;

LocalRendezvous::LocalRendezvous(asio::io_context& io, LocalRendezvousOptions options)
    : io_(io), options_(std::move(options)) {
  if (options_.agentStore) {
    store_ = std::make_unique<rendezvous::StoreServer>(
        io_, rendezvous::StoreServerOptions{.host = options_.bindAddr,
                                            .port = options_.port,
                                            .limits = options_.storeLimits});
  }
}

LocalRendezvous::~LocalRendezvous() = default;

void LocalRendezvous::setListener(Listener) {
  // One node: membership never changes and no other node can fail the job.
}

void LocalRendezvous::asyncNextRound(int localWorldSize, RoundHandler done) {
  RoundInfo info;
  std::exception_ptr error;
  try {
    info.round = round_++;
    info.restartCount = restarts_;
    info.nodeRank = 0;
    info.nodeCount = 1;
    info.rankOffset = 0;
    info.worldSize = localWorldSize;
    info.masterAddr = options_.masterAddr;
    info.useAgentStore = options_.agentStore;
    info.masterPort = store_ ? store_->port()
                             : (options_.port != 0 ? options_.port : pickFreePort(options_.bindAddr));
    info.runId = options_.runId;
  } catch (...) {
    error = std::current_exception();
  }
  asio::post(io_, [done = std::move(done), error, info] { done(error, info); });
}

void LocalRendezvous::asyncReportFailure(int exitCode, const std::string& what, bool retryable,
                                         DecisionHandler done) {
  JobDecision d;
  if (!retryable) {
    d = JobDecision{.kind = JobDecision::Kind::Failed, .exitCode = exitCode,
                    .reason = what + " (not retryable: no restart spent)"};
  } else if (restarts_ < options_.maxRestarts) {
    ++restarts_;
    d = JobDecision{.kind = JobDecision::Kind::NextRound, .reason = what,
                    .restartCount = restarts_};
  } else {
    d = JobDecision{.kind = JobDecision::Kind::Failed, .exitCode = exitCode, .reason = what};
  }
  asio::post(io_, [done = std::move(done), d] { done(nullptr, d); });
}

void LocalRendezvous::asyncFinish(DecisionHandler done) {
  asio::post(io_, [done = std::move(done)] {
    done(nullptr, JobDecision{.kind = JobDecision::Kind::Finished});
  });
}

void LocalRendezvous::asyncLeave(const std::string&, DoneHandler done) {
  asio::post(io_, [done = std::move(done)] { done(nullptr); });
}

void LocalRendezvous::asyncShutdown(DoneHandler done) {
  asio::post(io_, [done = std::move(done)] { done(nullptr); });
}

std::string LocalRendezvous::describe() const {
  std::string s = "single node, run id " + options_.runId;
  if (store_) s += ", agent store on " + options_.bindAddr + ":" + std::to_string(store_->port());
  return s;
}

uint16_t LocalRendezvous::storePort() const { return store_ ? store_->port() : 0; }

uint16_t pickFreePort(const std::string& ip) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    len = sizeof *v6;
  } else {
    throw ConfigError("'" + ip + "' is not an IP address");
  }
  const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw NetworkError(std::string("socket: ") + std::strerror(errno));
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    port = ntohs(ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
  }
  const int err = errno;
  ::close(fd);
  if (port == 0) {
    throw NetworkError("cannot find a free port on " + ip + ": " + std::strerror(err));
  }
  return port;
}

std::string resolveAddress(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    throw ConfigError("cannot resolve host '" + host + "': " + ::gai_strerror(rc));
  }
  std::string best;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    const void* addr = a->ai_family == AF_INET
                           ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                           : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (::inet_ntop(a->ai_family, addr, buf, sizeof buf) == nullptr) continue;
    if (a->ai_family == AF_INET) {
      best = buf;
      break;
    }
    if (best.empty()) best = buf;
  }
  ::freeaddrinfo(res);
  if (best.empty()) throw ConfigError("cannot resolve host '" + host + "'");
  return best;
}

}  // namespace ddprun::launcher
