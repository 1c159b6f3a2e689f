#pragma once
// DynamicRendezvous: one agent's side of the multi-node rendezvous (docs/rendezvous.md).
//
// Agents on several nodes meet in rounds through a store (ddprun-store, or the store one of
// them hosts). A round closes with a membership: node ranks, each node's share of the global
// worker ranks (prefix sums of nproc), MASTER_ADDR/PORT. While workers run, the round can end
// under the agent's feet -- a node arrived, left or died, or workers failed on another node --
// and the agent hears of it at once through `onEvent` (a background thread WAITs on the
// round's `over` marker). The agent then stops its workers and calls nextRound() again; only
// worker failures spend the restart budget, which is counted once per job in the state.
//
//   DynamicRendezvous rdzv(options, [&](const RoundEvent& e) { post(io, stopWorkers); });
//   for (;;) {
//     RoundInfo r = rdzv.nextRound();
//     ... run workers; on an event: stop them, continue ...
//     on failure:  if (rdzv.reportFailure(code, what) == AfterFailure::JobFailed) break;
//     on success:  if (rdzv.finishRound() == AfterSuccess::Finished) break;
//   }
//   rdzv.closeJob();  // the job has ended: tell the others (the store host waits for them)
//
// The static backend is the same protocol with fixed node ranks (NodeInfo::fixedRank),
// MIN = MAX and no heartbeats. Methods other than the constructor's event callback are called
// from one thread (the agent's).
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "rendezvous/blocking.h"
#include "rendezvous/rendezvous_backend.h"
#include "rendezvous/silent_members.h"
#include "rendezvous/state_log.h"

namespace ddprun::rendezvous {

struct DynamicRendezvousOptions {
  std::string runId;        // --rdzv-id; the backend keeps the job's keys apart from others'
  // Where the keys live and how nodes watch each other (rendezvous_backend.h). When null:
  // the ddprun store at `store` with heartbeats `heartbeat` (TcpStoreBackend).
  std::shared_ptr<const RendezvousBackend> backend;
  TcpStoreOptions store;    // the endpoint; store.timeout is read_timeout
  JobLimits limits;         // --nnodes MIN:MAX, --max-restarts
  std::string localAddr;    // advertised address; empty: the one that routes to the store
  int nproc = 1;
  int fixedRank = -1;       // static backend: --node-rank
  Millis joinTimeout{600'000};
  Millis lastCallTimeout{30'000};
  Millis closeTimeout{30'000};          // the store host's wait for every node to learn the job ended
  Millis exitBarrierTimeout{300'000};  // a finished node's wait for the others' workers
  HeartbeatOptions heartbeat{};         // interval 0: no heartbeats (static backend)
  bool isHost = false;                  // this agent hosts the store: see finishRound()
  // The round watcher WAITs on the agent's own connection instead of opening one of its own:
  // one connection fewer per agent. Whenever the agent needs its connection back (every call
  // disarms the watcher first), the watcher's WAIT is cancelled on the server (CANCEL_WAIT:
  // the connection is kept) and the agent waits for the watcher to let go of it. Needs a
  // backend whose connections can cancel a wait (the ddprun store); ignored otherwise. Used by
  // the launcher's agents (multi-node jobs on the ddprun store) and the simulated agents of
  // `ddprun-bench rendezvous --simulate` (one connection each).
  bool watcherOnAgentConnection = false;
  // Node ranks in slot (arrival) order within each round, as torchrun assigns them (the
  // default, --rdzv-conf rank_order=arrival), or, when false, kept from the round before and
  // newcomers in address order (rank_order=stable: the closer reads all N records, O(N)).
  // Every agent's store work to form or re-form a round is then constant, the closer's
  // included: each joiner writes its own entry of the member list with its record and the round
  // closes from two counters (scalable/slot_join.h, "Arrival ranks"; on etcd the counters are
  // weighted tickets).
  // The workers' store needs no kept rank: each round names node rank 0's address and port
  // (RoundInfo::masterAddr/Port), and its agent hosts the store of that round's workers.
  bool arrivalRanks = true;
};

// One closed round, from this node's point of view.
struct RoundInfo {
  int64_t round = 0;
  int restartCount = 0;  // restarts the job has spent (TORCHELASTIC_RESTART_COUNT)
  int nodeRank = 0;      // GROUP_RANK
  int nodeCount = 0;     // GROUP_WORLD_SIZE
  int rankOffset = 0;    // global rank of this node's local rank 0
  int worldSize = 0;     // WORLD_SIZE: sum of every node's nproc
  std::string masterAddr;
  uint16_t masterPort = 0;
  std::vector<NodeInfo> nodes;  // by node rank
};

// Something that ended the current round without this agent asking (delivered once per round).
struct RoundEvent {
  enum class Kind {
    Superseded,   // a new round opened (arrival, departure, eviction, failure elsewhere)
    JobFailed,    // workers failed somewhere and no restart is left
    JobFinished,  // the job finished while this node was not looking (it was lost: paused, cut off)
    StoreLost,    // the store cannot be reached: the agent must stop
    // Node rank 0 only, with JobLimits::keepRoundOnNodeLoss: a member was lost in process (its
    // agent evicted or gone) while the round goes on; answer with reportNodeLoss().
    NodeLost,
  };
  Kind kind;
  int64_t round = 0;
  int exitCode = 0;    // JobFailed: the root cause's exit code
  int restarts = 0;    // the job's restarts after the event (more than the round's: one was spent)
  std::string message;
  // NodeLost: the lost node's id and its node rank in the round.
  std::string lostId;
  int lostNodeRank = -1;
};

class DynamicRendezvous {
 public:
  // Called on a background thread: must not block, nor call back into the rendezvous.
  using EventFn = std::function<void(const RoundEvent&)>;

  // Connects (failing clearly when the endpoint is not a ddprun store, or the token is
  // wrong), checks that the job's settings match the other nodes', starts the liveness
  // signal (heartbeats, or an etcd lease).
  DynamicRendezvous(DynamicRendezvousOptions options, EventFn onEvent);
  ~DynamicRendezvous();
  DynamicRendezvous(const DynamicRendezvous&) = delete;
  DynamicRendezvous& operator=(const DynamicRendezvous&) = delete;

  // Whether the liveness signal (or the round watcher) has declared the store lost: from then on
  // every call fails at once and this node evicts nobody. Any thread; never blocks for long.
  bool storeLost();

  // Joins the next round and blocks until it closes with this node in it. Throws
  // TimeoutError after join_timeout, JobEndedError when the job has finished or failed.
  RoundInfo nextRound();

  enum class AfterFailure { Restart, JobFailed };
  // This node's workers failed in the current round: spends one restart of the job's budget
  // (unless the round had already ended) and returns Restart -- call nextRound() -- or ends
  // the job for every node and returns JobFailed (see jobExitCode()): when no restart is left, or
  // at once when `retryable` is false (the error cannot go away by retrying).
  AfterFailure reportFailure(int exitCode, const std::string& what, bool retryable = true);

  // This node's in-process recovery of the current round (reportRecovery or reportNodeLoss:
  // Recover) failed after all: the round ends and the group restarts without spending a second
  // restart (the recovery spent it). Restart -- call nextRound() --, also when the round had
  // already ended; JobFailed when the job had failed meanwhile (elsewhere).
  AfterFailure reportFailedRecovery(const std::string& what);

  enum class AfterRecovery { Recover, Restart, JobFailed };
  // A worker of this node died and the agent would recover in process (docs/recovery.md): spends
  // one restart of the job's budget while the round goes on (Recover: the other nodes are not
  // told, their workers keep running; the agent is still in the round). Restart when the round
  // had already ended (call nextRound(), as after reportFailure); JobFailed as reportFailure.
  AfterRecovery reportRecovery(int exitCode, const std::string& what, bool retryable = true);

  // Node rank 0, after a NodeLost event: `inProcess` spends one restart while the round goes on
  // (Recover; its agent publishes the generation without the lost node's ranks), or not
  // (Restart: the round is re-formed without the node, no restart spent, as an eviction always
  // did). Restart as well when the round had already ended; JobFailed when no restart is left.
  // `what` (naming the node) becomes the state's reason.
  AfterRecovery reportNodeLoss(const std::string& what, bool inProcess);

  enum class AfterSuccess { Finished, Rejoin, JobFailed };
  // This node's workers succeeded: the exit barrier. Finished once every member is done (or was
  // lost after the first one was: a finishing job is never re-formed); Rejoin when the round
  // ended first (call nextRound()); JobFailed when it failed. TimeoutError after
  // exit_barrier_timeout. On the ddprun store with heartbeats, the members silent for the
  // keep-alive bound are recorded lost together (evictSilentMembers), not one per bound.
  AfterSuccess finishRound();

  // The job has ended (finished or failed, as this node learned from the state): records that
  // this node knows (key ended/<id>) and stops the heartbeats. On the store host, then waits up to
  // close_timeout until every node the final state names has recorded it too, so that none of
  // them -- a node paused or cut off while the job ended, one waiting to join -- loses the store
  // before it has learned how the job ended; a node the state lost, with heartbeats on the
  // ddprun store, only while its beat counter moves (awaitLostNodes: a node silent for the
  // keep-alive bound never reads the end). Never throws (failures are logged).
  void closeJob();

  // Leaves the job for good (SIGTERM/SIGINT on this node); the others re-form without it.
  // Best effort and bounded: each store call within 2 s (its host may have got the same signal
  // and gone); a store already lost is not called at all. Throws what the store threw.
  void leave(const std::string& reason);

  // Makes the call in progress on the agent's thread (nextRound, finishRound, ...) fail at once
  // with NetworkError; the next call reconnects. Safe from any thread (a signal handler's
  // thread, the event loop) -- e.g. to leave() while a join is still waiting.
  void interrupt();
  // interrupt(), and every later call but leave() and closeJob() fails the same way: the agent
  // is leaving (a signal), even if that came before the call it was meant to cut short started.
  void interruptForLeave();

  // The current round's members by node rank (RoundInfo::nodes when it has them). The slot
  // join's agents do not read the membership (O(N)); this does, for the one that needs it (node
  // rank 0 writes the job's timeline). Call after nextRound(), on the agent's thread.
  std::vector<NodeInfo> roundMembers();

  // For tests of the round watcher's races: `fn` runs on the watcher thread whenever a watch of
  // the round's versions (node rank 0 with keepRoundOnNodeLoss) ended because the agent disarmed
  // it, before the watcher looks at what it is armed for next. Set it before nextRound().
  void onWatcherDisarmedForTest(std::function<void()> fn);

  const NodeInfo& self() const { return self_; }
  const DynamicRendezvousOptions& options() const { return options_; }
  int jobExitCode() const { return jobExitCode_; }
  const std::string& jobFailure() const { return jobFailure_; }
  // The newest state this node's agent thread has seen (its reason, its restart count).
  const RoundState& state() const { return current_.state; }

 private:
  // After reportRecovery's or reportNodeLoss's write: JobFailed when the job failed, Recover
  // when `stays` and the write kept this closed round, else Restart (this agent leaves the round).
  AfterRecovery afterRecoveryWrite(const StateLog::Result& r, bool stays);
  // After reportFailure's or reportFailedRecovery's write (this agent has left the round):
  // JobFailed when the job failed, else Restart.
  AfterFailure afterFailureWrite(const StateLog::Result& r);
  InterruptibleStore connect() const;
  void checkSettings();
  RoundInfo roundInfo(const RoundState& s) const;
  Versioned joinAndWait();
  // The ddprun store's dynamic backend forms rounds by the slot join (dynamic_rendezvous_slots.cpp).
  Versioned joinBySlots();
  Versioned closeBySlots(const Versioned& joining);
  // Arrival ranks: closes round r from the counters alone (this agent's written-ADD brought the
  // written slots to `target`; `world` is the processes of slots 1..target), or falls back to
  // closeBySlots when the round lost nodes while it was open.
  Versioned closeFromCounters(const Versioned& joining, int target, int64_t world);
  // Whether this node is a member of closed state `s`; remembers its position (selfAt_). On a
  // compact state one round trip, and only when it took a slot of that round.
  bool findSelf(const RoundState& s);
  AfterSuccess finishBySlots(int64_t round);
  // The exit barrier's sweep (issue 20): the members of round `r` (loaded once into `members`)
  // that are neither done nor lost and whose heartbeats have been silent for the keep-alive
  // bound are all recorded lost in one write, instead of one per bound around the ring.
  void evictSilentMembers(int64_t r, std::vector<std::string>& members);
  // Those of `members` (round r's, this node left out) neither done nor lost: O(N) reads.
  std::vector<std::string> runningMembers(int64_t r, const std::vector<std::string>& members);
  // Whether this node judges silent members itself (SilentMembers): the store's host and node
  // rank 0 only, on the ddprun store with heartbeats (the ring's counters), and only until it
  // has declared the store lost.
  bool judgesSilence();
  // The store host's close: waits until the nodes in `lost` have recorded the job's end, or are
  // silent for the keep-alive bound, or `deadline` passes; returns those not heard from.
  std::vector<std::string> awaitLostNodes(std::vector<std::string> lost,
                                          Clock::time_point deadline);
  // What finishRound() returns once current_ holds the round after the exit barrier (and
  // remembers a failed job's exit code and reason).
  AfterSuccess outcomeAfterBarrier();
  // Arms (round >= 0) or disarms (-1) the watcher; disarming makes a pending event stale, and
  // when the watcher shares the agent's connection, returns once the watcher has let go of it.
  void watch(int64_t round);
  // Disarms the watcher if it watches round `r` (resume with watch(r)); returns whether it did.
  // For a call on the agent's connection while a round runs (roundMembers).
  bool pauseWatcher(int64_t r);
  void disarmLocked(std::unique_lock<std::mutex>& lock);
  void watcherLoop();
  // The watcher of node rank 0 with keepRoundOnNodeLoss: reads every version of round `r` from
  // `from` on, emits NodeLost for each member lost in process, and returns the version that
  // ended the round (nullopt: disarmed meanwhile).
  std::optional<Versioned> watchVersions(StateLog& log, int64_t r, Versioned from,
                                         const std::function<bool()>& armed);
  void emit(const RoundEvent& e);
  void onBackgroundError(std::exception_ptr e);
  Versioned fresh();
  // Replaces the agent's connection after interrupt(); throws NetworkError after
  // interruptForLeave() unless `leaving` (the call is leave() or closeJob()).
  void reconnectIfInterrupted(bool leaving = false);

  DynamicRendezvousOptions options_;
  EventFn onEvent_;
  NodeInfo self_;
  InterruptibleStore main_;
  // The watcher's connection, under mu_: its own (set once by the watcher thread), or, when it
  // shares the agent's (sharedWatcher_), the agent's as of the WAIT in progress.
  InterruptibleStore watcherConn_;
  bool sharedWatcher_ = false;
  std::unique_ptr<StateLog> log_;
  StateView view_;
  std::unique_ptr<Liveness> liveness_;
  std::unique_ptr<SilentMembers> silent_;  // the agent thread's, made at its first use
  Versioned current_;  // the newest state the agent thread knows
  RoundInfo round_;
  std::atomic<int64_t> roundNo_{-1};  // round_.round, for background threads
  bool inRound_ = false;
  // The slot join: the round this node holds a slot of (-1: none), the slot, the round's target
  // when it was taken, and when this node's last call runs out (max: it has none).
  int64_t slotRound_ = -1;
  // The closed round whose waiting list this node registered on (scalable/waiting_list.h).
  int64_t waitRound_ = -1;
  int64_t slot_ = 0;
  int64_t slotProcs_ = 0;  // the processes of slots 1..slot_ (0 on a store with tickets)
  Clock::time_point closeAt_ = Clock::time_point::max();  // arrival ranks: the target's fallback
  int slotTarget_ = 0;
  Clock::time_point lastCallAt_ = Clock::time_point::max();
  std::optional<ListPosition> selfAt_;  // this node's entry in the closed round (findSelf)
  bool left_ = false;
  bool closed_ = false;
  int jobExitCode_ = 0;
  std::string jobFailure_;

  std::mutex mu_;  // guards the watcher's fields below
  // CondVar and Background are std::condition_variable and std::thread for a real agent; on the
  // simulator's fibers they park fibers instead (rendezvous/blocking.h).
  CondVar cv_;
  int64_t watchRound_ = -1;
  Versioned watchFrom_;      // the state the agent knew when it armed the watcher
  bool watchLosses_ = false;  // node rank 0 with keepRoundOnNodeLoss: watchVersions
  std::set<std::string> reportedLost_;  // the watcher's: NodeLost emitted once per node
  std::function<void()> watcherDisarmedForTest_;  // onWatcherDisarmedForTest
  bool watcherBusy_ = false;  // the watcher is in a call on the shared connection
  bool stopping_ = false;
  bool storeLost_ = false;
  std::atomic<bool> interrupted_{false};
  std::atomic<bool> leaving_{false};
  std::mutex mainMu_;  // interrupt() vs. reconnectIfInterrupted() swapping main_
  Background watcher_;
};

}  // namespace ddprun::rendezvous
