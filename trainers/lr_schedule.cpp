#include "trainers/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/errors.h"

namespace ddprun::trainers {

double learningRate(const LrScheduleOptions& o, int64_t step) {
  DDPRUN_CHECK(step >= 0, "step " << step);
  double rate = o.base;
  if (o.kind == "step") {
    DDPRUN_CHECK(o.stepsPerEpoch > 0 && o.stepEpochs > 0);
    const int64_t decays = step / o.stepsPerEpoch / o.stepEpochs;
    rate = o.base * std::pow(o.gamma, static_cast<double>(decays));
  } else if (o.kind == "cosine") {
    DDPRUN_CHECK(o.totalSteps > 0);
    const double progress = std::min(1.0, static_cast<double>(step) / o.totalSteps);
    rate = o.base * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  } else {
    DDPRUN_CHECK(o.kind == "constant", "unknown schedule " << o.kind);
  }
  if (step < o.warmupSteps) rate *= static_cast<double>(step + 1) / o.warmupSteps;
  return rate;
}

}  // namespace ddprun::trainers
