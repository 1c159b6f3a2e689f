#pragma once
// TrainingPlan: how long a training run is and where it stands, counted in samples, so that the
// count survives a change of the world size.
//
// Data parallelism keeps the batch per rank fixed (as PyTorch does), so the global batch, and
// with it the number of optimizer steps per epoch, changes with the world size. A run's length
// and its learning-rate schedule are therefore measured in samples passed: "seen" is
// epoch x datasetSize + the sampler's position in the epoch (runtime::SamplerState), the same
// number whatever the world size. Settings given in steps (max_steps, warmup_steps) are converted
// once, with the *reference* global batch: the per-rank batch and world size the job started
// with, kept in its checkpoints. At that world size the plan gives exactly the steps asked for;
// after a change the run still ends at the same point of the data, and the schedule continues
// from where it was.
//
// An epoch at world size W and per-rank batch B from position p has
// floor(floor((datasetSize - p) / W) / B) steps: the sampler drops the tail that does not divide
// by W and the trainer the incomplete batch (PyTorch's drop_last), fewer than W x B samples.
#include <cstdint>

namespace ddprun::trainers {

struct PlanInputs {
  int64_t datasetSize = 0;
  int64_t epochs = 1;
  int64_t maxSteps = 0;     // 0: no limit
  int64_t warmupSteps = 0;
  int64_t referenceBatch = 1;     // per rank, when the job started
  int referenceWorldSize = 1;     // when the job started
};

struct TrainingPlan {
  int64_t datasetSize = 0;
  int64_t epochs = 1;
  int64_t referenceGlobalBatch = 1;
  int64_t referenceStepsPerEpoch = 0;
  int64_t endSamples = 0;      // training is complete when seen reaches this
  int64_t warmupSamples = 0;

  // Where `steps` optimizer steps at the reference global batch end: the plan's unit.
  int64_t seenAfterSteps(int64_t steps) const;
};

// Throws ConfigError when one reference global batch is larger than a rank's share of the data.
TrainingPlan makePlan(const PlanInputs& in);

// Optimizer steps in a segment of an epoch from position `position` at world size `world` with
// per-rank batch `batch`.
int64_t stepsInSegment(int64_t datasetSize, int64_t position, int world, int64_t batch);

// Optimizer steps from (epoch, position) until the plan's end, at world size `world` and per-rank
// batch `batch` (for the progress lines: the announced total changes only when the world size
// does).
int64_t stepsToEnd(const TrainingPlan& plan, int64_t epoch, int64_t position, int world,
                   int64_t batch);

}  // namespace ddprun::trainers
