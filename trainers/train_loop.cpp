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

#include "base/log.h"
#include "trainers/evaluation.h"
#include "trainers/lr_schedule.h"
#include "trainers/metrics.h"
#include "trainers/models.h"
#include "worker_runtime/checkpoint.h"
#include "worker_runtime/ddp.h"
#include "worker_runtime/sampler.h"

namespace ddprun::trainers {
namespace {

constexpr size_t kLossWindow = 50;  // steps averaged into the final loss

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

void saveWeights(const torch::nn::Module& model, const std::string& path) {
  const std::string tmp = path + ".tmp";
  torch::serialize::OutputArchive archive;
  model.save(archive);
  archive.save_to(tmp);
  std::filesystem::rename(tmp, path);
}

// Loss and time bookkeeping for progress lines and the summary. Evaluation pauses are tracked
// so that samples/s and the ETA count training time only.
class StepStats {
 public:
  void addStep(double loss) {
    recent_.push_back(loss);
    if (recent_.size() > kLossWindow) recent_.pop_front();
    intervalLoss_ += loss;
    ++intervalSteps_;
  }
  void addPause(double seconds) {
    pauseSeconds_ += seconds;
    intervalPauseSeconds_ += seconds;
  }
  double intervalMeanLoss() const { return intervalLoss_ / static_cast<double>(intervalSteps_); }
  double intervalSamplesPerSec(int64_t globalBatch) const {
    return static_cast<double>(intervalSteps_ * globalBatch) /
           (interval_.seconds() - intervalPauseSeconds_);
  }
  void startInterval() {
    intervalLoss_ = 0;
    intervalSteps_ = 0;
    intervalPauseSeconds_ = 0;
    interval_.restart();
  }
  double trainSeconds() const { return total_.seconds() - pauseSeconds_; }
  double recentMeanLoss() const {
    if (recent_.empty()) return 0.0;
    return std::accumulate(recent_.begin(), recent_.end(), 0.0) / static_cast<double>(recent_.size());
  }

 private:
  std::deque<double> recent_;
  double intervalLoss_ = 0;
  int64_t intervalSteps_ = 0;
  double pauseSeconds_ = 0, intervalPauseSeconds_ = 0;
  Stopwatch total_, interval_;
};

// One call of train(): what it builds, in order, and the loop over epochs and steps.
class TrainingRun {
 public:
  TrainingRun(const TrainConfig& config, const TrainData& data, runtime::Runtime& rt)
      : config_(config),
        data_(data),
        rt_(rt),
        comm_(*rt.comm()),
        master_(rt.isMaster()),
        device_(chooseDevice(config, rt)),
        autocast_(config.mixed_precision && device_.is_cuda()),
        globalBatch_(config.batch_size * rt.worldSize()),
        model_(makeSeededModel(config, device_)),
        optimizer_(model_->parameters(), torch::optim::SGDOptions(config.lr)
                                             .momentum(config.momentum)
                                             .weight_decay(config.weight_decay)),
        sampler_({.datasetSize = static_cast<size_t>(data.train.size()),
                  .numReplicas = rt.worldSize(),
                  .rank = rt.rank(),
                  .shuffle = true,
                  .seed = config.seed,
                  .dropLast = true}) {
    planSteps();
    if (config_.mixed_precision && !autocast_ && master_) {
      DDPRUN_LOG(INFO, "trainer") << "mixed_precision applies on CUDA only; training in float32";
    }
    resume();
    // DDP is built after the checkpoint is loaded, so its initial broadcast from rank 0 starts
    // every rank from the restored weights.
    ddp_.emplace(model_, rt.comm());
    if (master_) openMetrics();
  }

  TrainResult run() {
    if (master_) {
      std::cout << "training " << config_.model << " on " << data_.train.size() << " examples, "
                << rt_.worldSize() << " rank(s) x batch " << config_.batch_size << ", "
                << stepsPerEpoch_ << " steps/epoch, " << totalSteps_ << " steps, device "
                << device_.str() << std::endl;
    }
    startStep_ = step_;
    comm_.barrier();  // time from a common start, as bench/ddp_mnist.py does
    stats_ = StepStats();
    for (int64_t epoch = position_.epoch; epoch < config_.epochs && step_ < totalSteps_; ++epoch) {
      sampler_.setEpoch(epoch);
      if (epoch == position_.epoch && position_.position > 0) sampler_.restore(position_);
      while (step_ < totalSteps_) {
        auto indices = sampler_.next(static_cast<size_t>(config_.batch_size));
        if (!indices || static_cast<int64_t>(indices->size()) < config_.batch_size) break;
        const double lr = learningRate(schedule_, step_);
        stats_.addStep(trainStep(*indices, lr));
        ++step_;

        const bool epochDone = sampler_.state().position + static_cast<size_t>(config_.batch_size) >
                               sampler_.size();
        const bool last = step_ == totalSteps_;
        if (step_ % config_.log_interval == 0 || last) report(epoch, lr);
        if (config_.evaluate && (epochDone || last)) evaluateNow(epoch);
        const bool due = config_.checkpoint_interval > 0 && step_ % config_.checkpoint_interval == 0;
        if (checkpoints_ && master_ && (due || epochDone || last)) checkpoint(epoch, epochDone);
        maybeKillForTest(step_, rt_.rank(), rt_.attempt());
      }
    }
    comm_.barrier();
    return finish();
  }

 private:
  static std::shared_ptr<Classifier> makeSeededModel(const TrainConfig& c, torch::Device device) {
    // Same seed on every rank: identical initial weights (DDP broadcasts rank 0's anyway).
    torch::manual_seed(c.seed);
    auto model = makeModel(c.model, c.hidden, c.width);
    model->to(device);
    return model;
  }

  void planSteps() {
    stepsPerEpoch_ = static_cast<int64_t>(sampler_.size()) / config_.batch_size;
    if (stepsPerEpoch_ == 0) {
      throw ConfigError("batch_size = " + std::to_string(config_.batch_size) +
                        " is larger than a rank's share of the training data (" +
                        std::to_string(sampler_.size()) + " examples)");
    }
    totalSteps_ = stepsPerEpoch_ * config_.epochs;
    if (config_.max_steps > 0) totalSteps_ = std::min(totalSteps_, config_.max_steps);
    schedule_ = {.kind = config_.lr_schedule,
                 .base = config_.lr,
                 .totalSteps = totalSteps_,
                 .stepsPerEpoch = stepsPerEpoch_,
                 .stepEpochs = config_.lr_step_epochs,
                 .gamma = config_.lr_gamma,
                 .warmupSteps = config_.warmup_steps};
  }

  // Loads the newest complete checkpoint, if any; every rank loads the same one.
  void resume() {
    if (config_.checkpoint_dir.empty()) return;
    checkpoints_.emplace(runtime::CheckpointOptions{.directory = config_.checkpoint_dir, .keep = 2});
    auto state = checkpoints_->loadLatest(*model_, &optimizer_, &comm_);
    if (!state) return;
    step_ = state->step;
    position_ = state->sampler;
    result_.resumedFrom = step_;
    result_.testAccuracy = state->extra.value("test_accuracy", -1.0);
    if (master_) {
      std::cout << "resumed from checkpoint at step " << step_ << " (epoch " << position_.epoch + 1
                << ", attempt " << rt_.attempt() << ")" << std::endl;
    }
  }

  void openMetrics() {
    if (config_.metrics.empty()) return;
    metrics_.emplace(config_.metrics, result_.resumedFrom);
    auto record = toJson(config_);
    record["kind"] = "config";
    record["world_size"] = rt_.worldSize();
    record["attempt"] = rt_.attempt();
    record["resumed_from"] = result_.resumedFrom;
    record["steps_per_epoch"] = stepsPerEpoch_;
    record["total_steps"] = totalSteps_;
    metrics_->write(record);
  }

  // One optimizer step on this rank's batch; DDP averages the gradients over all ranks inside
  // backward(). Returns this rank's loss.
  double trainStep(const std::vector<size_t>& batch, double lr) {
    std::vector<int64_t> indices(batch.begin(), batch.end());
    const auto idx = torch::from_blob(indices.data(), {static_cast<int64_t>(indices.size())},
                                      torch::kInt64);
    const auto x = data_.train.images.index_select(0, idx).to(device_);
    const auto y = data_.train.labels.index_select(0, idx).to(device_);
    for (auto& group : optimizer_.param_groups()) {
      static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
    }
    optimizer_.zero_grad();
    torch::Tensor loss;
    {
      AutocastScope scope(autocast_);
      loss = torch::nn::functional::cross_entropy(model_->forward(x), y);
    }
    loss.backward();
    optimizer_.step();
    return loss.item<double>();
  }

  // A progress line (rank 0) with the loss averaged over ranks and the interval's steps.
  void report(int64_t epoch, double lr) {
    const double loss = averageOverRanks(stats_.intervalMeanLoss(), comm_);
    const double rate = stats_.intervalSamplesPerSec(globalBatch_);
    const double perStep = stats_.trainSeconds() / static_cast<double>(step_ - startStep_);
    if (master_) {
      const Progress p{.epoch = epoch + 1, .epochs = config_.epochs, .step = step_,
                       .totalSteps = totalSteps_, .loss = loss, .lr = lr, .samplesPerSec = rate,
                       .etaSeconds = perStep * static_cast<double>(totalSteps_ - step_)};
      std::cout << formatProgress(p) << std::endl;
      if (metrics_) {
        metrics_->write({{"kind", "train"}, {"epoch", epoch + 1}, {"step", step_},
                         {"loss", loss}, {"lr", lr}, {"samples_per_sec", rate},
                         {"elapsed_s", stats_.trainSeconds()}});
      }
    }
    stats_.startInterval();
  }

  void evaluateNow(int64_t epoch) {
    Stopwatch time;
    const auto ev = evaluate(*model_, data_.test, device_, comm_);
    stats_.addPause(time.seconds());
    result_.testAccuracy = ev.accuracy;
    if (!master_) return;
    std::printf("epoch %lld  step %lld  test loss %.4f  test accuracy %.4f\n",
                static_cast<long long>(epoch + 1), static_cast<long long>(step_), ev.loss,
                ev.accuracy);
    std::fflush(stdout);
    if (metrics_) {
      metrics_->write({{"kind", "eval"}, {"epoch", epoch + 1}, {"step", step_},
                       {"test_loss", ev.loss}, {"test_accuracy", ev.accuracy}});
    }
  }

  // Rank 0 saves model, optimizer and position. A checkpoint taken as an epoch ends points at
  // the start of the next one, so a resume neither repeats the epoch's evaluation nor its end.
  void checkpoint(int64_t epoch, bool epochDone) {
    runtime::TrainingState state{.step = step_, .epoch = epoch, .sampler = sampler_.state()};
    if (epochDone) state.sampler = {.epoch = epoch + 1, .position = 0};
    state.epoch = state.sampler.epoch;
    state.extra["test_accuracy"] = result_.testAccuracy;
    checkpoints_->save(*model_, &optimizer_, state);
  }

  TrainResult finish() {
    result_.steps = step_;
    result_.trainSeconds = stats_.trainSeconds();
    const int64_t samples = (step_ - startStep_) * globalBatch_;
    result_.samplesPerSec =
        result_.trainSeconds > 0 ? static_cast<double>(samples) / result_.trainSeconds : 0;
    result_.finalLoss = averageOverRanks(stats_.recentMeanLoss(), comm_);
    if (!master_) return result_;
    if (!config_.save_weights.empty()) saveWeights(*model_, config_.save_weights);
    if (metrics_) {
      metrics_->write({{"kind", "summary"}, {"trainer", "ddprun"}, {"model", config_.model},
                       {"world_size", rt_.worldSize()}, {"steps", step_}, {"samples", samples},
                       {"train_seconds", result_.trainSeconds},
                       {"samples_per_sec", result_.samplesPerSec},
                       {"final_loss", result_.finalLoss}, {"test_accuracy", result_.testAccuracy},
                       {"resumed_from", result_.resumedFrom}});
    }
    return result_;
  }

  const TrainConfig& config_;
  const TrainData& data_;
  runtime::Runtime& rt_;
  runtime::Communicator& comm_;
  const bool master_;
  const torch::Device device_;
  const bool autocast_;
  const int64_t globalBatch_;

  std::shared_ptr<Classifier> model_;
  torch::optim::SGD optimizer_;
  runtime::DistributedSampler sampler_;
  std::optional<runtime::DistributedDataParallel> ddp_;
  std::optional<runtime::CheckpointManager> checkpoints_;
  std::optional<MetricsFile> metrics_;

  int64_t stepsPerEpoch_ = 0, totalSteps_ = 0;
  LrScheduleOptions schedule_;
  int64_t step_ = 0, startStep_ = 0;  // optimizer steps done; where this attempt started
  runtime::SamplerState position_;    // where the resumed checkpoint left the sampler
  StepStats stats_;
  TrainResult result_;
};

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
  return TrainingRun(config, data, rt).run();
}

}  // namespace ddprun::trainers
