#pragma once
// DistributedDataParallel::Reducer: the gradient synchronisation state machine behind ddp.h.
//
// One backward pass, as seen from here:
//   hook(i)  -- parameter i's gradient was accumulated: copy it into its bucket (CPU), count it;
//               when the bucket is complete, launch every complete bucket in order (allreduce
//               on the communication thread) -- the first hook of a pass also queues finalize()
//   finalize -- autograd's final callback: fill in what got no gradient, launch the rest (the
//               last bucket always: nothing is left to overlap it, so its allreduce runs here,
//               on this thread, with no hand-off), wait for all, write the averages into .grad()
//               (nothing to write with shared buckets), broadcast buffers
// Shared buckets: when the communicator lends memory it reduces in place (Communicator::
// lendSharedBuffer; the shm transport), every bucket is a view into it and every parameter's
// .grad() a view into its bucket (PyTorch's gradient_as_bucket_view): backward accumulates the
// gradients where the allreduce reads them, and the average lands where the optimizer reads it.
// copyIn() and the copy back then copy nothing, unless .grad() was replaced meanwhile (set to none
// or assigned): then that gradient is copied in once and .grad() points at the bucket again.
// Otherwise (gloo, nccl, shm+tcp) buckets are tensors of their own and gradients are copied.
// Hooks can run on autograd worker threads, so the state is guarded by a mutex; waiting happens
// outside it.
#include <mutex>
#include <vector>

#include "worker_runtime/ddp.h"

namespace torch::autograd {
struct Node;
}

namespace ddprun::runtime {

class DistributedDataParallel::Reducer {
 public:
  // `params`: the parameters that require grad; `moduleIndex[i]`: params[i]'s position in
  // module->parameters() (used in BucketInfo).
  Reducer(std::vector<torch::Tensor> params, const std::vector<size_t>& moduleIndex,
          std::vector<torch::Tensor> buffers, std::shared_ptr<Communicator> comm,
          const DdpOptions& options);
  ~Reducer();

  const std::vector<BucketInfo>& buckets() const { return infos_; }
  int64_t syncedBackwards() const;
  bool setSync(bool enabled);  // returns the previous value
  bool sharedBuckets() const { return shared_; }
  int64_t copiedBytes() const;

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into params_
    std::vector<int64_t> offsets;  // element offset of each param in flat
    std::vector<torch::Tensor> views;  // shared buckets: each param's slice, shaped as it
    torch::Tensor flat;
    size_t pending = 0;            // params not yet ready in this pass
    bool launched = false;
    bool deferred = false;         // launched in finalize(): allreduced there, without a Work
    ReduceOp op = ReduceOp::Sum;   // Avg when shared (nothing divided before)
    std::shared_ptr<Work> work;
  };

  void onGradReady(size_t param);
  void copyIn(Bucket& b, size_t slot);
  // Shared buckets: true when params_[b.params[slot]].grad() is already its view in the bucket.
  bool gradIsView(const Bucket& b, size_t slot) const;
  void launchCompleteBuckets(bool inFinalize = false);
  void launch(Bucket& b, bool deferred);
  void finalize();
  void resetPass();

  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> buffers_;
  std::shared_ptr<Communicator> comm_;
  DdpOptions options_;
  std::vector<BucketInfo> infos_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  // param -> (bucket, slot)
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hookKeys_;
  bool shared_ = false;

  mutable std::mutex mu_;
  bool sync_ = true;
  bool passActive_ = false;
  std::vector<bool> ready_;
  size_t nextLaunch_ = 0;
  int64_t synced_ = 0;
  int64_t copied_ = 0;  // bytes copied between gradients and buckets
};

}  // namespace ddprun::runtime
