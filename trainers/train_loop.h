#pragma once
// The data-parallel training loop shared by the bundled trainers.
//
// Every rank loads the data, builds the model from the seed and wraps it in
// runtime::DistributedDataParallel, so gradients are averaged over ranks and all ranks hold the
// same weights after every step. runtime::DistributedSampler gives each rank its share of every
// epoch (set_epoch each epoch). The global batch is batch_size * world size; an epoch has
// floor(samples per rank / batch_size) steps (incomplete batches are dropped).
//
// Elastic resume: with a checkpoint_dir, rank 0 saves model, optimizer, step, epoch, the
// sampler's position (of all ranks together) and the reference batch (training_plan.h) every
// checkpoint_interval steps (or after each epoch), at the end of each epoch and at the end of
// training. A (re)started job loads the newest complete checkpoint on every rank and continues
// from its position, at whatever world size it now has: the rest of the epoch is split over the
// new ranks, and the learning rate, the run's end and the progress lines are functions of the
// samples passed (training_plan.h, lr_schedule.h). At the same world size the resumed run
// computes exactly what the uninterrupted run would have: its final weights are bit-identical on
// CPU.
//
// Rank 0 prints a progress line every log_interval steps and the test accuracy after each epoch,
// and writes the metrics file (metrics.h).
#include <cstdint>
#include <memory>

#include "trainers/mnist_data.h"
#include "trainers/models.h"
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

// A hot spare's warm-up (runtime::InitOptions::spareWarmup; docs/recovery.md#warm-up): the
// training step of `config` run twice on throwaway copies -- the same model, optimizer, batch
// shape and data, DDP on `comm` (the spare alone), a commit and a restore of their elastic
// state, and a checkpoint serialized into memory when `config` checkpoints -- so that the code a
// replacement's first steps run has run once in this process.
// Nothing of it is kept (the real model, buildModel()'s, is built before init() and healed).
// On CPU only: with a GPU the spare's device is known only with its rank (a no-op there).
void warmUpSpare(const TrainConfig& config, const TrainData& data,
                 const std::shared_ptr<runtime::Communicator>& comm);

// The model of `config` from its seed, on the CPU: the same initial weights on every rank. The
// trainers build it before init(), like the data, so that a hot spare (which waits in init()) and
// a replacement forked from the spare template (a fork of local rank 0 made inside its init())
// hold it already when they take a rank: their heal overwrites its values, and its random
// initialisation was on the path from the rank's start to the heal's first collective.
std::shared_ptr<Classifier> buildModel(const TrainConfig& config);

// Trains `model` (buildModel's) as `config` says on the ranks of `rt`, on the device the
// config and `rt` choose. Throws ConfigError, BackendError, runtime::CheckpointError, ...
TrainResult train(const TrainConfig& config, const TrainData& data,
                  std::shared_ptr<Classifier> model, runtime::Runtime& rt);

}  // namespace ddprun::trainers
