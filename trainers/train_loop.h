#pragma once
// The data-parallel training loop shared by the bundled trainers.
//
// Every rank loads the data, builds the model from the seed and wraps it in
// runtime::DistributedDataParallel, so gradients are averaged over ranks and all ranks hold the
// same weights after every step. runtime::DistributedSampler gives each rank its share of every
// epoch (set_epoch each epoch). The global batch is batch_size * world size; an epoch has
// floor(samples per rank / batch_size) steps (incomplete batches are dropped).
//
// Elastic resume: with a checkpoint_dir, rank 0 saves model, optimizer, step, epoch and the
// sampler position every checkpoint_interval steps (or after each epoch), at the end of each epoch
// and at the end of training. A (re)started job loads the newest complete checkpoint on every rank
// and continues from its step. Since the learning rate is a function of the step and the data
// order a function of seed and epoch, the resumed run computes exactly what the uninterrupted run
// would have: its final weights are bit-identical on CPU.
//
// Rank 0 prints a progress line every log_interval steps and the test accuracy after each epoch,
// and writes the metrics file (metrics.h).
#include <cstdint>

#include "trainers/mnist_data.h"
#include "trainers/train_config.h"
#include "worker_runtime/runtime.h"

namespace ddprun::trainers {

struct TrainResult {
  int64_t steps = 0;          // optimizer steps done in total (including before a resume)
  int64_t resumedFrom = -1;   // the checkpoint's step, or -1 for a fresh start
  double trainSeconds = 0;    // this attempt's training time, evaluation excluded
  double samplesPerSec = 0;   // global samples per second in this attempt
  double finalLoss = 0;       // mean training loss over the last (up to) 50 steps, all ranks
  double testAccuracy = -1;   // after the last evaluation; -1 when none ran
};

// Both splits, read before the worker joins its group so a bad file fails fast. Every rank holds
// the whole training split: the sampler picks from all of it.
struct TrainData {
  MnistSplit train;
  MnistSplit test;  // empty when config.evaluate is false
};
TrainData loadTrainData(const TrainConfig& config);

// Trains as `config` says on the ranks of `rt`. Throws ConfigError, BackendError,
// runtime::CheckpointError, ...
TrainResult train(const TrainConfig& config, const TrainData& data, runtime::Runtime& rt);

// Test hook, for the elastic tests: when DDPRUN_TRAINER_KILL_AT_STEP=N is set, the rank named by
// DDPRUN_TRAINER_KILL_RANK (default 1) sends itself SIGKILL right after optimizer step N -- in
// the first attempt only (TORCHELASTIC_RESTART_COUNT 0), so the restarted group runs through.
void maybeKillForTest(int64_t step, int rank, int attempt);

}  // namespace ddprun::trainers
