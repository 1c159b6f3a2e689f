#pragma once
// Work: one collective in flight (Communicator's *Async calls return one). No LibTorch here, so
// that the work queue (work_queue.h) builds without it (the sanitizer trees, scripts/sanitize).

namespace ddprun::runtime {

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective finished; rethrows its error (BackendError, TimeoutError...).
  virtual void wait() = 0;
  // True once finished, successfully or not. Never blocks.
  virtual bool completed() = 0;
};

}  // namespace ddprun::runtime
