#pragma once
// PhaseSync: the one synchronisation primitive of the shared-memory collectives.
//
// Every rank owns a phase counter (RankControl::step) that only it increments. A collective is a
// fixed sequence of phases: post() publishes "I have finished writing what this phase needs"
// (release), waitAll(step) returns once every other rank has posted that step too (acquire), so
// what they wrote before posting is visible. No flag is ever reset, counters only grow (uint32,
// compared by signed difference, so wrap-around is harmless): no rank can post step s+1 before
// all posted s, so the counters never differ by more than one.
//
// Waiting, in three stages, so that a short wait never sleeps: a sleeping rank gives up its CPU,
// and getting it back (a futex wake, an idle virtual CPU woken by an IPI) costs 50-150 us, more
// than a small collective; that, not the work, was the shm allreduce's latency below 1 MiB.
//   1. spin (cpu pause) for spinMicros: the peer is running on another core and nearly there;
//   2. then sched_yield between checks until yieldMicros have passed: when the peer shares this
//      core (ranks outnumber the CPUs, or other load) it runs at once, and the wait still ends
//      without a wake-up;
//   3. then sleep on the peer's counter with futex (a post() wakes sleepers only when there are
//      some), waking after 1, 2, 4 ms and then every pollMillis to check that the peer is still
//      alive (kill(pid, 0) and not a zombie), has not aborted, and that the deadline has not
//      passed. So a rank that waits
//      long (a peer still computing) does not burn the CPU its peers need, and a dead or frozen
//      peer is an exception, never an endless wait.
#include <chrono>
#include <cstdint>
#include <string>

#include "worker_runtime/shm/segment.h"

namespace ddprun::runtime::shm {

using Clock = std::chrono::steady_clock;

struct SyncOptions {
  int spinMicros = 50;     // busy-wait (stage 1)
  int yieldMicros = 2000;  // spinMicros + the sched_yield stage (2): total wait before sleeping
  int pollMillis = 10;     // liveness / deadline check period while sleeping (3)
};

class PhaseSync {
 public:
  PhaseSync(RankControl* control, int rank, int size, SyncOptions options);

  // Publishes this rank's next phase; returns its number.
  uint32_t post();
  // Returns once every rank posted `step`. Throws TimeoutError past `deadline` (naming the ranks
  // not there yet), BackendError when one of them died or aborted.
  void waitAll(uint32_t step, Clock::time_point deadline);
  // Throws BackendError when a peer has aborted: called as a collective starts, so that after one
  // rank failed the others fail at once rather than run into a phase that never comes.
  void checkPeers() const;
  // Marks this rank as having given up, and wakes every sleeper: peers waiting for it fail at once.
  void abort();

  uint32_t current() const { return mine_; }

 private:
  void waitFor(int peer, uint32_t step, Clock::time_point deadline);
  // Empty when `peer` is alive and has not aborted, else why not.
  std::string peerProblem(int peer) const;

  RankControl* control_;
  int rank_;
  int size_;
  SyncOptions options_;
  uint32_t mine_;
};

}  // namespace ddprun::runtime::shm
