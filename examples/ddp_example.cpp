// ddp_example CHECKPOINT_DIR: data-parallel training of a small regression model with
// ddprun::runtime -- init, DDP, the distributed sampler, checkpoints -- meant to run under ddprun:
//   ddprun --standalone --nproc-per-node=2 ddp_example /tmp/ddp-example
// Run it twice: the second run resumes from the newest checkpoint of the first.
#include <iostream>

#include "worker_runtime/ddprun.h"

using namespace ddprun::runtime;

// y = x . w_true + noise, 4096 samples of 16 features, the same on every rank.
struct Data {
  torch::Tensor x, y;
  Data() {
    auto gen = at::detail::createCPUGenerator(7);
    x = torch::randn({4096, 16}, gen);
    y = x.matmul(torch::linspace(-1, 1, 16)).unsqueeze(1) + 0.01 * torch::randn({4096, 1}, gen);
  }
};

int train(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: ddp_example CHECKPOINT_DIR (run it under ddprun)\n";
    return 2;
  }
  try {
    auto rt = ddprun::init();
    auto model = std::make_shared<torch::nn::LinearImpl>(16, 1);
    DistributedDataParallel ddp(model, rt->comm());
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
    Data data;
    DistributedSampler sampler({.datasetSize = 4096, .numReplicas = rt->worldSize(),
                                .rank = rt->rank(), .seed = 1});
    CheckpointManager checkpoints({.directory = argv[1]});
    TrainingState state;
    if (auto resumed = checkpoints.loadLatest(*model, &opt, rt->comm().get())) {
      state = *resumed;
      if (rt->isMaster()) std::cout << "resumed at epoch " << state.epoch << "\n";
    }
    for (int64_t epoch = state.epoch; epoch < state.epoch + 3; ++epoch) {
      sampler.setEpoch(epoch);
      double loss = 0;
      int batches = 0;
      while (auto batch = sampler.next(64)) {
        auto idx = torch::tensor(std::vector<int64_t>(batch->begin(), batch->end()));
        opt.zero_grad();
        auto l = torch::mse_loss(model->forward(data.x.index_select(0, idx)), data.y.index_select(0, idx));
        l.backward();  // gradients are averaged over all ranks when this returns
        opt.step();
        loss += l.item<double>();
        ++batches;
      }
      torch::Tensor avg = torch::tensor({loss / batches}, torch::kFloat64);
      rt->comm()->allreduce(avg, ReduceOp::Avg);
      if (rt->isMaster()) {
        std::cout << "epoch " << epoch << " loss " << avg.item<double>() << "\n";
        checkpoints.save(*model, &opt, {.step = (epoch + 1) * batches, .epoch = epoch + 1});
      }
    }
    std::cout << "ddp_example: rank " << rt->rank() << "/" << rt->worldSize() << " done" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddp_example: " << e.what() << "\n";
    return 1;
  }
}

// The runtime is gone once train() returns (its error file written, its threads joined), and
// exitProcess ends the process without LibTorch's static destructors: they can take longer
// than the training of a small model (ddprun/runtime.h says why).
int main(int argc, char** argv) { ddprun::exitProcess(train(argc, argv)); }
