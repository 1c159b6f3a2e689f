#pragma once
// DistributedDataParallel for LibTorch's C++ frontend (what torch.nn.parallel.DDP is in Python).
//
//   auto model = std::make_shared<Net>();            // any torch::nn::Module
//   DistributedDataParallel ddp(model, rt->comm());  // rank 0's parameters reach every rank
//   for (auto& batch : loader) {
//     optimizer.zero_grad();
//     auto loss = loss_fn(model->forward(batch.data), batch.target);
//     loss.backward();                                // gradients are averaged over all ranks
//     optimizer.step();                               // when backward() returns
//   }
//
// Construction: parameters and buffers are broadcast from rank 0, after their count, names,
// shapes and dtypes were checked to agree across ranks (a mismatch is a ConfigError naming the
// first differing parameter and both shapes).
//
// Gradient synchronisation, as PyTorch's reducer does it:
//   - Parameters that require grad go into buckets in reverse registration order (gradients become
//     ready roughly back to front). The first bucket holds up to firstBucketCapBytes, the others up
//     to bucketCapBytes; parameters of different dtypes never share a bucket.
//   - A hook runs after each parameter's gradient was accumulated into .grad(). It copies the
//     gradient, divided by the world size, into its bucket's flat buffer. When a bucket is full its
//     allreduce starts at once on the communication thread, overlapping the rest of backward;
//     the last bucket's runs at the end of backward on the calling thread (nothing is left to
//     overlap it, and a hand-off would cost two thread wake-ups).
//     Buckets are launched in the same order on every rank.
//   - At the end of backward (an autograd final callback) every bucket still waiting is launched
//     (parameters that got no gradient in this pass contribute zeros), every allreduce is waited
//     for and the averages are copied back into .grad(). So when backward() returns, the gradients
//     are final; an error of any collective is thrown out of backward().
//   - When the communicator lends memory it reduces in place (the shm transport), the buckets live
//     there and each .grad() is a view into its bucket (PyTorch's gradient_as_bucket_view):
//     backward accumulates where the allreduce reads, and nothing is copied in or out. .grad()
//     then aliases the bucket; replacing it (set to none) costs one copy, after which it is a view
//     again. Elsewhere gradients are copied into buckets of their own, as described above.
//   - Within a noSync() scope backward only accumulates locally; the next backward outside it
//     synchronises the accumulated gradients.
//   - With broadcastBuffers, rank 0's buffers (e.g. BatchNorm statistics) are broadcast at the end
//     of each synchronised backward, so every forward sees the same buffers (PyTorch broadcasts them
//     at the start of forward; the values seen by the next forward are the same).
// On CUDA tensors (a CUDA build of LibTorch with the NCCL communicator) flattening and scaling run
// in one CUDA kernel per bucket.
//
// The model must not gain or lose parameters after construction. One DDP object per model.
#include <memory>
#include <vector>

#include "worker_runtime/communicator.h"

namespace ddprun::runtime {

struct DdpOptions {
  size_t bucketCapBytes = 25u << 20;      // 25 MiB, as PyTorch
  size_t firstBucketCapBytes = 1u << 20;  // 1 MiB, as PyTorch
  bool broadcastBuffers = true;
  // Put the buckets in memory the communicator lends (shm), .grad() views into them. false: own
  // buckets and copies, as on other backends (for A/B measurements).
  bool shareBuckets = true;
  // Broadcast rank 0's parameters and buffers at construction (PyTorch's init_sync). false only
  // when every rank is known to hold the same values already: after an in-process recovery's
  // heal (ElasticState::heal), which just made them the root's.
  bool initSync = true;
  // Check that every rank holds the same parameters and buffers (names, dtypes, shapes; one
  // allgather). false only when that was just checked: after an in-process recovery's heal,
  // whose state digest covers the same names, dtypes and shapes of the modules registered with
  // the ElasticState, when DDP wraps one of those modules. Every collective of a recovery waits
  // for its slowest rank, so one less matters there.
  bool checkModel = true;
};

// A bucket as built at construction (for logs and tests). `params` index into
// module->parameters() order.
struct BucketInfo {
  std::vector<size_t> params;
  size_t bytes = 0;
  torch::Dtype dtype = torch::kFloat;
};

// Pure bucket assignment: parameter sizes in bytes and dtypes (registration order) -> buckets in
// launch order (reverse registration order, caps as above).
std::vector<BucketInfo> assignBuckets(const std::vector<size_t>& paramBytes,
                                      const std::vector<torch::Dtype>& dtypes,
                                      const DdpOptions& options);

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<Communicator> comm, DdpOptions options = {});
  // Accepts a module holder too (torch::nn::Linear, or a TORCH_MODULE type).
  template <typename Holder, typename = decltype(std::declval<Holder&>().ptr())>
  DistributedDataParallel(Holder& holder, std::shared_ptr<Communicator> comm,
                          DdpOptions options = {})
      : DistributedDataParallel(std::static_pointer_cast<torch::nn::Module>(holder.ptr()),
                                std::move(comm), options) {}
  // Removes the hooks; waits for allreduces still in flight (errors are logged, not thrown).
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // While a NoSync is alive, backward accumulates gradients locally without communication.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync noSync() { return NoSync(*this); }

  torch::nn::Module& module() { return *module_; }
  const std::shared_ptr<Communicator>& comm() const { return comm_; }
  const std::vector<BucketInfo>& buckets() const;
  // How many backward passes synchronised gradients so far.
  int64_t syncedBackwards() const;
  // True when the buckets live in memory the communicator reduces in place (the shm transport
  // lends it) and every .grad() is a view into its bucket: no gradient is copied in or out.
  bool sharedBuckets() const;
  // Bytes copied between .grad() and the buckets so far (both ways). With shared buckets it grows
  // only when .grad() was replaced (e.g. set to none): the first backward, when no .grad() existed.
  int64_t copiedBytes() const;

  class Reducer;  // the per-backward state machine (ddp_reducer.h)

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace ddprun::runtime
