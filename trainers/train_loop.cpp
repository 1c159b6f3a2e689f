#include "trainers/train_loop.h"

#include <ATen/autocast_mode.h>

#include <deque>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <optional>

#include "base/log.h"
#include "base/timeline.h"
#include "trainers/evaluation.h"
#include "trainers/lr_schedule.h"
#include "trainers/metrics.h"
#include "trainers/models.h"
#include "trainers/sample_log.h"
#include "trainers/training_plan.h"
#include "worker_runtime/checkpoint.h"
#include "worker_runtime/ddp.h"
#include "worker_runtime/elastic/elastic_run.h"
#include "worker_runtime/elastic/elastic_state.h"
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
  TrainingRun(const TrainConfig& config, const TrainData& data, std::shared_ptr<Classifier> model,
              runtime::Runtime& rt)
      : config_(config),
        data_(data),
        rt_(rt),
        master_(rt.isMaster()),
        device_(chooseDevice(config, rt)),
        autocast_(config.mixed_precision && device_.is_cuda()),
        datasetSize_(data.train.size()),
        globalBatch_(config.batch_size * rt.worldSize()),
        model_(onDevice(std::move(model), device_)),
        optimizer_(model_->parameters(), torch::optim::SGDOptions(config.lr)
                                             .momentum(config.momentum)
                                             .weight_decay(config.weight_decay)),
        sampler_(samplerOptions()) {
    if (config_.mixed_precision && !autocast_ && master_) {
      DDPRUN_LOG(INFO, "trainer") << "mixed_precision applies on CUDA only; training in float32";
    }
    resume();
    // What a recovery rolls back to and heals a replacement with (docs/recovery.md): weights,
    // momentum, and the counters the loop continues from.
    state_.addModule(model_);
    state_.addOptimizer(optimizer_);
    state_.addCounter("step", &step_);
    state_.addCounter("epoch", &position_.epoch);
    state_.addCounter("position", &position_.position);
    state_.addCounter("reference_batch", &referenceBatch_);
    state_.addCounter("reference_world_size", &referenceWorldSize_);
    state_.addCounter("resumed_from", &result_.resumedFrom);
    state_.addCounter("test_accuracy", &result_.testAccuracy);
    position_ = {.epoch = resumeAt_.epoch, .position = static_cast<int64_t>(resumeAt_.position)};
    planRun();
    if (master_) openMetrics(result_.resumedFrom);
  }

  // Under ddprun --recovery=in-process|auto the loop survives a peer's death in this process
  // (runtime::runElastic): a commit after every step, and after a recovery the loop runs again
  // from the last one. Elsewhere it runs once.
  TrainResult run() {
    runtime::runElastic(rt_, state_, {.reset = [this] { reset(); }, .body = [this] { loop(); }});
    return result_;
  }

 private:
  runtime::Communicator& comm() { return *rt_.comm(); }

  // This rank's share of the data at the current world size. After a shrink or a grow back
  // (ddprun --recovery-policy=shrink) the ranks and the world size differ from the start's:
  // the sampler splits the rest of the epoch, from the committed position, over the ranks there
  // are now, so every sample of the epoch is still taken once (sampler.h).
  runtime::DistributedSamplerOptions samplerOptions() const {
    return {.datasetSize = static_cast<size_t>(data_.train.size()),
            .numReplicas = rt_.worldSize(),
            .rank = rt_.rank(),
            .shuffle = true,
            .seed = config_.seed,
            .dropLast = true};
  }

  // The state is in place (loaded, restored or healed): the position, the plan, and DDP on the
  // current communicator. DDP is built after the checkpoint is loaded, so its initial broadcast
  // from rank 0 starts every rank from the restored weights.
  void reset() {
    resumeAt_ = {.epoch = position_.epoch, .position = static_cast<size_t>(position_.position),
                 .datasetSize = static_cast<size_t>(datasetSize_)};
    if (rt_.worldSize() != sampler_.options().numReplicas || rt_.rank() != sampler_.options().rank) {
      // The group shrank in an in-process recovery, or grew back at a commit: a new split, a
      // new global batch, and perhaps a new rank 0 (which prints, writes the metrics and saves
      // the weights).
      const int before = sampler_.options().numReplicas;
      sampler_ = runtime::DistributedSampler(samplerOptions());
      globalBatch_ = config_.batch_size * rt_.worldSize();
      master_ = rt_.isMaster();
      if (master_) {
        std::cout << "world size " << before << " -> " << rt_.worldSize() << " (in-process "
                  << "recovery, generation " << rt_.generation() << "): global batch "
                  << globalBatch_ << "; the rest of epoch " << position_.epoch + 1 << " from sample "
                  << position_.position << " is split over " << rt_.worldSize() << " rank(s)"
                  << std::endl;
        if (!metrics_) openMetrics(step_);
      }
    }
    planRun();
    ddp_.reset();  // its hooks go before the new one's come
    // In a generation after the first, runElastic healed every rank from one root just before
    // (parameters and buffers included), having compared the state's digest, which covers
    // model_: DDP's own broadcast of rank 0's and its model check would repeat both.
    const bool healed = rt_.generation() > 0;
    ddp_.emplace(model_, rt_.comm(), runtime::DdpOptions{.initSync = !healed, .checkModel = !healed});
  }

  void commit() {
    const auto s = sampler_.state();
    position_ = {.epoch = s.epoch, .position = static_cast<int64_t>(s.position)};
    state_.commit();
  }

  void loop() {
    if (master_ && !announced_) {
      announced_ = true;
      std::cout << "training " << config_.model << " on " << datasetSize_ << " examples, "
                << rt_.worldSize() << " rank(s) x batch " << config_.batch_size << ", "
                << stepsInSegment(datasetSize_, 0, rt_.worldSize(), config_.batch_size)
                << " steps/epoch, " << totalSteps_ << " steps, device " << device_.str()
                << std::endl;
    }
    startStep_ = step_;
    // Time from a common start, as bench/ddp_mnist.py does. Not after an in-process recovery:
    // the heal's broadcasts have just lined the ranks up, and one more collective would only
    // lengthen the recovery.
    if (rt_.generation() == 0) comm().barrier();
    stats_ = StepStats();
    for (int64_t epoch = resumeAt_.epoch; epoch < config_.epochs; ++epoch) {
      ddprun::timeline::Scope epochSpan("epoch", "trainer");
      epochSpan.args().add("epoch", epoch + 1);
      sampler_.setEpoch(epoch);
      if (epoch == resumeAt_.epoch) sampler_.restore(resumeAt_);
      const auto batch = static_cast<size_t>(config_.batch_size);
      bool last = false;
      while (sampler_.remaining() >= batch && !last) {
        const int64_t seen = epoch * datasetSize_ + static_cast<int64_t>(sampler_.state().position);
        if (seen >= plan_.endSamples) break;
        const double lr = learningRate(schedule_, seen, globalBatch_) * lrScale_;
        {
          ddprun::timeline::Scope stepSpan("step", "trainer");
          // world_size: how many ranks share the step's global batch (after a shrink, fewer).
          stepSpan.args().add("step", step_ + 1).add("world_size", rt_.worldSize());
          // New pages a step touched (a replacement's first steps copy its template's pages).
          stepSpan.countMinorFaults();
          const auto indices = *sampler_.next(batch);
          sampleLog_.write(rt_.generation(), epoch, step_ + 1, rt_.rank(), rt_.worldSize(),
                           indices);
          stats_.addStep(trainStep(indices, lr));
        }
        ++step_;

        const bool epochDone = sampler_.remaining() < batch;
        const int64_t after = epochDone ? (epoch + 1) * datasetSize_ : seenNow(epoch);
        last = after >= plan_.endSamples;
        if (step_ % config_.log_interval == 0 || last) report(epoch, lr, seenNow(epoch));
        if (config_.evaluate && (epochDone || last)) evaluateNow(epoch);
        const bool due = config_.checkpoint_interval > 0 && step_ % config_.checkpoint_interval == 0;
        if (checkpoints_ && master_ && (due || epochDone || last)) checkpoint(epoch, epochDone);
        commit();
      }
      if (last) break;
    }
    // The run's last checkpoint is on disk before any rank reports the run done.
    if (checkpoints_) checkpoints_->flush();
    comm().barrier();
    finish();
  }

  static std::shared_ptr<Classifier> onDevice(std::shared_ptr<Classifier> model,
                                              torch::Device device) {
    model->to(device);  // a no-op on the CPU, where buildModel() made it
    return model;
  }

  int64_t seenNow(int64_t epoch) const {
    return epoch * datasetSize_ + static_cast<int64_t>(sampler_.state().position);
  }

  // The run's length and schedule in samples, from the reference batch (the job's first start,
  // or this one when there is no checkpoint yet).
  void planRun() {
    plan_ = makePlan({.datasetSize = datasetSize_,
                      .epochs = config_.epochs,
                      .maxSteps = config_.max_steps,
                      .warmupSteps = config_.warmup_steps,
                      .referenceBatch = referenceBatch_,
                      .referenceWorldSize = static_cast<int>(referenceWorldSize_)});
    if (stepsInSegment(datasetSize_, 0, rt_.worldSize(), config_.batch_size) == 0) {
      throw ConfigError("batch_size = " + std::to_string(config_.batch_size) +
                        " is larger than a rank's share of the training data (" +
                        std::to_string(datasetSize_ / rt_.worldSize()) + " examples at world size " +
                        std::to_string(rt_.worldSize()) + ")");
    }
    schedule_ = {.kind = config_.lr_schedule,
                 .base = config_.lr,
                 .totalSamples = plan_.endSamples,
                 .samplesPerEpoch = datasetSize_,
                 .stepEpochs = config_.lr_step_epochs,
                 .gamma = config_.lr_gamma,
                 .warmupSamples = plan_.warmupSamples};
    if (config_.lr_scaling == "linear") {
      lrScale_ = static_cast<double>(globalBatch_) / static_cast<double>(plan_.referenceGlobalBatch);
    }
    totalSteps_ = step_ + stepsToEnd(plan_, resumeAt_.epoch, static_cast<int64_t>(resumeAt_.position),
                                     rt_.worldSize(), config_.batch_size);
  }

  // Loads the newest complete checkpoint, if any; every rank loads the same one.
  void resume() {
    referenceBatch_ = config_.batch_size;
    referenceWorldSize_ = rt_.worldSize();
    resumeAt_ = {.epoch = 0, .position = 0, .datasetSize = static_cast<size_t>(datasetSize_)};
    if (config_.checkpoint_dir.empty()) return;
    checkpoints_.emplace(runtime::CheckpointOptions{.directory = config_.checkpoint_dir, .keep = 2});
    // A replacement (in-process recovery) heals from a survivor's memory instead.
    if (rt_.generation() > 0) return;
    auto state = checkpoints_->loadLatest(*model_, &optimizer_, rt_.comm().get());
    if (!state) return;
    step_ = state->step;
    resumeAt_ = state->sampler;
    // A state saved for another dataset size is refused here, before any step (not retryable).
    sampler_.restore(resumeAt_);
    const auto& reference = state->extra.value("reference", nlohmann::json::object());
    referenceBatch_ = reference.value("batch_size", referenceBatch_);
    referenceWorldSize_ = reference.value("world_size", referenceWorldSize_);
    result_.resumedFrom = step_;
    result_.testAccuracy = state->extra.value("test_accuracy", -1.0);
    if (!master_) return;
    std::cout << "resumed from checkpoint at step " << step_;
    if (resumeAt_.epoch >= config_.epochs) {
      std::cout << ": training is already complete (attempt " << rt_.attempt() << ")" << std::endl;
      return;
    }
    std::cout << " (epoch " << resumeAt_.epoch + 1 << "/" << config_.epochs << ", sample "
              << resumeAt_.position << " of " << datasetSize_ << ", attempt " << rt_.attempt()
              << ")" << std::endl;
    if (state->worldSize > 0 && state->worldSize != rt_.worldSize()) {
      std::cout << "world size " << state->worldSize << " -> " << rt_.worldSize()
                << ": global batch " << state->extra.value("global_batch", int64_t{0}) << " -> "
                << globalBatch_ << "; the rest of the epoch is split over " << rt_.worldSize()
                << " rank(s)" << std::endl;
    }
  }

  // `from`: the step the file resumes from (records after it are dropped; metrics.h).
  void openMetrics(int64_t from) {
    if (config_.metrics.empty()) return;
    metrics_.emplace(config_.metrics, from);
    auto record = toJson(config_);
    record["kind"] = "config";
    record["world_size"] = rt_.worldSize();
    record["attempt"] = rt_.attempt();
    record["resumed_from"] = result_.resumedFrom;
    record["steps_per_epoch"] = stepsInSegment(datasetSize_, 0, rt_.worldSize(), config_.batch_size);
    record["total_steps"] = totalSteps_;
    record["total_samples"] = plan_.endSamples;
    metrics_->write(record);
  }

  // One optimizer step on this rank's batch; DDP averages the gradients over all ranks inside
  // backward(). Returns this rank's loss.
  double trainStep(const std::vector<size_t>& batch, double lr) {
    std::vector<int64_t> indices(batch.begin(), batch.end());
    const auto idx = torch::from_blob(indices.data(), {static_cast<int64_t>(indices.size())},
                                      torch::kInt64);
    const auto x = data_.train.images(idx).to(device_);
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
  void report(int64_t epoch, double lr, int64_t seen) {
    const double loss = averageOverRanks(stats_.intervalMeanLoss(), comm());
    const double rate = stats_.intervalSamplesPerSec(globalBatch_);
    const double perStep = stats_.trainSeconds() / static_cast<double>(step_ - startStep_);
    // A step redone after an in-process rollback was reported already: once is enough.
    if (master_ && step_ > reportedUpTo_) {
      reportedUpTo_ = step_;
      const Progress p{.epoch = epoch + 1, .epochs = config_.epochs, .step = step_,
                       .totalSteps = totalSteps_, .loss = loss, .lr = lr, .samplesPerSec = rate,
                       .etaSeconds = perStep * static_cast<double>(totalSteps_ - step_)};
      std::cout << formatProgress(p) << std::endl;
      if (metrics_) {
        metrics_->write({{"kind", "train"}, {"epoch", epoch + 1}, {"step", step_},
                         {"samples", seen}, {"world_size", rt_.worldSize()},
                         {"loss", loss}, {"lr", lr}, {"samples_per_sec", rate},
                         {"elapsed_s", stats_.trainSeconds()}});
      }
    }
    stats_.startInterval();
  }

  void evaluateNow(int64_t epoch) {
    ddprun::timeline::Scope span("evaluation", "trainer");
    span.args().add("epoch", epoch + 1);
    Stopwatch time;
    const auto ev = evaluate(*model_, data_.test, device_, comm());
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
  // The file is written in the background (the next save or the run's end waits for it): the
  // other ranks do not wait at the next allreduce for rank 0's fsync.
  void checkpoint(int64_t epoch, bool epochDone) {
    runtime::TrainingState state{.step = step_, .epoch = epoch, .sampler = sampler_.state(),
                                 .worldSize = rt_.worldSize()};
    if (epochDone) {
      state.sampler = {.epoch = epoch + 1, .position = 0,
                       .datasetSize = static_cast<size_t>(datasetSize_)};
    }
    state.epoch = state.sampler.epoch;
    state.extra["test_accuracy"] = result_.testAccuracy;
    state.extra["global_batch"] = globalBatch_;
    state.extra["reference"] = {{"batch_size", referenceBatch_},
                                {"world_size", referenceWorldSize_}};
    checkpoints_->saveInBackground(*model_, &optimizer_, state);
  }

  void finish() {
    result_.steps = step_;
    result_.trainSeconds = stats_.trainSeconds();
    const int64_t samples = (step_ - startStep_) * globalBatch_;
    result_.samplesPerSec =
        result_.trainSeconds > 0 ? static_cast<double>(samples) / result_.trainSeconds : 0;
    result_.finalLoss = averageOverRanks(stats_.recentMeanLoss(), comm());
    if (!master_) return;
    if (!config_.save_weights.empty()) saveWeights(*model_, config_.save_weights);
    if (metrics_) {
      metrics_->write({{"kind", "summary"}, {"trainer", "ddprun"}, {"model", config_.model},
                       {"world_size", rt_.worldSize()}, {"steps", step_}, {"samples", samples},
                       {"train_seconds", result_.trainSeconds},
                       {"samples_per_sec", result_.samplesPerSec},
                       {"final_loss", result_.finalLoss}, {"test_accuracy", result_.testAccuracy},
                       {"resumed_from", result_.resumedFrom}});
    }
  }

  const TrainConfig& config_;
  const TrainData& data_;
  runtime::Runtime& rt_;
  bool master_;  // rank 0 (after a shrink, a survivor may become it)
  const torch::Device device_;
  const bool autocast_;
  const int64_t datasetSize_;
  int64_t globalBatch_;  // batch x world size (a shrink changes it)

  std::shared_ptr<Classifier> model_;
  torch::optim::SGD optimizer_;
  runtime::DistributedSampler sampler_;
  std::optional<runtime::DistributedDataParallel> ddp_;
  std::optional<runtime::CheckpointManager> checkpoints_;
  std::optional<MetricsFile> metrics_;

  int64_t referenceBatch_ = 0;  // per rank and world size when the job started (training_plan.h)
  int64_t referenceWorldSize_ = 0;
  TrainingPlan plan_;
  int64_t totalSteps_ = 0;  // announced: steps done + steps to the end at this world size
  LrScheduleOptions schedule_;
  double lrScale_ = 1.0;    // lr_scaling = linear: global batch / reference global batch
  int64_t step_ = 0, startStep_ = 0;  // optimizer steps done; where this attempt started
  int64_t reportedUpTo_ = 0;          // the last step this process printed (not rolled back)
  runtime::SamplerState resumeAt_;    // where this attempt starts
  // The sampler's position at the last commit (the elastic state's counters).
  struct {
    int64_t epoch = 0;
    int64_t position = 0;
  } position_;
  runtime::ElasticState state_;
  SampleLog sampleLog_;  // DDPRUN_SAMPLE_LOG: the indices of every step (off by default)
  bool announced_ = false;  // the "training ..." line was printed
  StepStats stats_;
  TrainResult result_;
};

}  // namespace

TrainData loadTrainData(const TrainConfig& config) {
  TrainData data;
  data.train = loadMnist({.dir = config.data, .split = Split::Train, .limit = config.train_limit});
  if (config.evaluate) {
    data.test = loadMnist({.dir = config.data, .split = Split::Test, .limit = config.test_limit});
  }
  return data;
}

void warmUpSpare(const TrainConfig& config, const TrainData& data,
                 const std::shared_ptr<runtime::Communicator>& comm) {
  if (torch::cuda::is_available()) return;
  torch::manual_seed(config.seed);  // as buildModel() does: the same weights
  auto model = makeModel(config.model, config.hidden, config.width);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(config.lr)
                                                       .momentum(config.momentum)
                                                       .weight_decay(config.weight_decay));
  runtime::DistributedDataParallel ddp(model, comm);
  runtime::ElasticState state;
  state.addModule(model);
  state.addOptimizer(optimizer);
  state.enable();
  const int64_t size = data.train.size();
  const int64_t batch = std::min<int64_t>(config.batch_size, size);
  // Two steps: the first creates the momentum buffers, the second is a step as every later one.
  for (int64_t i = 0; i < 2 && batch > 0; ++i) {
    const auto idx = torch::arange(i * batch, (i + 1) * batch, torch::kInt64).remainder(size);
    const auto x = data.train.images(idx);
    const auto y = data.train.labels.index_select(0, idx);
    optimizer.zero_grad();
    const auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    optimizer.step();
    (void)loss.item<double>();
    state.commit();
  }
  state.restore();
  // The spare may take rank 0, which saves the checkpoints: its first save then runs warm.
  if (!config.checkpoint_dir.empty()) runtime::CheckpointManager::rehearseSave(*model, &optimizer);
}

std::shared_ptr<Classifier> buildModel(const TrainConfig& config) {
  // Same seed on every rank: identical initial weights (DDP broadcasts rank 0's anyway).
  torch::manual_seed(config.seed);
  return makeModel(config.model, config.hidden, config.width);
}

TrainResult train(const TrainConfig& config, const TrainData& data,
                  std::shared_ptr<Classifier> model, runtime::Runtime& rt) {
  DDPRUN_CHECK(model != nullptr, "train() needs the model buildModel() made");
  return TrainingRun(config, data, std::move(model), rt).run();
}

}  // namespace ddprun::trainers
