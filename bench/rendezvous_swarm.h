#pragma once
// A swarm of simulated agents: many agents' real rendezvous code (DynamicRendezvous, the
// state log, the round state machine, TcpStore) in one process, each agent a fiber
// (bench/fiber_scheduler.h: its blocking calls park it) with its own store connection to a
// real `ddprun-store` process -- or, through a SwarmStore, to another store: a private etcd
// (bench/rendezvous_etcd_swarm.h) -- its round trips and bytes counted
// (rendezvous/counting_store.h). `ddprun-bench rendezvous --simulate N` uses it to measure
// how the protocol's cost grows with N, and tests use it to check the protocol's invariants
// with thousands of agents.
//
// An agent here has no heartbeats: a dead agent is evicted by the swarm itself, with the same
// compare-set (transition::remove) a heartbeat watcher makes, so re-forming is timed from the
// eviction. No workers run: an agent's part ends when its round closes.
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "rendezvous/counting_store.h"
#include "rendezvous/dynamic_rendezvous.h"

namespace ddprun::bench {

using rendezvous::Clock;
using rendezvous::Millis;

// A `ddprun-store` process on 127.0.0.1 and a free port (stopped by the destructor).
class StoreProcess {
 public:
  explicit StoreProcess(const std::string& binary);
  ~StoreProcess();
  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  // CPU (user + system) the store has used so far, from /proc/<pid>/stat.
  double cpuSeconds() const;
  // The same for any process (this one: ::getpid()).
  static double cpuSecondsOf(pid_t pid);

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

// Checks what every closed round must give its members: one round number, one membership,
// node ranks 0..n-1 each once, world size = the sum of nproc, each node's first global rank
// the prefix sum of the nproc below it, one MASTER_ADDR:PORT (node rank 0's). `rounds` are
// the members' views; returns "" or the first violation found. `membership`: the round's
// nodes by rank when the views carry none (the slot join's agents never read the membership);
// otherwise every view's own list must equal the first's.
std::string checkRound(const std::vector<rendezvous::RoundInfo>& rounds,
                       const std::vector<rendezvous::NodeInfo>* membership = nullptr);

// The members of round `round` by node rank, as the store keeps them: the version that closed
// it, its lists loaded (a checker's O(N) read; the slot join's agents read only their own entry).
// Throws StoreError when round `round` never closed.
std::vector<rendezvous::NodeInfo> membersOfRound(const rendezvous::TcpStoreOptions& store,
                                                 const std::string& runId,
                                                 const rendezvous::JobLimits& limits,
                                                 int64_t round);
// The same on `job`, a connection to the job's keys (prefixed as the agents' are).
std::vector<rendezvous::NodeInfo> membersOfRound(rendezvous::Store& job,
                                                 const rendezvous::JobLimits& limits,
                                                 int64_t round);

// Where the simulated agents' keys live, as runSwarmOn sees it: a ddprun-store process
// (runSwarm), or a private etcd (bench/rendezvous_etcd_swarm.h). Used from the harness's
// thread (connect, cpuSeconds) and from the agents' fibers (backend: the object is then
// shared, immutable).
class SwarmStore {
 public:
  virtual ~SwarmStore() = default;
  // Agent's backend (rendezvous_backend.h): every Store call its connections make is counted
  // into `traffic` (CountingStore); the liveness it starts is the backend's own, or none.
  virtual std::shared_ptr<const rendezvous::RendezvousBackend> backend(
      std::shared_ptr<rendezvous::StoreTraffic> traffic, bool slotJoin) const = 0;
  // A connection to job `runId`'s keys, for the harness: the eviction, the checks.
  virtual std::shared_ptr<rendezvous::Store> connect(const std::string& runId) const = 0;
  // DynamicRendezvousOptions::store (its timeout is read_timeout).
  virtual rendezvous::TcpStoreOptions storeOptions() const = 0;
  // CPU seconds the store's process(es) have used so far.
  virtual double cpuSeconds() const = 0;
};

// Per-agent cost of one phase: median and max over the agents.
struct Cost {
  int64_t medianRoundTrips = 0, maxRoundTrips = 0;
  int64_t medianBytes = 0, maxBytes = 0;
};
Cost costOf(std::vector<rendezvous::StoreTraffic::Snapshot> perAgent);

struct SwarmOptions {
  int agents = 16;
  uint64_t seed = 1;
  Millis spread{200};             // arrivals drawn uniformly from [0, spread)
  int maxNproc = 4;               // each agent's nproc drawn from 1..maxNproc
  Millis timeout{120'000};        // join_timeout and read_timeout: a run that takes longer fails
  // "agents": the protocol the agents run (DynamicRendezvous on a ddprun store: the slot join
  // forms rounds, the state log keeps membership and the rest; two connections per agent).
  // "log": DynamicRendezvous with the join it had before, each joiner appending itself to the
  // state log by compare-set. "slots": the stand-alone slot join of rendezvous/scalable/
  // (joinRound; one connection per agent; the survivors learn of the eviction by a WAIT on
  // r/<r>/over).
  std::string protocol = "agents";
  // Threads that run the agents' fibers (bench/fiber_scheduler.h), agent i on thread i % loops.
  int loops = 1;
  // "agents": node ranks in arrival order (DynamicRendezvousOptions::arrivalRanks: every agent's
  // store work constant, the closer's included); false: kept from the round before (the closer
  // reads every record and writes the member list). By default the rendezvous's own default, so
  // that the tests and the bench measure what a job gets without --rdzv-conf rank_order.
  bool arrivalRanks = ddprun::rendezvous::DynamicRendezvousOptions{}.arrivalRanks;
  // Agents that arrive at the full round once it formed (all at once): each goes on its waiting
  // list (scalable/waiting_list.h); the eviction then re-forms round 2 with MAX = N members, the
  // survivors and waiting nodes that took its first slots, and the rest wait on round 2's list.
  // Checked: the waiting nodes wrote no version; after the re-form every live agent is a member
  // of round 2 or on its waiting list, never both (no lost joiner). 0: the plain scenario.
  int waiting = 0;
  // Tests only: after round 1, the harness makes agent 0's view claim agent 1's node rank before
  // checking it, so that a test can see a violated invariant fail the run.
  bool corruptView = false;
};

struct SwarmResult {
  // Set-up before the first arrival, not in formSeconds: every agent's fiber started, its
  // connection made and the job's settings checked ("agents" and "log"; 0 for "slots", whose
  // agents connect as they arrive).
  double connectSeconds = 0;
  std::optional<double> formSeconds;    // first arrival to the last agent's closed round
  std::optional<double> reformSeconds;  // the eviction written to the last survivor's round
  // When the first agent had its round (the closer, about): the rest of the phase is the
  // closed round reaching every agent (its WAIT woken, its last reads).
  double formFirstSeconds = 0, reformFirstSeconds = 0;
  double formStoreCpu = 0, reformStoreCpu = 0;
  // File descriptors open in this process once every agent had its round (/proc/self/fd): what
  // bounds N in one process (RLIMIT_NOFILE) when each agent holds several connections.
  int64_t descriptorsFormed = 0;
  // CPU this process (the simulated agents: their fibers, sockets, the kernel's loopback TCP
  // work done on their behalf) used in each phase.
  double formSwarmCpu = 0, reformSwarmCpu = 0;
  Cost form, reform;
  // With SwarmOptions::waiting: each waiting agent's cost from its arrival until it was on
  // round 1's waiting list (its settings check included, as in `form`); `reform` then covers
  // every live agent, the waiting ones and those left on round 2's list included. `evictor`:
  // the eviction's own store work (removeNode on the newest version, which is the re-form's
  // writer: with a waiting list it reads the waiting count), one agent.
  Cost wait, evictor;
  double waitSeconds = 0;  // the waiting agents' arrival to the last one registered
  std::string error;  // why a phase has no time (a violated invariant, an agent's error)
};

// N agents form round 1 (--nnodes=N-1:N, closed at MAX), one agent drawn at random is then
// evicted, the N-1 survivors re-form. Invariants are checked after each round.
SwarmResult runSwarm(const std::string& storeBinary, const SwarmOptions& options);
// The same against `store` ("agents" and "log" protocols).
SwarmResult runSwarmOn(const SwarmStore& store, const SwarmOptions& options);
SwarmResult runSlotSwarm(const std::string& storeBinary, const SwarmOptions& options);

}  // namespace ddprun::bench
