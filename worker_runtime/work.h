#pragma once
// Work: one collective in flight (Communicator's *Async calls return one). No LibTorch here, so
// that the work queue (work_queue.h) builds without it (the sanitizer trees, scripts/sanitize).

#include <cstdint>

namespace ddprun::runtime {

// Where a communicator's collectives ran: on the thread that called (or waited for) them, or
// handed off to its communication thread. For tests and benchmarks; backends without such a
// thread (NCCL) report zeros.
struct ThreadCounts {
  uint64_t onCaller = 0;
  uint64_t handedOff = 0;
  uint64_t wakeups = 0;  // times the communication thread woke up (to run a job, or needlessly)
};

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective finished; rethrows its error (BackendError, TimeoutError...).
  virtual void wait() = 0;
  // True once finished, successfully or not. Never blocks.
  virtual bool completed() = 0;
};

}  // namespace ddprun::runtime
