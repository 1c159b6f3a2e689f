// ddprun-bench recovery: what a worker's death costs a training job, per recovery mode, with
// torchrun restarting PyTorch DDP as the anchor, same run (issue 18; docs/recovery.md).
//
// Each mode trains the bundled mnist_mlp (torchrun: bench/ddp_mnist.py, the same model, data,
// batch and steps) twice per repeat with the same flags: once undisturbed, once while this
// benchmark SIGKILLs a worker k times, spread over the run. Time lost per failure =
// (wall time with k kills - wall time without) / k, one sample per repeat; the table shows p50
// and p95 over the repeats. Wall time is the launcher's, start to exit (start-up, data loading
// and every recovery count). The two runs of a repeat come in turns, undisturbed first in even
// repeats and killed first in odd ones, so that what a run leaves the next (the memory it freed,
// caches) falls on both sides alike.
//
// Where a kill lands: kill j waits until the job has checkpointed step t_j (t_j spread evenly
// over the run, at least two checkpoint intervals apart), then a seeded random fraction of the
// time between two checkpoints more, and SIGKILLs a seeded random rank (rank 0 included). Every
// mode of a repeat gets the same ranks and fractions. So a restart redoes, on average, half a
// checkpoint interval of steps, as it would after a crash at a random moment.
//
// Modes (--modes):
//   restart     ddprun --recovery=restart: every worker stopped and started, newest checkpoint
//   in-process  ddprun --recovery=in-process: survivors keep running, a replacement heals from
//               their memory (docs/recovery.md)
//   spare       ddprun --recovery=in-process --spares=1: a warm standby takes the rank (only
//               when `ddprun --help` lists --spares; otherwise skipped with a line saying so)
//   shrink      ddprun --recovery=in-process --recovery-policy=shrink: the survivors go on
//               without the dead rank (docs/recovery.md#shrink). The job still trains the
//               samples of --steps steps at the starting world size, in more, smaller steps
//               after a shrink, so its time lost also holds the change in throughput at fewer
//               ranks. A planned rank that a shrink already took is replaced by the next one of
//               the start's ranks still alive. Not in the default --modes; with 2 ranks and 2
//               kills the second leaves no survivor (a restart): use --nproc 3 or more.
//   shrink-spare  shrink with --spares=1: after the shrink a loaded spare grows the group back
//               at the survivors' next commit (with --kill-when-spare-ready: every death finds
//               one loaded). Not in the default --modes.
//               Plain shrink starts the spare template in the background (docs/recovery.md#
//               spare-template), and its replacement is a fork of it; with --kill-when-spare-
//               ready the kills wait until the template has loaded.
//   torchrun    torchrun (bench/torchrun_wrapper.py, Debian's torch 1.13) --max_restarts=k
//               restarting bench/ddp_mnist.py, which checkpoints at the same interval and
//               resumes from its newest checkpoint; --monitor_interval=0.1 by default (1.13's
//               default, 5 s, would add seconds per failure of pure waiting)
// --timeline-split: the ddprun modes run with --timeline, and each killed run's lost time is also
// split by step number into start-up and end, the failure's window and the rest of the training
// (recovery_timeline.h): the window's noise is a few ms where the whole run's is tenths of a s.
// Shrink modes are split by samples: their window runs to 20 steps after the group grew back.
// A run counts only when it exited 0, trained to its final step (the metrics summary says so)
// and every kill landed; otherwise the repeat is reported as failed, never as a time.
// bench/results/recovery.csv: one row per repeat and mode, then p50/p95 rows.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/process.h"
#include "bench/paths.h"
#include "bench/recovery_timeline.h"
#include "bench/registry.h"
#include "launcher/worker_lookup.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int> nprocs{2, 4};
  std::vector<std::string> modes{"restart", "in-process", "spare", "torchrun"};
  int repeats = 20;
  int kills = 2;
  int steps = 400;
  int checkpointInterval = 20;
  int batchSize = 32;
  int trainLimit = 12800;
  double lr = 0.05;
  uint64_t seed = 1;
  double torchrunMonitorInterval = 0.1;
  double runTimeout = 600;  // seconds: a run that takes longer is killed and counted as failed
  std::string python = "/usr/bin/python3";
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string csv = ddprun::bench::resultsPath("recovery.csv");
  std::string workDir;
  // spare mode: arm each kill only once a spare is loaded (a death rarer than a spare's start-up,
  // as in a long job); by default every mode is killed at the same steps.
  bool killWhenSpareReady = false;
  // ddprun modes run with --timeline, and the lost time is split by part (recovery_timeline.h)
  bool timelineSplit = false;
};

// The kills of one run: which rank, and how far (0..1 of a checkpoint interval) past t_j.
struct KillPlan {
  std::vector<int> targets;  // checkpointed step after which kill j is armed
  std::vector<int> ranks;
  std::vector<double> fractions;
};

struct RunResult {
  bool ok = false;
  std::string why;  // when !ok
  double wallSeconds = 0;
  int killsDone = 0;
  int inProcessRecoveries = 0;  // ddprun's "recovering in process" lines
  int groupRestarts = 0;        // ddprun's "restarting the worker group" lines
  // Per in-process recovery: the slowest survivor's "recovered in process in N ms" (from the
  // death's notice to its loop running again), in ms.
  std::vector<double> survivorStallMs;
  // spare mode: the deaths whose spare had logged "ready" before the agent saw the death.
  int spareReady = 0;
  // --timeline-split, ddprun modes: the run's timeline (or why there is none)
  std::optional<ddprun::bench::RunTimeline> timeline;
  std::string timelineWhy;
};

// The spare mode's deaths at which the spare that took the rank was already loaded: the time of
// the spare's "spare N (pid P) ready" line against the agent's "spare N (pid P) takes rank" line
// (same clock, same day: the log's HH:MM:SS.mmm stamps compare as strings). Pure.
int sparesReadyAtDeath(const std::string& log) {
  static const std::regex ready(R"(\[ddprun I (\S+) runtime spare \d+\] spare (\d+) \(pid (\d+)\) ready)");
  static const std::regex takes(
      R"(\[ddprun W (\S+) launcher\] .*spare (\d+) \(pid (\d+)\)(?: is ready and)? takes rank)");
  std::map<std::string, std::string> readyAt;  // "id/pid" -> stamp
  for (std::sregex_iterator it(log.begin(), log.end(), ready), end; it != end; ++it) {
    readyAt[(*it)[2].str() + "/" + (*it)[3].str()] = (*it)[1];
  }
  int n = 0;
  for (std::sregex_iterator it(log.begin(), log.end(), takes), end; it != end; ++it) {
    const auto r = readyAt.find((*it)[2].str() + "/" + (*it)[3].str());
    if (r != readyAt.end() && r->second <= (*it)[1].str()) ++n;
  }
  return n;
}

std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int countOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Whether the agent's log says a spare template started and has neither loaded nor ended ("the
// spare template (pid N) exited"; also part of "forked from the spare template (pid N)", which
// only a loaded template does).
bool templateLoading(const std::string& log) {
  return countOf(log, "starting the spare template") > 0 &&
         countOf(log, ") ready: loaded, forks the spares") == 0 &&
         countOf(log, "the spare template (pid ") == 0;
}

// The newest checkpoint step in `dir` (ckpt-<step>.ddpck of mnist_mlp, ckpt-<step>.pt of
// ddp_mnist.py; both rename a complete file into place), or -1.
int newestCheckpoint(const fs::path& dir) {
  static const std::regex name(R"(ckpt-(\d+)\.(ddpck|pt))");
  int newest = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string f = e.path().filename().string();
    if (std::regex_match(f, m, name)) newest = std::max(newest, std::stoi(m[1]));
  }
  return newest;
}

using ddprun::launcher::lookup::procComm;
using ddprun::launcher::lookup::workerPid;  // the rule, shared with the tests

bool isShrink(const std::string& mode) { return mode == "shrink" || mode == "shrink-spare"; }
bool hasSpare(const std::string& mode) { return mode == "spare" || mode == "shrink-spare"; }

// The spare that holds global rank `rank` by the agent's newest "spare N (pid P) takes rank R"
// line for it, if P is alive (not a zombie) and still runs `comm` (pids are reused); else -1
// (no spare took it, or that one died: a process started for the rank has RANK=<rank>,
// workerPid finds it).
pid_t spareHolding(const std::string& log, int rank, const std::string& comm) {
  static const std::regex takes(R"(spare \d+ \(pid (\d+)\)(?: is ready and)? takes rank (\d+))");
  pid_t holder = -1;
  for (std::sregex_iterator it(log.begin(), log.end(), takes), end; it != end; ++it) {
    if (std::stoi((*it)[2]) == rank) holder = static_cast<pid_t>(std::stol((*it)[1]));
  }
  if (holder <= 0 || ddprun::processDead(holder)) return -1;
  return procComm(holder) == comm.substr(0, 15) ? holder : -1;
}

// Starts argv in a process group of its own, stdout and stderr to `log`.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

// The steps of the last {"kind":"summary"} line of a metrics file, or -1.
int64_t summarySteps(const fs::path& metrics) {
  std::ifstream in(metrics);
  int64_t steps = -1;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == "summary") steps = j.value("steps", int64_t{-1});
  }
  return steps;
}

class Bench {
 public:
  explicit Bench(Options o) : o_(std::move(o)) {}

  std::vector<std::string> command(const std::string& mode, int nproc, const fs::path& dir) const {
    const std::string bin = ddprun::bench::programDir();
    const std::string ckpt = (dir / "ckpt").string();
    const std::string metrics = (dir / "metrics.jsonl").string();
    const std::string k = std::to_string(o_.kills);
    if (mode == "torchrun") {
      char interval[32];
      std::snprintf(interval, sizeof interval, "%g", o_.torchrunMonitorInterval);
      return {o_.python, ddprun::bench::scriptPath("torchrun_wrapper.py"), "--standalone",
              "--nproc_per_node=" + std::to_string(nproc), "--max_restarts=" + k,
              std::string("--monitor_interval=") + interval,
              ddprun::bench::scriptPath("ddp_mnist.py"), "--model", "mlp", "--data", o_.data,
              "--train-limit", std::to_string(o_.trainLimit), "--batch-size",
              std::to_string(o_.batchSize), "--lr", std::to_string(o_.lr), "--steps",
              std::to_string(o_.steps), "--metrics", metrics, "--checkpoint-dir", ckpt,
              "--checkpoint-interval", std::to_string(o_.checkpointInterval)};
    }
    std::vector<std::string> argv{bin + "/ddprun", "--standalone",
                                  "--nproc-per-node=" + std::to_string(nproc),
                                  "--max-restarts=" + k};
    if (mode == "restart") argv.push_back("--recovery=restart");
    if (mode != "restart") argv.push_back("--recovery=in-process");
    if (isShrink(mode)) argv.push_back("--recovery-policy=shrink");
    if (hasSpare(mode)) argv.push_back("--spares=1");
    if (o_.timelineSplit) argv.push_back("--timeline=" + (dir / "timeline.json").string());
    argv.insert(argv.end(),
                {bin + "/mnist_mlp", "--data", o_.data, "--train-limit",
                 std::to_string(o_.trainLimit), "--test-limit", "100", "--batch-size",
                 std::to_string(o_.batchSize), "--lr", std::to_string(o_.lr), "--lr-schedule",
                 "constant", "--max-steps", std::to_string(o_.steps), "--epochs", "1000",
                 "--evaluate", "false", "--log-interval", "1000000", "--metrics", metrics,
                 "--checkpoint-dir", ckpt, "--checkpoint-interval",
                 std::to_string(o_.checkpointInterval)});
    return argv;
  }

  // The kill plan of (nproc, repeat): the same for every mode.
  KillPlan plan(int nproc, int repeat, int kills) const {
    KillPlan p;
    std::mt19937_64 rng(o_.seed * 1000003u + static_cast<uint64_t>(nproc) * 101u +
                        static_cast<uint64_t>(repeat));
    std::uniform_int_distribution<int> rank(0, nproc - 1);
    std::uniform_real_distribution<double> fraction(0.0, 1.0);
    const int c = o_.checkpointInterval;
    for (int j = 0; j < kills; ++j) {
      const int spread = o_.steps * (j + 1) / (kills + 1) / c * c;
      p.targets.push_back(std::max(2 * c, spread));
      p.ranks.push_back(rank(rng));
      p.fractions.push_back(fraction(rng));
    }
    return p;
  }

  // One job, killed as `plan` says (no kills: plan.targets empty).
  RunResult run(const std::string& mode, int nproc, const KillPlan& plan, const fs::path& dir) {
    fs::remove_all(dir);
    fs::create_directories(dir / "ckpt");
    const std::string log = (dir / "log").string();
    const std::string program = mode == "torchrun" ? "python3" : "mnist_mlp";
    RunResult r;
    const auto start = Clock::now();
    const pid_t pid = spawn(command(mode, nproc, dir), log);
    std::map<int, Clock::time_point> seen;  // checkpoint step -> when it was first seen
    double interval = 0;                    // seconds between two checkpoints, last measured
    // When the next kill lands; kNever while it is not armed.
    constexpr Clock::time_point kNever = Clock::time_point::max();
    Clock::time_point killAt = kNever;
    int status = 0;
    bool exited = false;
    while (!exited) {
      const pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid) {
        exited = true;
        break;
      }
      const auto now = Clock::now();
      if (std::chrono::duration<double>(now - start).count() > o_.runTimeout) {
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        r.why = "timed out after " + std::to_string(static_cast<int>(o_.runTimeout)) + " s";
        r.wallSeconds = std::chrono::duration<double>(Clock::now() - start).count();
        return r;
      }
      const int newest = newestCheckpoint(dir / "ckpt");
      if (newest >= 0 && !seen.count(newest)) {
        seen[newest] = now;
        if (auto prev = seen.find(newest - o_.checkpointInterval); prev != seen.end()) {
          interval = std::chrono::duration<double>(now - prev->second).count();
        }
      }
      const size_t j = static_cast<size_t>(r.killsDone);
      if (j < plan.targets.size()) {
        if (killAt == kNever && newest >= plan.targets[j]) {
          killAt = now + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(plan.fractions[j] * interval));
        }
        // --kill-when-spare-ready: not before spare j (one per death so far) has loaded, nor
        // while the spare template the job started with is still loading (at normal priority,
        // beside the ranks: in a long job it has long loaded, and the spare started after the
        // death is a fork of it, not a process loading LibTorch).
        bool due = now >= killAt;
        if (due && hasSpare(mode) && o_.killWhenSpareReady) {
          const std::string text = readFile(log);
          if (countOf(text, ") ready: loaded, waiting for a rank") <= r.killsDone ||
              templateLoading(text)) {
            due = false;
          }
        }
        // shrink without spares: not before the spare template (which forks the replacement
        // that grows the group back) has loaded.
        if (due && mode == "shrink" && o_.killWhenSpareReady &&
            countOf(readFile(log), ") ready: loaded, forks the spares") == 0) {
          due = false;
        }
        if (due) {
          // A spare that took the rank has no RANK=<rank> of its own: the agent's line names it.
          pid_t victim = hasSpare(mode) ? spareHolding(readFile(log), plan.ranks[j], program) : -1;
          if (victim <= 0) victim = workerPid(pid, plan.ranks[j], program);
          // shrink: the start's rank may be gone; the next one of the start's ranks alive.
          for (int d = 1; isShrink(mode) && victim <= 0 && d < nproc; ++d) {
            victim = workerPid(pid, (plan.ranks[j] + d) % nproc, program);
          }
          if (victim > 0 && ::kill(victim, SIGKILL) == 0) {
            ++r.killsDone;
            killAt = kNever;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    r.wallSeconds = std::chrono::duration<double>(Clock::now() - start).count();
    const std::string output = readFile(log);
    r.inProcessRecoveries = countOf(output, "recovering in process");
    r.groupRestarts = countOf(output, "restarting the worker group");
    if (hasSpare(mode)) r.spareReady = sparesReadyAtDeath(output);
    if (o_.timelineSplit && mode != "torchrun") {
      r.timeline = ddprun::bench::readRunTimeline((dir / "timeline.json").string(), &r.timelineWhy);
    }
    {
      static const std::regex stall(R"(recovered in process in (\d+) ms: generation (\d+))");
      std::map<int, double> slowest;  // generation -> ms
      for (std::sregex_iterator it(output.begin(), output.end(), stall), end; it != end; ++it) {
        double& ms = slowest[std::stoi((*it)[2])];
        ms = std::max(ms, std::stod((*it)[1]));
      }
      for (const auto& [g, ms] : slowest) r.survivorStallMs.push_back(ms);
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const int64_t trained = summarySteps(dir / "metrics.jsonl");
    if (code != 0) {
      r.why = "exited " + std::to_string(code) + " (" + log + ")";
    } else if (isShrink(mode) ? trained < o_.steps : trained != o_.steps) {
      r.why = "trained " + std::to_string(trained) + " of " + std::to_string(o_.steps) +
              " steps (" + log + ")";
    } else if (r.killsDone != static_cast<int>(plan.targets.size())) {
      r.why = "the job ended after " + std::to_string(r.killsDone) + " of " +
              std::to_string(plan.targets.size()) + " kills (" + log + ")";
    } else {
      r.ok = true;
    }
    ::kill(-pid, SIGKILL);  // whatever is left of its process group
    return r;
  }

  const Options& options() const { return o_; }

 private:
  Options o_;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  // Nearest rank: the smallest value with at least p of the samples at or below it.
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::string label(const std::string& mode) {
  return mode == "torchrun" ? "torchrun (PyTorch DDP)" : "ddprun " + mode;
}

std::string csvName(const std::string& mode) {
  return mode == "torchrun" ? "torchrun" : "ddprun-" + mode;
}

bool ddprunHasSpares(const fs::path& work) {
  const std::string log = (work / "help.log").string();
  const pid_t pid = spawn({ddprun::bench::programDir() + "/ddprun", "--help"}, log);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return readFile(log).find("--spares") != std::string::npos;
}

std::vector<int> parseInts(const std::string& s) {
  std::vector<int> out;
  std::istringstream in(s);
  for (std::string x; std::getline(in, x, ',');) out.push_back(std::stoi(x));
  return out;
}

// --timeline-split: per mode and size, p50 and p95 over the repeats of each part of the time
// lost per failure (recovery_timeline.h), in ms.
template <typename SplitsOf>
void printSplits(const Options& o, SplitsOf splitsOf) {
  std::printf("\nwhere the time lost per failure goes (--timeline-split; ms, p50 / p95 over the "
              "repeats; window: %lld steps before the recovery to %lld after, against the same "
              "steps undisturbed; shrink: to %lld after the group grew back, against the same "
              "samples)\n",
              static_cast<long long>(ddprun::bench::kWindowBefore),
              static_cast<long long>(ddprun::bench::kWindowAfter),
              static_cast<long long>(ddprun::bench::kWindowAfter));
  std::printf("| %-24s | ranks | start-up + end | failure's window | rest of training | total |\n",
              "mode");
  std::printf("|--------------------------|-------|----------------|------------------|------------------|-------|\n");
  for (int n : o.nprocs) {
    for (const auto& mode : o.modes) {
      std::vector<double> edges, windows, rests, totals;
      for (const auto& s : splitsOf(mode, n)) {
        double w = 0;
        bool whole = true;
        for (const auto& x : s.window) whole = whole && x.has_value(), w += x.value_or(0.0);
        if (!whole || s.window.empty()) continue;  // a window cut by the run's start or end
        const double k = static_cast<double>(s.window.size());
        edges.push_back((s.startup + s.end) / k * 1e3);
        windows.push_back(w / k * 1e3);
        rests.push_back(s.rest() / k * 1e3);
        totals.push_back((s.startup + s.end + s.training) / k * 1e3);
      }
      if (windows.empty()) continue;
      auto cell = [](const std::vector<double>& v) {
        char b[48];
        std::snprintf(b, sizeof b, "%.0f / %.0f", percentile(v, 0.5), percentile(v, 0.95));
        return std::string(b);
      };
      std::printf("| %-24s | %5d | %14s | %16s | %16s | %s (%zu) |\n", label(mode).c_str(), n,
                  cell(edges).c_str(), cell(windows).c_str(), cell(rests).c_str(),
                  cell(totals).c_str(), windows.size());
    }
  }
}

int benchRecovery(int argc, char** argv) {
  Options o;
  std::string nprocs = "2,4", modes = "restart,in-process,spare,torchrun";
  CLI::App app{"ddprun-bench recovery: time lost per worker death (SIGKILL of a random rank, k "
               "per run), ddprun's recovery modes vs torchrun restarting PyTorch DDP. A quick "
               "run: --repeats 3 --steps 200 --nproc 2",
               "ddprun-bench recovery"};
  app.add_option("--nproc", nprocs, "world sizes, comma-separated (default 2,4)");
  app.add_option("--modes", modes,
                 "comma-separated: restart, in-process, spare, shrink, shrink-spare, torchrun (default: "
                 "all but shrink and shrink-spare)");
  app.add_option("--repeats", o.repeats, "pairs of runs (undisturbed, killed) per mode and size")
      ->check(CLI::Range(1, 100));
  app.add_option("--kills", o.kills, "SIGKILLs per killed run, spread over it")
      ->check(CLI::Range(1, 20));
  app.add_option("--steps", o.steps, "optimizer steps per job")->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-interval", o.checkpointInterval, "steps between checkpoints")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batchSize, "per rank")->check(CLI::PositiveNumber);
  app.add_option("--train-limit", o.trainLimit, "training examples loaded")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "which ranks are killed and when (same for every mode)");
  app.add_option("--torchrun-monitor-interval", o.torchrunMonitorInterval,
                 "torchrun's --monitor_interval, seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--run-timeout", o.runTimeout, "seconds after which a run counts as failed")
      ->check(CLI::PositiveNumber);
  app.add_option("--python", o.python, "python3 with torch (torchrun mode)");
  app.add_option("--data", o.data, "MNIST-format data directory");
  app.add_option("--csv", o.csv, "results file");
  app.add_option("--work-dir", o.workDir, "logs, checkpoints and metrics of the runs");
  app.add_flag("--kill-when-spare-ready", o.killWhenSpareReady,
               "spare modes: arm each kill only once a spare (and the spare template the job "
               "starts with) has loaded (shrink: the spare template; deaths rarer than a spare's start-up, as in a long job); by default the kills come at the same steps "
               "in every mode, and the summary says at how many deaths the spare was loaded. The "
               "spare started after a death runs at SCHED_IDLE: with no idle core it may not load "
               "before the job ends, so use it with --kills 1 or long jobs");
  app.add_flag("--timeline-split", o.timelineSplit,
               "ddprun modes run with --timeline, and the time lost per failure is split into "
               "start-up and end, the failure's window (5 steps before the recovery to 20 after, "
               "against the same steps undisturbed; shrink modes: to 20 steps after the group "
               "grew back, against the same samples undisturbed) and the rest of the training");
  try {
    app.parse(argc, argv);
    o.nprocs = parseInts(nprocs);
    o.modes.clear();
    std::istringstream in(modes);
    for (std::string m; std::getline(in, m, ',');) {
      if (m != "restart" && m != "in-process" && m != "spare" && m != "shrink" &&
          m != "shrink-spare" && m != "torchrun") {
        throw CLI::ValidationError("--modes", "unknown mode '" + m + "'");
      }
      o.modes.push_back(m);
    }
    for (int n : o.nprocs) {
      if (n < 2 || n > 64) throw CLI::ValidationError("--nproc", "world size " + std::to_string(n) + " is not in 2..64");
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::cerr << "ddprun-bench recovery: --nproc '" << nprocs << "': " << e.what() << "\n";
    return 2;
  }
  const int c = o.checkpointInterval;
  // Kill j waits for step t_j and may land up to a checkpoint interval later; the next one must
  // be armed by a checkpoint written after it, and the last must land before the end.
  if (o.steps < (o.kills + 1) * 2 * c + c) {
    std::cerr << "ddprun-bench recovery: --steps " << o.steps << " is too few for --kills "
              << o.kills << " at --checkpoint-interval " << c << " (need at least "
              << (o.kills + 1) * 2 * c + c << ")\n";
    return 2;
  }
  if (o.workDir.empty()) {
    char tmpl[] = "/tmp/ddprun-bench-recovery-XXXXXX";
    o.workDir = ::mkdtemp(tmpl);
  }
  const fs::path work = o.workDir;
  fs::create_directories(work);
  for (const char* m : {"spare", "shrink-spare"}) {
    if (std::find(o.modes.begin(), o.modes.end(), m) != o.modes.end() && !ddprunHasSpares(work)) {
      std::printf("%s: skipped (this ddprun has no --spares: `ddprun --help` does not list it)\n", m);
      o.modes.erase(std::find(o.modes.begin(), o.modes.end(), m));
    }
  }
  double loadStart[1] = {0};
  ::getloadavg(loadStart, 1);
  std::printf("recovery: mnist_mlp, %d steps, batch %d per rank, checkpoint every %d steps, %d "
              "kill(s) per killed run, %d repeat(s); load average %.2f on %ld CPUs; logs in %s\n",
              o.steps, o.batchSize, c, o.kills, o.repeats, loadStart[0],
              ::sysconf(_SC_NPROCESSORS_ONLN), work.c_str());
  std::fflush(stdout);

  Bench bench(o);
  struct Sample {
    double clean = 0, killed = 0;
    std::string status;  // "ok" or why not
    int inProcess = 0, restarts = 0;
    std::vector<double> stallMs;  // the killed run's survivorStallMs
    int spareReady = 0;           // the killed run's spareReady
    std::optional<ddprun::bench::TimeSplit> split;  // --timeline-split
  };
  std::map<std::pair<std::string, int>, std::vector<Sample>> samples;
  // Repeats outermost, modes alternating inside: drift on the machine spreads over all modes.
  for (int rep = 0; rep < o.repeats; ++rep) {
    for (int n : o.nprocs) {
      const KillPlan plan = bench.plan(n, rep, o.kills);
      for (const auto& mode : o.modes) {
        const fs::path dir = work / (mode + "-" + std::to_string(n) + "-" + std::to_string(rep));
        Sample s;
        // In turns (see the top): the second run of a pair ran ~0.15 ms per step slower even
        // before its kill (4 ranks, spare; stop 72, docs/recovery.md#measured).
        RunResult clean, killed;
        if (rep % 2 == 0) {
          clean = bench.run(mode, n, {}, dir / "clean");
          killed = bench.run(mode, n, plan, dir / "killed");
        } else {
          killed = bench.run(mode, n, plan, dir / "killed");
          clean = bench.run(mode, n, {}, dir / "clean");
        }
        s.clean = clean.wallSeconds;
        s.killed = killed.wallSeconds;
        s.inProcess = killed.inProcessRecoveries;
        s.restarts = killed.groupRestarts;
        s.stallMs = killed.survivorStallMs;
        s.spareReady = killed.spareReady;
        if (clean.timeline && killed.timeline) {
          s.split = ddprun::bench::splitLostTime(
              *clean.timeline, *killed.timeline,
              isShrink(mode) ? ddprun::bench::SplitBy::samples : ddprun::bench::SplitBy::steps);
        } else if (o.timelineSplit && mode != "torchrun") {
          std::printf("  (no split for this repeat: %s)\n",
                      (clean.timeline ? killed.timelineWhy : clean.timelineWhy).c_str());
        }
        s.status = !clean.ok    ? "failed: undisturbed run " + clean.why
                   : !killed.ok ? "failed: killed run " + killed.why
                                : "ok";
        std::string ranks;
        for (int r : plan.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
        if (s.status == "ok") {
          std::printf("  %-24s %d ranks  repeat %2d: undisturbed %6.2f s, %d kill(s) of rank %s "
                      "%6.2f s: %6.3f s per failure",
                      label(mode).c_str(), n, rep + 1, s.clean, o.kills, ranks.c_str(), s.killed,
                      (s.killed - s.clean) / o.kills);
          if (mode != "torchrun") std::printf(" (%d in process, %d restarts)", s.inProcess, s.restarts);
          std::printf("\n");
        } else {
          std::printf("  %-24s %d ranks  repeat %2d: %s\n", label(mode).c_str(), n, rep + 1,
                      s.status.c_str());
        }
        std::fflush(stdout);
        samples[{mode, n}].push_back(s);
      }
    }
  }
  double loadEnd[1] = {0};
  ::getloadavg(loadEnd, 1);

  fs::create_directories(fs::path(o.csv).parent_path().empty() ? "." : fs::path(o.csv).parent_path());
  std::ofstream csv(o.csv, std::ios::trunc);
  csv << "mode,ranks,repeat,undisturbed_s,killed_s,kills,lost_per_failure_s,in_process_recoveries,"
         "group_restarts,status,load_start,load_end\n";
  std::printf("\ntime lost per failure (%d kill(s) per run, %d repeat(s); p95 is the nearest rank, "
              "the maximum below 20 repeats); load average %.2f at the start, %.2f at the end\n",
              o.kills, o.repeats, loadStart[0], loadEnd[0]);
  std::printf("| %-24s | ranks | undisturbed s (p50) | lost p50 s | lost p95 s | runs ok |\n", "mode");
  std::printf("|--------------------------|-------|---------------------|------------|------------|---------|\n");
  int failed = 0;
  for (int n : o.nprocs) {
    for (const auto& mode : o.modes) {
      const auto& v = samples[{mode, n}];
      std::vector<double> lost, clean;
      for (size_t i = 0; i < v.size(); ++i) {
        const Sample& s = v[i];
        const bool ok = s.status == "ok";
        csv << csvName(mode) << ',' << n << ',' << i + 1 << ',' << s.clean << ',' << s.killed << ','
            << o.kills << ',';
        if (ok) csv << (s.killed - s.clean) / o.kills;
        csv << ',' << s.inProcess << ',' << s.restarts << ",\"" << s.status << "\","
            << loadStart[0] << ',' << loadEnd[0] << '\n';
        if (!ok) {
          ++failed;
          continue;
        }
        lost.push_back((s.killed - s.clean) / o.kills);
        clean.push_back(s.clean);
      }
      const double p50 = percentile(lost, 0.5), p95 = percentile(lost, 0.95);
      std::printf("| %-24s | %5d | %19.2f | %10.3f | %10.3f | %3zu of %zu |\n", label(mode).c_str(),
                  n, percentile(clean, 0.5), p50, p95, lost.size(), v.size());
      if (!lost.empty()) {
        csv << csvName(mode) << ',' << n << ",p50," << percentile(clean, 0.5) << ",," << o.kills
            << ',' << p50 << ",,,ok," << loadStart[0] << ',' << loadEnd[0] << '\n';
        csv << csvName(mode) << ',' << n << ",p95,,," << o.kills << ',' << p95 << ",,,ok,"
            << loadStart[0] << ',' << loadEnd[0] << '\n';
      }
    }
  }
  // The survivors' own view of each in-process recovery: the slowest survivor's time from the
  // death's notice to its loop running again (its log line), over every killed run that passed.
  std::printf("\nsurvivors back after an in-process recovery (slowest survivor's \"recovered in "
              "process in N ms\", per recovery)\n");
  for (int n : o.nprocs) {
    for (const auto& mode : o.modes) {
      std::vector<double> ms;
      int ready = 0, deaths = 0;
      for (const Sample& s : samples[{mode, n}]) {
        if (s.status != "ok") continue;
        ms.insert(ms.end(), s.stallMs.begin(), s.stallMs.end());
        ready += s.spareReady;
        deaths += o.kills;
      }
      if (ms.empty()) continue;
      std::printf("  %-24s %d ranks: p50 %.0f ms, p95 %.0f ms (%zu recoveries)", label(mode).c_str(),
                  n, percentile(ms, 0.5), percentile(ms, 0.95), ms.size());
      if (hasSpare(mode)) std::printf("; the spare was loaded at %d of %d deaths", ready, deaths);
      std::printf("\n");
    }
  }
  if (o.timelineSplit) printSplits(o, [&](const std::string& mode, int n) {
    std::vector<ddprun::bench::TimeSplit> out;
    for (const Sample& s : samples[{mode, n}]) {
      if (s.status == "ok" && s.split) out.push_back(*s.split);
    }
    return out;
  });
  std::printf("results: %s\n", o.csv.c_str());
  if (failed > 0) std::printf("%d repeat(s) failed (see the lines above and their logs)\n", failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace

DDPRUN_BENCH("recovery",
             "time lost per worker death: ddprun restart / in-process / spare vs torchrun "
             "restarting PyTorch DDP",
             benchRecovery)
