// runtime_mp_worker MODE: a real worker process for the multi-process tests, started by ddprun (or
// torchrun, or a test's own spawner). It checks its own results and exits 0 when all is right,
// 1 (with the first mismatch on stderr) when not.
//   collectives  every collective vs a reference computed locally (every rank can compute every
//                rank's input): sizes 0, 1, odd, 262147 (1 MiB + 3 float32), 64 MiB; every dtype; sum,
//                avg, min, max
//   collectives-small  the same on sizes 0, 1, odd and 786433 (3 MiB and one float32): quick enough
//                for the multi-node scenarios over TCP; rank 0 prints "backend <name>"
//   ddp          DDP gradients vs the single-process gradient of the concatenated batch; after 10
//                steps the weights equal rank 0's bit for bit
//   nccl-id      NCCL unique-id exchange through the job's store; all ranks compare their bytes
//   die          the last rank SIGKILLs itself in the middle of a 64 MiB allreduce; the others
//                print "CAUGHT <seconds> <message>" and exit 3
//   freeze       the last rank SIGSTOPs itself mid-allreduce; the others must time out (they
//                print "CAUGHT ..." and exit 3)
//   restart      attempt 0: as die; later attempts (TORCHELASTIC_RESTART_COUNT > 0): as ddp, in
//                the fresh attempt-scoped keys of the restarted group
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <thread>

#include "worker_runtime/ddprun.h"

using namespace ddprun::runtime;
using Clock = std::chrono::steady_clock;

namespace {

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok && failures++ < 5) std::cerr << "MISMATCH: " << what << std::endl;
}

const std::vector<torch::Dtype> kDtypes = {torch::kFloat32, torch::kFloat64, torch::kFloat16,
                                           torch::kBFloat16, torch::kInt32,  torch::kInt64,
                                           torch::kInt8,     torch::kUInt8};

// Rank r's input is v + r with v[i] = (7 i mod 11) - 5 (no negatives for uint8): small integers,
// exact in every dtype even when summed over 4 ranks, so the reference is exact and cheap:
// sum = P v + P(P-1)/2, avg = v + (P-1)/2, min = v, max = v + P - 1. An exact match with it also
// proves that every rank holds the same bits.
torch::Tensor base(int64_t n, torch::Dtype t) {
  auto v = torch::arange(n, torch::kInt32).mul_(7).remainder_(11);
  if (t != torch::kUInt8) v.sub_(5);
  return v.to(t);
}

torch::Tensor expected(int64_t n, torch::Dtype t, ReduceOp op, int P) {
  auto v = base(n, t);
  switch (op) {
    case ReduceOp::Sum: return v.mul_(P).add_(P * (P - 1) / 2);
    case ReduceOp::Avg: return v.add_((P - 1) / 2.0);
    case ReduceOp::Min: return v;
    case ReduceOp::Max: return v.add_(P - 1);
  }
  return v;
}

void collectives(Runtime& rt, bool small) {
  Communicator& comm = *rt.comm();
  const int P = rt.worldSize();
  if (rt.rank() == 0) std::cout << "backend " << comm.backend() << std::endl;
  auto input = [&](int r, int64_t n, torch::Dtype t) { return base(n, t).add_(r); };
  for (auto dtype : kDtypes) {
    const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
    // 262147: more than one shm chunk (256 KiB slots) in every dtype, odd, not divisible by the rank count.
    const std::vector<int64_t> sizes =
        small ? std::vector<int64_t>{0, 1, 12347, 786433}
              : std::vector<int64_t>{0, 1, 12347, 262147, (int64_t{64} << 20) / es};
    for (int64_t n : sizes) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max}) {
        if (op == ReduceOp::Avg && !c10::isFloatingType(dtype)) continue;
        // The largest: every dtype with sum, every op with float32 (the test's time budget).
        if (n > 12347 && op != ReduceOp::Sum && dtype != torch::kFloat32) continue;
        torch::Tensor t = input(rt.rank(), n, dtype);
        comm.allreduce(t, op);
        expect(torch::equal(t, expected(n, dtype, op, P)),
               "allreduce " + std::string(toString(op)) + " " + c10::toString(dtype) +
                   " n=" + std::to_string(n));
      }
      if (n > 262147) continue;
      for (int root = 0; root < P; ++root) {
        torch::Tensor b = input(rt.rank(), n, dtype);
        comm.broadcast(b, root);
        expect(torch::equal(b, input(root, n, dtype)), "broadcast from " + std::to_string(root));
      }
      torch::Tensor g = comm.allgather(input(rt.rank(), n, dtype));
      for (int r = 0; r < P; ++r) expect(torch::equal(g[r], input(r, n, dtype)), "allgather");
    }
  }
  comm.barrier();
}

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(20, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 64));
    fc3 = register_module("fc3", torch::nn::Linear(64, 5));
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

std::pair<torch::Tensor, torch::Tensor> batchOf(int r, int step) {
  auto gen = at::detail::createCPUGenerator(100 * step + r);
  return {torch::randn({16, 20}, gen), torch::randint(0, 5, {16}, gen)};
}

void ddp(Runtime& rt) {
  const int P = rt.worldSize();
  torch::manual_seed(1000 + rt.rank());  // different everywhere: DDP broadcasts rank 0's
  auto model = std::make_shared<Mlp>();
  DistributedDataParallel ddp(model, rt.comm(), {.bucketCapBytes = 8192, .firstBucketCapBytes = 1024});
  // Reference: the broadcast initial weights on the concatenated batch, in this process.
  Mlp ref;
  {
    torch::NoGradGuard g;
    auto a = ref.parameters(), b = model->parameters();
    for (size_t i = 0; i < a.size(); ++i) a[i].copy_(b[i]);
  }
  std::vector<torch::Tensor> xs, ys;
  for (int r = 0; r < P; ++r) {
    auto [x, y] = batchOf(r, 0);
    xs.push_back(x);
    ys.push_back(y);
  }
  torch::nll_loss(torch::log_softmax(ref.forward(torch::cat(xs)), 1), torch::cat(ys)).backward();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 10; ++step) {
    opt.zero_grad();
    auto [x, y] = batchOf(rt.rank(), step);
    torch::nll_loss(torch::log_softmax(model->forward(x), 1), y).backward();
    if (step == 0) {
      auto a = model->parameters(), b = ref.parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        expect(torch::allclose(a[i].grad(), b[i].grad(), 1e-5, 1e-6),
               "gradient of parameter " + std::to_string(i) + " vs single process");
      }
    }
    opt.step();
  }
  std::vector<torch::Tensor> flat;
  for (auto& p : model->parameters()) flat.push_back(p.detach().reshape(-1));
  auto all = rt.comm()->allgather(torch::cat(flat));
  for (int r = 1; r < P; ++r) expect(torch::equal(all[r], all[0]), "weights of rank " + std::to_string(r));
  expect(ddp.syncedBackwards() == 10, "synced backward count");
}

void ncclId(Runtime& rt) {
  auto generate = [] {
    return ncclBuilt() ? generateNcclUniqueId() : std::string(128, '\x11');
  };
  const std::string id = exchangeUniqueId(*rt.store(), "test/nccl_unique_id", rt.rank(), generate,
                                          std::chrono::seconds(30));
  torch::Tensor mine = torch::empty({128}, torch::kUInt8);
  std::memcpy(mine.data_ptr(), id.data(), 128);
  auto all = rt.comm()->allgather(mine);
  for (int r = 1; r < rt.worldSize(); ++r) expect(torch::equal(all[r], all[0]), "nccl id of rank " + std::to_string(r));
  expect(!torch::equal(mine, torch::zeros({128}, torch::kUInt8)), "nccl id is all zeros");
  std::cout << "rank " << rt.rank() << " nccl id ok (" << (ncclBuilt() ? "real" : "stand-in") << ")"
            << std::endl;
}

// The last rank stops (SIGKILL or SIGSTOP) itself while a large allreduce is in flight.
int peerLost(Runtime& rt, int sig) {
  const bool victim = rt.rank() == rt.worldSize() - 1;
  torch::Tensor t = torch::ones({(int64_t{64} << 20) / 4});
  rt.comm()->allreduce(t);  // warm-up: everyone is connected and in step
  if (victim) {
    std::thread([sig] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      ::kill(::getpid(), sig);
    }).detach();
  }
  const auto start = Clock::now();
  try {
    for (int i = 0; i < 1000; ++i) rt.comm()->allreduce(t);
  } catch (const std::exception& e) {
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    std::cout << "CAUGHT " << s << " " << e.what() << std::endl;
    std::_Exit(3);  // skip Runtime's orderly shutdown: a peer is gone
  }
  std::cout << "NOT CAUGHT" << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: runtime_mp_worker collectives|collectives-small|ddp|nccl-id|die|freeze\n";
    return 2;
  }
  const std::string mode = argv[1];
  try {
    auto rt = ddprun::init();
    if (mode == "collectives") collectives(*rt, false);
    else if (mode == "collectives-small") collectives(*rt, true);
    else if (mode == "ddp") ddp(*rt);
    else if (mode == "nccl-id") ncclId(*rt);
    else if (mode == "die") return peerLost(*rt, SIGKILL);
    else if (mode == "freeze") return peerLost(*rt, SIGSTOP);
    else if (mode == "restart" && rt->attempt() == 0) return peerLost(*rt, SIGKILL);
    else if (mode == "restart") ddp(*rt);
    else {
      std::cerr << "unknown mode " << mode << "\n";
      return 2;
    }
    if (failures == 0) std::cout << "rank " << rt->rank() << "/" << rt->worldSize() << " " << mode << " OK" << std::endl;
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "runtime_mp_worker " << mode << ": " << e.what() << std::endl;
    return 1;
  }
}
