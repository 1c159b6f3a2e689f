#pragma once
// ProgressWatch: one warning line when a worker makes no progress for too long.
//
// Each worker bumps a counter in its progress file (base/progress_file.h) once per step; the
// runtime's DistributedDataParallel does it for every synchronised backward. The agent reads
// the files on a timer (never blocking on a worker) and, for a rank whose counter has not moved
// for longer than the threshold, logs one line naming the rank, the node and how long:
//   rank 1 on node 0 (host-a, local rank 1, pid 4242) has made no progress for 4.0 s (step 57;
//   its recent steps took 0.012 s; warning after 3.0 s)
// then again at 2x, 4x, 8x ... the threshold while it stays stalled (backoff), and one line
// when it moves again. A rank blocked in a collective (its file says so) is named as waiting
// for a peer: the stalled rank is another one, maybe on another node.
// The threshold is --stall-warning SECONDS, or with `auto` (the default) max(kAutoFloor,
// kAutoMultiple x the rank's recent step time). A rank is watched from its first step on (start
// up, data loading and the rendezvous are not steps); only while its group runs. Acting on a
// stall (stopping the job) is not this class's business.
//
// Frozen, not slow (--peer-timeout): a worker whose runtime started its heartbeat thread
// (worker_runtime/progress.h) bumps a heartbeat counter in the same file every period; the
// thread beats through any long step and stops only when the whole process does (SIGSTOP, a
// debugger, a frozen cgroup). A worker whose counter has not moved for the peer timeout is
// handed to Options::onSilent, once (the agent kills it and treats it as a failure). A worker
// that never beat (no runtime: a Python script, a program that does not call init()) is never
// handed over.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/progress_file.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::launcher {

using SteadyTime = std::chrono::steady_clock::time_point;

struct StallPolicy {
  double thresholdSeconds = 0;  // 0: auto
  static constexpr double kAutoFloor = 3.0;    // seconds
  static constexpr double kAutoMultiple = 10;  // x the recent step time
};

// The pure part: what one rank's samples, observed at given times, call for. No I/O.
class StallTracker {
 public:
  struct Event {
    enum class Kind { Stalled, Resumed } kind;
    double seconds;            // without progress so far (Stalled), or in all (Resumed)
    uint64_t steps;            // the counter
    bool waiting;              // blocked in a collective (Stalled)
    double stepSeconds;        // recent step time (0: not known yet)
    double thresholdSeconds;   // the threshold that applied
  };
  explicit StallTracker(StallPolicy policy) : policy_(policy) {}
  // Feeds one sample taken at `now`; returns the line to log, if any.
  std::optional<Event> observe(SteadyTime now, const progress::ProgressSample& s);
  double threshold() const;
  double stepSeconds() const { return stepSeconds_; }

 private:
  StallPolicy policy_;
  bool seen_ = false;       // a sample was observed
  uint64_t steps_ = 0;
  SteadyTime lastChange_{};
  double stepSeconds_ = 0;  // moving average of the time per step
  double nextWarning_ = 0;  // seconds without progress at which the next line is due (0: first)
  bool warned_ = false;
};

// --peer-timeout: the pure part of the freeze watch. No I/O.
struct FreezePolicy {
  double timeoutSeconds = 0;  // 0: off
  static constexpr double kDefaultSeconds = 5.0;
  // The heartbeat period asked of the workers: a tenth of the timeout, within 10..500 ms (a
  // beat costs an atomic add and a wake-up).
  static uint32_t heartbeatPeriodMs(double timeoutSeconds);
};

class HeartbeatTracker {
 public:
  explicit HeartbeatTracker(FreezePolicy policy) : policy_(policy) {}
  // Feeds the heartbeat counter read at `now`; returns how long it has not moved, once, when
  // that reaches the timeout. Nothing before the first beat, nor when the policy is off.
  std::optional<double> observe(SteadyTime now, uint64_t heartbeats);

 private:
  FreezePolicy policy_;
  uint64_t beats_ = 0;
  SteadyTime lastChange_{};
  bool fired_ = false;
};

// One line for an event (without the log prefix).
std::string describeStall(const StallTracker::Event& e, int rank, int localRank, int nodeRank,
                          const std::string& host, long pid);

// The asio part: reads the files of one worker group every `period` and logs the events.
class ProgressWatch {
 public:
  struct Worker {
    int rank = 0;
    int localRank = 0;
    std::string path;  // the progress table (written by the agent before the spawn); the
                       // worker's record is its local rank's
  };
  struct Options {
    StallPolicy policy;
    bool warnStalls = true;  // --stall-warning (false: 0, off)
    FreezePolicy freeze;     // --peer-timeout
    int nodeRank = 0;      // how the lines name this node
    std::string host;
    std::vector<Worker> workers;
    // The worker's pid for the lines (-1: not known yet); 0 once it has ended: an ended worker
    // (one that finished before the others) is no longer watched.
    std::function<long(int localRank)> pidOf;
    // A worker that stopped beating for freeze.timeoutSeconds (seconds measured), once.
    std::function<void(const Worker& worker, long pid, double silentSeconds)> onSilent;
    // Once per watch, at the first read that finds any worker's heartbeat or step counter
    // above 0: a worker of this group runs the runtime (the agent then opens what only such
    // workers use, its link to the workers' store on several nodes).
    std::function<void()> onFirstSign;
  };
  ProgressWatch(boost::asio::io_context& io, Options options);
  ~ProgressWatch();  // stops watching; no line comes after it
  ProgressWatch(const ProgressWatch&) = delete;
  ProgressWatch& operator=(const ProgressWatch&) = delete;

  // How often the files are read for a threshold (auto: 0.5 s).
  static std::chrono::milliseconds period(const StallPolicy& p);
  // ... and for both watches: the shorter of the two periods (a tenth of the peer timeout,
  // within 50..500 ms, for the freeze watch).
  static std::chrono::milliseconds period(const Options& o);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddprun::launcher
