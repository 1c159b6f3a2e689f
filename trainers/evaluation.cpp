#include "trainers/evaluation.h"

#include <algorithm>

#include "worker_runtime/progress.h"

namespace ddprun::trainers {
namespace {
constexpr int64_t kEvalChunk = 2000;  // test examples per forward pass
}  // namespace

EvalResult evaluate(Classifier& model, const MnistSplit& test, torch::Device device,
                    runtime::Communicator& comm) {
  namespace F = torch::nn::functional;
  torch::NoGradGuard noGrad;
  model.eval();
  const auto mine = torch::arange(comm.rank(), test.size(), comm.size(), torch::kInt64);
  double lossSum = 0, correct = 0;
  for (int64_t begin = 0; begin < mine.size(0); begin += kEvalChunk) {
    const auto idx = mine.slice(0, begin, std::min(begin + kEvalChunk, mine.size(0)));
    const auto x = test.images(idx).to(device);
    const auto y = test.labels.index_select(0, idx).to(device);
    const auto logits = model.forward(x);
    lossSum += F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
    correct += logits.argmax(1).eq(y).sum().item<double>();
    runtime::reportProgress();  // evaluating is progress too (the agent's stall warning)
  }
  auto sums = torch::tensor({lossSum, correct, static_cast<double>(mine.size(0))},
                            torch::TensorOptions().dtype(torch::kFloat64).device(comm.device()));
  comm.allreduce(sums, runtime::ReduceOp::Sum);
  sums = sums.cpu();
  model.train();
  const double count = sums[2].item<double>();
  return {sums[0].item<double>() / count, sums[1].item<double>() / count};
}

double averageOverRanks(double value, runtime::Communicator& comm) {
  auto t = torch::tensor({value}, torch::TensorOptions().dtype(torch::kFloat64).device(comm.device()));
  comm.allreduce(t, runtime::ReduceOp::Avg);
  return t.cpu().item<double>();
}

}  // namespace ddprun::trainers
