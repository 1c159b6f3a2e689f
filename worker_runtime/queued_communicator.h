#pragma once
// QueuedCommunicator: what the CPU communicators (gloo, shm, shm+tcp) share: the argument checks,
// the broken latch, and allreduce / broadcast on a WorkQueue (async: submitted to its thread;
// blocking: run inline on the caller's thread after everything queued before, work_queue.h).
//
// A subclass provides allreduceNow / broadcastNow (run one collective, on whichever thread the
// queue chooses) and queue(). It keeps the WorkQueue as its own last member and drains it in its
// destructor, so that the queue's thread stops before the rest of the subclass is destroyed.
#include <mutex>
#include <string>
#include <string_view>

#include "worker_runtime/communicator.h"
#include "worker_runtime/work_queue.h"

namespace ddprun::runtime {

// Throws ConfigError unless `t` suits checkCollectiveTensor and `op` (avg needs a floating dtype).
// Messages start with comm.backend(), e.g. "shm allreduce: op avg needs a floating dtype, ...".
void checkAllreduceArgs(const torch::Tensor& t, ReduceOp op, const Communicator& comm);
// Throws ConfigError unless `t` suits checkCollectiveTensor and `root` is a rank of comm.
void checkBroadcastArgs(const torch::Tensor& t, int root, const Communicator& comm);
// An uninitialized tensor for allgather's result: shape [size, *input.sizes()], input's options.
torch::Tensor allgatherOutput(const torch::Tensor& input, int size);

// Remembers why a communicator broke: the first reason given wins. Thread-safe.
class BrokenLatch {
 public:
  void set(const std::string& why);
  // Throws BackendError "<backend> <what> refused: the communicator is broken since an earlier
  // error (<why>)" once set; returns otherwise.
  void throwIfBroken(std::string_view backend, const char* what) const;

 private:
  mutable std::mutex mu_;
  std::string why_;
};

class QueuedCommunicator : public Communicator {
 public:
  std::shared_ptr<Work> allreduceAsync(torch::Tensor tensor, ReduceOp op) final {
    checkAllreduceArgs(tensor, op, *this);
    return queue().submit([this, tensor, op] { allreduceNow(tensor, op); });
  }

  std::shared_ptr<Work> broadcastAsync(torch::Tensor tensor, int root) final {
    checkBroadcastArgs(tensor, root, *this);
    return queue().submit([this, tensor, root] { broadcastNow(tensor, root); });
  }

  ThreadCounts threadCounts() const final { return queue().counts(); }

 protected:
  // On the caller's thread, after every collective queued before (work_queue.h).
  void allreduceBlocking(torch::Tensor tensor, ReduceOp op) final {
    checkAllreduceArgs(tensor, op, *this);
    queue().runInline([&] { allreduceNow(tensor, op); });
  }

  void broadcastBlocking(torch::Tensor tensor, int root) final {
    checkBroadcastArgs(tensor, root, *this);
    queue().runInline([&] { broadcastNow(tensor, root); });
  }

  // One collective, its arguments already checked.
  virtual void allreduceNow(const torch::Tensor& t, ReduceOp op) = 0;
  virtual void broadcastNow(const torch::Tensor& t, int root) = 0;
  virtual WorkQueue& queue() = 0;
  virtual const WorkQueue& queue() const = 0;
};

}  // namespace ddprun::runtime
