// End to end: in-process recovery (docs/recovery.md) when the failure is harder than one clean
// death -- the real mnist_mlp under the real ddprun --recovery=in-process, real signals.
//
//   - two of three ranks SIGKILLed at once: one recovery, one generation, one restart spent;
//   - a survivor SIGKILLed while the replacement of another rank heals: the next generation,
//     the replacement keeps its process and heals in it;
//   - the only survivor SIGKILLed while the replacement loads: nobody holds the state, the
//     group restarts from its newest checkpoint, one line saying why;
//   - a second death during a recovery: the replacement SIGKILLed right after it starts, before
//     it healed;
//   - a frozen rank (SIGSTOP): noticed by --peer-timeout, killed, recovered in process;
//   - a death whose exit cannot be reaped yet (its guard stopped): recovered on the survivor's
//     hint from the zombie's status, and its late exit report is no second failure;
//   - forged and flooded hints from a stranger on the agent's store: nothing happens;
//   - rank 0 SIGKILLed while it writes a checkpoint: recovered in process, and with no restart
//     left the job ends and a new start resumes from the newest complete checkpoint;
//   - a single rank with --spares=1: no spare starts (no survivor to heal one from), one line
//     at the start says so, and its death restarts it from its checkpoint;
//   - under --recovery=auto, both ranks of two SIGKILLed at once: the refusal of the in-process
//     recovery is said (no survivor), as under --recovery=in-process, and the group restarts.
// Each ends with the weights of an uninterrupted run (bit for bit), the survivors in the
// processes they started in, or with a bounded failure naming its root cause; no survivor
// waits for ever (every job wait is bounded, the test fails on a timeout).
#include "tests/support/catch_torch.h"

#include <sys/inotify.h>

#include <filesystem>
#include <regex>

#include "fashion_mnist.h"
#include "rendezvous/recovery_keys.h"
#include "rendezvous/tcp_store.h"
#include "job_runner.h"
#include "trained_weights.h"
#include "test_files.h"
#include "tests/support/process.h"
#include "tests/support/skip.h"
#include "trainers/mnist_data.h"
#include "trainers/models.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;
using ddprun::testing::startEnv;
namespace fs = std::filesystem;

namespace {

constexpr auto kJobTimeout = std::chrono::seconds(180);

// 4096 examples, `nproc` ranks x 16, 2 epochs (job_runner.h's MlpRun).
std::vector<std::string> underDdprun(int nproc, const std::string& dir,
                                     std::vector<std::string> launcherFlags) {
  return standaloneJob(nproc, mlpCommand({.dir = dir}), launcherFlags);
}

// The uninterrupted run of `nproc` ranks (once per test process and size).
const TempDir& referenceRun(int nproc) {
  static std::map<int, std::unique_ptr<TempDir>> runs;
  auto& dir = runs[nproc];
  if (dir) return *dir;
  dir = std::make_unique<TempDir>();
  Job job(underDdprun(nproc, dir->path(), {}), {}, *dir / "log");
  const int code = job.wait(kJobTimeout);
  INFO(job.output());
  REQUIRE(code == 0);
  REQUIRE_THAT(job.output(), Contains("done: "));
  REQUIRE_THAT(job.output(), !Contains("resumed from checkpoint"));
  return *dir;
}

// The "done: N steps" line of the uninterrupted run of `nproc` ranks.
std::string doneLine(int nproc) {
  std::ifstream in(referenceRun(nproc) / "log");
  std::stringstream text;
  text << in.rdbuf();
  std::smatch m;
  const std::string s = text.str();
  REQUIRE(std::regex_search(s, m, std::regex(R"(done: \d+ steps)")));
  return m[0];
}

pid_t waitForWorker(Job& job, int rank, pid_t notThis = -1) {
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  while (std::chrono::steady_clock::now() < deadline && !job.exited()) {
    const pid_t p = workerPid(job.pid(), rank, "mnist_mlp");
    if (p > 0 && p != notThis) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return -1;
}

// The pids of ranks 0..n-1 (each found), once the job has checkpointed step 40: every rank
// holds the training state by then.
std::vector<pid_t> ranksOf(Job& job, const TempDir& dir, int n) {
  REQUIRE(showingOutput(waitForCheckpoint(job, dir / "ckpt", 40, kJobTimeout), job));
  const auto pids = workerPids(job.pid(), n, "mnist_mlp");
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(pids[r] > 0);
  }
  return pids;
}

int finish(Job& job) {
  const int code = job.wait(kJobTimeout);
  INFO(job.output());
  return code;
}

// A job of `nproc` ranks under ddprun with `launcherFlags`, in a directory of its own (its output
// in dir/log), and the uninterrupted run of as many ranks whose weights it must end with.
struct RecoveryJob {
  RecoveryJob(int nproc, std::vector<std::string> launcherFlags)
      : reference(referenceRun(nproc)),
        job(underDdprun(nproc, dir.path(), std::move(launcherFlags)), {}, dir / "log") {}

  // Waits for the job (bounded) and requires exit code 0, showing the output otherwise; returns
  // the output.
  std::string succeeded() {
    const int code = finish(job);
    std::string out = job.output();
    INFO(out);
    REQUIRE(code == 0);
    return out;
  }

  // Whether the job's final weights are the uninterrupted run's, bit for bit.
  bool sameWeights() const {
    return bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt"));
  }

  const TempDir& reference;
  TempDir dir;
  Job job;
};

// Watches a checkpoint directory for a temporary file being created (a save in progress) and
// returns the writer's pid and the step, from its name "ckpt-<step>.ddpck.tmp-<host>-<pid>-<hex>"
// (worker_runtime/checkpoint.h); {-1, -1} when the job ended or the deadline passed.
std::pair<pid_t, int64_t> waitForSave(Job& job, const std::string& dir, int64_t fromStep) {
  const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::inotify_add_watch(fd, dir.c_str(), IN_CREATE) >= 0);
  const std::regex name(R"(ckpt-(\d+)\.ddpck\.tmp-.*-(\d+)-[0-9a-f]+)");
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  alignas(inotify_event) char buf[4096];
  std::pair<pid_t, int64_t> found{-1, -1};
  while (found.first < 0 && std::chrono::steady_clock::now() < deadline && !job.exited()) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    for (ssize_t at = 0; at < n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buf + at);
      at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      std::smatch m;
      const std::string file = e->len > 0 ? std::string(e->name) : std::string();
      if (std::regex_match(file, m, name) && std::stoll(m[1]) >= fromStep) {
        found = {static_cast<pid_t>(std::stol(m[2])), std::stoll(m[1])};
        break;
      }
    }
  }
  ::close(fd);
  return found;
}

// The parent of `pid` and its state letter (/proc/<pid>/stat), or -1 / '?' when it is gone.
pid_t parentOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream rest(text.substr(paren + 2));
  char state = 0;
  pid_t ppid = -1;
  rest >> state >> ppid;
  return ppid;
}
char processState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? '?' : text[paren + 2];
}

}  // namespace

TEST_CASE("in-process recovery: two of three ranks SIGKILLed at once are recovered in one "
          "generation, the survivor keeps its process, weights bit-identical",
          "[recovery][slow]") {
  if (!haveData()) return skipWithoutData();
  // One restart: both deaths are one recovery.
  RecoveryJob run(3, {"--max-restarts=1", "--recovery=in-process"});
  Job& job = run.job;
  const auto pids = ranksOf(job, run.dir, 3);
  REQUIRE(ddprun::testing::killAtOnce({pids[1], pids[2]}, SIGKILL));
  const auto seen = rankPidsUntilExit(job, {0}, "mnist_mlp", kJobTimeout);
  const std::string out = run.succeeded();
  INFO(out);
  // The survivor's process from the kills to the end: no restart of the group.
  CHECK(seen.at(0) == std::set<pid_t>{pids[0]});
  const std::string line = lineWith(out, "recovering in process (generation 1)");
  CHECK_THAT(line, Contains("rank 1 (local rank 1, pid " + std::to_string(pids[1]) + ") failed"));
  CHECK_THAT(line, Contains("rank 2 (local rank 2, pid " + std::to_string(pids[2]) + ") failed"));
  CHECK_THAT(line, Contains("(restart 1 of 1 spent, one for the 2 deaths)"));
  CHECK_THAT(out, Contains("rank 0 recovered in process"));
  CHECK_THAT(out, !Contains("generation 2"));
  CHECK_THAT(out, !Contains("stopping the other workers"));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains(doneLine(3)));
  CHECK(run.sameWeights());
}

TEST_CASE("in-process recovery: a survivor SIGKILLed while the replacement of another rank "
          "heals, the next generation takes it in process, weights bit-identical",
          "[recovery][slow]") {
  if (!haveData()) return skipWithoutData();
  RecoveryJob run(3, {"--max-restarts=2", "--recovery=in-process"});
  Job& job = run.job;
  const auto pids = ranksOf(job, run.dir, 3);
  REQUIRE(::kill(pids[1], SIGKILL) == 0);
  // As soon as rank 1's replacement runs (it loads LibTorch and the data for about a second
  // before it can heal), rank 2 dies: generation 1 is still re-forming.
  const pid_t replacement = waitForWorker(job, 1, pids[1]);
  REQUIRE(showingOutput(replacement > 0, job));
  REQUIRE(::kill(pids[2], SIGKILL) == 0);
  const auto seen = rankPidsUntilExit(job, {0, 1}, "mnist_mlp", kJobTimeout);
  const std::string out = run.succeeded();
  INFO(out);
  // Rank 0 and rank 1's replacement keep their processes: the replacement joins generation 2.
  CHECK(seen.at(0) == std::set<pid_t>{pids[0]});
  CHECK(seen.at(1) == std::set<pid_t>{replacement});
  CHECK_THAT(lineWith(out, "recovering in process (generation 1)"),
             Contains("rank 1 (local rank 1, pid " + std::to_string(pids[1]) + ") failed"));
  CHECK_THAT(lineWith(out, "recovering in process (generation 2)"),
             Contains("rank 2 (local rank 2, pid " + std::to_string(pids[2]) + ") failed"));
  CHECK_THAT(out, !Contains("joined generation 1 and healed"));
  CHECK_THAT(out, Contains("rank 1 joined generation 2 and healed from rank 0's memory"));
  CHECK_THAT(out, Contains("rank 2 joined generation 2 and healed from rank 0's memory"));
  CHECK_THAT(out, !Contains("generation 3"));
  CHECK_THAT(out, !Contains("stopping the other workers"));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains(doneLine(3)));
  CHECK(run.sameWeights());
}

TEST_CASE("in-process recovery: rank 0 SIGKILLed while rank 1's replacement loads, no survivor "
          "holds the state: the group restarts naming why, weights bit-identical",
          "[recovery][slow]") {
  if (!haveData()) return skipWithoutData();
  RecoveryJob run(2, {"--max-restarts=2", "--recovery=in-process"});
  Job& job = run.job;
  const auto pids = ranksOf(job, run.dir, 2);
  REQUIRE(::kill(pids[1], SIGKILL) == 0);
  // The only survivor dies before the replacement (a second of start-up) could heal from it.
  const pid_t replacement = waitForWorker(job, 1, pids[1]);
  REQUIRE(showingOutput(replacement > 0, job));
  REQUIRE(::kill(pids[0], SIGKILL) == 0);
  const std::string out = run.succeeded();
  INFO(out);
  CHECK_THAT(out, Contains("recovering in process (generation 1)"));
  CHECK_THAT(out, Contains("in-process recovery of rank(s) 0 is not possible: no surviving "
                           "worker holds the training state (rank 1 (pid " +
                           std::to_string(replacement) + ") started for an earlier death and "
                           "had not healed yet); restarting the group from the newest "
                           "checkpoint instead"));
  CHECK_THAT(out, !Contains("generation 2"));
  CHECK_THAT(out, Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains("done: 256 steps"));
  CHECK(run.sameWeights());
}

TEST_CASE("in-process recovery: the replacement SIGKILLed before it healed, weights "
          "bit-identical", "[recovery][slow]") {
  if (!haveData()) return skipWithoutData();
  RecoveryJob run(2, {"--max-restarts=2", "--recovery=in-process"});
  Job& job = run.job;
  const auto pids = ranksOf(job, run.dir, 2);
  const pid_t first = pids[1];
  REQUIRE(::kill(first, SIGKILL) == 0);
  // The replacement, as soon as it runs (it takes about a second to load LibTorch and the data
  // and heal): the survivor is waiting for it in generation 1.
  const pid_t replacement = waitForWorker(job, 1, first);
  REQUIRE(showingOutput(replacement > 0, job));
  REQUIRE(::kill(replacement, SIGKILL) == 0);
  const auto seen = rankPidsUntilExit(job, {0}, "mnist_mlp", kJobTimeout);
  const std::string out = run.succeeded();
  INFO(out);
  CHECK(seen.at(0) == std::set<pid_t>{pids[0]});
  CHECK_THAT(out, Contains("recovering in process (generation 1)"));
  CHECK_THAT(out, Contains("pid " + std::to_string(replacement) + ") failed"));
  CHECK_THAT(out, !Contains("joined generation 1 and healed"));
  CHECK_THAT(out, Contains("done: 256 steps"));
  CHECK(run.sameWeights());
}

TEST_CASE("in-process recovery: a frozen rank (SIGSTOP) is killed after --peer-timeout and "
          "recovered in process, weights bit-identical", "[recovery][slow]") {
  if (!haveData()) return skipWithoutData();
  RecoveryJob run(2, {"--max-restarts=1", "--recovery=in-process", "--peer-timeout=2"});
  Job& job = run.job;
  const auto pids = ranksOf(job, run.dir, 2);
  const pid_t frozen = pids[1];
  const pid_t survivor = pids[0];
  REQUIRE(::kill(frozen, SIGSTOP) == 0);
  const pid_t replacement = waitForWorker(job, 1, frozen);
  const pid_t survivorNow = workerPid(job.pid(), 0, "mnist_mlp");
  const std::string out = run.succeeded();
  INFO(out);
  CHECK(replacement > 0);
  CHECK(survivorNow == survivor);
  CHECK_THAT(out, Contains("rank 1 (local rank 1, pid " + std::to_string(frozen) +
                           ") on node 0 stopped answering"));
  CHECK_THAT(out, Contains("recovering in process (generation 1)"));
  CHECK_THAT(out, Contains("rank 0 recovered in process"));
  CHECK_THAT(out, Contains("joined generation 1 and healed from rank 0's memory"));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains("done: 256 steps"));
  CHECK(run.sameWeights());
}

TEST_CASE("in-process recovery: a death is recovered before its exit is reaped (its guard "
          "stopped), on the survivor's hint, and counted once", "[recovery][slow]") {
  if (!haveData()) return skipWithoutData();
  RecoveryJob run(2, {"--max-restarts=1", "--recovery=in-process"});
  Job& job = run.job;
  const auto pids = ranksOf(job, run.dir, 2);
  // Rank 1's guard (its parent) is stopped: its exit cannot be reaped nor reported until the
  // guard runs again. Only the survivor's hint and /proc (a zombie killed by SIGKILL) can tell
  // the agent. (Without them the agent learns it only when its progress watch kills the silent
  // rank's guard after --peer-timeout, which reaps the zombie: the check of it below fails.)
  const pid_t guard = parentOf(pids[1]);
  REQUIRE(guard > 1);
  REQUIRE(guard != job.pid());
  REQUIRE(::kill(guard, SIGSTOP) == 0);
  REQUIRE(::kill(pids[1], SIGKILL) == 0);
  const bool recovered = waitForOutput(job, "rank 0 recovered in process", std::chrono::seconds(60));
  const bool zombieMeanwhile = processState(pids[1]) == 'Z';  // still not reaped
  ::kill(guard, SIGCONT);
  const int code = finish(job);
  const std::string out = job.output();
  INFO(out);
  REQUIRE(recovered);
  CHECK(zombieMeanwhile);
  REQUIRE(code == 0);
  const std::string line = lineWith(out, "recovering in process (generation 1)");
  CHECK_THAT(line, Contains("rank 1 (local rank 1, pid " + std::to_string(pids[1]) +
                            ") failed: signal 9 (SIGKILL)"));
  CHECK_THAT(line, Contains("(restart 1 of 1 spent)"));
  // The guard's report, once it ran again, was no second failure.
  CHECK_THAT(out, !Contains("generation 2"));
  CHECK_THAT(out, !Contains("stopping the other workers"));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains(doneLine(2)));
  CHECK(run.sameWeights());
}

TEST_CASE("in-process recovery: forged and flooded survivor's hints (ddprun/suspect/<rank>) "
          "from a stranger on the agent's store end no worker and recover nothing",
          "[recovery][slow][attack]") {
  if (!haveData()) return skipWithoutData();
  RecoveryJob run(2, {"--max-restarts=1", "--recovery=in-process"});
  Job& job = run.job;
  const auto pids = ranksOf(job, run.dir, 2);
  // The agent's store is the workers' MASTER_ADDR:MASTER_PORT; it cannot authenticate (PyTorch
  // clients could not), so any local process can write there: the attacker does.
  const std::string host = startEnv(pids[0], "MASTER_ADDR");
  const std::string port = startEnv(pids[0], "MASTER_PORT");
  REQUIRE(!host.empty());
  REQUIRE(!port.empty());
  using namespace ddprun::rendezvous;
  TcpStore attacker({.host = host, .port = static_cast<uint16_t>(std::stoi(port)),
                     .timeout = Millis(10'000), .connectTimeout = Millis(10'000),
                     .tokenFromEnvironment = false});
  // Hints for live ranks, for ranks the job has not, malformed rank names, other attempts,
  // values that are not a generation, large values; overwritten again and again.
  const std::string prefix = recovery::attemptPrefix(0) + "/";
  const std::vector<std::string> keys = {
      prefix + recovery::suspectKey(0), prefix + recovery::suspectKey(1),
      prefix + recovery::suspectKey(2), prefix + recovery::suspectKey(-1),
      prefix + "ddprun/suspect/rank1", prefix + "ddprun/suspect/", prefix + "ddprun/suspect/1/x",
      recovery::attemptPrefix(1) + "/" + recovery::suspectKey(1),
      recovery::attemptPrefix(-7) + "/" + recovery::suspectKey(0)};
  const std::vector<std::string> values = {"0", "1", "999999999999", "-1", "generation", "",
                                           std::string(64 * 1024, 'g')};
  // Every key with every value, four times over (252 writes, a few ms on loopback): bounded by a
  // count, not a time, as the job has only ~200 steps left after step 40 (0.3 s on a fast
  // machine; an 800 ms flood outlasted it and met a closed store).
  const int rounds = 4 * static_cast<int>(keys.size() * values.size());
  int written = 0;
  while (written < rounds && !job.exited()) {
    const std::string& key = keys[static_cast<size_t>(written) % keys.size()];
    attacker.set(key, values[static_cast<size_t>(written / keys.size()) % values.size()]);
    ++written;
  }
  INFO("forged hints written: " << written);
  // The flood met a running job (else it attacked nothing), whose ranks are the processes they
  // started as.
  REQUIRE_FALSE(job.exited());
  CHECK(written == rounds);
  CHECK(workerPid(job.pid(), 0, "mnist_mlp") == pids[0]);
  CHECK(workerPid(job.pid(), 1, "mnist_mlp") == pids[1]);
  const std::string out = run.succeeded();
  INFO(out);
  CHECK_THAT(out, !Contains("recovering in process"));
  CHECK_THAT(out, !Contains("failed"));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains(doneLine(2)));
  CHECK(run.sameWeights());
}

TEST_CASE("rank 0 SIGKILLed while it writes a checkpoint is recovered in process, and with no "
          "restart left a new start resumes from the newest complete checkpoint",
          "[recovery][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun(2);
  TempDir dir;
  const std::string ckpt = dir / "ckpt";
  fs::create_directories(ckpt);
  int64_t secondKill = -1;
  {
    // One restart: the first kill (a save of step 40 or later) is recovered in process, the
    // second (a save of step 120 or later) ends the job.
    Job job(underDdprun(2, dir.path(), {"--max-restarts=1", "--recovery=in-process"}), {},
            dir / "log1");
    const auto [writer, step] = waitForSave(job, ckpt, 40);
    REQUIRE(showingOutput(writer > 0, job));
    REQUIRE(writer == workerPid(job.pid(), 0, "mnist_mlp"));  // rank 0 saves
    REQUIRE(::kill(writer, SIGKILL) == 0);
    const auto [writer2, step2] = waitForSave(job, ckpt, std::max<int64_t>(step + 10, 120));
    REQUIRE(showingOutput(writer2 > 0, job));
    REQUIRE(writer2 != writer);
    REQUIRE(::kill(writer2, SIGKILL) == 0);
    secondKill = step2;
    const int code = finish(job);
    const std::string out = job.output();
    INFO(out);
    CHECK(code == 128 + SIGKILL);
    CHECK_THAT(out, Contains("rank 0 (local rank 0, pid " + std::to_string(writer) +
                             ") failed: signal 9 (SIGKILL); recovering in process (generation 1)"));
    CHECK_THAT(out, Contains("joined generation 1 and healed from rank 1's memory"));
    CHECK_THAT(out, Contains("Root cause (first observed failure)"));
    CHECK_FALSE(fs::exists(dir / "final.pt"));
  }
  // What the second kill left: the complete checkpoints before it (its own save may have been
  // renamed into place just before the signal landed, never half of it).
  const int64_t newest = newestCheckpoint(ckpt);
  REQUIRE(newest >= 40);
  REQUIRE(newest <= secondKill);
  Job again(underDdprun(2, dir.path(), {"--max-restarts=0"}), {}, dir / "log2");
  const int code = finish(again);
  const std::string out = again.output();
  INFO(out);
  REQUIRE(code == 0);
  CHECK_THAT(out, Contains("resumed from checkpoint at step " + std::to_string(newest)));
  CHECK_THAT(out, !Contains("skipping"));  // no torn file was met
  CHECK_THAT(out, Contains("done: 256 steps"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
  // The killed writers' temporary files are gone: a later save removes those of dead writers.
  for (const auto& e : fs::directory_iterator(ckpt)) {
    CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);
  }
}

TEST_CASE("a single rank with --spares=1: one line at the start says why no spare starts, "
          "SIGKILLed, it restarts from its newest checkpoint, weights bit-identical",
          "[recovery][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  RecoveryJob run(1, {"--max-restarts=1", "--recovery=in-process", "--spares=1"});
  Job& job = run.job;
  const auto pids = ranksOf(job, run.dir, 1);
  // Step 40 is long after a spare would have started (they start once the ranks announced).
  CHECK(sparePid(job.pid(), 0, "mnist_mlp") < 0);
  REQUIRE(::kill(pids[0], SIGKILL) == 0);
  const std::string out = run.succeeded();
  INFO(out);
  CHECK_THAT(out, Contains("--spares=1: no spare starts while the job has a single rank (world "
                           "size 1): in-process recovery heals a dead rank's new process from a "
                           "surviving rank's memory, and one rank leaves no survivor"));
  CHECK_THAT(out, !Contains("starting spare"));
  CHECK_THAT(out, !Contains("spare template"));
  // The refusal names the reason, not the announcement a single rank never makes.
  CHECK_THAT(out, Contains("--recovery=in-process: no worker survived to heal a replacement "
                           "from; restarting the group instead"));
  CHECK_THAT(out, !Contains("had not announced"));
  CHECK_THAT(out, Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains(doneLine(1)));
  CHECK(run.sameWeights());
}

TEST_CASE("under --recovery=auto, both ranks of two SIGKILLed at once: one line says why the "
          "in-process recovery is refused, the group restarts, weights bit-identical",
          "[recovery][slow]") {
  if (!haveData()) return skipWithoutData();
  // auto (the default) chose in-process: the bundled trainer runs the elastic loop.
  RecoveryJob run(2, {"--max-restarts=1"});
  Job& job = run.job;
  const auto pids = ranksOf(job, run.dir, 2);
  REQUIRE(ddprun::testing::killAtOnce({pids[0], pids[1]}, SIGKILL));
  const std::string out = run.succeeded();
  INFO(out);
  CHECK_THAT(out, Contains("--recovery=auto (in process: the workers run the runtime's elastic "
                           "loop): no worker survived to heal a replacement from; restarting "
                           "the group instead"));
  CHECK_THAT(out, !Contains("recovering in process (generation"));
  CHECK_THAT(out, Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains(doneLine(2)));
  CHECK(run.sameWeights());
}
