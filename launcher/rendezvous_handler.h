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
#include <string>

namespace boost::asio {
class io_context;
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
};

class RendezvousHandler {
 public:
  using RoundHandler = std::function<void(std::exception_ptr, RoundInfo)>;
  using DecisionHandler = std::function<void(std::exception_ptr, bool restart)>;
  using DoneHandler = std::function<void(std::exception_ptr)>;
  // Why the running group must restart although none of this node's workers failed: a node
  // joined or left, a worker failed on another node. Such a restart spends no restart.
  using RestartListener = std::function<void(const std::string& reason)>;

  virtual ~RendezvousHandler() = default;

  // Called once, before the first round. The handler calls it (posted) while a group runs.
  virtual void setRestartListener(RestartListener listener) = 0;
  // Joins the next round with `localWorldSize` workers on this node.
  virtual void asyncNextRound(int localWorldSize, RoundHandler done) = 0;
  // A worker of this node failed: may the job restart? The budget (--max-restarts) counts
  // once per job, so the answer may come from other nodes. `true` means: call
  // asyncNextRound again (with restartCount + 1).
  virtual void asyncRequestRestart(DecisionHandler done) = 0;
  // Every local worker succeeded: waits until the job may end (the exit barrier).
  virtual void asyncFinish(DoneHandler done) = 0;
  // This node leaves the job (a signal, or the job failed). Best effort, bounded in time.
  virtual void asyncLeave(DoneHandler done) = 0;
  // One line for logs: "standalone on 127.0.0.1:41234", "c10d at host:29400 as node 1 of 3".
  virtual std::string describe() const = 0;
};

// Picks the handler for the options: LocalRendezvous for a single node; multi-node backends
// plug in here. Throws ConfigError for a combination this build cannot run.
std::unique_ptr<RendezvousHandler> makeRendezvousHandler(boost::asio::io_context& io,
                                                         const LaunchOptions& options);

}  // namespace ddprun::launcher
