#pragma once
// Learning-rate schedules as pure functions of training progress counted in samples.
//
// Progress is measured in samples of the data passed, not in optimizer steps: "seen" is
// epoch x dataset size + the position in the epoch's order (runtime::SamplerState), the same
// number whatever the world size, and a step trains on the samples [seen, seen + batch). So a
// job resumed at another world size (another global batch, another number of steps per epoch)
// continues the schedule where it stopped instead of jumping, and a run resumed at the same
// world size repeats exactly the rates of the uninterrupted run.
//   constant: base
//   step:     base * gamma^floor(epoch / stepEpochs), epoch = floor(seen / samplesPerEpoch)
//   cosine:   base * (1 + cos(pi * seen / totalSamples)) / 2, decaying to 0 at totalSamples
// A warm-up over the first warmupSamples multiplies any of them by
// min(1, (seen + batch) / warmupSamples): at a fixed global batch G with warmupSamples = k x G
// that is PyTorch's (step + 1) / k.
#include <cstdint>
#include <string>

namespace ddprun::trainers {

struct LrScheduleOptions {
  std::string kind = "cosine";   // "constant", "step" or "cosine"
  double base = 0.05;
  int64_t totalSamples = 1;      // cosine: the progress at which the rate reaches 0
  int64_t samplesPerEpoch = 1;   // step: converts samples to epochs
  int64_t stepEpochs = 1;        // step: epochs between decays
  double gamma = 0.1;            // step: decay factor
  int64_t warmupSamples = 0;
};

// The rate for the step that trains on samples [seen, seen + batch) of the run.
double learningRate(const LrScheduleOptions& options, int64_t seen, int64_t batch);

}  // namespace ddprun::trainers
