#pragma once
// MultiNodeRendezvous: the RendezvousHandler of a job on several nodes (--nnodes=N>1 or
// MIN:MAX, --rdzv-backend=c10d|static|etcd-v3), over the store protocol of
// rendezvous/dynamic_rendezvous.h (docs/rendezvous.md).
//
// The protocol blocks (it WAITs on store keys) and the agent's io_context must not: every
// call runs on this handler's own thread, one at a time, and its completion is posted back to
// the io_context. The protocol's watcher events (a node arrived, left or died; the job failed
// elsewhere; the store is lost) become JobDecisions for the agent's listener, posted too.
// A signal while a join or the exit barrier is waiting interrupts that wait, then leaves.
//
// Stores:
//   - etcd-v3: the rendezvous lives in the etcd cluster the endpoints name; no agent hosts it.
//   - c10d: the rendezvous store at the endpoint is hosted, on a thread of its own (not the
//     agent's io_context: docs/rendezvous.md, "The store host's thread"), by the agent
//     whose --local-addr (or, without it, this machine) is the endpoint's host, or that has
//     rdzv-conf is_host=true; static: node 0 at --master-addr:--master-port. A host that cannot
//     bind fails naming the endpoint: it never joins somebody else's store instead -- unless a
//     ddprun store answering for this job's id holds the port (another agent of the job on
//     this machine), which it then joins as a client. A host checks, through the endpoint,
//     that it reaches its own store (INFO's instance id): no split brain.
//     The host waits (close_timeout) for every node to pass the exit barrier before it exits.
//   - with the agent store (the default), node rank 0 of each round hosts a fresh store for
//     that round's workers at MASTER_ADDR:MASTER_PORT, so keys of an earlier round (same
//     TORCHELASTIC_RESTART_COUNT after a membership change) never reach them (pytorch#135712).
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "launcher/rendezvous_handler.h"
#include "rendezvous/dynamic_rendezvous.h"
#include "rendezvous/store_limits.h"

namespace ddprun::rendezvous {
class StoreServer;
class ThreadedStoreServer;
}

namespace ddprun::launcher {

// Builds the protocol's options from the launcher's flags; throws ConfigError naming the flag.
// `hostStore` is set to whether this agent hosts the rendezvous store.
rendezvous::DynamicRendezvousOptions multiNodeOptions(const LaunchOptions& o, bool& hostStore);
// The limits of the stores this agent hosts: the defaults and --rdzv-conf store_* keys.
rendezvous::ServerLimits hostedStoreLimits(const LaunchOptions& o);

class MultiNodeRendezvous final : public RendezvousHandler {
 public:
  // Hosts the rendezvous store at once when this node is its host (throws NetworkError naming
  // the endpoint when it cannot bind); connects on the handler's thread at the first round.
  MultiNodeRendezvous(boost::asio::io_context& io, const LaunchOptions& options);
  ~MultiNodeRendezvous() override;

  void setListener(Listener listener) override;
  bool storeLost() const override;
  void asyncNextRound(int localWorldSize, RoundHandler done) override;
  void asyncReportFailure(int exitCode, const std::string& what, bool retryable,
                          DecisionHandler done) override;
  void asyncReportRecovery(int exitCode, const std::string& what, bool retryable,
                           DecisionHandler done) override;
  void asyncReportFailedRecovery(int exitCode, const std::string& what,
                                 DecisionHandler done) override;
  // Node rank 0 in agent-store mode: the store it hosts for every node's workers.
  rendezvous::StoreServer* workerStore() override { return workerStore_.get(); }
  void asyncReportNodeLoss(const std::string& what, bool inProcess, DecisionHandler done) override;
  void asyncFinish(DecisionHandler done) override;
  void asyncLeave(const std::string& reason, DoneHandler done) override;
  void asyncShutdown(DoneHandler done) override;
  void asyncNodeWorkers(const RoundInfo& round,
                        std::function<void(std::vector<int>)> done) override;
  std::string describe() const override;
  uint16_t hostedStorePort() const override;
  std::optional<rendezvous::TcpStoreOptions> sharedStore(const RoundInfo& round) const override;

 private:
  // Runs `job` on the handler's thread after the jobs before it.
  void submit(std::function<void()> job);
  void threadMain();
  rendezvous::DynamicRendezvous& protocol();  // connects on first use (handler's thread)
  void onEvent(const rendezvous::RoundEvent& e);
  // Runs `decide` on the handler's thread and posts its JobDecision (or its exception) to
  // `done`: what every call that asks the protocol for the job's next step shares.
  void submitDecision(std::function<JobDecision(rendezvous::DynamicRendezvous&)> decide,
                      DecisionHandler done);
  // The decision after an in-process recovery's report (a death, or a lost node).
  JobDecision afterRecovery(rendezvous::DynamicRendezvous::AfterRecovery outcome,
                            const std::string& what);
  // Failed: the job's failure as the protocol recorded it.
  JobDecision jobFailed();
  std::string heldBy(const std::string& bindError) const;
  void checkOwnStore();  // on the handler's thread, before the first round
  void hostWorkerStore(const RoundInfo& info);  // on the io_context
  // "job 'ID' finished: REASON" / "job 'ID' FAILED (exit code N): REASON".
  std::string summary(bool failed, int exitCode, const std::string& reason) const;

  boost::asio::io_context& io_;
  bool agentStore_;
  std::string backend_;
  rendezvous::DynamicRendezvousOptions options_;
  rendezvous::ServerLimits storeLimits_;  // of both stores hosted here
  // When this node hosts it: on a thread of its own, not on io_ (threaded_store_server.h).
  std::unique_ptr<rendezvous::ThreadedStoreServer> rendezvousStore_;
  std::unique_ptr<rendezvous::StoreServer> workerStore_;      // node rank 0, agent store mode
  Listener listener_;
  std::unique_ptr<rendezvous::DynamicRendezvous> protocol_;
  std::atomic<rendezvous::DynamicRendezvous*> live_{nullptr};  // for interrupt() from io thread
  std::atomic<bool> leaving_{false};  // asyncLeave() was called: cut every call short
  std::string describe_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  bool busy_ = false;
  std::thread thread_;
};

}  // namespace ddprun::launcher
