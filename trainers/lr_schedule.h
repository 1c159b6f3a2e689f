#pragma once
// Learning-rate schedules as pure functions of the optimizer step.
//
// Because the rate depends only on the step (never on state kept between steps), a run that
// resumes from a checkpoint at step s continues with exactly the rates the uninterrupted run
// would have used.
//   constant: base
//   step:     base * gamma^floor(epoch / stepEpochs), epoch = step / stepsPerEpoch
//   cosine:   base * (1 + cos(pi * step / totalSteps)) / 2, decaying to 0 at totalSteps
// A warm-up of warmupSteps multiplies any of them by (step + 1) / warmupSteps at the start.
#include <cstdint>
#include <string>

namespace ddprun::trainers {

struct LrScheduleOptions {
  std::string kind = "cosine";  // "constant", "step" or "cosine"
  double base = 0.05;
  int64_t totalSteps = 1;     // cosine: the step at which the rate reaches 0
  int64_t stepsPerEpoch = 1;  // step: converts steps to epochs
  int64_t stepEpochs = 1;     // step: epochs between decays
  double gamma = 0.1;         // step: decay factor
  int64_t warmupSteps = 0;
};

// The rate for optimizer step `step` (0-based: the step about to be taken).
double learningRate(const LrScheduleOptions& options, int64_t step);

}  // namespace ddprun::trainers
