#pragma once
// Communicator: the collectives a data-parallel worker needs, over one fixed group of ranks.
//
// Contract, for every backend:
//   - Every rank calls the same collectives in the same order, with tensors of the same dtype and
//     number of elements (allreduce, broadcast, allgather). Tensors must be dense, contiguous and
//     on device(): the CPU for Gloo, this rank's CUDA device for NCCL. They are updated in place.
//   - Supported dtypes: float32, float64, float16, int32, int64, int8, uint8. ReduceOp::Avg needs a
//     floating dtype (the sum is divided by size()). Anything else throws ConfigError naming the
//     operation, the dtype and what is allowed.
//   - Every collective is bounded by timeout(). A dead peer or a missed deadline makes the call
//     throw BackendError (or TimeoutError): never an endless hang. After such an error the
//     communicator is broken and every later call throws at once; the expected reaction is to exit
//     non-zero so that the launcher restarts the group.
//   - *Async variants return at once with a Work; collectives still run in submission order (one
//     communication thread for Gloo and shm, one CUDA stream for NCCL). Work::wait() rethrows the
//     error of that collective. The tensor must stay alive and untouched until wait() returns.
//   - The blocking allreduce() / broadcast() of the CPU backends (gloo, shm) run on the calling
//     thread, after every collective queued before them has finished: no hand-off to the
//     communication thread, whose wake-up can cost more than a small message (threadCounts()
//     shows where collectives ran). NCCL's are the async variant plus wait().
//   - Lent memory (lendSharedBuffer): a backend that can reduce in place where the ranks' tensors
//     lie (shm: peers read each other's tensors in shared memory) lends that memory; an allreduce
//     of a tensor inside it, at the same offset on every rank, skips the copies into the transport
//     and back. DDP puts its gradient buckets there. Others lend nothing, and any tensor still works.
//   - One Communicator is used from one thread at a time (the communication thread is internal).
//
// Created by ddprun::init() (see runtime.h), or directly with makeGlooCommunicator() /
// makeNcclCommunicator() on any rendezvous::Store.
#include <chrono>
#include <memory>
#include <string_view>

#include <torch/torch.h>

#include "worker_runtime/work.h"

namespace ddprun::runtime {

using Millis = std::chrono::milliseconds;

// The default bound of every collective: PyTorch's default process-group timeout (30 min).
inline constexpr Millis kDefaultCollectiveTimeout{30 * 60 * 1000};

enum class ReduceOp : uint8_t { Sum, Avg, Min, Max };

// Allreduce bytes (elements x element size) since construction, by how they were moved: copied
// into the transport's own memory first (staged), or reduced where they lie in lent memory
// (inPlace). For tests and benchmarks; backends that do not count report zeros.
struct AllreduceBytes {
  uint64_t staged = 0;
  uint64_t inPlace = 0;
};

std::string_view toString(ReduceOp op);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo" or "nccl".
  virtual std::string_view backend() const = 0;
  // Where tensors must live.
  virtual torch::Device device() const = 0;
  virtual Millis timeout() const = 0;

  // Reduces `tensor` over all ranks; every rank receives the result (bit-identical on all ranks).
  virtual std::shared_ptr<Work> allreduceAsync(torch::Tensor tensor, ReduceOp op) = 0;
  // Copies rank `root`'s `tensor` into every rank's `tensor`.
  virtual std::shared_ptr<Work> broadcastAsync(torch::Tensor tensor, int root) = 0;
  // Returns a new tensor of shape [size(), *input.sizes()] holding every rank's input, in rank
  // order.
  virtual torch::Tensor allgather(const torch::Tensor& input) = 0;
  // Returns once every rank has entered the barrier.
  virtual void barrier() = 0;

  // Blocking: as the async variant followed by wait(), but see the contract above for the thread.
  void allreduce(torch::Tensor tensor, ReduceOp op = ReduceOp::Sum) {
    allreduceBlocking(std::move(tensor), op);
  }
  void broadcast(torch::Tensor tensor, int root = 0) { broadcastBlocking(std::move(tensor), root); }

  // Gives up on this communicator from the thread that uses it, after a collective failed (in-process
  // recovery, docs/recovery.md): peers still waiting on this rank fail at once instead of at
  // their timeout (the TCP mesh is shut down, the shm segment marks this rank aborted, Gloo's
  // connections are closed), and every later call throws. Never blocks. NCCL peers are not
  // woken by it: they learn of a peer's death from the peer watch, of a frozen peer only at
  // the timeout.
  virtual void abort() {}

  virtual ThreadCounts threadCounts() const { return {}; }
  virtual AllreduceBytes allreduceBytes() const { return {}; }

  // `bytes` (or a little more) of memory this communicator reduces in place, as a uint8 CPU tensor
  // of this rank's own (see the contract above), alive as long as it or a view of it is; an
  // undefined tensor when the backend has none (gloo, nccl, shm+tcp) or cannot get it now (no
  // room in /dev/shm: logged). Collective: every rank calls it, in the same order, same bytes;
  // all ranks get memory or none does.
  virtual torch::Tensor lendSharedBuffer(size_t bytes) {
    (void)bytes;
    return {};
  }

 protected:
  // What allreduce() / broadcast() run; by default the async variant, then wait().
  virtual void allreduceBlocking(torch::Tensor tensor, ReduceOp op) {
    allreduceAsync(std::move(tensor), op)->wait();
  }
  virtual void broadcastBlocking(torch::Tensor tensor, int root) {
    broadcastAsync(std::move(tensor), root)->wait();
  }
};

// Throws ConfigError unless `t` is a tensor every backend accepts for `op` (see the contract
// above). `what` names the collective in the message, e.g. "allreduce".
void checkCollectiveTensor(const torch::Tensor& t, const Communicator& comm, const char* what);

}  // namespace ddprun::runtime
