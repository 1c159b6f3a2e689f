// End to end: in-process recovery under --recovery-policy=shrink (docs/recovery.md#shrink) --
// the real mnist_mlp under the real ddprun, real SIGKILLs.
//
//   - a rank of three SIGKILLed: the survivors go on at two ranks in their own processes, and
//     the samples the job trained on, epoch by epoch, are the dataset's once each;
//   - rank 0 SIGKILLed: the survivor that becomes rank 0 prints, saves the weights, and the
//     samples are still exactly once;
//   - a second death when the budget (--max-restarts) was spent by the first shrink: the job
//     ends with that death as its root cause;
//   - a death that would take the group below the job's minimum (shrink:2): the group restarts.
// What the job trained on comes from the trainer's DDPRUN_SAMPLE_LOG (trainers/sample_log.h):
// every rank's indices of every step, with the generation that took it.
#include "tests/support/catch_torch.h"

#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "fashion_mnist.h"
#include "job_runner.h"
#include "test_files.h"
#include "tests/support/skip.h"
#include "trainers/mnist_data.h"
#include "worker_runtime/sampler.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kBin = DDPRUN_BIN_DIR;
constexpr auto kJobTimeout = std::chrono::seconds(180);
constexpr int64_t kExamples = 4096;
constexpr int64_t kBatch = 16;
constexpr int kEpochs = 2;
constexpr uint64_t kSeed = 11;

// 4096 examples, ranks x 16, 2 epochs; a checkpoint every 10 steps.
std::vector<std::string> underDdprun(int nproc, const std::string& dir,
                                     std::vector<std::string> launcherFlags) {
  std::vector<std::string> argv = {kBin + "/ddprun", "--standalone",
                                   "--nproc-per-node=" + std::to_string(nproc)};
  argv.insert(argv.end(), launcherFlags.begin(), launcherFlags.end());
  const std::vector<std::string> trainer = {
      kBin + "/mnist_mlp", "--train-limit", std::to_string(kExamples), "--test-limit", "1000",
      "--batch-size", std::to_string(kBatch), "--epochs", std::to_string(kEpochs),
      "--seed", std::to_string(kSeed), "--lr", "0.05", "--log-interval", "32",
      "--checkpoint-dir", dir + "/ckpt", "--checkpoint-interval", "10",
      "--save-weights", dir + "/final.pt"};
  argv.insert(argv.end(), trainer.begin(), trainer.end());
  return argv;
}

std::map<std::string, std::string> sampleLogEnv(const TempDir& dir) {
  return {{"DDPRUN_SAMPLE_LOG", dir / "samples"}};
}

int finish(Job& job) {
  const int code = job.wait(kJobTimeout);
  INFO(job.output());
  return code;
}

// What one epoch trained on, from the sample log: for each step, the lines of its highest
// generation (earlier ones were rolled back), which must come from every rank of that
// generation's world; their indices, in step order.
struct EpochSamples {
  std::vector<int64_t> indices;
  std::set<int> worlds;        // the world sizes the epoch's steps ran at
  int64_t steps = 0;
  std::vector<std::string> problems;
};

EpochSamples epochSamples(const std::string& log, int64_t epoch) {
  struct Line {
    int g, rank, world;
    std::vector<int64_t> idx;
  };
  std::map<int64_t, std::vector<Line>> byStep;
  std::ifstream in(log);
  const std::regex re(R"(g=(\d+) epoch=(\d+) step=(\d+) rank=(\d+) world=(\d+) idx=([\d,]+))");
  for (std::string text; std::getline(in, text);) {
    std::smatch m;
    if (!std::regex_match(text, m, re)) continue;  // a line torn by a SIGKILL
    if (std::stoll(m[2]) != epoch) continue;
    Line l{std::stoi(m[1]), std::stoi(m[4]), std::stoi(m[5]), {}};
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
    if (static_cast<int>(ranks.size()) != world) {
      out.problems.push_back("step " + std::to_string(step) + ": " + std::to_string(ranks.size()) +
                             " rank(s) in generation " + std::to_string(g) + ", world " +
                             std::to_string(world));
    }
    out.worlds.insert(world);
    out.indices.insert(out.indices.end(), idx.begin(), idx.end());
    ++out.steps;
  }
  return out;
}

// Every sample of the epoch exactly once: no index twice, and the indices are the epoch's order
// (the sampler's shuffle for `epoch`) up to a tail of fewer than world x batch samples, which
// the trainer drops as PyTorch's drop_last does (an uninterrupted run drops one too).
void checkExactlyOnce(const std::string& log, int64_t epoch, int finalWorld) {
  const EpochSamples s = epochSamples(log, epoch);
  INFO("epoch " << epoch << ": " << s.steps << " steps, " << s.indices.size() << " samples");
  for (const auto& p : s.problems) FAIL_CHECK(p);
  std::map<int64_t, int> seen;
  for (int64_t i : s.indices) ++seen[i];
  int64_t twice = 0;
  for (const auto& [i, n] : seen) twice += n > 1 ? 1 : 0;
  CHECK(twice == 0);
  const auto order = ddprun::runtime::distributedEpochOrder(
      {.datasetSize = kExamples, .numReplicas = 1, .rank = 0, .shuffle = true, .seed = kSeed,
       .dropLast = false},
      epoch);
  const int64_t taken = static_cast<int64_t>(seen.size());
  CHECK(kExamples - taken >= 0);
  CHECK(kExamples - taken < finalWorld * kBatch);
  // The set taken is the order's first `taken` positions.
  std::set<int64_t> prefix(order.begin(), order.begin() + std::min<int64_t>(taken, kExamples));
  std::set<int64_t> got;
  for (const auto& [i, n] : seen) got.insert(i);
  CHECK(got == prefix);
}

}  // namespace

TEST_CASE("a rank of three SIGKILLed, the other two finish at two ranks in their own "
          "processes and train on every sample of each epoch exactly once",
          "[recovery][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink"}),
          sampleLogEnv(dir), dir / "log");
  REQUIRE(waitForCheckpoint(job, dir / "ckpt", 20, kJobTimeout));
  const pid_t zero = workerPid(job.pid(), 0, "mnist_mlp");
  const pid_t one = workerPid(job.pid(), 1, "mnist_mlp");
  const pid_t two = workerPid(job.pid(), 2, "mnist_mlp");
  REQUIRE(zero > 0);
  REQUIRE(one > 0);
  REQUIRE(two > 0);
  REQUIRE(::kill(one, SIGKILL) == 0);
  // The survivors keep their processes: still running once the group went on without rank 1.
  REQUIRE(waitForOutput(job, "the group shrank", kJobTimeout));
  CHECK(::kill(zero, 0) == 0);
  CHECK(::kill(two, 0) == 0);
  const int code = finish(job);
  const std::string out = job.output();
  INFO(out);
  REQUIRE(code == 0);
  CHECK_THAT(out, Contains("rank 1 (local rank 1, pid " + std::to_string(one) + ") failed: "
                           "signal 9 (SIGKILL); recovering in process (generation 1): the group "
                           "shrinks from 3 to 2 rank(s)"));
  CHECK_THAT(out, Contains("as rank 1 of 2 (was rank 2 of 3; the group shrank)"));
  CHECK_THAT(out, Contains("world size 3 -> 2 (in-process recovery, generation 1)"));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, !Contains("restarting the worker group"));
  CHECK_THAT(out, Contains("done: "));
  CHECK(fs::exists(dir / "final.pt"));
  const std::string log = dir / "samples";
  const EpochSamples first = epochSamples(log, 0);
  CHECK(first.worlds == std::set<int>{3, 2});  // the shrink came within the first epoch
  checkExactlyOnce(log, 0, 2);
  CHECK(epochSamples(log, 1).worlds == std::set<int>{2});
  checkExactlyOnce(log, 1, 2);
}

TEST_CASE("rank 0 SIGKILLed, the survivor that becomes rank 0 reports and saves, every "
          "sample exactly once", "[recovery][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink"}),
          sampleLogEnv(dir), dir / "log");
  REQUIRE(waitForCheckpoint(job, dir / "ckpt", 20, kJobTimeout));
  const pid_t zero = workerPid(job.pid(), 0, "mnist_mlp");
  REQUIRE(zero > 0);
  REQUIRE(::kill(zero, SIGKILL) == 0);
  const int code = finish(job);
  const std::string out = job.output();
  INFO(out);
  REQUIRE(code == 0);
  CHECK_THAT(out, Contains("rank 0 (local rank 0, pid " + std::to_string(zero) + ") failed: "
                           "signal 9 (SIGKILL); recovering in process (generation 1): the group "
                           "shrinks from 3 to 2 rank(s)"));
  CHECK_THAT(out, Contains("as rank 0 of 2 (was rank 1 of 3; the group shrank)"));
  CHECK_THAT(out, Contains("world size 3 -> 2 (in-process recovery, generation 1)"));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains("done: "));
  CHECK(fs::exists(dir / "final.pt"));  // the new rank 0 saved them
  const std::string log = dir / "samples";
  checkExactlyOnce(log, 0, 2);
  checkExactlyOnce(log, 1, 2);
}

TEST_CASE("the budget spent by a shrink, the next death ends the job with its root cause",
          "[recovery][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink"}),
          sampleLogEnv(dir), dir / "log");
  REQUIRE(waitForCheckpoint(job, dir / "ckpt", 20, kJobTimeout));
  const pid_t one = workerPid(job.pid(), 1, "mnist_mlp");
  const pid_t two = workerPid(job.pid(), 2, "mnist_mlp");
  REQUIRE(one > 0);
  REQUIRE(two > 0);
  REQUIRE(::kill(one, SIGKILL) == 0);
  REQUIRE(waitForOutput(job, "the group shrank", kJobTimeout));
  // Rank 2 of the start is rank 1 of generation 1.
  REQUIRE(::kill(two, SIGKILL) == 0);
  const int code = finish(job);
  const std::string out = job.output();
  INFO(out);
  CHECK(code == 128 + SIGKILL);
  CHECK_THAT(out, Contains("shrinks from 3 to 2 rank(s), the others keep running (restart 1 of 1 "
                           "spent)"));
  CHECK_THAT(out, Contains("rank 1 (local rank 2, pid " + std::to_string(two) + ") failed: "
                           "signal 9 (SIGKILL); stopping the other workers"));
  CHECK_THAT(out, Contains("Root cause (first observed failure)"));
  CHECK_THAT(out, !Contains("shrinks from 2 to 1"));
  CHECK_FALSE(fs::exists(dir / "final.pt"));
}

TEST_CASE("a death that would go below the job's minimum (shrink:2) restarts the group",
          "[recovery][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(2, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink:2"}),
          {}, dir / "log");
  REQUIRE(waitForCheckpoint(job, dir / "ckpt", 20, kJobTimeout));
  const pid_t one = workerPid(job.pid(), 1, "mnist_mlp");
  REQUIRE(one > 0);
  REQUIRE(::kill(one, SIGKILL) == 0);
  const int code = finish(job);
  const std::string out = job.output();
  INFO(out);
  REQUIRE(code == 0);
  CHECK_THAT(out, Contains("--recovery-policy=shrink: without rank 1 the group would have 1 "
                           "rank(s), below the job's minimum of 2; restarting the group instead"));
  CHECK_THAT(out, Contains("resumed from checkpoint"));
  CHECK_THAT(out, !Contains("the group shrank"));
  CHECK(fs::exists(dir / "final.pt"));
}
