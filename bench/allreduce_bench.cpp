// ddprun-bench allreduce: ddprun's communicators against raw Gloo and OpenMPI, in one run.
//   - allreduce of float32 in place, 4 KiB .. 256 MiB, for 2 and 4 ranks: ddprun's shared-memory
//     transport (worker_runtime/shm) and its TCP mesh (the Gloo communicator's allreduce, its
//     per-size choice of algorithm) vs Gloo's classic AllreduceRingChunked and
//     AllreduceHalvingDoubling, each built once per size on its own buffer (Gloo's best case: no
//     set-up in the timed loop). The four are interleaved iteration by iteration, in rotating
//     order, so that load on a shared machine hits them alike; every timed call starts after a
//     barrier; the median of rank 0's times is the latency, and bus bandwidth = bytes * 2 (P-1) /
//     P / latency (nccl-tests' definition).
//   - OpenMPI, when mpicc and mpirun are found: bench/mpi_allreduce.c, built here, times
//     MPI_Allreduce the same way (barrier, median on rank 0) right after ddprun's ranks, for the
//     same sizes; without them the table says the anchor was skipped.
//   - DDP step overhead: forward + backward + SGD step of an MLP wrapped in DDP (on shm and on
//     TCP) vs the same model stepping locally (no communication), interleaved, same batch. On shm
//     twice: buckets in the lent shared memory (the default) and, as an A/B anchor, buckets of
//     their own with gradients copied in and out (DdpOptions::shareBuckets = false).
// The machine's load average is printed before and after each rank count.
// The ranks are processes of this binary (started with posix_spawn, environment as ddprun gives
// it, the agent store hosted here). Prints a table with ratios; writes bench/results/allreduce.csv.
// The shm rows also count rank 0's context switches per call (getrusage, outside the timed
// region): a wait that yielded its core or slept shows there (CSV: impl ddprun_shm_csw /
// shm_alt_csw, the count in median_us).
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "bench/paths.h"
#include "bench/registry.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/threaded_store_server.h"
#include "worker_runtime/ddprun.h"
#include "worker_runtime/gloo_store_adapter.h"
#include "worker_runtime/shm/shm_communicator.h"

extern char** environ;

namespace {

using namespace ddprun::runtime;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int> ranks{2, 4};
  size_t minBytes = 4 << 10;
  size_t maxBytes = 256 << 20;
  double seconds = 1.0;  // rough time budget per size and implementation
  bool ddp = true;
  std::string csv = ddprun::bench::resultsPath("allreduce.csv");
  GlooOptions tuning;  // ddprun's algorithm settings (defaults unless overridden for experiments)
  // Optional second ddprun communicator with other settings, interleaved with the rest: an A/B
  // test of tunings under the same load ("SEGMENT,WINDOW,DIRECT_MAX[,PREFER_HD]").
  std::string alt;
  // Optional second shm communicator with other settings
  // ("SPIN_US,YIELD_US[,STREAM 0|1[,STREAM_MIN_KIB[,SLOT_KIB]]]", ShmOptions' spinMicros /
  // yieldMicros / streamStores / streamMinBytes / slotBytes), interleaved with the rest: an A/B.
  std::string shmAlt;
  // Time ddprun's shm communicator (and its A/B) alone, not interleaved with the TCP mesh and raw
  // Gloo: each call then starts with the caches as the previous shm call left them, as in
  // OpenMPI's program (which runs alone) and in a training loop.
  bool shmOnly = false;
  int rounds = 1;  // ddprun's ranks and OpenMPI alternately, this many times (medianRows)
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Context switches of the calling thread so far (voluntary + involuntary): a wait that slept or
// yielded its core shows up here.
long contextSwitches() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  return u.ru_nvcsw + u.ru_nivcsw;
}

template <typename Fn>
double timeUs(Fn&& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// ---- worker side (one process per rank) ----

struct Row {
  std::string what;  // "allreduce" or "ddp:<model>"
  size_t bytes = 0;
  std::vector<std::pair<std::string, double>> us;  // implementation -> median microseconds
};

std::vector<Row> allreduceRows(Runtime& rt, const Options& o) {
  const int P = rt.worldSize();
  auto raw = std::make_shared<gloo::rendezvous::Context>(rt.rank(), P);
  raw->setTimeout(std::chrono::minutes(5));
  {
    auto scoped = std::make_shared<ddprun::rendezvous::PrefixStore>("raw-gloo", rt.store());
    GlooStoreAdapter adapter(*scoped);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    raw->connectFullMesh(adapter, dev);
  }
  GlooOptions go = o.tuning;
  go.rank = rt.rank();
  go.size = P;
  go.hostname = "127.0.0.1";
  auto comm = makeGlooCommunicator(rt.store(), go);
  auto shmComm = shm::makeShmCommunicator(
      rt.store(), {.rank = rt.rank(), .size = P, .timeout = std::chrono::minutes(5)});
  std::shared_ptr<Communicator> alt;
  if (!o.alt.empty()) {
    GlooOptions ao = go;
    char comma;
    std::istringstream in(o.alt);
    in >> ao.ringSegmentBytes >> comma >> ao.ringWindow >> comma >> ao.directMaxBytes;
    int hd = 1;
    if (in >> comma >> hd) ao.preferHalvingDoubling = hd != 0;
    alt = makeGlooCommunicator(rt.store(), ao);
  }
  // The barrier before each timed call has a communicator of its own, so that no timed one is
  // the communicator that has just synchronised (which made shm's calls ~1.3 us slower at 4 KiB
  // than the same settings on another communicator: an A/B would compare unequal positions).
  auto barrierComm = shm::makeShmCommunicator(
      rt.store(), {.rank = rt.rank(), .size = P, .timeout = std::chrono::minutes(5)});
  std::shared_ptr<Communicator> shmAlt;
  if (!o.shmAlt.empty()) {
    shm::ShmOptions so{.rank = rt.rank(), .size = P, .timeout = std::chrono::minutes(5)};
    char comma;
    std::istringstream in(o.shmAlt);
    in >> so.spinMicros >> comma >> so.yieldMicros;
    if (int stream = 1; in >> comma >> stream) so.streamStores = stream != 0;
    if (size_t kib = 0; in >> comma >> kib) so.streamMinBytes = kib << 10;
    if (size_t kib = 0; in >> comma >> kib) so.slotBytes = kib << 10;
    shmAlt = shm::makeShmCommunicator(rt.store(), so);
  }
  std::vector<Row> rows;
  for (size_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= 4) {
    const size_t n = bytes / 4;
    torch::Tensor ours = torch::ones({static_cast<int64_t>(n)});
    std::vector<float> hdBuf(n, 1.0f), rcBuf(n, 1.0f);
    gloo::AllreduceHalvingDoubling<float> hd(raw, {hdBuf.data()}, static_cast<int>(n));
    gloo::AllreduceRingChunked<float> rc(raw, {rcBuf.data()}, static_cast<int>(n));
    torch::Tensor altBuf = torch::ones({static_cast<int64_t>(n)});
    torch::Tensor shmBuf = torch::ones({static_cast<int64_t>(n)});
    // Timed in this order (the rows below read them by position); with shmOnly the first three
    // do nothing and are not timed.
    std::vector<std::function<void()>> impls{[&] { comm->allreduce(ours); },
                                             [&] { hd.run(); }, [&] { rc.run(); },
                                             [&] { shmComm->allreduce(shmBuf); }};
    const size_t firstTimed = o.shmOnly ? 3 : 0;
    if (alt) impls.push_back([&] { alt->allreduce(altBuf); });
    torch::Tensor shmAltBuf = torch::ones({static_cast<int64_t>(n)});
    if (shmAlt) impls.push_back([&] { shmAlt->allreduce(shmAltBuf); });
    // Iterations: from a probe of the slowest implementation, within the time budget; the same
    // count on every rank (rank 0 decides).
    for (size_t k = firstTimed; k < impls.size(); ++k) impls[k]();
    double probe = 0;
    for (size_t k = firstTimed; k < impls.size(); ++k) probe = std::max(probe, timeUs(impls[k]));
    torch::Tensor iters = torch::tensor({static_cast<int64_t>(
        std::clamp(o.seconds * 1e6 / std::max(probe, 1.0), 5.0, 300.0))});
    rt.comm()->broadcast(iters, 0);
    std::vector<std::vector<double>> times(impls.size());
    std::vector<long> switches(impls.size(), 0);
    const int64_t n_iters = iters.item<int64_t>();
    for (int64_t i = 0; i < n_iters; ++i) {
      for (size_t k = 0; k < impls.size(); ++k) {
        const size_t which = (i + k) % impls.size();
        if (which < firstTimed) continue;
        barrierComm->barrier();
        const long before = contextSwitches();
        times[which].push_back(timeUs(impls[which]));
        switches[which] += contextSwitches() - before;
      }
    }
    auto perCall = [&](size_t which) { return static_cast<double>(switches[which]) / n_iters; };
    rows.push_back({"allreduce", bytes, {{"ddprun_shm", median(times[3])}, {"ddprun_shm_csw", perCall(3)}}});
    if (!o.shmOnly) {
      rows.back().us.insert(rows.back().us.end(), {{"ddprun", median(times[0])},
                                                   {"gloo_halving_doubling", median(times[1])},
                                                   {"gloo_ring_chunked", median(times[2])}});
    }
    if (alt) rows.back().us.push_back({"ddprun_alt", median(times[4])});
    if (shmAlt) {
      rows.back().us.push_back({"shm_alt", median(times[alt ? 5 : 4])});
      rows.back().us.push_back({"shm_alt_csw", perCall(alt ? 5 : 4)});
    }
  }
  return rows;
}

struct Mlp : torch::nn::Module {
  Mlp(int in, int hidden, int layers, int out) {
    int width = in;
    for (int i = 0; i < layers; ++i) {
      fcs.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, hidden)));
      width = hidden;
    }
    head = register_module("head", torch::nn::Linear(width, out));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& fc : fcs) x = torch::relu(fc(x));
    return head(x);
  }
  std::vector<torch::nn::Linear> fcs;
  torch::nn::Linear head{nullptr};
};

// DDP over the TCP mesh (`tcp`) and over shared memory (`shm`) vs a local step, interleaved.
Row ddpRow(Runtime& rt, const std::string& name, int hidden, int layers,
           const std::shared_ptr<Communicator>& tcp, const std::shared_ptr<Communicator>& shmComm) {
  auto distributed = std::make_shared<Mlp>(784, hidden, layers, 10);
  auto viaShm = std::make_shared<Mlp>(784, hidden, layers, 10);
  auto viaShmCopy = std::make_shared<Mlp>(784, hidden, layers, 10);
  auto local = std::make_shared<Mlp>(784, hidden, layers, 10);
  DistributedDataParallel ddp(distributed, tcp);
  DistributedDataParallel ddpShm(viaShm, shmComm);
  DistributedDataParallel ddpShmCopy(viaShmCopy, shmComm, {.shareBuckets = false});
  torch::optim::SGD optD(distributed->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD optS(viaShm->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD optC(viaShmCopy->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD optL(local->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto x = torch::randn({64, 784});
  auto y = torch::randint(0, 10, {64});
  auto step = [&](Mlp& m, torch::optim::Optimizer& opt) {
    opt.zero_grad();
    torch::nll_loss(torch::log_softmax(m.forward(x), 1), y).backward();
    opt.step();
  };
  size_t bytes = 0;
  for (auto& p : distributed->parameters()) bytes += p.nbytes();
  for (int i = 0; i < 3; ++i) {
    step(*distributed, optD);
    step(*viaShm, optS);
    step(*viaShmCopy, optC);
    step(*local, optL);
  }
  std::vector<double> d, s, c, l;
  for (int i = 0; i < 40; ++i) {
    // The local step waits at a barrier first, like the DDP step's allreduces, so that both start
    // with the ranks in step.
    rt.comm()->barrier();
    l.push_back(timeUs([&] { step(*local, optL); }));
    rt.comm()->barrier();
    d.push_back(timeUs([&] { step(*distributed, optD); }));
    rt.comm()->barrier();
    s.push_back(timeUs([&] { step(*viaShm, optS); }));
    rt.comm()->barrier();
    c.push_back(timeUs([&] { step(*viaShmCopy, optC); }));
  }
  return {"ddp:" + name, bytes,
          {{"ddp_step", median(d)}, {"ddp_step_shm", median(s)}, {"ddp_step_shm_copy", median(c)},
           {"local_step", median(l)}}};
}

int worker(const Options& o) {
  auto rt = ddprun::init();
  std::vector<Row> rows = allreduceRows(*rt, o);
  if (o.ddp) {
    GlooOptions go = o.tuning;
    go.rank = rt->rank();
    go.size = rt->worldSize();
    go.hostname = "127.0.0.1";
    auto tcp = makeGlooCommunicator(rt->store(), go);
    auto viaShm = shm::makeShmCommunicator(
        rt->store(), {.rank = rt->rank(), .size = rt->worldSize(), .timeout = std::chrono::minutes(5)});
    rows.push_back(ddpRow(*rt, "784-512-10", 512, 1, tcp, viaShm));
    rows.push_back(ddpRow(*rt, "784-2048x3-10", 2048, 3, tcp, viaShm));
  }
  if (rt->rank() == 0) {  // one line per row for the parent: what bytes impl=us ...
    for (auto& r : rows) {
      std::cout << "ROW " << r.what << " " << r.bytes;
      for (auto& [impl, us] : r.us) std::cout << " " << impl << "=" << us;
      std::cout << "\n";
    }
  }
  return 0;
}

// ---- parent side ----

std::vector<std::string> runRanks(int P, const std::vector<std::string>& args) {
  ddprun::rendezvous::ThreadedStoreServer store({.host = "127.0.0.1", .port = 0});
  int out[2];
  if (::pipe(out) != 0) throw std::runtime_error("pipe failed");
  std::vector<pid_t> pids;
  for (int r = 0; r < P; ++r) {
    std::vector<std::string> env{"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(P),
                                 "LOCAL_RANK=" + std::to_string(r),
                                 "LOCAL_WORLD_SIZE=" + std::to_string(P), "MASTER_ADDR=127.0.0.1",
                                 "MASTER_PORT=" + std::to_string(store.port()),
                                 "TORCHELASTIC_USE_AGENT_STORE=True", "OMP_NUM_THREADS=1",
                                 "DDPRUN_LOG_LEVEL=warn"};
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    std::vector<char*> envp, argv;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> a{"/proc/self/exe", "allreduce", "--worker"};
    a.insert(a.end(), args.begin(), args.end());
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (r == 0) posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), envp.data()) != 0) {
      throw std::runtime_error("cannot start a rank");
    }
    posix_spawn_file_actions_destroy(&fa);
    pids.push_back(pid);
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t k; (k = ::read(out[0], buf, sizeof(buf))) > 0;) text.append(buf, k);
  ::close(out[0]);
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok) throw std::runtime_error("a rank failed (P=" + std::to_string(P) + ")");
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("ROW ", 0) == 0) lines.push_back(l.substr(4));
  }
  return lines;
}

// With --rounds K: ddprun's ranks and OpenMPI's program run alternately K times, and each time
// (each impl of each row, each size of OpenMPI) is the median of the K rounds' medians. On these
// virtual machines the host moves the two vCPUs between cores, and a placement lasts seconds:
// one program's run can land on a fast placement and the next one's on a slow one (1 MiB took
// 102-375 us for ddprun and 174-529 us for OpenMPI in consecutive runs); alternating rounds
// gives both the same mix.
std::vector<std::string> medianRows(const std::vector<std::vector<std::string>>& rounds) {
  std::vector<std::string> keys;  // "what bytes", in the first round's order
  std::map<std::string, std::map<std::string, std::vector<double>>> times;
  for (const auto& lines : rounds) {
    for (const auto& line : lines) {
      std::istringstream in(line);
      std::string what, bytes;
      in >> what >> bytes;
      const std::string key = what + " " + bytes;
      if (!times.count(key)) keys.push_back(key);
      for (std::string kv; in >> kv;) {
        times[key][kv.substr(0, kv.find('='))].push_back(std::stod(kv.substr(kv.find('=') + 1)));
      }
    }
  }
  std::vector<std::string> out;
  for (const auto& key : keys) {
    std::ostringstream line;
    line << key;
    for (const auto& [impl, t] : times[key]) line << " " << impl << "=" << median(t);
    out.push_back(line.str());
  }
  return out;
}

std::map<size_t, double> medianMpi(const std::vector<std::map<size_t, double>>& rounds) {
  std::map<size_t, std::vector<double>> times;
  for (const auto& round : rounds) {
    for (const auto& [bytes, t] : round) times[bytes].push_back(t);
  }
  std::map<size_t, double> out;
  for (const auto& [bytes, t] : times) out[bytes] = median(t);
  return out;
}

std::string loadAverage() {
  double l[3] = {0, 0, 0};
  if (::getloadavg(l, 3) < 0) return "?";
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << l[0] << " " << l[1] << " " << l[2];
  return os.str();
}

// Runs `command` through the shell; its standard output, and its exit status in `status`.
std::string capture(const std::string& command, int& status) {
  std::string text;
  FILE* f = ::popen(command.c_str(), "r");
  if (!f) {
    status = -1;
    return text;
  }
  char buf[4096];
  for (size_t k; (k = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, k);
  status = ::pclose(f);
  return text;
}

// The OpenMPI anchor: bench/mpi_allreduce.c built with mpicc (once per run), run with mpirun as
// the baseline was (--oversubscribe, default binding). Returns bytes -> median us; empty
// with `why` set when mpicc/mpirun are missing or the program fails.
struct MpiAnchor {
  std::string program;  // built binary, or empty
  std::string why;      // why there is none
};

MpiAnchor buildMpi() {
  int status = 0;
  capture("command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1", status);
  if (status != 0) {
    return {"", "mpicc/mpirun not found (Debian openmpi-bin + libopenmpi-dev; scripts/setup "
                "installs them)"};
  }
  char dir[] = "/tmp/ddprun-bench-mpi-XXXXXX";
  if (!::mkdtemp(dir)) return {"", "cannot create a temporary directory"};
  const std::string program = std::string(dir) + "/mpi_allreduce";
  const std::string log = capture("mpicc -O2 -o " + program + " " +
                                      ddprun::bench::scriptPath("mpi_allreduce.c") + " 2>&1",
                                  status);
  if (status != 0) return {"", "mpicc failed: " + log};
  return {program, ""};
}

std::map<size_t, double> runMpi(const MpiAnchor& mpi, int P, const Options& o, std::string& why) {
  std::map<size_t, double> us;
  if (mpi.program.empty()) {
    why = mpi.why;
    return us;
  }
  int status = 0;
  const std::string out =
      capture("mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(P) + " " +
                  mpi.program + " " + std::to_string(o.minBytes) + " " +
                  std::to_string(o.maxBytes) + " " + std::to_string(o.seconds) + " 2>&1",
              status);
  std::istringstream in(out);
  for (std::string tag; in >> tag;) {
    size_t bytes;
    double t;
    if (tag == "MPI" && in >> bytes >> t) us[bytes] = t;
  }
  if (status != 0 || us.empty()) {
    why = "mpirun failed (status " + std::to_string(status) + "): " + out.substr(0, 400);
    us.clear();
  }
  return us;
}

std::string human(size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

int benchAllreduce(int argc, char** argv) {
  Options o;
  bool isWorker = false;
  CLI::App app{"ddprun's allreduce (shm, TCP mesh) vs raw Gloo and OpenMPI; DDP step overhead"};
  app.add_option("--ranks", o.ranks, "rank counts to run [2 4]")->delimiter(',');
  app.add_option("--min-bytes", o.minBytes, "smallest message [4096]");
  app.add_option("--max-bytes", o.maxBytes, "largest message [268435456]");
  app.add_option("--seconds", o.seconds, "time budget per size and implementation [1]");
  app.add_flag("!--no-ddp", o.ddp, "skip the DDP step measurement");
  app.add_option("--csv", o.csv, "where to write the results");
  app.add_option("--direct-max-bytes", o.tuning.directMaxBytes, "tuning: ddprun's direct/ring switch");
  app.add_option("--ring-segment-bytes", o.tuning.ringSegmentBytes, "tuning: ring pipeline segment");
  app.add_option("--ring-window", o.tuning.ringWindow, "tuning: ring receives posted ahead");
  app.add_option("--alt", o.alt, "tuning A/B: also time ddprun with SEGMENT,WINDOW,DIRECT_MAX[,HD 0|1]");
  app.add_option("--rounds", o.rounds,
                 "run ddprun's ranks and OpenMPI alternately this many times; medians of the "
                 "rounds' medians [1]")
      ->check(CLI::Range(1, 50));
  app.add_flag("--shm-only", o.shmOnly,
               "time ddprun's shm (and --shm-alt) alone, not interleaved with TCP and raw Gloo");
  app.add_option("--shm-alt", o.shmAlt,
                 "A/B: also time ddprun's shm with SPIN_US,YIELD_US[,STREAM 0|1[,STREAM_MIN_KIB[,SLOT_KIB]]] "
                 "(sync.h, collectives.h, shm_communicator.h)");
  app.add_flag("--worker", isWorker, "internal: run as one rank")->group("");
  CLI11_PARSE(app, argc, argv);
  if (isWorker) return worker(o);

  std::vector<std::string> args{"--min-bytes", std::to_string(o.minBytes), "--max-bytes",
                                std::to_string(o.maxBytes), "--seconds", std::to_string(o.seconds),
                                "--direct-max-bytes", std::to_string(o.tuning.directMaxBytes),
                                "--ring-segment-bytes", std::to_string(o.tuning.ringSegmentBytes),
                                "--ring-window", std::to_string(o.tuning.ringWindow)};
  if (!o.alt.empty()) args.insert(args.end(), {"--alt", o.alt});
  if (!o.shmAlt.empty()) args.insert(args.end(), {"--shm-alt", o.shmAlt});
  if (!o.ddp) args.push_back("--no-ddp");
  if (o.shmOnly) args.push_back("--shm-only");
  std::ofstream csv(o.csv);
  csv << "ranks,what,bytes,impl,median_us,busbw_GBps,ratio\n";
  const MpiAnchor mpi = buildMpi();
  // The program's temporary directory goes when the bench ends (it was left in /tmp before).
  const std::unique_ptr<const MpiAnchor, void (*)(const MpiAnchor*)> removeMpi(
      &mpi, [](const MpiAnchor* m) {
        if (!m->program.empty()) std::filesystem::remove_all(std::filesystem::path(m->program).parent_path());
      });
  for (int P : o.ranks) {
    std::cout << "\n== " << P << " ranks == (load average before: " << loadAverage() << ", "
              << std::thread::hardware_concurrency() << " CPUs)\n";
    std::vector<std::vector<std::string>> roundLines;
    std::vector<std::map<size_t, double>> roundMpi;
    std::string mpiWhy;
    for (int k = 0; k < o.rounds; ++k) {
      roundLines.push_back(runRanks(P, args));
      roundMpi.push_back(runMpi(mpi, P, o, mpiWhy));
    }
    const auto lines = medianRows(roundLines);
    const auto mpiUs = medianMpi(roundMpi);
    std::cout << "load average after: " << loadAverage() << "\n";
    if (!mpiWhy.empty()) std::cout << "OpenMPI anchor skipped: " << mpiWhy << "\n";
    std::cout << std::left << std::setw(9) << "size" << std::right << std::setw(10) << "shm us"
              << std::setw(10) << "tcp us" << std::setw(10) << "Gloo us" << std::setw(10)
              << "MPI us" << std::setw(10) << "shm GB/s" << std::setw(10) << "MPI/shm"
              << std::setw(10) << "tcp/shm" << std::setw(10) << "Gloo/shm" << std::setw(10)
              << "Gloo/tcp" << "\n";
    for (const auto& line : lines) {
      std::istringstream in(line);
      std::string what;
      size_t bytes;
      in >> what >> bytes;
      std::map<std::string, double> us;
      for (std::string kv; in >> kv;) us[kv.substr(0, kv.find('='))] = std::stod(kv.substr(kv.find('=') + 1));
      if (what == "allreduce") {
        const double factor = 2.0 * (P - 1) / P;
        auto bw = [&](double t) { return bytes * factor / (t * 1e3); };  // GB/s
        // Without the TCP mesh and raw Gloo (--shm-only) their cells are "-" and best is 0.
        const bool all = us.count("ddprun") != 0;
        const double best = all ? std::min(us["gloo_halving_doubling"], us["gloo_ring_chunked"]) : 0;
        const double shmUs = us["ddprun_shm"];
        if (mpiUs.count(bytes)) us["openmpi"] = mpiUs.at(bytes);
        auto cell = [&](double t, int precision) {
          std::ostringstream os;
          os << std::fixed << std::setprecision(precision) << t;
          return os.str();
        };
        auto get = [&](const char* impl) {  // without inserting a row for a missing one
          const auto it = us.find(impl);
          return it == us.end() ? 0.0 : it->second;
        };
        auto ratioCell = [&](bool present, double t) { return present ? cell(t, 2) + "x" : "-"; };
        const bool mpi = us.count("openmpi") != 0;
        std::cout << std::left << std::setw(9) << human(bytes) << std::right << std::setw(10)
                  << cell(shmUs, 1) << std::setw(10) << (all ? cell(get("ddprun"), 1) : "-")
                  << std::setw(10) << (all ? cell(best, 1) : "-") << std::setw(10)
                  << (mpi ? cell(get("openmpi"), 1) : "-") << std::setw(10) << cell(bw(shmUs), 2)
                  << std::setw(10) << ratioCell(mpi, get("openmpi") / shmUs) << std::setw(10)
                  << ratioCell(all, get("ddprun") / shmUs) << std::setw(10)
                  << ratioCell(all, best / shmUs) << std::setw(10)
                  << ratioCell(all, best / get("ddprun"));
        if (us.count("ddprun_alt")) std::cout << "   alt " << cell(us["ddprun_alt"], 0) << " us";
        if (us.count("shm_alt")) std::cout << "   shm alt " << cell(us["shm_alt"], 1) << " us";
        std::cout << "   switches/call shm " << cell(us["ddprun_shm_csw"], 3);
        if (us.count("shm_alt_csw")) std::cout << " alt " << cell(us["shm_alt_csw"], 3);
        std::cout << "\n";
        for (auto& [impl, t] : us) {
          if (impl.ends_with("_csw")) {  // context switches per call on rank 0, not a time
            csv << P << ",allreduce," << bytes << "," << impl << "," << t << ",,\n";
            continue;
          }
          // ratio column: the best raw Gloo time / this implementation's (> 1: faster than Gloo)
          csv << P << ",allreduce," << bytes << "," << impl << "," << t << "," << bw(t) << ",";
          if (all) csv << best / t;
          csv << "\n";
        }
      } else {
        const double ratio = us["ddp_step"] / us["local_step"];
        const double shmRatio = us["ddp_step_shm"] / us["local_step"];
        const double copyRatio = us["ddp_step_shm_copy"] / us["local_step"];
        std::cout << std::fixed << what.substr(4) << " (" << human(bytes)
                  << " of parameters): local step " << std::setprecision(0) << us["local_step"]
                  << " us; DDP step on shm " << us["ddp_step_shm"] << " us (overhead "
                  << std::setprecision(2) << shmRatio << "x; with copied buckets "
                  << std::setprecision(0) << us["ddp_step_shm_copy"] << " us, "
                  << std::setprecision(2) << copyRatio << "x), on tcp " << std::setprecision(0)
                  << us["ddp_step"] << " us (overhead " << std::setprecision(2) << ratio << "x)\n";
        csv << P << "," << what << "," << bytes << ",ddp_step," << us["ddp_step"] << ",," << ratio
            << "\n"
            << P << "," << what << "," << bytes << ",ddp_step_shm," << us["ddp_step_shm"] << ",,"
            << shmRatio << "\n"
            << P << "," << what << "," << bytes << ",ddp_step_shm_copy," << us["ddp_step_shm_copy"]
            << ",," << copyRatio << "\n"
            << P << "," << what << "," << bytes << ",local_step," << us["local_step"] << ",,1\n";
      }
    }
  }
  std::cout << "\nX/shm = X's time / ddprun shm's time (>= 1: shm at least as fast); tcp = "
               "ddprun's TCP mesh, Gloo = best of raw Gloo ring-chunked and halving-doubling, "
               "MPI = OpenMPI MPI_Allreduce; overhead = DDP step / local step\nwritten to "
            << o.csv << "\n";
  return 0;
}

}  // namespace

DDPRUN_BENCH("allreduce", "ddprun's allreduce (shm, tcp) vs raw Gloo and OpenMPI; DDP step vs local",
             benchAllreduce)
