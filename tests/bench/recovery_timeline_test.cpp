// bench/recovery_timeline.h: the split of a recovery's lost time, on made-up timelines whose
// answer is known (the bench's smoke test runs it on real ones).
#include <catch2/catch.hpp>

#include "bench/recovery_timeline.h"

using ddprun::bench::RunTimeline;
using ddprun::bench::SplitBy;
using ddprun::bench::splitLostTime;

namespace {

// Steps 1..n, each `seconds` long after a start at 1 s, `world` ranks each; job end 0.5 s later.
RunTimeline steady(int64_t n, double seconds, int world) {
  RunTimeline t;
  t.jobStart = 0;
  t.firstStepStart = 1;
  for (int64_t s = 1; s <= n; ++s) {
    t.stepEnd[s] = t.jobStepEnd[s] = 1 + seconds * static_cast<double>(s);
    t.stepWorld[s] = world;
  }
  t.jobEnd = t.jobStepEnd[n] + 0.5;
  return t;
}

}  // namespace

TEST_CASE("recovery split by samples: a shrink's window is the killed run's time against the "
          "undisturbed run's for the same samples", "[bench]") {
  // Undisturbed: 4 ranks, 0.01 s a step, 200 steps. Killed: the same until step 100; then a
  // 0.03 s stall, 6 steps at 3 ranks (0.008 s each, 3/4 of the samples), a 0.02 s regroup, and
  // 4 ranks again to the end.
  const RunTimeline u = steady(200, 0.01, 4);
  RunTimeline k = steady(100, 0.01, 4);
  double t = k.jobStepEnd[100];
  k.recoveries.push_back(t + 0.001);
  t += 0.03;
  int64_t step = 100;
  for (int i = 0; i < 6; ++i) {
    t += 0.008;
    k.jobStepEnd[++step] = t;
    k.stepWorld[step] = 3;
  }
  t += 0.02;
  while (step < 205) {  // 6 steps at 3 ranks trained 4.5 steps' samples: 1.5 more steps
    t += 0.01;
    k.jobStepEnd[++step] = t;
    k.stepWorld[step] = 4;
  }
  k.jobEnd = t + 0.5;
  const auto split = splitLostTime(u, k, SplitBy::samples);
  REQUIRE(split.window.size() == 1);
  REQUIRE(split.window[0]);
  // Window: from the end of step 96 (5 before step 101, the recovery's first) to the end of
  // step 127 (20 after step 107, the first at 4 ranks again): steps 97-100, 101-106 at 3 ranks
  // and 107-127 trained 16 + 18 + 84 rank batches, 29.5 undisturbed steps (0.295 s), in
  // 0.04 + 0.03 + 0.048 + 0.02 + 0.21 = 0.348 s. Lost: 0.053 s.
  CHECK(*split.window[0] == Approx(0.053).margin(1e-9));
  // Split by steps instead, the same timelines compare unlike steps (and rank 0's track, which
  // ends at the kill here, has no window at all).
  CHECK_FALSE(splitLostTime(u, k, SplitBy::steps).window[0]);
}

TEST_CASE("recovery split by samples: no window when the group never grows back, or a step's "
          "world size is unknown", "[bench]") {
  const RunTimeline u = steady(200, 0.01, 4);
  RunTimeline k = steady(100, 0.01, 4);
  k.recoveries.push_back(k.jobStepEnd[100] + 0.001);
  double t = k.jobStepEnd[100];
  for (int64_t s = 101; s <= 230; ++s) {
    t += 0.008;
    k.jobStepEnd[s] = t;
    k.stepWorld[s] = 3;  // never whole again
  }
  k.jobEnd = t + 0.5;
  CHECK_FALSE(splitLostTime(u, k, SplitBy::samples).window[0]);
  RunTimeline old = steady(200, 0.01, 4);  // a timeline written before steps had world_size
  for (auto& [s, w] : old.stepWorld) w = 0;
  old.recoveries.push_back(old.jobStepEnd[100] + 0.001);
  CHECK_FALSE(splitLostTime(u, old, SplitBy::samples).window[0]);
}
