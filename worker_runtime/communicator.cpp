#include "worker_runtime/communicator.h"

#include "base/errors.h"
#include "worker_runtime/reduce.h"

namespace ddprun::runtime {

std::string_view toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

void checkCollectiveTensor(const torch::Tensor& t, const Communicator& comm, const char* what) {
  const std::string op = std::string(comm.backend()) + " " + what;
  if (!t.defined()) throw ConfigError(op + ": the tensor is undefined");
  if (!supportedDtype(t.scalar_type())) {
    throw ConfigError(op + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                      " is not supported (allowed: float32, float64, float16, bfloat16, int32, "
                      "int64, int8, uint8)");
  }
  if (t.layout() != torch::kStrided || !t.is_contiguous()) {
    throw ConfigError(op + ": the tensor must be dense and contiguous (call .contiguous())");
  }
  if (t.device() != comm.device()) {
    throw ConfigError(op + ": the tensor is on " + t.device().str() + " but this communicator "
                      "works on " + comm.device().str());
  }
}

}  // namespace ddprun::runtime
