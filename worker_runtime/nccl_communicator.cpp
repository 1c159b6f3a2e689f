// The NCCL communicator (built only when CUDA and NCCL are found; see nccl_communicator.h).
// Compiled here, but without a GPU only generateNcclUniqueId() and visibleGpuCount() can run: the
// collectives themselves are untested on such machines (docs/worker_runtime.md).
#include "worker_runtime/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "base/errors.h"
#include "base/log.h"
#include "rendezvous/prefix_store.h"

namespace ddprun::runtime {
namespace {

using Clock = std::chrono::steady_clock;

#define DDPRUN_CUDA_CHECK(call)                                                           \
  do {                                                                                    \
    const cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess) {                                                              \
      throw BackendError(std::string("CUDA: ") + #call + " failed: " + cudaGetErrorString(e_)); \
    }                                                                                     \
  } while (0)

std::string ncclMessage(const char* what, ncclResult_t r) {
  return std::string("NCCL: ") + what + " failed: " + ncclGetErrorString(r);
}

ncclDataType_t ncclType(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return ncclFloat32;
    case c10::ScalarType::Double: return ncclFloat64;
    case c10::ScalarType::Half: return ncclFloat16;
    case c10::ScalarType::BFloat16: return ncclBfloat16;
    case c10::ScalarType::Int: return ncclInt32;
    case c10::ScalarType::Long: return ncclInt64;
    case c10::ScalarType::Char: return ncclInt8;
    case c10::ScalarType::Byte: return ncclUint8;
    default: break;
  }
  DDPRUN_CHECK(false, "unsupported dtype " << c10::toString(t));
  return ncclFloat32;
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

bool asyncErrorHandling() {
  for (const char* name : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"}) {
    const char* v = std::getenv(name);
    if (v && std::string(v) == "1") return true;
  }
  return false;
}

// One collective enqueued on the communicator's stream; done when its event has fired.
class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t done, Clock::time_point deadline, std::function<std::string()> failure,
           torch::Tensor keep)
      : done_(done), deadline_(deadline), failure_(std::move(failure)), keep_(std::move(keep)) {}
  ~NcclWork() override { cudaEventDestroy(done_); }

  void wait() override {
    for (;;) {
      const std::string failed = failure_();
      if (!failed.empty()) throw BackendError(failed);
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) throw BackendError(std::string("CUDA: ") + cudaGetErrorString(q));
      if (Clock::now() > deadline_ + std::chrono::seconds(1)) {
        // The watchdog aborts at the deadline; this only guards against a stuck watchdog.
        throw TimeoutError("NCCL collective did not finish by its deadline");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  bool completed() override {
    return !failure_().empty() || cudaEventQuery(done_) != cudaErrorNotReady;
  }
  cudaEvent_t event() const { return done_; }
  Clock::time_point deadline() const { return deadline_; }

 private:
  cudaEvent_t done_;
  Clock::time_point deadline_;
  std::function<std::string()> failure_;
  torch::Tensor keep_;  // the tensor stays alive while NCCL may still use it
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<rendezvous::Store> store, NcclOptions o) : options_(o) {
    DDPRUN_CUDA_CHECK(cudaSetDevice(o.device));
    const int64_t n = store->add("nccl/count/" + std::to_string(o.rank), 1);
    const std::string id = exchangeUniqueId(*store, "nccl/" + std::to_string(n) + "/unique_id",
                                            o.rank, generateNcclUniqueId, o.timeout);
    ::ncclUniqueId uid;
    std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
    // Non-blocking init, so that a peer that never arrives is a timeout, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, o.size, uid, o.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) throw BackendError(ncclMessage("ncclCommInitRank", r));
    settle("ncclCommInitRank", Clock::now() + o.timeout);
    DDPRUN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (!aborted_) {  // an aborted communicator is already freed
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string_view backend() const override { return "nccl"; }
  torch::Device device() const override { return torch::Device(torch::kCUDA, options_.device); }
  Millis timeout() const override { return options_.timeout; }

  std::shared_ptr<Work> allreduceAsync(torch::Tensor t, ReduceOp op) override {
    checkCollectiveTensor(t, *this, "allreduce");
    return enqueue("ncclAllReduce", t, [&] {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), ncclType(t.scalar_type()),
                           ncclOp(op), comm_, stream_);
    });
  }

  std::shared_ptr<Work> broadcastAsync(torch::Tensor t, int root) override {
    checkCollectiveTensor(t, *this, "broadcast");
    if (root < 0 || root >= size()) {
      throw ConfigError("nccl broadcast: root " + std::to_string(root) + " is not a rank");
    }
    return enqueue("ncclBroadcast", t, [&] {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), ncclType(t.scalar_type()), root,
                           comm_, stream_);
    });
  }

  torch::Tensor allgather(const torch::Tensor& input) override {
    checkCollectiveTensor(input, *this, "allgather");
    std::vector<int64_t> shape{size()};
    shape.insert(shape.end(), input.sizes().begin(), input.sizes().end());
    torch::Tensor out = torch::empty(shape, input.options());
    enqueue("ncclAllGather", out, [&] {
      return ncclAllGather(input.data_ptr(), out.data_ptr(), input.numel(),
                           ncclType(input.scalar_type()), comm_, stream_);
    })->wait();
    return out;
  }

  void barrier() override {
    auto one = torch::ones({1}, torch::TensorOptions().device(device()));
    allreduceAsync(one, ReduceOp::Sum)->wait();
  }

  // In-process recovery gives up on this communicator (communicator.h): pending and later
  // collectives fail at once. Never blocks on the peers (the communicator is non-blocking).
  void abort() override { abortOnce("aborted by this rank for in-process recovery"); }

 private:
  std::string failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

  // Orders the collective after the work already queued on the legacy default stream (where
  // LibTorch's kernels run unless told otherwise), enqueues it on our stream, and makes the default
  // stream wait for it in turn, so later kernels see the result.
  template <typename Fn>
  std::shared_ptr<Work> enqueue(const char* what, const torch::Tensor& keep, Fn&& call) {
    if (const std::string f = failure(); !f.empty()) {
      throw BackendError(std::string("nccl ") + what + " refused: communicator broken (" + f + ")");
    }
    DDPRUN_CUDA_CHECK(cudaSetDevice(options_.device));
    cudaEvent_t ready, done;
    DDPRUN_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    DDPRUN_CUDA_CHECK(cudaEventRecord(ready, cudaStreamLegacy));
    DDPRUN_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    cudaEventDestroy(ready);
    ncclResult_t r = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(commMu_);
      if (aborted_) throw BackendError(std::string("nccl ") + what + " refused: communicator aborted");
      r = call();
    }
    if (r != ncclSuccess && r != ncclInProgress) throw BackendError(ncclMessage(what, r));
    settle(what, Clock::now() + options_.timeout);
    DDPRUN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    DDPRUN_CUDA_CHECK(cudaEventRecord(done, stream_));
    DDPRUN_CUDA_CHECK(cudaStreamWaitEvent(cudaStreamLegacy, done, 0));
    auto work = std::make_shared<NcclWork>(done, Clock::now() + options_.timeout,
                                           [this] { return failure(); }, keep);
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(work);
    }
    cv_.notify_all();
    return work;
  }

  // With a non-blocking communicator, calls may return ncclInProgress: poll until settled.
  void settle(const char* what, Clock::time_point deadline) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclSuccess;
      {
        std::lock_guard<std::mutex> lock(commMu_);
        if (aborted_) throw BackendError(std::string("nccl ") + what + ": communicator aborted");
        r = ncclCommGetAsyncError(comm_, &state);
      }
      if (r != ncclSuccess) throw BackendError(ncclMessage("ncclCommGetAsyncError", r));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        const std::string why = ncclMessage(what, state);
        abortOnce(why);
        throw BackendError(why);
      }
      if (Clock::now() > deadline) {
        const std::string why = std::string("NCCL: ") + what + " did not complete within " +
                                std::to_string(options_.timeout.count()) + " ms";
        abortOnce(why);
        throw TimeoutError(why);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // The watchdog: every 100 ms, drop finished works, then check the communicator's asynchronous
  // error and the oldest deadline. On either it aborts the communicator, so every pending and
  // later collective fails, and with asynchronous error handling ends the process.
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (!failed_.empty()) continue;
      while (!pending_.empty() && cudaEventQuery(pending_.front()->event()) == cudaSuccess) {
        pending_.pop_front();
      }
      std::string why;
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclSuccess;
      {
        std::lock_guard<std::mutex> commLock(commMu_);  // order: mu_, then commMu_
        if (aborted_) continue;
        r = ncclCommGetAsyncError(comm_, &state);
      }
      if (r == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
        why = ncclMessage("a collective", state) + " (did a peer exit?)";
      } else if (!pending_.empty() && Clock::now() > pending_.front()->deadline()) {
        why = "NCCL collective timed out after " + std::to_string(options_.timeout.count()) + " ms";
      } else if (options_.peerLost) {
        why = options_.peerLost();
      }
      if (why.empty()) continue;
      lock.unlock();
      abortOnce(why);
      DDPRUN_LOG(ERROR, "nccl") << why << "; communicator aborted";
      if (!options_.peerLost && asyncErrorHandling()) {
        DDPRUN_LOG(ERROR, "nccl") << "asynchronous error handling is on: exiting with code 1";
        std::_Exit(1);
      }
      lock.lock();
    }
  }

  // Aborts the communicator once (ncclCommAbort frees it: a second call, or any call after it,
  // would touch freed memory) and records `why` as the failure every Work reports.
  void abortOnce(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.empty()) failed_ = why;
    }
    cv_.notify_all();
    std::lock_guard<std::mutex> lock(commMu_);
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  NcclOptions options_;
  // Serializes the host-side NCCL calls on comm_ with abortOnce, from the training thread, the
  // watchdog and a recovery; the communicator is non-blocking, so each call under it is short.
  // Lock order: mu_ before commMu_.
  std::mutex commMu_;
  bool aborted_ = false;  // guarded by commMu_
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<NcclWork>> pending_;
  std::string failed_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

bool ncclBuilt() { return true; }

int visibleGpuCount() {
  if (!nvidiaDriverPresent()) return 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string generateNcclUniqueId() {
  ::ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) throw BackendError(ncclMessage("ncclGetUniqueId", r));
  return std::string(id.internal, sizeof(id.internal));
}

std::shared_ptr<Communicator> makeNcclCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                   NcclOptions options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw ConfigError("nccl: rank " + std::to_string(options.rank) + " is outside 0.." +
                      std::to_string(options.size - 1));
  }
  return std::make_shared<NcclCommunicator>(std::move(store), options);
}

}  // namespace ddprun::runtime
