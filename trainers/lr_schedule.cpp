#include "trainers/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/errors.h"

namespace ddprun::trainers {

double learningRate(const LrScheduleOptions& o, int64_t seen, int64_t batch) {
  DDPRUN_CHECK(seen >= 0 && batch > 0, "seen " << seen << ", batch " << batch);
  double rate = o.base;
  if (o.kind == "step") {
    DDPRUN_CHECK(o.samplesPerEpoch > 0 && o.stepEpochs > 0);
    const int64_t decays = seen / o.samplesPerEpoch / o.stepEpochs;
    rate = o.base * std::pow(o.gamma, static_cast<double>(decays));
  } else if (o.kind == "cosine") {
    DDPRUN_CHECK(o.totalSamples > 0);
    const double progress = std::min(1.0, static_cast<double>(seen) / o.totalSamples);
    rate = o.base * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  } else {
    DDPRUN_CHECK(o.kind == "constant", "unknown schedule " << o.kind);
  }
  if (seen < o.warmupSamples) {
    rate *= std::min(1.0, static_cast<double>(seen + batch) / static_cast<double>(o.warmupSamples));
  }
  return rate;
}

}  // namespace ddprun::trainers
