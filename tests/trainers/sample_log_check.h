#pragma once
// What the job trained on, from the bundled trainers' DDPRUN_SAMPLE_LOG (trainers/sample_log.h):
// every rank's indices of every step, with the generation that took it. Shared by the shrink
// and grow-back tests: whatever the world size did during an epoch, every sample of it is
// trained on exactly once.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/catch_torch.h"
#include "worker_runtime/sampler.h"

namespace ddprun::trainers::testing {

// What one epoch trained on, from the sample log: for each step, the lines of its highest
// generation (earlier ones were rolled back), which must come from every rank of that
// generation's world; their indices, in step order.
//
// One exception, a grow back at the epoch's last commits: a rank already in the next step when
// the grow re-forms the group rolls that step back (elastic_run.cpp), and at the larger world
// the rest of the epoch may be too short for a step, so no later generation takes that step
// again. Its lines, from some ranks only, are the last step their generation logged, and a
// later generation exists: that step was never trained (its collective needs every rank), its
// samples fall into the epoch's dropped tail, and it is left out (`rolledBack`).
struct EpochSamples {
  std::vector<int64_t> indices;
  std::set<int> worlds;        // the world sizes the epoch's steps ran at
  std::vector<int> stepWorlds; // the world size of each step, in step order
  int lastWorld = 0;           // the world size of the epoch's last step
  int64_t steps = 0;
  int64_t rolledBack = 0;      // steps left out: see above
  std::vector<std::string> problems;
};

inline EpochSamples epochSamples(const std::string& log, int64_t epoch) {
  struct Line {
    int g, rank, world;
    std::vector<int64_t> idx;
  };
  std::map<int64_t, std::vector<Line>> byStep;
  std::map<int, int64_t> lastStepOf;  // every generation of the whole log: its last step
  std::ifstream in(log);
  const std::regex re(R"(g=(\d+) epoch=(\d+) step=(\d+) rank=(\d+) world=(\d+) idx=([\d,]+))");
  for (std::string text; std::getline(in, text);) {
    std::smatch m;
    if (!std::regex_match(text, m, re)) continue;  // a line torn by a SIGKILL
    const int gen = std::stoi(m[1]);
    lastStepOf[gen] = std::max<int64_t>(lastStepOf[gen], std::stoll(m[3]));
    if (std::stoll(m[2]) != epoch) continue;
    Line l{gen, std::stoi(m[4]), std::stoi(m[5]), {}};
    std::stringstream list(m[6]);
    for (std::string x; std::getline(list, x, ',');) l.idx.push_back(std::stoll(x));
    byStep[std::stoll(m[3])].push_back(std::move(l));
  }
  EpochSamples out;
  for (auto& [step, lines] : byStep) {
    int g = 0;
    for (const auto& l : lines) g = std::max(g, l.g);
    std::set<int> ranks;
    int world = -1;
    std::vector<int64_t> idx;
    for (const auto& l : lines) {
      if (l.g != g) continue;
      if (!ranks.insert(l.rank).second) {
        out.problems.push_back("step " + std::to_string(step) + ": rank " +
                               std::to_string(l.rank) + " twice in generation " + std::to_string(g));
      }
      world = l.world;
      // Rank r's batch is positions r, r + world, ... of the step's share of the order.
      idx.insert(idx.end(), l.idx.begin(), l.idx.end());
    }
    const bool laterGeneration = !lastStepOf.empty() && lastStepOf.rbegin()->first > g;
    if (static_cast<int>(ranks.size()) < world && laterGeneration && step == lastStepOf[g]) {
      ++out.rolledBack;
      continue;
    }
    if (static_cast<int>(ranks.size()) != world) {
      out.problems.push_back("step " + std::to_string(step) + ": " + std::to_string(ranks.size()) +
                             " rank(s) in generation " + std::to_string(g) + ", world " +
                             std::to_string(world));
    }
    out.worlds.insert(world);
    out.stepWorlds.push_back(world);
    out.lastWorld = world;
    out.indices.insert(out.indices.end(), idx.begin(), idx.end());
    ++out.steps;
  }
  return out;
}

// Every sample of the epoch exactly once: no index twice, and the indices are the epoch's order
// (the sampler's shuffle for `epoch`) up to a tail of fewer than world x batch samples, which
// the trainer drops as PyTorch's drop_last does (an uninterrupted run drops one too).
// Every sample of the epoch exactly once (see above); `finalWorld`: the world size of the
// epoch's last step, whose global batch (or the next epoch's first, when the group grew in
// between) bounds the dropped tail.
struct SampleJob {
  int64_t examples;
  int64_t batch;
  uint64_t seed;
};

inline void checkEpochExactlyOnce(const std::string& log, int64_t epoch, int finalWorld,
                                  const SampleJob& job) {
  const int64_t kExamples = job.examples;
  const int64_t kBatch = job.batch;
  const EpochSamples s = epochSamples(log, epoch);
  CHECK(s.lastWorld == finalWorld);
  INFO("epoch " << epoch << ": " << s.steps << " steps, " << s.indices.size() << " samples, "
                 << s.rolledBack << " rolled-back step(s) left out");
  for (const auto& p : s.problems) {
    // Also on stderr, first: a test's INFO(output) comes before it in Catch's report, and a
    // CI log cut to its first lines would show only the job's output.
    std::cerr << "sample log, epoch " << epoch << ": " << p << "\n";
    FAIL_CHECK(p);
  }
  std::map<int64_t, int> seen;
  for (int64_t i : s.indices) ++seen[i];
  int64_t twice = 0;
  for (const auto& [i, n] : seen) twice += n > 1 ? 1 : 0;
  CHECK(twice == 0);
  const auto order = ddprun::runtime::distributedEpochOrder(
      {.datasetSize = static_cast<size_t>(kExamples), .numReplicas = 1, .rank = 0, .shuffle = true, .seed = job.seed,
       .dropLast = false},
      epoch);
  const int64_t taken = static_cast<int64_t>(seen.size());
  CHECK(kExamples - taken >= 0);
  // The tail is dropped at the world size the epoch ended at: its last step's, or a larger one
  // when the group grew after that step (a grow at the epoch's last commit leaves a tail too
  // short for a step at the new size); the next epoch's first step runs at it.
  int tailWorld = finalWorld;
  const EpochSamples next = epochSamples(log, epoch + 1);
  if (!next.stepWorlds.empty()) tailWorld = std::max(tailWorld, next.stepWorlds.front());
  INFO("the tail was dropped at world size " << tailWorld);
  CHECK(kExamples - taken < tailWorld * kBatch);
  // The set taken is the order's first `taken` positions.
  std::set<int64_t> prefix(order.begin(), order.begin() + std::min<int64_t>(taken, kExamples));
  std::set<int64_t> got;
  for (const auto& [i, n] : seen) got.insert(i);
  CHECK(got == prefix);
}

}  // namespace ddprun::trainers::testing
