#include "trainers/train_loop.h"

#include <ATen/autocast_mode.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <optional>

#include "rendezvous/log.h"
#include "trainers/lr_schedule.h"
#include "trainers/metrics.h"
#include "trainers/models.h"
#include "worker_runtime/checkpoint.h"
#include "worker_runtime/ddp.h"
#include "worker_runtime/sampler.h"

namespace ddprun::trainers {
namespace {

using runtime::ReduceOp;

constexpr size_t kLossWindow = 50;    // steps averaged into the final loss
constexpr int64_t kEvalChunk = 2000;  // test examples per forward pass

// Training runs where the communicator's tensors live: the CPU for Gloo, this rank's GPU for
// NCCL (which init() picks when a GPU is visible). A device setting that contradicts it is an
// error rather than a silent copy on every step.
torch::Device chooseDevice(const TrainConfig& config, const runtime::Runtime& rt) {
  const torch::Device commDevice = rt.device();
  if (config.device == "cpu" && commDevice.is_cuda()) {
    throw ConfigError("device = \"cpu\" but the communicator is on " + commDevice.str() +
                      " (NCCL); set DDPRUN_BACKEND=gloo to train on the CPU");
  }
  if (config.device == "cuda" && !commDevice.is_cuda()) {
    throw ConfigError("device = \"cuda\" but no GPU is in use (communicator on " +
                      commDevice.str() + "); use device \"auto\" or \"cpu\"");
  }
  return commDevice;
}

// Enables float16 autocast for the forward pass on CUDA (mixed_precision); a no-op elsewhere.
class AutocastScope {
 public:
  explicit AutocastScope(bool on) : on_(on) {
    if (on_) at::autocast::set_enabled(true);
  }
  ~AutocastScope() {
    if (on_) {
      at::autocast::set_enabled(false);
      at::autocast::clear_cache();
    }
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool on_;
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
};

// Each rank scores every world-size-th test example; the sums are allreduced, so all ranks
// return the accuracy on the whole test split.
EvalResult evaluate(Classifier& model, const MnistSplit& test, torch::Device device,
                    runtime::Communicator& comm) {
  torch::NoGradGuard noGrad;
  model.eval();
  const auto mine = torch::arange(comm.rank(), test.size(), comm.size(), torch::kInt64);
  double lossSum = 0, correct = 0;
  for (int64_t begin = 0; begin < mine.size(0); begin += kEvalChunk) {
    const auto idx = mine.slice(0, begin, std::min(begin + kEvalChunk, mine.size(0)));
    const auto x = test.images.index_select(0, idx).to(device);
    const auto y = test.labels.index_select(0, idx).to(device);
    const auto logits = model.forward(x);
    lossSum += torch::nn::functional::cross_entropy(
                   logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
    correct += logits.argmax(1).eq(y).sum().item<double>();
  }
  auto sums = torch::tensor({lossSum, correct, static_cast<double>(mine.size(0))},
                            torch::TensorOptions().dtype(torch::kFloat64).device(comm.device()));
  comm.allreduce(sums, ReduceOp::Sum);
  sums = sums.cpu();
  model.train();
  const double count = sums[2].item<double>();
  return {sums[0].item<double>() / count, sums[1].item<double>() / count};
}

// The mean of `value` over all ranks.
double averageOverRanks(double value, runtime::Communicator& comm) {
  auto t = torch::tensor({value}, torch::TensorOptions().dtype(torch::kFloat64).device(comm.device()));
  comm.allreduce(t, ReduceOp::Avg);
  return t.cpu().item<double>();
}

void saveWeights(const torch::nn::Module& model, const std::string& path) {
  const std::string tmp = path + ".tmp";
  torch::serialize::OutputArchive archive;
  model.save(archive);
  archive.save_to(tmp);
  std::filesystem::rename(tmp, path);
}

}  // namespace

void maybeKillForTest(int64_t step, int rank, int attempt) {
  static const char* atStep = std::getenv("DDPRUN_TRAINER_KILL_AT_STEP");
  if (!atStep || attempt != 0 || std::atoll(atStep) != step) return;
  const char* killRank = std::getenv("DDPRUN_TRAINER_KILL_RANK");
  if ((killRank ? std::atoi(killRank) : 1) != rank) return;
  DDPRUN_LOG(WARN, "trainer") << "test hook: SIGKILL to myself after step " << step;
  ::kill(::getpid(), SIGKILL);
}

TrainData loadTrainData(const TrainConfig& config) {
  TrainData data;
  data.train = loadMnist({.dir = config.data, .split = Split::Train, .limit = config.train_limit});
  if (config.evaluate) {
    data.test = loadMnist({.dir = config.data, .split = Split::Test, .limit = config.test_limit});
  }
  return data;
}

TrainResult train(const TrainConfig& config, const TrainData& data, runtime::Runtime& rt) {
  auto& comm = *rt.comm();
  const bool master = rt.isMaster();
  const torch::Device device = chooseDevice(config, rt);
  const bool autocast = config.mixed_precision && device.is_cuda();
  if (config.mixed_precision && !autocast && master) {
    DDPRUN_LOG(INFO, "trainer") << "mixed_precision applies on CUDA only; training in float32";
  }
  const auto B = config.batch_size;
  const auto W = static_cast<int64_t>(rt.worldSize());

  // Same seed on every rank: identical initial weights (DDP broadcasts rank 0's anyway).
  torch::manual_seed(config.seed);
  auto model = makeModel(config.model, config.hidden, config.width);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(config.lr)
                                                       .momentum(config.momentum)
                                                       .weight_decay(config.weight_decay));

  runtime::DistributedSampler sampler({.datasetSize = static_cast<size_t>(data.train.size()),
                                       .numReplicas = rt.worldSize(),
                                       .rank = rt.rank(),
                                       .shuffle = true,
                                       .seed = config.seed,
                                       .dropLast = true});
  const int64_t stepsPerEpoch = static_cast<int64_t>(sampler.size()) / B;
  if (stepsPerEpoch == 0) {
    throw ConfigError("batch_size = " + std::to_string(B) + " is larger than a rank's share of " +
                      "the training data (" + std::to_string(sampler.size()) + " examples)");
  }
  int64_t totalSteps = stepsPerEpoch * config.epochs;
  if (config.max_steps > 0) totalSteps = std::min(totalSteps, config.max_steps);
  const LrScheduleOptions schedule{.kind = config.lr_schedule,
                                   .base = config.lr,
                                   .totalSteps = totalSteps,
                                   .stepsPerEpoch = stepsPerEpoch,
                                   .stepEpochs = config.lr_step_epochs,
                                   .gamma = config.lr_gamma,
                                   .warmupSteps = config.warmup_steps};

  // Resume from the newest complete checkpoint, if there is one (every rank loads the same).
  TrainResult result;
  int64_t step = 0;
  runtime::SamplerState position;
  std::optional<runtime::CheckpointManager> checkpoints;
  if (!config.checkpoint_dir.empty()) {
    checkpoints.emplace(runtime::CheckpointOptions{.directory = config.checkpoint_dir, .keep = 2});
    if (auto state = checkpoints->loadLatest(*model, &optimizer, &comm)) {
      step = state->step;
      position = state->sampler;
      result.resumedFrom = step;
      result.testAccuracy = state->extra.value("test_accuracy", -1.0);
      if (master) {
        std::cout << "resumed from checkpoint at step " << step << " (epoch " << position.epoch + 1
                  << ", attempt " << rt.attempt() << ")" << std::endl;
      }
    }
  }

  // DDP is built after the checkpoint is loaded: Module::load replaces the parameters' tensors,
  // and a DDP built before would keep watching the old ones (ranks silently drift apart).
  runtime::DistributedDataParallel ddp(model, rt.comm());

  std::optional<MetricsFile> metrics;
  if (master && !config.metrics.empty()) {
    metrics.emplace(config.metrics, result.resumedFrom);
    auto record = toJson(config);
    record["kind"] = "config";
    record["world_size"] = W;
    record["attempt"] = rt.attempt();
    record["resumed_from"] = result.resumedFrom;
    record["steps_per_epoch"] = stepsPerEpoch;
    record["total_steps"] = totalSteps;
    metrics->write(record);
  }
  if (master) {
    std::cout << "training " << config.model << " on " << data.train.size() << " examples, "
              << W << " rank(s) x batch " << B << ", " << stepsPerEpoch << " steps/epoch, "
              << totalSteps << " steps, device " << device.str() << std::endl;
  }

  const int64_t startStep = step;
  std::deque<double> recentLosses;
  double intervalLoss = 0;
  int64_t intervalSteps = 0;
  double evalSeconds = 0, intervalEvalSeconds = 0;  // evaluation is not training time
  comm.barrier();  // time from a common start, as bench/ddp_mnist.py does
  Stopwatch total, interval;

  for (int64_t epoch = position.epoch; epoch < config.epochs && step < totalSteps; ++epoch) {
    sampler.setEpoch(epoch);
    if (epoch == position.epoch && position.position > 0) sampler.restore(position);
    while (step < totalSteps) {
      auto next = sampler.next(static_cast<size_t>(B));
      if (!next || static_cast<int64_t>(next->size()) < B) break;
      std::vector<int64_t> indices(next->begin(), next->end());
      const auto idx = torch::from_blob(indices.data(), {B}, torch::kInt64);
      const auto x = data.train.images.index_select(0, idx).to(device);
      const auto y = data.train.labels.index_select(0, idx).to(device);

      const double lr = learningRate(schedule, step);
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
      }
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        AutocastScope scope(autocast);
        loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      }
      loss.backward();  // DDP averages the gradients over all ranks before this returns
      optimizer.step();
      ++step;

      const double lossValue = loss.item<double>();
      recentLosses.push_back(lossValue);
      if (recentLosses.size() > kLossWindow) recentLosses.pop_front();
      intervalLoss += lossValue;
      ++intervalSteps;

      if (step % config.log_interval == 0 || step == totalSteps) {
        const double meanLoss = averageOverRanks(intervalLoss / intervalSteps, comm);
        const double rate =
            static_cast<double>(intervalSteps * B * W) / (interval.seconds() - intervalEvalSeconds);
        const double perStep = (total.seconds() - evalSeconds) / static_cast<double>(step - startStep);
        if (master) {
          const Progress p{.epoch = epoch + 1, .epochs = config.epochs, .step = step,
                           .totalSteps = totalSteps, .loss = meanLoss, .lr = lr,
                           .samplesPerSec = rate,
                           .etaSeconds = perStep * static_cast<double>(totalSteps - step)};
          std::cout << formatProgress(p) << std::endl;
          if (metrics) {
            metrics->write({{"kind", "train"}, {"epoch", epoch + 1}, {"step", step},
                            {"loss", meanLoss}, {"lr", lr}, {"samples_per_sec", rate},
                            {"elapsed_s", total.seconds()}});
          }
        }
        intervalLoss = 0;
        intervalSteps = 0;
        intervalEvalSeconds = 0;
        interval.restart();
      }

      const bool epochDone = sampler.state().position + static_cast<size_t>(B) > sampler.size();
      const bool last = step == totalSteps;
      if (config.evaluate && (epochDone || last)) {
        Stopwatch evalTime;
        const auto ev = evaluate(*model, data.test, device, comm);
        evalSeconds += evalTime.seconds();
        intervalEvalSeconds += evalTime.seconds();
        result.testAccuracy = ev.accuracy;
        if (master) {
          std::printf("epoch %lld  step %lld  test loss %.4f  test accuracy %.4f\n",
                      static_cast<long long>(epoch + 1), static_cast<long long>(step), ev.loss,
                      ev.accuracy);
          std::fflush(stdout);
          if (metrics) {
            metrics->write({{"kind", "eval"}, {"epoch", epoch + 1}, {"step", step},
                            {"test_loss", ev.loss}, {"test_accuracy", ev.accuracy}});
          }
        }
      }

      const bool due = config.checkpoint_interval > 0 && step % config.checkpoint_interval == 0;
      if (checkpoints && master && (due || epochDone || last)) {
        runtime::TrainingState state{.step = step, .epoch = epoch, .sampler = sampler.state()};
        if (epochDone) state.sampler = {.epoch = epoch + 1, .position = 0};
        state.epoch = state.sampler.epoch;
        state.extra["test_accuracy"] = result.testAccuracy;
        checkpoints->save(*model, &optimizer, state);
      }
      maybeKillForTest(step, rt.rank(), rt.attempt());
    }
  }
  comm.barrier();

  result.steps = step;
  result.trainSeconds = total.seconds() - evalSeconds;
  const int64_t samples = (step - startStep) * B * W;
  result.samplesPerSec = result.trainSeconds > 0 ? static_cast<double>(samples) / result.trainSeconds : 0;
  const double localFinal =
      recentLosses.empty() ? 0.0
                           : std::accumulate(recentLosses.begin(), recentLosses.end(), 0.0) /
                                 static_cast<double>(recentLosses.size());
  result.finalLoss = averageOverRanks(localFinal, comm);

  if (master) {
    if (!config.save_weights.empty()) saveWeights(*model, config.save_weights);
    if (metrics) {
      metrics->write({{"kind", "summary"}, {"trainer", "ddprun"}, {"model", config.model},
                      {"world_size", W}, {"steps", step}, {"samples", samples},
                      {"train_seconds", result.trainSeconds},
                      {"samples_per_sec", result.samplesPerSec},
                      {"final_loss", result.finalLoss}, {"test_accuracy", result.testAccuracy},
                      {"resumed_from", result.resumedFrom}});
    }
  }
  return result;
}

}  // namespace ddprun::trainers
