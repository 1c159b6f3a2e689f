// End to end: the real mnist_mlp under the real ddprun, on a slice of Fashion-MNIST.
//
// Proof that elastic training loses nothing: a job whose worker is SIGKILLed from outside at an
// arbitrary moment and restarted by ddprun, and a job stopped with SIGTERM and started again, both
// end with weights bit-identical to an uninterrupted run; 2 workers match 1 worker with the same
// global batch; a job resumed at another world size continues the same data order and schedule
// (both trainers). Bad data and bad settings end the job with one clear message.
#include "tests/support/catch_torch.h"

#include <sched.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "fashion_mnist.h"
#include "job_runner.h"
#include "trained_weights.h"
#include "tests/support/skip.h"
#include "test_files.h"
#include "trainers/mnist_data.h"
#include "trainers/models.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kBin = DDPRUN_BIN_DIR;
constexpr auto kJobTimeout = std::chrono::seconds(120);

// One training job's settings: 4096 examples, global batch 32 -> 128 steps per epoch, 2 epochs
// (job_runner.h's MlpRun); none of the runs differs in anything that reaches the weights.
std::vector<std::string> trainerArgs(const std::string& dir, int perRankBatch, int epochs = 2) {
  return mlpCommand({.dir = dir, .batch = perRankBatch, .epochs = epochs, .metrics = true});
}

std::vector<std::string> underDdprun(int nproc, const std::vector<std::string>& trainer,
                                     std::vector<std::string> launcherFlags = {}) {
  return standaloneJob(nproc, trainer, launcherFlags);
}

struct Finished {
  int code;
  std::string output;
};

Finished runJob(const std::vector<std::string>& argv, const std::string& log,
                const std::map<std::string, std::string>& env = {}) {
  Job job(argv, env, log);
  const int code = job.wait(kJobTimeout);
  return {code, job.output()};
}

double maxAbsDifference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, (a[i] - b[i]).abs().max().item<double>());
  return m;
}

// The uninterrupted 2-worker run every other run is compared with (run once per test process).
const TempDir& referenceRun() {
  static TempDir dir;
  static const bool done = [] {
    const auto r = runJob(underDdprun(2, trainerArgs(dir.path(), 16)), dir / "log");
    INFO(r.output);
    REQUIRE(r.code == 0);
    REQUIRE_THAT(r.output, Contains("done: 256 steps"));
    REQUIRE_THAT(r.output, !Contains("resumed from checkpoint"));
    // scripts/setup installs libopenblas0-pthread; without it LibTorch's sgemm_ is the reference
    // BLAS and training is about 4x slower.
    CHECK_THAT(r.output, Contains("BLAS OpenBLAS"));
    return true;
  }();
  (void)done;
  return dir;
}

// SIGKILLs the worker of global rank `rank` of a running job from outside.
void killWorker(Job& job, int rank, const std::string& program = "mnist_mlp") {
  pid_t pid = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((pid = workerPid(job.pid(), rank, program)) < 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(showingOutput(pid > 0, job));
  REQUIRE(::kill(pid, SIGKILL) == 0);
}

// The step of the "resumed from checkpoint at step N" line (-1 when there is none).
int64_t resumedStep(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(R"(resumed from checkpoint at step (\d+))"))) return -1;
  return std::stoll(m[1]);
}

struct MetricsRecord {
  int64_t step, samples, worldSize;
  double lr;
};
std::vector<MetricsRecord> trainRecords(const std::string& path) {
  std::ifstream in(path);
  std::vector<MetricsRecord> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "train") continue;
    out.push_back({j["step"].get<int64_t>(), j["samples"].get<int64_t>(),
                   j["world_size"].get<int64_t>(), j["lr"].get<double>()});
  }
  return out;
}

}  // namespace

TEST_CASE("a worker SIGKILLed mid-run is restarted and the weights are bit-identical",
          "[elastic][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  int64_t killedAfter = -1;
  std::string output;
  {
    // Rank 1 is SIGKILLed from outside once step 40 has been checkpointed, at whatever point of
    // its step it is; the steps after the newest checkpoint are lost and redone.
    // Restart semantics (in-process recovery has tests of its own below).
    Job job(underDdprun(2, trainerArgs(dir.path(), 16), {"--max-restarts=1", "--recovery=restart"}),
            {}, dir / "log");
    REQUIRE(showingOutput(waitForCheckpoint(job, dir / "ckpt", 40, kJobTimeout), job));
    killedAfter = newestCheckpoint(dir / "ckpt");
    killWorker(job, 1);
    const int code = job.wait(kJobTimeout);
    output = job.output();
    INFO(output);
    REQUIRE(code == 0);
  }
  INFO(output);
  CHECK_THAT(output, Contains("signal 9 (SIGKILL)"));
  // One attempt number: the launcher's (TORCHELASTIC_RESTART_COUNT) is the trainer's.
  CHECK_THAT(output, Contains("started 2 worker(s) of 2 (attempt 1, round 1: 1/1 restarts used"));
  CHECK_THAT(output, Contains("mnist_mlp: world size 2, attempt 1, BLAS"));
  CHECK_THAT(output, Contains(", attempt 1)"));  // "resumed from checkpoint at step N (..."
  CHECK(resumedStep(output) >= killedAfter);
  CHECK(resumedStep(output) < 256);
  CHECK_THAT(output, Contains("done: 256 steps"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("a job that fails without restarts left resumes when started again and matches",
          "[elastic][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  {
    Job job(underDdprun(2, trainerArgs(dir.path(), 16)), {}, dir / "log1");
    REQUIRE(showingOutput(waitForCheckpoint(job, dir / "ckpt", 90, kJobTimeout), job));
    killWorker(job, 1);
    const int code = job.wait(kJobTimeout);
    INFO(job.output());
    REQUIRE(code == 128 + SIGKILL);
    REQUIRE_FALSE(fs::exists(dir / "final.pt"));
  }
  const int64_t newest = newestCheckpoint(dir / "ckpt");
  const auto again = runJob(underDdprun(2, trainerArgs(dir.path(), 16)), dir / "log2");
  INFO(again.output);
  REQUIRE(again.code == 0);
  CHECK(resumedStep(again.output) == newest);
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("a job stopped with SIGTERM and started again continues from the newest checkpoint",
          "[elastic][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  {
    Job job(underDdprun(2, trainerArgs(dir.path(), 16)), {}, dir / "log1");
    // Stop the job once it has checkpointed step 30 or later, as an operator would: SIGTERM to
    // the launcher, which passes it on to the workers.
    const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
    while (newestCheckpoint(dir / "ckpt") < 30 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    job.signal(SIGTERM);
    const int code = job.wait(kJobTimeout);
    INFO(job.output());
    REQUIRE(code != 0);
    REQUIRE_FALSE(fs::exists(dir / "final.pt"));
  }
  // The newest complete checkpoint left behind is where the next start must continue.
  const int64_t newest = newestCheckpoint(dir / "ckpt");
  REQUIRE(newest >= 30);
  REQUIRE(newest < 256);

  const auto again = runJob(underDdprun(2, trainerArgs(dir.path(), 16)), dir / "log2");
  INFO(again.output);
  REQUIRE(again.code == 0);
  CHECK_THAT(again.output, Contains("resumed from checkpoint at step " + std::to_string(newest)));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));

  // The metrics file shows every logged step once, across both starts.
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") steps.push_back(j["step"].get<int64_t>());
  }
  CHECK((steps == std::vector<int64_t>{32, 64, 96, 128, 160, 192, 224, 256}));
}

// ---- In-process recovery (docs/recovery.md): the survivor keeps its process ----

// The worker of `rank` once it is another process than `not` (the replacement), or -1 when the
// job ended first or the deadline passed.
pid_t waitForReplacement(Job& job, int rank, pid_t notThis) {
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  while (std::chrono::steady_clock::now() < deadline && !job.exited()) {
    const pid_t p = workerPid(job.pid(), rank, "mnist_mlp");
    if (p > 0 && p != notThis) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return -1;
}

// SIGKILLs rank `victim` mid-run under --recovery=in-process; the other rank must keep its pid.
void inProcessKill(int victim) {
  const auto& reference = referenceRun();
  TempDir dir;
  const int survivor = 1 - victim;
  std::string output;
  {
    Job job(underDdprun(2, trainerArgs(dir.path(), 16), {"--max-restarts=1", "--recovery=in-process"}),
            {}, dir / "log");
    REQUIRE(showingOutput(waitForCheckpoint(job, dir / "ckpt", 40, kJobTimeout), job));
    const pid_t survivorPid = workerPid(job.pid(), survivor, "mnist_mlp");
    const pid_t victimPid = workerPid(job.pid(), victim, "mnist_mlp");
    REQUIRE(survivorPid > 0);
    REQUIRE(victimPid > 0);
    REQUIRE(::kill(victimPid, SIGKILL) == 0);
    const pid_t replacement = waitForReplacement(job, victim, victimPid);
    // The survivor is the same process after the death and while the replacement runs.
    const pid_t survivorNow = workerPid(job.pid(), survivor, "mnist_mlp");
    const int code = job.wait(kJobTimeout);
    output = job.output();
    INFO(output);
    REQUIRE(code == 0);
    CHECK(replacement > 0);
    CHECK(survivorNow == survivorPid);
    CHECK_THAT(output, Contains("rank " + std::to_string(survivor) + " recovered in process"));
  }
  INFO(output);
  CHECK_THAT(output, Contains("signal 9 (SIGKILL); recovering in process (generation 1)"));
  CHECK_THAT(output, Contains("restart 1 of 1 spent"));
  CHECK_THAT(output, Contains("rank " + std::to_string(victim) + " joined generation 1 and healed "
                              "from rank " + std::to_string(survivor) + "'s memory"));
  // Nothing restarted: one start of the group, no second attempt, no state read from disk.
  CHECK_THAT(output, !Contains("attempt 1"));
  CHECK_THAT(output, !Contains("resumed from checkpoint"));
  CHECK_THAT(output, Contains("done: 256 steps"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("in-process recovery: rank 1 SIGKILLed, the survivor keeps its process, weights "
          "bit-identical", "[elastic][recovery][slow]") {
  if (!haveData()) return skipWithoutData();
  inProcessKill(1);
}

TEST_CASE("in-process recovery: rank 0 SIGKILLed, the replacement heals from rank 1, weights "
          "bit-identical", "[elastic][recovery][slow]") {
  if (!haveData()) return skipWithoutData();
  inProcessKill(0);
}

TEST_CASE("in-process recovery: a death with no restart left ends the job with its root cause",
          "[elastic][recovery]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(2, trainerArgs(dir.path(), 16), {"--max-restarts=0", "--recovery=in-process"}),
          {}, dir / "log");
  REQUIRE(showingOutput(waitForCheckpoint(job, dir / "ckpt", 10, kJobTimeout), job));
  killWorker(job, 1);
  const int code = job.wait(kJobTimeout);
  INFO(job.output());
  CHECK(code == 128 + SIGKILL);
  CHECK_THAT(job.output(), Contains("Root cause (first observed failure)"));
  CHECK_THAT(job.output(), Contains("signal 9 (SIGKILL)"));
  CHECK_THAT(job.output(), !Contains("recovering in process"));
  CHECK_FALSE(fs::exists(dir / "final.pt"));
}

// ---- Hot spares (ddprun --spares, docs/recovery.md#hot-spares) ----

// 8 epochs (1024 steps, ~4.5 s here): a spare starts once both workers announced (after their
// first step) and must be ready well before the end, however loaded the machine (at 512 steps
// the job once ended as spare 0 said ready, with three tests at a time on 2 cores).
constexpr int kSpareEpochs = 8;

// The uninterrupted run of the spare tests' length (run once per test process).
const TempDir& spareReferenceRun() {
  static TempDir dir;
  static const bool done = [] {
    const auto r = runJob(underDdprun(2, trainerArgs(dir.path(), 16, kSpareEpochs)), dir / "log");
    INFO(r.output);
    REQUIRE(r.code == 0);
    REQUIRE_THAT(r.output, Contains("done: 1024 steps"));
    return true;
  }();
  (void)done;
  return dir;
}

bool alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

TEST_CASE("hot spare: rank 1 SIGKILLed, the waiting spare takes the rank and heals, the survivor "
          "keeps its process, weights bit-identical", "[elastic][recovery][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = spareReferenceRun();
  TempDir dir;
  std::string output;
  pid_t spare = -1, nextSpare = -1;
  int nextPolicy = -1;
  {
    Job job(underDdprun(2, trainerArgs(dir.path(), 16, kSpareEpochs),
                        {"--max-restarts=1", "--recovery=in-process", "--spares=1",
                         "--timeline=" + (dir / "timeline.json")}),
            {}, dir / "log");
    // The spare starts once both workers announced in-process recovery; killed once it waits.
    REQUIRE(
        showingOutput(waitForOutput(job, "ready: loaded, waiting for a rank", kJobTimeout), job));
    spare = sparePid(job.pid(), 0, "mnist_mlp");
    const pid_t survivorPid = workerPid(job.pid(), 0, "mnist_mlp");
    const pid_t victimPid = workerPid(job.pid(), 1, "mnist_mlp");
    REQUIRE(spare > 0);
    REQUIRE(survivorPid > 0);
    REQUIRE(victimPid > 0);
    REQUIRE_FALSE(job.exited());
    REQUIRE(::kill(victimPid, SIGKILL) == 0);
    REQUIRE(showingOutput(waitForOutput(job, "rank 0 recovered in process", kJobTimeout), job));
    const bool spareAliveAsRank1 = alive(spare);
    // No process was started for rank 1: the spare (started without RANK) is rank 1 now.
    const pid_t startedAsRank1 = workerPid(job.pid(), 1, "mnist_mlp");
    const pid_t survivorNow = workerPid(job.pid(), 0, "mnist_mlp");
    // A new spare starts in the background, under SCHED_IDLE, while the old one is rank 1. A
    // fork of the spare template is made at idle priority from the start, so on cores the job
    // keeps busy it may not run (nor say its pid) before the job ends.
    nextSpare = waitForStartingSpare(job, 1, kJobTimeout);
    if (nextSpare > 0) nextPolicy = ::sched_getscheduler(nextSpare);  // -1 once it is gone
    const int code = job.wait(kJobTimeout);
    output = job.output();
    INFO(output);
    REQUIRE(code == 0);
    CHECK(spareAliveAsRank1);
    CHECK(startedAsRank1 < 0);
    CHECK(survivorNow == survivorPid);
  }
  INFO(output);
  const std::string sp = std::to_string(spare);
  CHECK_THAT(output, Contains("recovering in process (generation 1): the other workers keep "
                              "running, spare 0 (pid " + sp + ") takes rank 1"));
  // It ran the trainer's warm-up (two training steps on throwaway copies) before it was ready,
  // and the weights below are still those of the uninterrupted run.
  CHECK_THAT(output, Contains("spare 0 (pid " + sp + ") warmed up in"));
  CHECK_THAT(output, Contains("spare 0 (pid " + sp + ") takes rank 1 (local rank 1) in "
                              "generation 1"));
  CHECK_THAT(output, Contains("rank 1 joined generation 1 and healed from rank 0's memory"));
  CHECK_THAT(output, Contains("rank 0 recovered in process"));
  CHECK_THAT(output, !Contains("a new rank 1 is starting"));
  CHECK_THAT(output, Contains("starting spare 1 in the background (SCHED_IDLE)"));
  if (nextSpare < 0) {
    CHECK_THAT(output, Contains("spare 1 forked from the spare template"));
  } else {
    CHECK(nextSpare != spare);
    CHECK(nextPolicy == SCHED_IDLE);  // its start-up takes no CPU time training wants
  }
  CHECK_THAT(output, !Contains("attempt 1"));
  CHECK_THAT(output, !Contains("resumed from checkpoint"));
  CHECK_THAT(output, Contains("done: 1024 steps"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
  // DDP's buckets of generation 1 are in the buffer of generation 0 (shm/lent_carry.h): the
  // survivor's own mapping, and the spare's opened through the survivor's /proc/<pid>/fd.
  std::ifstream in(dir / "timeline.json");
  REQUIRE(in);
  const auto trace = nlohmann::json::parse(in);
  const auto& events = trace.is_object() ? trace.at("traceEvents") : trace;
  int lends = 0, reused = 0;
  for (const auto& e : events) {
    if (e.value("name", "") != "lend buffer") continue;
    ++lends;
    if (e.contains("args") && e["args"].value("reused", 0) == 1) ++reused;
  }
  CHECK(lends == 4);  // two ranks, two generations
  CHECK(reused == 2);
}

TEST_CASE("hot spare: the waiting spare SIGKILLed is started again, the workers are not touched "
          "and no restart is spent", "[elastic][recovery][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = spareReferenceRun();
  TempDir dir;
  std::string output;
  {
    // --max-restarts=0: a restart (or an in-process recovery) spent would end the job.
    Job job(underDdprun(2, trainerArgs(dir.path(), 16, kSpareEpochs),
                        {"--max-restarts=0", "--recovery=in-process", "--spares=1"}),
            {}, dir / "log");
    REQUIRE(
        showingOutput(waitForOutput(job, "ready: loaded, waiting for a rank", kJobTimeout), job));
    const pid_t spare = sparePid(job.pid(), 0, "mnist_mlp");
    const pid_t w0 = workerPid(job.pid(), 0, "mnist_mlp");
    const pid_t w1 = workerPid(job.pid(), 1, "mnist_mlp");
    REQUIRE(spare > 0);
    REQUIRE(w0 > 0);
    REQUIRE(w1 > 0);
    REQUIRE_FALSE(job.exited());
    REQUIRE(::kill(spare, SIGKILL) == 0);
    const pid_t next = waitForStartingSpare(job, 1, kJobTimeout);
    const pid_t w0Now = workerPid(job.pid(), 0, "mnist_mlp");
    const pid_t w1Now = workerPid(job.pid(), 1, "mnist_mlp");
    const int code = job.wait(kJobTimeout);
    output = job.output();
    INFO(output);
    REQUIRE(code == 0);
    CHECK(next > 0);
    CHECK(w0Now == w0);
    CHECK(w1Now == w1);
    CHECK_THAT(output, Contains("spare 0 (pid " + std::to_string(spare) + ") died while waiting, "
                                "after it was ready (signal 9 (SIGKILL)): starting another; the "
                                "workers are not touched, no restart is spent"));
  }
  INFO(output);
  CHECK_THAT(output, !Contains("recovering in process"));
  CHECK_THAT(output, !Contains("restarting the worker group"));
  CHECK_THAT(output, !Contains("attempt 1"));
  CHECK_THAT(output, Contains("done: 1024 steps"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("hot spare: the spare SIGKILLed as it takes the rank, the next generation gives the "
          "rank to another process, the survivor keeps its process, weights bit-identical",
          "[elastic][recovery][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = spareReferenceRun();
  TempDir dir;
  std::string output;
  {
    // DDPRUN_TIMEOUT bounds the survivor's wait should the spare die before it published its
    // keys of generation 1's communicator (docs/recovery.md, limits).
    Job job(underDdprun(2, trainerArgs(dir.path(), 16, kSpareEpochs),
                        {"--max-restarts=2", "--recovery=in-process", "--spares=1"}),
            {{"DDPRUN_TIMEOUT", "20"}}, dir / "log");
    REQUIRE(
        showingOutput(waitForOutput(job, "ready: loaded, waiting for a rank", kJobTimeout), job));
    const pid_t spare = sparePid(job.pid(), 0, "mnist_mlp");
    const pid_t survivorPid = workerPid(job.pid(), 0, "mnist_mlp");
    const pid_t victimPid = workerPid(job.pid(), 1, "mnist_mlp");
    REQUIRE(spare > 0);
    REQUIRE(survivorPid > 0);
    REQUIRE(victimPid > 0);
    REQUIRE(::kill(victimPid, SIGKILL) == 0);
    // The spare is killed the moment the agent has given it the rank (before or while it heals).
    REQUIRE(showingOutput(waitForOutput(job, ") takes rank 1 (restart 1 of 2 spent)", kJobTimeout),
                          job));
    REQUIRE(::kill(spare, SIGKILL) == 0);
    const pid_t survivorNow = workerPid(job.pid(), 0, "mnist_mlp");
    const int code = job.wait(kJobTimeout);
    output = job.output();
    INFO(output);
    REQUIRE(code == 0);
    CHECK(survivorNow == survivorPid);
    CHECK_THAT(output, Contains("rank 1 (local rank 1, pid " + std::to_string(spare) + ") failed: "
                                "signal 9 (SIGKILL); recovering in process (generation 2)"));
    CHECK_THAT(output, Contains("rank 0 recovered in process"));
  }
  INFO(output);
  // The survivor never restarted: one start of the group, no second attempt, no checkpoint read.
  CHECK_THAT(output, Contains("rank 1 joined generation 2 and healed from rank 0's memory"));
  CHECK_THAT(output, !Contains("attempt 1"));
  CHECK_THAT(output, !Contains("restarting the worker group"));
  CHECK_THAT(output, !Contains("resumed from checkpoint"));
  CHECK_THAT(output, Contains("done: 1024 steps"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("2 workers match 1 worker with the same global batch", "[elastic][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  const auto r = runJob(underDdprun(1, trainerArgs(dir.path(), 32)), dir / "log");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains("done: 256 steps"));
  const auto one = loadWeights(dir / "final.pt");
  const auto two = loadWeights(reference / "final.pt");
  const double diff = maxAbsDifference(one, two);
  INFO("max |w1 - w2| = " << diff);
  CHECK(diff < 1e-5);
  for (size_t i = 0; i < one.size(); ++i) CHECK(torch::allclose(one[i], two[i], 1e-4, 1e-6));
}

TEST_CASE("bad data and bad settings end the job with one clear message", "[elastic][errors]") {
  TempDir dir;
  writeSplit(dir.path(), "train", 64);
  writeSplit(dir.path(), "t10k", 64);
  const std::string images = dir / "train-images-idx3-ubyte.gz";
  auto bytes = readFile(images);
  bytes.resize(bytes.size() - 30);
  writeFile(images, bytes);

  // Directly, without a launcher: the message names the file, exit code 2.
  auto r = runJob({kBin + "/mnist_mlp", "--data", dir.path()}, dir / "log1");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Contains("mnist_mlp: error: data file " + images + ": truncated"));

  // Under ddprun the same message reaches the user and the job fails.
  r = runJob(underDdprun(2, {kBin + "/mnist_mlp", "--data", dir.path()}), dir / "log2");
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Contains("data file " + images + ": truncated"));

  r = runJob({kBin + "/mnist_mlp", "--data", dir / "missing"}, dir / "log3");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Contains("data directory " + (dir / "missing") + " does not exist"));

  r = runJob({kBin + "/mnist_mlp", "--lr", "fast"}, dir / "log4");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Contains("mnist_mlp: error: flag --lr = 'fast': expected a number"));

  std::ofstream(dir / "bad.json") << R"({"model": "mlp", "batch_size": "big"})";
  r = runJob({kBin + "/mnist_mlp", "--config", dir / "bad.json"}, dir / "log5");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Contains("bad.json: batch_size = \"big\": expected an integer"));

  r = runJob({kBin + "/mnist_cnn", "--config", std::string(DDPRUN_SOURCE_DIR) +
                                                   "/configs/mnist_mlp.json"},
             dir / "log6");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Contains("mnist_cnn trains the cnn model (use mnist_mlp)"));
}

TEST_CASE("mnist_cnn trains under ddprun and its loss falls", "[elastic][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  const auto r = runJob(underDdprun(2, {kBin + "/mnist_cnn", "--config",
                                        std::string(DDPRUN_SOURCE_DIR) + "/configs/mnist_cnn.json",
                                        "--train-limit", "3200", "--test-limit", "500",
                                        "--epochs", "1", "--warmup-steps", "10",
                                        "--log-interval", "10", "--checkpoint-dir",
                                        dir / "ckpt", "--metrics", dir / "metrics.jsonl"}),
                        dir / "log");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains("training cnn on 3200 examples, 2 rank(s) x batch 64"));
  CHECK_THAT(r.output, Contains("done: 25 steps"));
  std::vector<double> losses;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") losses.push_back(j["loss"].get<double>());
  }
  REQUIRE(losses.size() == 3);  // steps 10, 20, 25
  CHECK(losses.back() < losses.front());
}

// Runs `argv` until it has checkpointed step `step` or later, then stops it with SIGTERM, as an
// operator (or a shrinking cluster) would; returns the newest checkpoint left.
int64_t runUntilCheckpoint(const std::vector<std::string>& argv, const std::string& ckpt,
                           int64_t step, const std::string& log) {
  Job job(argv, {}, log);
  REQUIRE(showingOutput(waitForCheckpoint(job, ckpt, step, kJobTimeout), job));
  job.signal(SIGTERM);
  const int code = job.wait(kJobTimeout);
  INFO(job.output());
  REQUIRE(code != 0);
  return newestCheckpoint(ckpt);
}

TEST_CASE("a job resumed at another world size continues the same data and schedule",
          "[elastic][slow]") {
  if (!haveData()) return skipWithoutData();
  // 1 worker x 32, then 2 workers x 16: the same global batch, so the resumed job must take the
  // same samples in the same steps with the same rates as the uninterrupted 2 x 16 run.
  const auto& reference = referenceRun();
  TempDir dir;
  const int64_t stopped = runUntilCheckpoint(underDdprun(1, trainerArgs(dir.path(), 32)),
                                             dir / "ckpt", 50, dir / "log1");
  REQUIRE(stopped < 256);
  const auto again = runJob(underDdprun(2, trainerArgs(dir.path(), 16)), dir / "log2");
  INFO(again.output);
  REQUIRE(again.code == 0);
  CHECK(resumedStep(again.output) == stopped);
  CHECK_THAT(again.output, Contains("world size 1 -> 2: global batch 32 -> 32"));
  CHECK_THAT(again.output, Contains("done: 256 steps"));
  const double diff = maxAbsDifference(loadWeights(dir / "final.pt"),
                                       loadWeights(reference / "final.pt"));
  INFO("max |w - w_reference| = " << diff);
  CHECK(diff < 1e-5);
}

TEST_CASE("2 -> 1 -> 2 workers with a fixed per-rank batch: samples, steps and rates count right",
          "[elastic][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  auto args = trainerArgs(dir.path(), 16);
  *(std::find(args.begin(), args.end(), "--log-interval") + 1) = "8";
  args.insert(args.end(), {"--lr-scaling", "linear"});
  const int64_t first = runUntilCheckpoint(underDdprun(2, args), dir / "ckpt", 40, dir / "log1");
  const int64_t second =
      runUntilCheckpoint(underDdprun(1, args), dir / "ckpt", first + 60, dir / "log2");
  REQUIRE(second > first);
  const auto last = runJob(underDdprun(2, args), dir / "log3");
  INFO(last.output);
  REQUIRE(last.code == 0);
  CHECK(resumedStep(last.output) == second);
  CHECK_THAT(last.output, Contains("world size 1 -> 2: global batch 16 -> 32"));
  // Epochs as configured: 2 epochs, whatever the resumes did to the steps.
  CHECK_THAT(last.output, Contains("epoch 2/2"));
  CHECK_THAT(last.output, Contains("epoch 2  step"));  // the last evaluation
  CHECK_THAT(last.output, !Contains("epoch 3"));

  // The total this start announces is what it does.
  std::smatch m;
  REQUIRE(std::regex_search(last.output, m, std::regex(R"(steps/epoch, (\d+) steps)")));
  const std::string announced = m[1];
  CHECK_THAT(last.output, Contains("done: " + announced + " steps"));

  // Every record: steps and samples strictly increasing; each rate is the cosine of the samples
  // passed before the step, scaled by global batch / 32 (lr_scaling linear).
  const auto records = trainRecords(dir / "metrics.jsonl");
  REQUIRE(records.size() > 10);
  bool sawOne = false;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    if (i > 0) {
      CHECK(r.step > records[i - 1].step);
      CHECK(r.samples > records[i - 1].samples);
    }
    sawOne = sawOne || r.worldSize == 1;
    const int64_t global = 16 * r.worldSize;
    const double before = static_cast<double>(r.samples - global);
    const double expected =
        0.05 * 0.5 * (1 + std::cos(M_PI * before / 8192.0)) * static_cast<double>(global) / 32.0;
    INFO("step " << r.step << " samples " << r.samples << " world " << r.worldSize);
    CHECK(r.lr == Approx(expected).epsilon(1e-9));
  }
  CHECK(sawOne);
  // 2 epochs of 4096 samples, less what did not fill a global batch where a segment ended.
  CHECK(records.back().samples > 8192 - 2 * 32);
  CHECK(records.back().step == std::stoll(announced));
}

TEST_CASE("mnist_cnn resumes at another world size", "[elastic][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  const std::vector<std::string> args = {
      kBin + "/mnist_cnn", "--config", std::string(DDPRUN_SOURCE_DIR) + "/configs/mnist_cnn.json",
      "--train-limit", "3200", "--test-limit", "500", "--epochs", "1", "--batch-size", "32",
      "--log-interval", "10", "--checkpoint-dir", dir / "ckpt", "--checkpoint-interval", "10",
      "--metrics", dir / "metrics.jsonl"};
  const int64_t stopped = runUntilCheckpoint(underDdprun(1, args), dir / "ckpt", 20, dir / "log1");
  REQUIRE(stopped < 100);
  const auto r = runJob(underDdprun(2, args), dir / "log2");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(resumedStep(r.output) == stopped);
  CHECK_THAT(r.output, Contains("world size 1 -> 2: global batch 32 -> 64"));
  // 3200 samples: `stopped` steps of 32, then the rest in steps of 64.
  const int64_t rest = (3200 - stopped * 32) / 64;
  CHECK_THAT(r.output, Contains("done: " + std::to_string(stopped + rest) + " steps"));
  const auto records = trainRecords(dir / "metrics.jsonl");
  REQUIRE(!records.empty());
  CHECK(3200 - records.back().samples < 64);  // the tail that does not fill a global batch
}

TEST_CASE("an incompatible checkpoint ends the job once, with its message", "[elastic][errors]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  const std::vector<std::string> small = {kBin + "/mnist_mlp", "--train-limit", "512",
                                          "--test-limit", "100", "--epochs", "1",
                                          "--hidden", "32", "--checkpoint-dir", dir / "ckpt"};
  REQUIRE(runJob(underDdprun(1, small), dir / "log1").code == 0);
  // The same directory with another model: every attempt would fail the same way, so the job
  // ends at the first, whatever the restart budget, naming the parameter and both shapes.
  auto other = small;
  other[8] = "64";
  const auto r = runJob(underDdprun(2, other, {"--max-restarts=3"}), dir / "log2");
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Contains("does not fit this model: fc1.weight has shape [32, 784]"));
  CHECK_THAT(r.output, Contains("type       : ddprun::runtime::IncompatibleCheckpoint"));
  CHECK_THAT(r.output, Contains("retryable  : no"));
  CHECK_THAT(r.output, Contains("0 of 3 restarts used"));
  CHECK_THAT(r.output, !Contains("restarting"));
}
