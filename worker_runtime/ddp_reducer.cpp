#include "worker_runtime/ddp_reducer.h"

#include <map>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "base/errors.h"
#include "base/log.h"
#include "base/progress_file.h"
#include "base/timeline.h"
#ifdef DDPRUN_HAVE_CUDA_KERNELS
#include "worker_runtime/cuda/bucket_kernels.h"
#endif

namespace ddprun::runtime {
namespace {

// Runs `fn` after the autograd node it is attached to (a parameter's AccumulateGrad) ran, that
// is once the gradient has been accumulated into .grad(). A Tensor::register_hook would run
// before accumulation and see only this pass's contribution, not the accumulated gradient.
class AfterAccumulation final : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulation(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

DistributedDataParallel::Reducer::Reducer(std::vector<torch::Tensor> params,
                                          const std::vector<size_t>& moduleIndex,
                                          std::vector<torch::Tensor> buffers,
                                          std::shared_ptr<Communicator> comm,
                                          const DdpOptions& options)
    : params_(std::move(params)),
      buffers_(std::move(buffers)),
      comm_(std::move(comm)),
      options_(options) {
  std::vector<size_t> bytes;
  std::vector<torch::Dtype> types;
  for (const auto& p : params_) {
    if (p.device() != comm_->device()) {
      throw ConfigError("DistributedDataParallel: parameter on " + p.device().str() +
                        " but the " + std::string(comm_->backend()) + " communicator works on " +
                        comm_->device().str() + " (move the model there first)");
    }
    bytes.push_back(p.nbytes());
    types.push_back(p.scalar_type());
  }
  infos_ = assignBuckets(bytes, types, options_);
  where_.resize(params_.size());
  // Shared buckets: one lent buffer, each bucket at a 64-byte aligned offset in it.
  std::vector<size_t> byteOffsets;
  size_t total = 0;
  for (const auto& info : infos_) {
    byteOffsets.push_back(total);
    total += (info.bytes + 63) / 64 * 64;
  }
  torch::Tensor lent;
  if (options_.shareBuckets && comm_->size() > 1 && comm_->device().is_cpu() && total > 0) {
    // A gradient from before moves into the bucket (below). It may lie in the buffer an earlier
    // DDP lent (a generation of in-process recovery rebuilds DDP): held on the side meanwhile,
    // so that the old buffer is free when this one is lent and the communicator can reuse it
    // (shm/lent_carry.h).
    torch::NoGradGuard noGrad;
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad() = p.grad().clone();
    }
    lent = comm_->lendSharedBuffer(total);
  }
  shared_ = lent.defined();
  torch::NoGradGuard noGrad;
  for (size_t b = 0; b < infos_.size(); ++b) {
    Bucket bucket;
    int64_t elements = 0;
    for (size_t slot = 0; slot < infos_[b].params.size(); ++slot) {
      const size_t i = infos_[b].params[slot];
      where_[i] = {b, slot};
      bucket.params.push_back(i);
      bucket.offsets.push_back(elements);
      elements += params_[i].numel();
    }
    const auto options = params_[bucket.params[0]].options().requires_grad(false);
    if (shared_) {
      bucket.flat = lent.narrow(0, static_cast<int64_t>(byteOffsets[b]), static_cast<int64_t>(infos_[b].bytes))
                        .view(options.dtype().toScalarType());
      bucket.flat.zero_();
      for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
        torch::Tensor& p = params_[bucket.params[slot]];
        // Not an autograd view of the bucket (optimizer.zero_grad() calls detach_(), which
        // views refuse): a tensor of its own over the bucket's memory, keeping the lend alive.
        auto* at = static_cast<char*>(bucket.flat.data_ptr()) +
                   bucket.offsets[slot] * static_cast<int64_t>(bucket.flat.element_size());
        torch::Tensor view = torch::from_blob(at, p.sizes(), [lent](void*) {}, options);
        if (p.grad().defined()) {  // a gradient from before: it moves into the bucket
          view.copy_(p.grad());
          p.mutable_grad() = view;
        }
        bucket.views.push_back(std::move(view));
      }
    } else {
      bucket.flat = torch::zeros({elements}, options);
    }
    buckets_.push_back(std::move(bucket));
    for (auto& i : infos_[b].params) i = moduleIndex[i];  // report module positions
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    DDPRUN_CHECK(acc, "parameter " << i << " has no gradient accumulator");
    hookKeys_.push_back(
        acc->add_post_hook(std::make_unique<AfterAccumulation>([this, i] { onGradReady(i); })));
    accumulators_.push_back(std::move(acc));
  }
  ready_.assign(params_.size(), false);
  resetPass();
}

DistributedDataParallel::Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hookKeys_[i]);
  for (auto& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (const std::exception& e) {
      DDPRUN_LOG(WARN, "ddp") << "allreduce still in flight at destruction failed: " << e.what();
    }
  }
}

int64_t DistributedDataParallel::Reducer::syncedBackwards() const {
  std::lock_guard<std::mutex> lock(mu_);
  return synced_;
}

int64_t DistributedDataParallel::Reducer::copiedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return copied_;
}

bool DistributedDataParallel::Reducer::setSync(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool previous = sync_;
  sync_ = enabled;
  return previous;
}

void DistributedDataParallel::Reducer::resetPass() {
  passActive_ = false;
  nextLaunch_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.deferred = false;
    b.work.reset();
  }
}

void DistributedDataParallel::Reducer::onGradReady(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sync_) return;
  if (!passActive_) {
    passActive_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
  }
  if (ready_[i]) return;  // a second accumulation in the same pass changes nothing we sent
  ready_[i] = true;
  auto [b, slot] = where_[i];
  Bucket& bucket = buckets_[b];
  if (bucket.launched) return;
  copyIn(bucket, slot);
  if (--bucket.pending == 0) launchCompleteBuckets();
}

bool DistributedDataParallel::Reducer::gradIsView(const Bucket& b, size_t slot) const {
  const torch::Tensor& g = params_[b.params[slot]].grad();
  return g.defined() && g.data_ptr() == b.views[slot].data_ptr() &&
         g.strides() == b.views[slot].strides();
}

// CPU: the gradient is copied into the bucket at once, spreading the copies over backward; with
// shared buckets it is there already (unless .grad() was replaced).
// CUDA: nothing here; launch() gathers the whole bucket in one kernel.
void DistributedDataParallel::Reducer::copyIn(Bucket& b, size_t slot) {
  const torch::Tensor& p = params_[b.params[slot]];
  if (b.flat.is_cuda()) return;
  if (shared_ && gradIsView(b, slot)) return;
  torch::NoGradGuard noGrad;
  torch::Tensor dst = b.flat.narrow(0, b.offsets[slot], p.numel());
  const torch::Tensor& g = p.grad();
  if (!g.defined()) {
    dst.zero_();
  } else {
    if (g.is_sparse()) throw ConfigError("DistributedDataParallel: sparse gradients are not supported");
    dst.copy_(g.reshape(-1));
    copied_ += static_cast<int64_t>(p.nbytes());
  }
}

// From a hook, the last bucket is left for finalize(), which runs right after it: its allreduce
// then runs there, on the thread that waits for it anyway, rather than being handed to the
// communication thread (a wake-up, and a second one for the waiter) with nothing left to overlap.
void DistributedDataParallel::Reducer::launchCompleteBuckets(bool inFinalize) {
  while (nextLaunch_ < buckets_.size() && buckets_[nextLaunch_].pending == 0) {
    if (!inFinalize && nextLaunch_ + 1 == buckets_.size()) return;
    launch(buckets_[nextLaunch_++], inFinalize);
  }
}

void DistributedDataParallel::Reducer::launch(Bucket& b, bool deferred) {
  torch::NoGradGuard noGrad;
  const int world = comm_->size();
  if (b.flat.is_cuda()) {
#ifdef DDPRUN_HAVE_CUDA_KERNELS
    std::vector<cuda::FlattenPiece> pieces;
    for (size_t s = 0; s < b.params.size(); ++s) {
      const torch::Tensor& g = params_[b.params[s]].grad();
      if (g.defined()) {
        pieces.push_back({g.contiguous().data_ptr(), b.offsets[s], g.numel()});
      } else {
        b.flat.narrow(0, b.offsets[s], params_[b.params[s]].numel()).zero_();
      }
    }
    cuda::Element type = cuda::Element::Float32;
    switch (b.flat.scalar_type()) {
      case torch::kFloat: type = cuda::Element::Float32; break;
      case torch::kDouble: type = cuda::Element::Float64; break;
      case torch::kHalf: type = cuda::Element::Float16; break;
      case torch::kBFloat16: type = cuda::Element::BFloat16; break;
      default: throw ConfigError("DistributedDataParallel: gradients of dtype " +
                                 std::string(c10::toString(b.flat.scalar_type())) +
                                 " are not supported on CUDA");
    }
    cuda::flattenScale(b.flat.data_ptr(), pieces.data(), static_cast<int>(pieces.size()), type,
                       1.0 / world, /*legacy default stream*/ nullptr);
#else
    for (size_t s = 0; s < b.params.size(); ++s) {
      const torch::Tensor& g = params_[b.params[s]].grad();
      torch::Tensor dst = b.flat.narrow(0, b.offsets[s], params_[b.params[s]].numel());
      if (g.defined()) {
        dst.copy_(g.reshape(-1)).div_(world);
      } else {
        dst.zero_();
      }
    }
#endif
  } else if (shared_ && c10::isFloatingType(b.flat.scalar_type())) {
    // Summed, then divided once by each slice's owner: no pass over the bucket before.
    b.op = ReduceOp::Avg;
  } else if (world > 1) {
    b.flat.div_(world);
  }
  b.launched = true;
  if (deferred) {
    b.deferred = true;  // finalize() allreduces it on its own thread
  } else {
    b.work = comm_->allreduceAsync(b.flat, b.op);
  }
}

void DistributedDataParallel::Reducer::finalize() {
  std::vector<std::shared_ptr<Work>> works;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!passActive_) return;
    // Parameters that got no gradient in this pass contribute what .grad() holds (or zeros).
    for (size_t b = nextLaunch_; b < buckets_.size(); ++b) {
      Bucket& bucket = buckets_[b];
      for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
        if (!ready_[bucket.params[slot]]) {
          ready_[bucket.params[slot]] = true;
          copyIn(bucket, slot);
          --bucket.pending;
        }
      }
    }
    launchCompleteBuckets(/*inFinalize=*/true);
    DDPRUN_CHECK(nextLaunch_ == buckets_.size());
    for (auto& b : buckets_) works.push_back(b.work);  // null: deferred, run below
  }
  auto& progress = progress::ProgressWriter::instance();
  int64_t copiedOut = 0;
  try {
    // Blocked on the peers from here: the agent's progress watch tells this from a stall.
    progress.enterWait();
    {
      // The communication backward did not hide: waiting for the buckets' allreduces.
      ddprun::timeline::Scope span("ddp gradient sync", "ddp");
      span.args().add("buckets", static_cast<int64_t>(works.size()));
      try {
        for (size_t b = 0; b < works.size(); ++b) {
          if (works[b]) {
            works[b]->wait();
          } else {  // after the ones queued before it, on this thread
            comm_->allreduce(buckets_[b].flat, buckets_[b].op);
          }
        }
      } catch (...) {
        progress.leaveWait();
        throw;
      }
    }
    progress.leaveWait();
    torch::NoGradGuard noGrad;
    for (auto& b : buckets_) {
      for (size_t slot = 0; slot < b.params.size(); ++slot) {
        torch::Tensor& p = params_[b.params[slot]];
        if (shared_) {  // the average is in .grad() already, unless .grad() was replaced
          if (!gradIsView(b, slot)) p.mutable_grad() = b.views[slot];
          continue;
        }
        torch::Tensor avg = b.flat.narrow(0, b.offsets[slot], p.numel()).view(p.sizes());
        if (p.grad().defined()) {
          p.mutable_grad().copy_(avg);
        } else {
          p.mutable_grad() = avg.clone();
        }
        copiedOut += static_cast<int64_t>(p.nbytes());
      }
    }
    if (options_.broadcastBuffers && !buffers_.empty() && comm_->size() > 1) {
      std::map<c10::ScalarType, std::vector<torch::Tensor>> byType;
      for (auto& t : buffers_) {
        if (t.numel() > 0) byType[t.scalar_type()].push_back(t);
      }
      for (auto& [type, group] : byType) {
        std::vector<torch::Tensor> flat;
        for (auto& t : group) flat.push_back(t.reshape(-1));
        torch::Tensor all = torch::cat(flat);
        comm_->broadcast(all, 0);
        int64_t offset = 0;
        for (auto& t : group) {
          t.copy_(all.narrow(0, offset, t.numel()).view_as(t));
          offset += t.numel();
        }
      }
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    resetPass();
    throw;
  }
  progress.step();  // one synchronised backward: one step of progress
  std::lock_guard<std::mutex> lock(mu_);
  ++synced_;
  copied_ += copiedOut;
  resetPass();
}

}  // namespace ddprun::runtime
