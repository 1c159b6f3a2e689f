#include "worker_runtime/queued_communicator.h"

#include "base/errors.h"

namespace ddprun::runtime {

void checkAllreduceArgs(const torch::Tensor& t, ReduceOp op, const Communicator& comm) {
  checkCollectiveTensor(t, comm, "allreduce");
  if (op == ReduceOp::Avg && !c10::isFloatingType(t.scalar_type())) {
    throw ConfigError(std::string(comm.backend()) + " allreduce: op avg needs a floating dtype, not " +
                      std::string(c10::toString(t.scalar_type())) + " (use sum and divide)");
  }
}

void checkBroadcastArgs(const torch::Tensor& t, int root, const Communicator& comm) {
  checkCollectiveTensor(t, comm, "broadcast");
  if (root < 0 || root >= comm.size()) {
    throw ConfigError(std::string(comm.backend()) + " broadcast: root " + std::to_string(root) +
                      " is not a rank (0.." + std::to_string(comm.size() - 1) + ")");
  }
}

torch::Tensor allgatherOutput(const torch::Tensor& input, int size) {
  std::vector<int64_t> shape{size};
  shape.insert(shape.end(), input.sizes().begin(), input.sizes().end());
  return torch::empty(shape, input.options());
}

void BrokenLatch::set(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (why_.empty()) why_ = why;
}

void BrokenLatch::throwIfBroken(std::string_view backend, const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!why_.empty()) {
    throw BackendError(std::string(backend) + " " + what + " refused: the communicator is broken "
                       "since an earlier error (" + why_ + ")");
  }
}

}  // namespace ddprun::runtime
