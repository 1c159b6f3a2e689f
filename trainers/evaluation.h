#pragma once
// Collective measurements over all ranks: test-set evaluation and averages. Every rank must call
// them at the same point of the run (they allreduce), and every rank gets the same result.
#include <torch/torch.h>

#include "trainers/mnist_data.h"
#include "trainers/models.h"
#include "worker_runtime/communicator.h"

namespace ddprun::trainers {

struct EvalResult {
  double loss = 0;      // mean cross-entropy over the test split
  double accuracy = 0;  // fraction of test examples classified right
};

// Each rank scores every world-size-th test example (in chunks, without gradients); the sums
// are allreduced, so the result covers the whole test split. Leaves the model in training mode.
EvalResult evaluate(Classifier& model, const MnistSplit& test, torch::Device device,
                    runtime::Communicator& comm);

// The mean of `value` over all ranks.
double averageOverRanks(double value, runtime::Communicator& comm);

}  // namespace ddprun::trainers
