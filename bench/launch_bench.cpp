// ddprun-bench launch: ddprun against torchrun (torch 1.13), same run, on what a launcher
// itself costs:
//   - wall time of `--standalone --nproc-per-node=4 true` (launcher start to exit);
//   - restart latency: worker 0 of the first attempt exits 1; time from just before that exit
//     to the moment the last worker of the replacement group runs its first command;
//   - the launcher's peak RSS: VmHWM of the launcher process itself, read from /proc when it
//     is about to exit (the benchmark traces it with PTRACE_O_TRACEEXIT; nothing else is
//     traced). wait4's ru_maxrss cannot serve: it keeps the high-water mark of the forking
//     parent (ddprun-bench maps libtorch) across exec.
// torchrun runs through bench/torchrun_wrapper.py (Debian's torchrun crashes under Python
// 3.11 otherwise) at --monitor_interval=0.1 and, for the wall time, also at 1.13's default 5 s.
// Workers are /bin/sh scripts; their timestamps come from `date +%s%N` (~1 ms each), the
// same for both launchers. Prints a table with ratios; writes bench/results/launch.csv.
// --realtime runs both launchers (and so their workers) under SCHED_FIFO, so that other work
// on a shared machine does not stretch the wall times of either (needs root).
#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/paths.h"
#include "bench/registry.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  int runs = 20;          // ddprun repetitions per measurement
  int torchrunRuns = 3;   // torchrun repetitions per measurement (each takes seconds)
  bool torchrun = true;
  bool torchrunDefaultInterval = true;
  std::string python = "/usr/bin/python3";
  bool realtime = false;
  std::string csv = ddprun::bench::resultsPath("launch.csv");
};

struct Sample {
  double wallMs = 0;
  int exitCode = -1;
};

bool gRealtime = false;  // --realtime: spawn the launchers under SCHED_FIFO

int exitCodeOf(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs argv to completion (stdout and stderr to `log`) and measures its wall time. posix_spawn
// (vfork + exec) keeps the cost of copying ddprun-bench's large address space out of it.
Sample run(const std::vector<std::string>& argv, const std::string& log) {
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
  if (gRealtime) {
    sched_param param{.sched_priority = 10};
    posix_spawnattr_setschedpolicy(&attr, SCHED_FIFO);
    posix_spawnattr_setschedparam(&attr, &param);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSCHEDULER);
  }
  const auto start = Clock::now();
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) std::cerr << "cannot start " << args[0] << ": " << std::strerror(rc) << "\n";
  Sample s;
  if (rc != 0) return s;
  int status = 0;
  ::waitpid(pid, &status, 0);
  s.wallMs = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  s.exitCode = exitCodeOf(status);
  return s;
}

// VmHWM of /proc/PID/status in MiB (0 when unreadable).
double vmHwmMiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// Runs argv to completion under ptrace, stopping it only at exec and at its exit, and returns
// the peak RSS of that process itself (not of its children) just before it exits.
double peakRssMiB(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  double peak = 0;
  int status = 0;
  ::waitpid(pid, &status, 0);  // the stop at exec
  ::ptrace(PTRACE_SETOPTIONS, pid, nullptr, reinterpret_cast<void*>(PTRACE_O_TRACEEXIT));
  ::ptrace(PTRACE_CONT, pid, nullptr, nullptr);
  while (::waitpid(pid, &status, 0) == pid && WIFSTOPPED(status)) {
    long deliver = 0;
    if ((status >> 8) == (SIGTRAP | (PTRACE_EVENT_EXIT << 8))) {
      peak = vmHwmMiB(pid);
    } else {
      deliver = WSTOPSIG(status);  // a signal for the launcher (SIGCHLD...): pass it on
    }
    ::ptrace(PTRACE_CONT, pid, nullptr, reinterpret_cast<void*>(deliver));
  }
  return peak;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The restart worker: attempt 0's rank 0 records the time and exits 1 (the others wait to be
// stopped); in attempt 1 every rank records when it runs, then exits 0.
constexpr const char* kRestartWorker = R"(#!/bin/sh
t=$(date +%s%N)
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 0 ]; then date +%s%N > "$1/failed"; exit 1; fi
  exec sleep 60
fi
echo "$t" > "$1/started.$RANK"
)";

// Nanoseconds from attempt 0's failure to the last replacement worker's start.
std::optional<double> restartLatencyMs(const fs::path& dir, int nproc) {
  const std::string failed = readFile(dir / "failed");
  if (failed.empty()) return std::nullopt;
  long long last = 0;
  for (int r = 0; r < nproc; ++r) {
    const std::string s = readFile(dir / ("started." + std::to_string(r)));
    if (s.empty()) return std::nullopt;
    last = std::max(last, std::stoll(s));
  }
  return static_cast<double>(last - std::stoll(failed)) / 1e6;
}

struct Series {
  std::string name;
  std::vector<double> wallMs, rssMiB, restartMs;
  int failures = 0;
};

// One launcher: `prefix` is its argv up to PROGRAM.
Series measure(const std::string& name, const std::vector<std::string>& prefix, int runs,
               bool restarts, const fs::path& work) {
  Series s{.name = name};
  constexpr int kNproc = 4;
  for (int i = 0; i < runs; ++i) {
    auto argv = prefix;
    argv.push_back("/bin/true");
    Sample w = run(argv, (work / (name + ".wall.log")).string());
    if (w.exitCode != 0) {
      ++s.failures;
      std::cerr << name << ": `true` job exited " << w.exitCode << " (see "
                << (work / (name + ".wall.log")).string() << ")\n";
      continue;
    }
    s.wallMs.push_back(w.wallMs);
  }
  for (int i = 0; i < std::min(runs, 3); ++i) {
    auto argv = prefix;
    argv.push_back("/bin/true");
    s.rssMiB.push_back(peakRssMiB(argv, (work / (name + ".rss.log")).string()));
  }
  if (!restarts) return s;
  const fs::path script = work / "restart_worker.sh";
  for (int i = 0; i < runs; ++i) {
    const fs::path dir = work / (name + ".restart." + std::to_string(i));
    fs::create_directories(dir);
    auto argv = prefix;
    argv.insert(argv.end() - (argv.back() == "--no_python" ? 1 : 0),
                name.rfind("ddprun", 0) == 0 ? "--max-restarts=1" : "--max_restarts=1");
    argv.push_back(script.string());
    argv.push_back(dir.string());
    Sample r = run(argv, (dir / "launcher.log").string());
    auto latency = restartLatencyMs(dir, kNproc);
    if (r.exitCode != 0 || !latency) {
      ++s.failures;
      std::cerr << name << ": restart run exited " << r.exitCode << " (see " << dir.string()
                << "/launcher.log)\n";
      continue;
    }
    s.restartMs.push_back(*latency);
  }
  return s;
}

std::string fmt(double v, const char* unit) {
  char buf[64];
  if (v <= 0) return "-";
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f %s" : "%.1f %s", v, unit);
  return buf;
}

int benchLaunch(int argc, char** argv) {
  Options o;
  CLI::App app{"ddprun-bench launch: ddprun vs torchrun -- wall time of 4 no-op workers, "
               "restart latency, launcher peak RSS"};
  app.add_option("--runs", o.runs, "ddprun repetitions per measurement")->check(CLI::PositiveNumber);
  app.add_option("--torchrun-runs", o.torchrunRuns, "torchrun repetitions per measurement")
      ->check(CLI::PositiveNumber);
  app.add_flag("!--no-torchrun", o.torchrun, "measure ddprun only");
  app.add_flag("!--no-default-interval", o.torchrunDefaultInterval,
               "skip torchrun at its 1.13 default --monitor_interval=5 (6 s per run)");
  app.add_option("--python", o.python, "the python3 that has torch");
  app.add_flag("--realtime", o.realtime,
               "run both launchers under SCHED_FIFO, so other load on the machine does not "
               "stretch wall times (root only)");
  app.add_option("--csv", o.csv, "where to write the results");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  gRealtime = o.realtime;
  char tmpl[] = "/tmp/ddprun-bench-launch-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const fs::path work = tmpl;
  {
    std::ofstream(work / "restart_worker.sh") << kRestartWorker;
    fs::permissions(work / "restart_worker.sh", fs::perms::owner_all);
  }
  const std::string ddprun = ddprun::bench::programDir() + "/ddprun";
  const std::string wrapper = ddprun::bench::scriptPath("torchrun_wrapper.py");
  const bool haveTorch =
      o.torchrun && run({o.python, "-c", "import torch.distributed.run"},
                        (work / "probe.log").string()).exitCode == 0;
  if (o.torchrun && !haveTorch) {
    std::cout << "torchrun: " << o.python << " has no torch (Debian python3-torch): measuring "
              << "ddprun only\n";
  }

  double load[1] = {0};
  ::getloadavg(load, 1);
  std::vector<Series> series;
  std::cout << "measuring ddprun (" << o.runs << " runs each)..." << std::endl;
  series.push_back(measure("ddprun", {ddprun, "--standalone", "--nproc-per-node=4"}, o.runs,
                           true, work));
  if (haveTorch) {
    std::cout << "measuring torchrun --monitor_interval=0.1 (" << o.torchrunRuns
              << " runs each)..." << std::endl;
    series.push_back(measure("torchrun(0.1s)",
                             {o.python, wrapper, "--standalone", "--nproc_per_node=4",
                              "--monitor_interval=0.1", "--no_python"},
                             o.torchrunRuns, true, work));
    if (o.torchrunDefaultInterval) {
      std::cout << "measuring torchrun at its default --monitor_interval=5 (1 run)..." << std::endl;
      series.push_back(measure("torchrun(5s)",
                               {o.python, wrapper, "--standalone", "--nproc_per_node=4",
                                "--no_python"},
                               1, false, work));
    }
  }

  struct Row {
    std::string metric, unit;
    double target;
    std::vector<double> Series::*field;
  };
  const Row rows[] = {{"wall time, 4 no-op workers", "ms", 20, &Series::wallMs},
                      {"restart latency", "ms", 20, &Series::restartMs},
                      {"launcher peak RSS", "MiB", 15, &Series::rssMiB}};
  std::printf("\n%-28s", "median");
  for (const auto& s : series) std::printf(" %16s", s.name.c_str());
  for (size_t i = 1; i < series.size(); ++i) std::printf(" %14s", (series[i].name + "/ddprun").c_str());
  std::printf(" %10s\n", "target");
  std::ofstream csv(o.csv);
  csv << "metric,unit,launcher,median,min,max,runs,target,ddprun_meets_target,load_avg_1min,"
         "realtime\n";
  for (const auto& row : rows) {
    std::printf("%-28s", row.metric.c_str());
    const double ours = median(series[0].*row.field);
    for (const auto& s : series) std::printf(" %16s", fmt(median(s.*row.field), row.unit.c_str()).c_str());
    for (size_t i = 1; i < series.size(); ++i) {
      const double theirs = median(series[i].*row.field);
      char ratio[32] = "-";
      if (ours > 0 && theirs > 0) std::snprintf(ratio, sizeof ratio, "%.0fx", theirs / ours);
      std::printf(" %14s", ratio);
    }
    std::printf(" %10s\n", ("<= " + fmt(row.target, row.unit.c_str())).c_str());
    for (const auto& s : series) {
      const auto& v = s.*row.field;
      if (v.empty()) continue;
      csv << row.metric << "," << row.unit << "," << s.name << "," << median(v) << ","
          << *std::min_element(v.begin(), v.end()) << "," << *std::max_element(v.begin(), v.end())
          << "," << v.size() << "," << row.target << ","
          << (s.name == "ddprun" ? (median(v) <= row.target ? "yes" : "no") : "") << ","
          << load[0] << "," << (o.realtime ? "yes" : "no") << "\n";
    }
  }
  int failures = 0;
  for (const auto& s : series) failures += s.failures;
  auto minOf = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
  };
  std::printf("\nddprun best run: wall %.1f ms, restart %.1f ms. Load average when the benchmark "
              "started: %.2f on %ld CPUs (other work on the machine inflates wall times)%s.\n",
              minOf(series[0].wallMs), minOf(series[0].restartMs), load[0],
              ::sysconf(_SC_NPROCESSORS_ONLN),
              o.realtime ? "; launchers ran under SCHED_FIFO (--realtime)" : "");
  std::printf("workers: /bin/true (wall, RSS) and a /bin/sh script (restart); ratios are "
              "torchrun/ddprun.\nwritten: %s\n", o.csv.c_str());
  std::error_code ec;
  if (failures == 0) fs::remove_all(work, ec);
  return failures == 0 ? 0 : 1;
}

}  // namespace

DDPRUN_BENCH("launch", "ddprun vs torchrun: wall time of 4 no-op workers, restart latency, peak RSS",
             benchLaunch)
