#pragma once
// LocalRendezvous: the RendezvousHandler of a single-node job (--standalone, or --nnodes=1).
//
// There is nobody to wait for, so every round completes at once (posted). The agent hosts
// the store here, on its own io_context: by default the workers are told MASTER_ADDR and
// MASTER_PORT of this store and TORCHELASTIC_USE_AGENT_STORE=True, and PyTorch workers use it
// as TCPStore clients; with --no-agent-store no store is hosted and each round gets a free
// MASTER_PORT for rank 0 to host its own (TORCHELASTIC_USE_AGENT_STORE=False).
// The restart budget is --max-restarts, counted here.
#include <memory>
#include <string>

#include "launcher/rendezvous_handler.h"
#include "rendezvous/store_limits.h"

namespace ddprun::rendezvous {
class StoreServer;
}

namespace ddprun::launcher {

struct LocalRendezvousOptions {
  std::string runId;
  int maxRestarts = 0;
  bool agentStore = true;
  std::string masterAddr = "127.0.0.1";  // what workers are told (MASTER_ADDR)
  std::string bindAddr = "127.0.0.1";    // the IP the store (or a free port) is bound on
  uint16_t port = 0;                     // 0: a free port
  rendezvous::ServerLimits storeLimits{};  // --rdzv-conf store_*
};

class LocalRendezvous final : public RendezvousHandler {
 public:
  // Binds the store at once (when hosting); throws NetworkError naming the address.
  LocalRendezvous(boost::asio::io_context& io, LocalRendezvousOptions options);
  ~LocalRendezvous() override;

  void setListener(Listener listener) override;
  void asyncNextRound(int localWorldSize, RoundHandler done) override;
  void asyncReportFailure(int exitCode, const std::string& what, bool retryable,
                          DecisionHandler done) override;
  void asyncFinish(DecisionHandler done) override;
  void asyncLeave(const std::string& reason, DoneHandler done) override;
  void asyncShutdown(DoneHandler done) override;
  void asyncNodeWorkers(const RoundInfo& round,
                        std::function<void(std::vector<int>)> done) override;
  std::string describe() const override;
  rendezvous::StoreServer* workerStore() override { return store_.get(); }

  // The hosted store's port (0 when there is none).
  uint16_t storePort() const;

 private:
  boost::asio::io_context& io_;
  LocalRendezvousOptions options_;
  std::unique_ptr<rendezvous::StoreServer> store_;
  uint64_t round_ = 0;
  int restarts_ = 0;
};

// A port that was free on `ip` a moment ago (bound to port 0, then released).
uint16_t pickFreePort(const std::string& ip);
// The first IPv4 (else IPv6) address of `host`, or `host` itself if it already is one.
// Throws ConfigError naming the host when it does not resolve.
std::string resolveAddress(const std::string& host);

}  // namespace ddprun::launcher
