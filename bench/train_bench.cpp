// ddprun-bench train: the C++ trainer under ddprun against PyTorch DDP under torchrun, same run.
//
// Both sides train the same model (mlp 784-512-10 or the residual cnn) on the same data
// (Fashion-MNIST), with the same per-rank batch, world size, optimizer (SGD, momentum 0.9,
// constant learning rate) and number of steps, on the CPU with Gloo:
//   PyTorch: python3 bench/torchrun_wrapper.py --standalone --nproc_per_node=N bench/ddp_mnist.py
//   ddprun:  build/bin/ddprun --standalone --nproc-per-node=N build/bin/mnist_<model>
// Each side reports its training throughput (samples/s between two barriers, from the trainer's
// own summary line) and final loss; the wall time of the whole job (launcher start to exit,
// so start-up and data loading count) and its CPU time (user + system of the launcher and the
// workers it waited for) are measured here. torchrun keeps its defaults (1.13: 5 s monitor
// interval), as a user would run it. Runs alternate between the two sides,
// --repeat times; the table shows medians and the ratio ddprun/PyTorch, and
// bench/results/train.csv gets one row per run plus the medians.
// --timeline adds a third side, ddprun with --timeline=FILE (docs/timeline.md), and reports
// what recording the job's timeline costs: its best samples/s against plain ddprun's (issue
// target: within 2%). --no-pytorch leaves torchrun out.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/paths.h"
#include "bench/registry.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;

struct Options {
  std::string model = "mlp";
  int nproc = 2;
  int batchSize = 64;  // per rank
  int steps = 1500;
  double lr = 0.05;
  int repeat = 3;
  bool timeline = false;  // also run ddprun --timeline
  bool pytorch = true;    // run the PyTorch side
  std::string python = "/usr/bin/python3";
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string csv = ddprun::bench::resultsPath("train.csv");
  std::string workDir;  // logs and metrics; default: a fresh directory under /tmp
};

struct RunResult {
  std::string side;  // "pytorch", "ddprun" or "ddprun+timeline"
  double samplesPerSec = 0;
  double wallSeconds = 0;
  double cpuSeconds = 0;  // user + system of the launcher and everything it waited for
  double finalLoss = 0;
};

struct Timing {
  double wall = 0;
  double cpu = 0;
};

// Runs argv to completion with stdout+stderr in `log`; returns its wall and CPU time.
Timing runLogged(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto tv = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error(argv[0] + " failed (status " + std::to_string(status) + "); see " +
                             log);
  }
  return {seconds, tv(usage.ru_utime) + tv(usage.ru_stime)};
}

// The last {"kind":"summary"} record of a metrics file.
nlohmann::json readSummary(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json summary;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == "summary") summary = j;
  }
  if (summary.is_null()) throw std::runtime_error("no summary line in " + path);
  return summary;
}

RunResult runPytorch(const Options& o, int run) {
  const std::string wrapper = ddprun::bench::scriptPath("torchrun_wrapper.py");
  if (!fs::exists(wrapper)) throw std::runtime_error(wrapper + " is missing");
  const std::string metrics = o.workDir + "/pytorch-" + std::to_string(run) + ".jsonl";
  const std::string log = o.workDir + "/pytorch-" + std::to_string(run) + ".log";
  fs::remove(metrics);
  const Timing t = runLogged(
      {o.python, wrapper, "--standalone", "--nproc_per_node=" + std::to_string(o.nproc),
       ddprun::bench::scriptPath("ddp_mnist.py"), "--model", o.model, "--data",
       o.data, "--batch-size", std::to_string(o.batchSize), "--lr", std::to_string(o.lr),
       "--steps", std::to_string(o.steps), "--metrics", metrics},
      log);
  const auto s = readSummary(metrics);
  return {"pytorch", s["samples_per_sec"].get<double>(), t.wall, t.cpu,
          s["final_loss"].get<double>()};
}

RunResult runDdprun(const Options& o, int run, bool timeline) {
  const std::string bin = ddprun::bench::programDir();
  const std::string side = timeline ? "ddprun+timeline" : "ddprun";
  const std::string stem = o.workDir + "/" + side + "-" + std::to_string(run);
  const std::string metrics = stem + ".jsonl";
  std::vector<std::string> argv{bin + "/ddprun", "--standalone",
                                "--nproc-per-node=" + std::to_string(o.nproc)};
  if (timeline) argv.push_back("--timeline=" + stem + ".trace.json");
  argv.insert(argv.end(),
              {bin + "/mnist_" + o.model, "--data", o.data, "--batch-size",
               std::to_string(o.batchSize), "--lr", std::to_string(o.lr), "--lr-schedule",
               "constant", "--max-steps", std::to_string(o.steps), "--epochs", "1000",
               "--evaluate", "false", "--log-interval", "1000000", "--metrics", metrics});
  const Timing t = runLogged(argv, stem + ".log");
  const auto s = readSummary(metrics);
  return {side, s["samples_per_sec"].get<double>(), t.wall, t.cpu,
          s["final_loss"].get<double>()};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int benchTrain(int argc, char** argv) {
  Options o;
  CLI::App app{"ddprun-bench train: C++ trainer under ddprun vs PyTorch DDP under torchrun",
               "ddprun-bench train"};
  app.add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--nproc", o.nproc, "workers (ranks) on this machine")->check(CLI::Range(1, 64));
  app.add_option("--batch-size", o.batchSize, "per rank")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "constant learning rate")->check(CLI::PositiveNumber);
  app.add_option("--repeat", o.repeat, "runs per side (medians are reported)")
      ->check(CLI::Range(1, 20));
  app.add_option("--python", o.python, "python3 with torch");
  app.add_option("--data", o.data, "MNIST-format data directory");
  app.add_option("--csv", o.csv, "results file");
  app.add_option("--work-dir", o.workDir, "logs and metrics of the runs");
  app.add_flag("--timeline", o.timeline,
               "also run ddprun --timeline=FILE and report its cost against plain ddprun");
  app.add_flag("!--no-pytorch", o.pytorch, "leave PyTorch DDP under torchrun out");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (o.workDir.empty()) {
    char tmpl[] = "/tmp/ddprun-bench-train-XXXXXX";
    o.workDir = mkdtemp(tmpl);
  }
  fs::create_directories(o.workDir);

  std::printf("train: %s, %d ranks x batch %d (global %d), %d steps, SGD lr %g, CPU/gloo; "
              "logs in %s\n",
              o.model.c_str(), o.nproc, o.batchSize, o.nproc * o.batchSize, o.steps, o.lr,
              o.workDir.c_str());
  std::vector<RunResult> runs;
  // The sides take turns, the order rotating each round, so drift on the machine spreads evenly.
  std::vector<std::string> sides;
  if (o.pytorch) sides.push_back("pytorch");
  sides.push_back("ddprun");
  if (o.timeline) sides.push_back("ddprun+timeline");
  try {
    for (int r = 0; r < o.repeat; ++r) {
      for (size_t k = 0; k < sides.size(); ++k) {
        const std::string& side = sides[(k + static_cast<size_t>(r)) % sides.size()];
        RunResult res = side == "pytorch" ? runPytorch(o, r)
                                          : runDdprun(o, r, side == "ddprun+timeline");
        std::printf("  run %d %-15s %9.0f samples/s  wall %6.2f s  cpu %6.2f s  final loss %.4f\n",
                    r + 1, res.side.c_str(), res.samplesPerSec, res.wallSeconds, res.cpuSeconds,
                    res.finalLoss);
        std::fflush(stdout);
        runs.push_back(res);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun-bench train: %s\n", e.what());
    return 1;
  }

  struct Medians {
    double rate, best, wall, cpu, loss;  // best: the highest samples/s (least disturbed run)
  };
  auto medians = [&](const std::string& side) {
    std::vector<double> rate, wall, cpu, loss;
    for (const auto& r : runs) {
      if (r.side != side) continue;
      rate.push_back(r.samplesPerSec);
      wall.push_back(r.wallSeconds);
      cpu.push_back(r.cpuSeconds);
      loss.push_back(r.finalLoss);
    }
    return Medians{median(rate), *std::max_element(rate.begin(), rate.end()), median(wall),
                   median(cpu), median(loss)};
  };
  std::map<std::string, Medians> m;
  for (const auto& side : sides) m[side] = medians(side);
  const auto label = [&](const std::string& side) {
    return side == "pytorch" ? std::string("PyTorch DDP under torchrun")
           : side == "ddprun" ? "mnist_" + o.model + " under ddprun"
                              : "... with --timeline";
  };
  std::printf("\n%d runs per side, medians (best: the highest samples/s of the runs)\n", o.repeat);
  std::printf("| %-28s | %10s | %10s | %8s | %8s | %10s |\n", "", "samples/s", "best", "wall s",
              "CPU s", "final loss");
  std::printf("|------------------------------|------------|------------|----------|----------|"
              "------------|\n");
  for (const auto& side : sides) {
    const Medians& x = m[side];
    std::printf("| %-28s | %10.0f | %10.0f | %8.2f | %8.2f | %10.4f |\n", label(side).c_str(),
                x.rate, x.best, x.wall, x.cpu, x.loss);
  }
  const Medians& cc = m["ddprun"];
  if (o.pytorch) {
    const Medians& py = m["pytorch"];
    std::printf("| %-28s | %9.2fx | %9.2fx | %7.2fx | %7.2fx | %10s |\n", "ddprun vs PyTorch",
                cc.rate / py.rate, cc.best / py.best, py.wall / cc.wall, py.cpu / cc.cpu, "");
    std::printf("(samples/s: ddprun / PyTorch; wall and CPU: PyTorch / ddprun; > 1 favours "
                "ddprun)\n");
  }
  if (o.timeline) {
    const Medians& tl = m["ddprun+timeline"];
    std::printf("timeline cost: best samples/s with --timeline / without = %.3f (median %.3f); "
                "target >= 0.98\n",
                tl.best / cc.best, tl.rate / cc.rate);
  }

  fs::create_directories(fs::path(o.csv).parent_path());
  std::ofstream csv(o.csv, std::ios::trunc);
  csv << "model,nproc,global_batch,steps,side,run,samples_per_sec,wall_s,cpu_s,final_loss\n";
  // One row per run, then per side the medians ("median") and the best samples/s ("best"),
  // then the ratios ddprun/pytorch for samples/s (median, best) and pytorch/ddprun for wall,
  // CPU, and with --timeline the ratio with/without it ("timeline_ratio").
  const auto prefix = [&] {
    return o.model + ',' + std::to_string(o.nproc) + ',' + std::to_string(o.nproc * o.batchSize) +
           ',' + std::to_string(o.steps) + ',';
  };
  std::map<std::string, int> runIndex;
  for (const auto& r : runs) {
    csv << prefix() << r.side << ',' << ++runIndex[r.side] << ',' << r.samplesPerSec << ','
        << r.wallSeconds << ',' << r.cpuSeconds << ',' << r.finalLoss << '\n';
  }
  for (const auto& side : sides) {
    const Medians& x = m[side];
    csv << prefix() << side << ",median," << x.rate << ',' << x.wall << ',' << x.cpu << ','
        << x.loss << '\n';
    csv << prefix() << side << ",best," << x.best << ",,,\n";
  }
  if (o.pytorch) {
    const Medians& py = m["pytorch"];
    csv << prefix() << "ratio,median," << cc.rate / py.rate << ',' << py.wall / cc.wall << ','
        << py.cpu / cc.cpu << ",\n";
    csv << prefix() << "ratio,best," << cc.best / py.best << ",,,\n";
  }
  if (o.timeline) {
    const Medians& tl = m["ddprun+timeline"];
    csv << prefix() << "timeline_ratio,median," << tl.rate / cc.rate << ',' << cc.wall / tl.wall
        << ',' << cc.cpu / tl.cpu << ",\n";
    csv << prefix() << "timeline_ratio,best," << tl.best / cc.best << ",,,\n";
  }
  std::printf("results: %s\n", o.csv.c_str());
  return 0;
}

}  // namespace

DDPRUN_BENCH("train", "mnist trainer under ddprun vs PyTorch DDP under torchrun (samples/s, wall)",
             benchTrain)
