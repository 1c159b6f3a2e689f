// A training-shaped worker for the exactly-once tests (scenarios.py exactly_once_*): it does
// what a data-parallel trainer does with the data -- the real runtime::DistributedSampler, real
// checkpoints (runtime::CheckpointManager) holding the sampler's global position, one collective
// per step -- and records every sample id it "trains" on, so the test can check that across
// world-size changes and kills every id is used exactly once per epoch.
//
//   sample_worker --out DIR --ckpt DIR [--samples N] [--epochs E] [--batch B] [--step-ms MS]
//                 [--interval K]
// Each process appends to DIR/rank-<pid>.log, one line per write (O_APPEND):
//   start <round token> <resumed-from step> <world size> <rank> <wall clock, microseconds>
//   step <step> <epoch> <position before the step> <id>:<position> ...
// The round token is rank 0's random number, broadcast to all ranks of the round; the positions
// are the places of the ids in the epoch's order (positions >= N are the sampler's padding).
// Rank 0 saves a checkpoint every K steps and at each epoch's end.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "worker_runtime/ddprun.h"

using namespace ddprun::runtime;

namespace {

struct Args {
  std::string out, ckpt;
  size_t samples = 600;
  int64_t epochs = 2;
  size_t batch = 4;
  int stepMs = 20;
  int64_t interval = 5;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--out") a.out = v;
    else if (k == "--ckpt") a.ckpt = v;
    else if (k == "--samples") a.samples = std::stoul(v);
    else if (k == "--epochs") a.epochs = std::stoll(v);
    else if (k == "--batch") a.batch = std::stoul(v);
    else if (k == "--step-ms") a.stepMs = std::stoi(v);
    else if (k == "--interval") a.interval = std::stoll(v);
    else throw ddprun::ConfigError("sample_worker: unknown flag " + k);
  }
  if (a.out.empty() || a.ckpt.empty()) throw ddprun::ConfigError("sample_worker: --out and --ckpt");
  return a;
}

class Log {
 public:
  explicit Log(const std::string& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw ddprun::Error("cannot open " + path);
  }
  ~Log() { ::close(fd_); }
  void line(const std::string& s) {
    const std::string l = s + "\n";
    if (::write(fd_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) {
      throw ddprun::Error("short write to the sample log");
    }
  }

 private:
  int fd_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    auto rt = ddprun::init();
    const int w = rt->worldSize(), r = rt->rank();
    ::mkdir(a.out.c_str(), 0755);
    Log log(a.out + "/rank-" + std::to_string(::getpid()) + ".log");

    torch::manual_seed(1);
    torch::nn::Linear model(1, 1);
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    CheckpointManager checkpoints({.directory = a.ckpt, .keep = 3});
    auto state = checkpoints.loadLatest(*model, &optimizer, rt->comm().get());
    int64_t step = state ? state->step : 0;
    SamplerState at = state ? state->sampler : SamplerState{.datasetSize = a.samples};

    // The round's token: rank 0's random number, the same on every rank of this round.
    auto token = torch::tensor({static_cast<int64_t>(std::random_device{}() & 0x7fffffff)},
                               torch::kInt64);
    rt->comm()->broadcastAsync(token, 0)->wait();
    const auto now = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::system_clock::now().time_since_epoch());
    log.line("start " + std::to_string(token.item<int64_t>()) + " " + std::to_string(step) + " " +
             std::to_string(w) + " " + std::to_string(r) + " " + std::to_string(now.count()));

    DistributedSampler sampler({.datasetSize = a.samples, .numReplicas = w, .rank = r,
                                .shuffle = true, .seed = 7, .dropLast = false});
    for (int64_t epoch = at.epoch; epoch < a.epochs; ++epoch) {
      sampler.setEpoch(epoch);
      if (epoch == at.epoch) sampler.restore(at);
      while (sampler.remaining() > 0) {
        // Rank r's k-th index of a segment starting at p is at position p + k * w + r, so the
        // i-th of this batch is at before + i * w + r.
        const size_t before = sampler.state().position;
        const auto ids = *sampler.next(a.batch);
        std::this_thread::sleep_for(std::chrono::milliseconds(a.stepMs));
        ++step;
        // Recorded before the step's collective: a checkpoint of this step (rank 0 saves it after
        // the collective, which needs every rank) implies that every rank's record is written.
        std::string line = "step " + std::to_string(step) + " " + std::to_string(epoch) + " " +
                           std::to_string(before);
        for (size_t i = 0; i < ids.size(); ++i) {
          line += " " + std::to_string(ids[i]) + ":" + std::to_string(before + i * w + r);
        }
        log.line(line);
        // One collective per step, as DDP's gradient allreduce: the ranks step together.
        auto sync = torch::ones({1});
        rt->comm()->allreduceAsync(sync, ReduceOp::Sum)->wait();
        reportProgress();
        const bool epochEnd = sampler.remaining() == 0;
        if (r == 0 && (step % a.interval == 0 || epochEnd)) {
          TrainingState s{.step = step, .epoch = epoch, .sampler = sampler.state(), .worldSize = w};
          if (epochEnd) s.sampler = {.epoch = epoch + 1, .position = 0, .datasetSize = a.samples};
          s.epoch = s.sampler.epoch;
          checkpoints.save(*model, &optimizer, s);
        }
      }
    }
    rt->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sample_worker: error: %s\n", e.what());
    return 1;
  }
}
