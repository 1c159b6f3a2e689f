#include "trainers/training_plan.h"

#include <algorithm>
#include <string>

#include "base/errors.h"

namespace ddprun::trainers {

int64_t TrainingPlan::seenAfterSteps(int64_t steps) const {
  DDPRUN_CHECK(referenceStepsPerEpoch > 0);
  return steps / referenceStepsPerEpoch * datasetSize +
         steps % referenceStepsPerEpoch * referenceGlobalBatch;
}

TrainingPlan makePlan(const PlanInputs& in) {
  DDPRUN_CHECK(in.datasetSize >= 0 && in.epochs >= 1 && in.referenceBatch >= 1 &&
               in.referenceWorldSize >= 1);
  TrainingPlan p;
  p.datasetSize = in.datasetSize;
  p.epochs = in.epochs;
  p.referenceGlobalBatch = in.referenceBatch * in.referenceWorldSize;
  p.referenceStepsPerEpoch = stepsInSegment(in.datasetSize, 0, in.referenceWorldSize,
                                            in.referenceBatch);
  if (p.referenceStepsPerEpoch == 0) {
    throw ConfigError("batch_size = " + std::to_string(in.referenceBatch) +
                      " is larger than a rank's share of the training data (" +
                      std::to_string(in.datasetSize / in.referenceWorldSize) + " examples at world size " +
                      std::to_string(in.referenceWorldSize) + ")");
  }
  p.endSamples = in.epochs * in.datasetSize;
  if (in.maxSteps > 0) p.endSamples = std::min(p.endSamples, p.seenAfterSteps(in.maxSteps));
  p.warmupSamples = p.seenAfterSteps(in.warmupSteps);
  return p;
}

int64_t stepsInSegment(int64_t datasetSize, int64_t position, int world, int64_t batch) {
  DDPRUN_CHECK(world >= 1 && batch >= 1 && position >= 0);
  if (position >= datasetSize) return 0;
  return (datasetSize - position) / world / batch;
}

int64_t stepsToEnd(const TrainingPlan& plan, int64_t epoch, int64_t position, int world,
                   int64_t batch) {
  const int64_t global = batch * world;
  int64_t steps = 0;
  for (int64_t e = epoch, p = position; e < plan.epochs; ++e, p = 0) {
    const int64_t seen = e * plan.datasetSize + p;
    if (seen >= plan.endSamples) break;
    const int64_t segment = stepsInSegment(plan.datasetSize, p, world, batch);
    const int64_t needed = (plan.endSamples - seen + global - 1) / global;
    if (needed <= segment) return steps + needed;
    steps += segment;
  }
  return steps;
}

}  // namespace ddprun::trainers
