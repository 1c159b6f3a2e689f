#include "launcher/local_rendezvous.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <arpa/inet.h>
#include <sys/socket.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cstring>

#include "base/errors.h"
#include "base/resolve.h"
#include "base/unique_fd.h"
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

void LocalRendezvous::asyncNodeWorkers(const RoundInfo& round,
                                       std::function<void(std::vector<int>)> done) {
  asio::post(io_, [counts = round.nodeWorkers, done = std::move(done)] { done(counts); });
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
  const UniqueFd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw NetworkError(std::string("socket: ") + std::strerror(errno));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    throw NetworkError("cannot find a free port on " + ip + ": " + std::strerror(errno));
  }
  return ntohs(ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
}

std::string resolveAddress(const std::string& host) {
  std::vector<SocketAddress> all;
  try {
    all = resolveTcp(host);
  } catch (const NetworkError& e) {  // the host comes from the user's flags
    throw ConfigError(e.what());
  }
  for (const auto& a : all) {
    if (a.family() == AF_INET) return a.ip();
  }
  return all.front().ip();
}

}  // namespace ddprun::launcher
