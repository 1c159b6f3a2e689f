#pragma once
// Where a recovery's lost time goes, from the job timelines (`ddprun --timeline`) of an
// undisturbed run and a killed run with the same flags (ddprun-bench recovery --timeline-split).
//
// Why: the bench's headline, (killed wall - undisturbed wall) / kills, carries the whole run's
// run-to-run noise (a standard deviation of 0.2-0.4 s on this machine for 2-5 s runs), so it
// cannot tell 50 ms from 150 ms. The timelines split the difference by *step number* instead of
// by wall time:
//   - start-up: launcher start to rank 0's first step, and end: rank 0's last step to the job's
//     end (the two runs differ here only by noise and by what the kill left running);
//   - the failure's window: from step k-5 to step k+20, k being the first step rank 0 completes
//     after the agent's "recovery" event. It holds the stall, the step redone from the last
//     commit, and the replacement's first (cold) steps. Against the same step numbers of the
//     undisturbed run, 25 steps of noise (a few ms) instead of the whole run's;
//   - the rest of the training: what is left (after a death the next spare loads beside the
//     ranks: its share shows here).
// After a shrink the step numbers mean other batches (fewer ranks share each), so shrink modes
// are split by *samples* instead (SplitBy::samples): the window runs from step k-5 to 20 steps
// after the group is whole again (grown back), and is compared with the time the undisturbed run
// took for the same number of samples from step k-5 (its step ends interpolated), every step's
// samples being its ranks' batches (the "world_size" of its timeline span). Step ends are then
// the job's (the last rank to end the step), since rank 0 may be the one that died.
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::bench {

// What the split needs of one run's timeline.
struct RunTimeline {
  double jobStart = 0;                // seconds: the agent's first event (its rendezvous)
  double jobEnd = 0;                  // the agent's "job end"
  std::map<int64_t, double> stepEnd;  // rank 0's track: step number -> end of its last run
  std::map<int64_t, double> jobStepEnd;  // every rank's track: step number -> the latest end
  std::map<int64_t, int> stepWorld;      // step number -> ranks in its latest run (0: unknown)
  double firstStepStart = 0;          // rank 0's first step
  std::vector<double> recoveries;     // the agent's "recovery" events, in order
};

// Reads a Chrome-trace JSON written by `ddprun --timeline` (docs/timeline.md). nullopt when the
// file is missing, not JSON, or has no rank 0 steps or no job end (the reason in *why).
std::optional<RunTimeline> readRunTimeline(const std::string& path, std::string* why);

// Seconds lost, killed against undisturbed, in each part; the failure's window is per recovery
// (nullopt for a recovery too close to either end of the run to have its whole window).
struct TimeSplit {
  double startup = 0;
  double end = 0;
  std::vector<std::optional<double>> window;
  double training = 0;  // rank 0's first step to its last step, killed minus undisturbed
  // training minus the windows that could be measured
  double rest() const;
};

inline constexpr int64_t kWindowBefore = 5;
inline constexpr int64_t kWindowAfter = 20;

// By step number against rank 0's steps (replace modes), or by samples against the job's steps
// (shrink modes, above).
enum class SplitBy { steps, samples };

// Pure.
TimeSplit splitLostTime(const RunTimeline& undisturbed, const RunTimeline& killed,
                        SplitBy by = SplitBy::steps);

}  // namespace ddprun::bench
