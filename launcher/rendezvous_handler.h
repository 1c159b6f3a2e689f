#pragma once
// RendezvousHandler: how the agent learns who it works with, round after round.
//
// The agent's loop is: next round -> start the local workers -> supervise -> restart or stop.
// A *round* is one membership of the job: how many nodes, this node's rank among them, the
// global rank of this node's first worker, the world size, and where the workers meet
// (MASTER_ADDR/MASTER_PORT). Everything that depends on other nodes lives behind this
// interface, so the agent itself is the same for one node and for many:
//   - LocalRendezvous (local_rendezvous.h): one node; rounds are immediate.
//   - a multi-node handler (the store-based dynamic rendezvous) plugs in through
//     makeRendezvousHandler() (make_rendezvous.cpp).
//
// Threading contract: every method is called on the agent's io_context thread and must not
// block it (the agent may host the very store the handler talks to). Every completion and
// every listener call happens on that io_context too (post them; never call a completion
// from inside the initiating method). Errors reach completions as exception_ptr, never as
// exceptions thrown on the I/O thread.
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/errors.h"
#include "rendezvous/tcp_store.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::rendezvous {
class StoreServer;
}

namespace ddprun::launcher {

struct LaunchOptions;

// One membership of the job, as this node sees it.
struct RoundInfo {
  uint64_t round = 0;        // 0, 1, 2, ...: one per start of the worker group
  int restartCount = 0;      // failures spent so far, job-wide (TORCHELASTIC_RESTART_COUNT)
  int nodeRank = 0;          // GROUP_RANK
  int nodeCount = 1;         // GROUP_WORLD_SIZE
  int rankOffset = 0;        // global rank of this node's local rank 0
  int worldSize = 1;         // workers in the whole job
  std::string masterAddr;    // MASTER_ADDR
  uint16_t masterPort = 0;   // MASTER_PORT
  bool useAgentStore = true; // MASTER_ADDR:PORT is the agent's store (workers are clients)
  std::string runId;         // TORCHELASTIC_RUN_ID
  // Each node's worker count, by node rank, when the round gave them (one node; a round whose
  // state carries its members); else empty: asyncNodeWorkers reads them.
  std::vector<int> nodeWorkers;
};

// What happens to the job next, decided by the handler (possibly with the other nodes).
struct JobDecision {
  enum class Kind {
    NextRound,  // stop the workers (if running) and join the next round
    Finished,   // the job succeeded everywhere: exit 0
    Failed,     // the job failed (here or elsewhere, budget spent, store lost): exit exitCode
    // A listener event of node rank 0 only (several nodes, in-process recovery): another node
    // was lost (its agent gone) and the round goes on; answer with asyncReportNodeLoss.
    NodeLost,
  };
  Kind kind = Kind::NextRound;
  int exitCode = 0;    // Failed: ddprun's exit code (the root cause's, or 1)
  std::string reason;  // one line for the log: "node 2 joined", "rank 5 on node 1 failed"
  int restartCount = 0;  // the job's restarts spent after this decision (NextRound)
  bool storeLost = false;  // Failed because the rendezvous store cannot be reached
  // NextRound of asyncReportRecovery: the restart was spent and the round goes on (the other
  // nodes' workers keep running); false: the round had ended, restart as after any failure.
  bool recovered = false;
  // NodeLost: the lost node's rank in the round and its id.
  int lostNode = -1;
  std::string lostId;
  // Multi-node, Finished/Failed: how the job ended, the same line on every node (empty for one
  // node, where the exit code and the failure report say it all).
  std::string summary;
};

// The job ended while this node was joining a round (it finished or failed elsewhere).
// asyncNextRound delivers it as its error; ddprun then exits with exitCode().
class JobEnded : public Error {
 public:
  JobEnded(const std::string& what, int exitCode, std::string summary = {})
      : Error(what), exitCode_(exitCode), summary_(std::move(summary)) {}
  int exitCode() const { return exitCode_; }
  const std::string& summary() const { return summary_; }  // as JobDecision::summary

 private:
  int exitCode_;
  std::string summary_;
};

class RendezvousHandler {
 public:
  using RoundHandler = std::function<void(std::exception_ptr, RoundInfo)>;
  using DecisionHandler = std::function<void(std::exception_ptr, JobDecision)>;
  using DoneHandler = std::function<void(std::exception_ptr)>;
  // The running round ended without this node asking: a node joined, left or died
  // (NextRound: restart, spending no restart), or the job failed elsewhere (Failed).
  using Listener = std::function<void(const JobDecision&)>;

  virtual ~RendezvousHandler() = default;

  // Called once, before the first round.
  virtual void setListener(Listener listener) = 0;
  // Whether this node has declared the rendezvous store lost (its heartbeat: the store stopped
  // answering, or its connections failed). The listener gets a Failed decision with storeLost
  // for it, but maybe after a completion posted earlier: a round that closed just before the
  // loss must not start workers, so the agent asks this before it does. Never blocks.
  virtual bool storeLost() const { return false; }
  // Joins the next round with `localWorldSize` workers on this node. Errors: JobEnded, or
  // anything else (TimeoutError, NetworkError, ...), which ends ddprun with exit code 1.
  virtual void asyncNextRound(int localWorldSize, RoundHandler done) = 0;
  // A worker of this node failed (the root cause: its exit code and a description). Spends a
  // restart of the job's budget (--max-restarts counts once per job): NextRound when one was
  // left, else Failed with the exit code the job ends with. Not `retryable` (the worker's error
  // file says retrying cannot help): Failed at once, spending nothing.
  virtual void asyncReportFailure(int exitCode, const std::string& what, bool retryable,
                                  DecisionHandler done) = 0;
  // The same for a death the agent recovers in process (docs/recovery.md): one restart of the
  // budget, but the round goes on, so no other node restarts: NextRound with `recovered` set.
  // One node: asyncReportFailure (its rounds are this agent's).
  virtual void asyncReportRecovery(int exitCode, const std::string& what, bool retryable,
                                   DecisionHandler done) {
    asyncReportFailure(exitCode, what, retryable,
                       [done = std::move(done)](std::exception_ptr e, JobDecision d) {
                         d.recovered = !e && d.kind == JobDecision::Kind::NextRound;
                         done(e, d);
                       });
  }
  // This node's in-process recovery of the running round (asyncReportRecovery or
  // asyncReportNodeLoss answered `recovered`) failed after all, so its group restarts: the round
  // ends for every node (NextRound) without spending a second restart -- one failure costs the
  // budget one. Failed when the job had failed meanwhile. One node: its agent keeps the
  // recovery's decision instead (a restart of its own rounds), so this is not called.
  virtual void asyncReportFailedRecovery(int exitCode, const std::string& what,
                                         DecisionHandler done) {
    asyncReportFailure(exitCode, what, /*retryable=*/true, std::move(done));
  }
  // Node rank 0 after a NodeLost event: `inProcess` spends one restart and keeps the round
  // (NextRound with `recovered` set: the agent publishes a generation without the node's
  // ranks), else the round is re-formed without the node, no restart spent (NextRound). Failed
  // when no restart is left. `what` names the node (the rendezvous state's reason).
  virtual void asyncReportNodeLoss(const std::string& what, bool inProcess, DecisionHandler done) {
    (void)inProcess;
    asyncReportFailure(1, what, true, std::move(done));  // one node: never called
  }
  // Every local worker succeeded: the exit barrier. Finished once the job is done; NextRound
  // when the round ended first (rejoin); Failed when the job failed elsewhere.
  virtual void asyncFinish(DecisionHandler done) = 0;
  // This node leaves the job for good (a signal to the agent). Best effort, bounded in time.
  virtual void asyncLeave(const std::string& reason, DoneHandler done) = 0;
  // The job has ended (Finished or Failed, however this node learned it): the last call before
  // ddprun exits. Multi-node: tell the other nodes this one knows; the store host waits, bounded
  // by close_timeout, until every node knows. Never fails.
  virtual void asyncShutdown(DoneHandler done) = 0;
  // One line for logs: "single node, agent store on 127.0.0.1:41234".
  virtual std::string describe() const = 0;
  // Each node's worker count in `round`, by node rank, when RoundInfo::nodeWorkers came without
  // them: an agent of a round closed by the slot join learns only its own entry, and reading
  // every node's is O(N), so node rank 0's agent (the one that needs them: a lost node's
  // shrink, the timeline) asks for them once its workers are starting, not before. Completes
  // with an empty vector when the round has moved on or the read failed (logged).
  virtual void asyncNodeWorkers(const RoundInfo& round,
                                std::function<void(std::vector<int>)> done) = 0;
  // The port of the rendezvous store this node hosts for other nodes, 0 when it hosts none
  // (an endpoint with port 0 lets the host pick a free one; an ssh launch tells the others).
  virtual uint16_t hostedStorePort() const { return 0; }
  // A store every node of `round` reaches besides the rendezvous (the timeline ships each
  // node's events through it to node rank 0's agent, docs/timeline.md): the c10d/static
  // rendezvous store; for etcd-v3 (no store protocol in etcd) the workers' store that node rank
  // 0's agent hosts for the round at MASTER_ADDR:MASTER_PORT, which lives as long as that agent
  // does. nullopt for one node, and for etcd-v3 with --no-agent-store (that store is rank 0's
  // and ends with it).
  virtual std::optional<rendezvous::TcpStoreOptions> sharedStore(const RoundInfo& round) const {
    (void)round;
    return std::nullopt;
  }
  // The workers' store when this agent hosts it for all of them (the agent store: one node, or
  // node rank 0 of several): in-process recovery publishes its generations there
  // (docs/recovery.md). Null otherwise (the other nodes reach it as clients: workerStoreAddress).
  virtual rendezvous::StoreServer* workerStore() { return nullptr; }
};

// Picks the handler for the options: LocalRendezvous for a single node; multi-node backends
// plug in here. Throws ConfigError for a combination this build cannot run.
std::unique_ptr<RendezvousHandler> makeRendezvousHandler(boost::asio::io_context& io,
                                                         const LaunchOptions& options);

}  // namespace ddprun::launcher
