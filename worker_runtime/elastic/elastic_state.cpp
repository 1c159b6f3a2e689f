#include "worker_runtime/elastic/elastic_state.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "base/errors.h"
#include "base/timeline.h"
#include "worker_runtime/model_description.h"

namespace ddprun::runtime {
namespace {

std::string stateKey(const torch::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

torch::optim::SGDParamState* sgdState(torch::optim::Optimizer& o, const torch::Tensor& p) {
  auto it = o.state().find(stateKey(p));
  if (it == o.state().end()) return nullptr;
  return static_cast<torch::optim::SGDParamState*>(it->second.get());
}

}  // namespace

void ElasticState::addModule(std::shared_ptr<torch::nn::Module> module) {
  DDPRUN_CHECK(module != nullptr, "ElasticState::addModule: null module");
  modules_.push_back(std::move(module));
}

void ElasticState::addOptimizer(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<torch::optim::SGD*>(&optimizer) == nullptr) {
    throw ConfigError(
        "ElasticState::addOptimizer: only torch::optim::SGD is supported; register the state "
        "of another optimizer yourself (its tensors as a module's buffers, its counters with "
        "addCounter), or run with ddprun --recovery=restart");
  }
  Optimizer o{.optimizer = &optimizer, .params = {}};
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) o.params.push_back(p);
  }
  optimizers_.push_back(std::move(o));
}

void ElasticState::addCounter(std::string name, int64_t* value) {
  DDPRUN_CHECK(value != nullptr, "ElasticState::addCounter: null");
  counters_.push_back({.name = std::move(name), .i = value});
}

void ElasticState::addCounter(std::string name, double* value) {
  DDPRUN_CHECK(value != nullptr, "ElasticState::addCounter: null");
  counters_.push_back({.name = std::move(name), .d = value});
}

std::vector<int64_t> ElasticState::optimizerStateMask() const {
  std::vector<int64_t> mask;
  for (const auto& o : optimizers_) {
    for (const auto& p : o.params) mask.push_back(sgdState(*o.optimizer, p) ? 1 : 0);
  }
  return mask;
}

void ElasticState::matchOptimizerState(const std::vector<int64_t>& mask) {
  size_t i = 0;
  for (auto& o : optimizers_) {
    for (const auto& p : o.params) {
      DDPRUN_CHECK(i < mask.size(), "optimizer state mask too short");
      const bool want = mask[i++] != 0;
      const bool have = sgdState(*o.optimizer, p) != nullptr;
      if (want && !have) {
        // Its values come from the commit or the root right after.
        auto st = std::make_unique<torch::optim::SGDParamState>();
        st->momentum_buffer(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
        o.optimizer->state()[stateKey(p)] = std::move(st);
      } else if (!want && have) {
        // Not there at the commit (created by a step rolled back): SGD's next step creates it
        // as its first step does.
        o.optimizer->state().erase(stateKey(p));
      }
    }
  }
}

std::vector<torch::Tensor> ElasticState::liveTensors() const {
  std::vector<torch::Tensor> out;
  for (const auto& m : modules_) {
    for (const auto& p : m->parameters()) out.push_back(p);
    for (const auto& b : m->buffers()) out.push_back(b);
  }
  for (const auto& o : optimizers_) {
    for (const auto& p : o.params) {
      if (auto* st = sgdState(*o.optimizer, p); st && st->momentum_buffer().defined()) {
        out.push_back(st->momentum_buffer());
      }
    }
  }
  return out;
}

std::vector<int64_t> ElasticState::counterValues() const {
  std::vector<int64_t> v;
  for (const auto& c : counters_) {
    int64_t x = 0;
    if (c.i) x = *c.i;
    else std::memcpy(&x, c.d, sizeof x);
    v.push_back(x);
  }
  return v;
}

void ElasticState::setCounters(const std::vector<int64_t>& values) {
  DDPRUN_CHECK(values.size() == counters_.size(), "counter count");
  for (size_t i = 0; i < counters_.size(); ++i) {
    if (counters_[i].i) *counters_[i].i = values[i];
    else std::memcpy(counters_[i].d, &values[i], sizeof(double));
  }
}

size_t ElasticState::bytes() const {
  size_t n = counters_.size() * sizeof(int64_t);
  for (const auto& t : liveTensors()) n += t.nbytes();
  return n;
}

void ElasticState::fitSaved(const std::vector<torch::Tensor>& live) {
  bool same = live.size() == saved_.size();
  for (size_t i = 0; same && i < live.size(); ++i) {
    same = saved_[i].sizes() == live[i].sizes() && saved_[i].dtype() == live[i].dtype() &&
           saved_[i].device() == live[i].device();
  }
  if (same) return;
  // One flat buffer per (dtype, device), in the order of first appearance, each tensor's
  // snapshot a view of it.
  saved_.clear();
  flats_.clear();
  std::vector<size_t> flatOf;
  std::vector<int64_t> offset;
  std::vector<int64_t> total;
  for (const auto& t : live) {
    size_t f = 0;
    while (f < flats_.size() &&
           (flats_[f].scalar_type() != t.scalar_type() || flats_[f].device() != t.device())) {
      ++f;
    }
    if (f == flats_.size()) {
      flats_.push_back(torch::empty({0}, t.options()));  // a placeholder for its type and device
      total.push_back(0);
    }
    flatOf.push_back(f);
    offset.push_back(total[f]);
    total[f] += t.numel();
  }
  for (size_t f = 0; f < flats_.size(); ++f) {
    flats_[f] = torch::empty({total[f]}, flats_[f].options());
  }
  for (size_t i = 0; i < live.size(); ++i) {
    saved_.push_back(flats_[flatOf[i]].narrow(0, offset[i], live[i].numel()).view(live[i].sizes()));
  }
}

void ElasticState::commit() {
  if (!enabled_) return;
  {
    ddprun::timeline::Scope span("commit", "elastic");
    torch::NoGradGuard noGrad;
    const auto live = liveTensors();
    // First commit, or the optimizer created its state: buffers allocated once more.
    fitSaved(live);
    for (size_t i = 0; i < live.size(); ++i) saved_[i].copy_(live[i]);
    savedMask_ = optimizerStateMask();
    savedCounters_ = counterValues();
    ++commits_;
    if (groupCommit_ >= 0) ++groupCommit_;
  }
  if (boundary_) boundary_();  // may throw: the group changes here (grow back)
}

void ElasticState::restore() {
  if (commits_ == 0) throw ConfigError("ElasticState::restore: nothing was committed");
  torch::NoGradGuard noGrad;
  matchOptimizerState(savedMask_);
  const auto live = liveTensors();
  DDPRUN_CHECK(live.size() == saved_.size(), "the state's tensors changed since the commit");
  for (size_t i = 0; i < live.size(); ++i) live[i].copy_(saved_[i]);
  setCounters(savedCounters_);
}

void ElasticState::broadcast(Communicator& comm, int root) {
  // Five collectives whatever the state holds (a heal is on the critical path of a recovery,
  // and each collective waits for the slowest rank, often a replacement that runs this code for
  // the first time): the root's layout (its length, then the layout), one agreement, the
  // values packed by dtype, the counters.
  torch::NoGradGuard noGrad;
  const auto device = comm.device();
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  const bool isRoot = comm.rank() == root;
  // Every rank throws when one found a difference (the others would wait for it in vain).
  auto agree = [&](const std::string& problem) {
    auto ok = torch::tensor(std::vector<int64_t>{problem.empty() ? 1 : 0}, i64).to(device);
    comm.allreduce(ok, ReduceOp::Min);
    if (!problem.empty()) throw ConfigError(problem);
    if (ok.to(torch::kCPU).item<int64_t>() == 0) {
      throw ConfigError("elastic state: another rank's state differs from rank " +
                        std::to_string(root) + "'s (its error names it)");
    }
  };
  // 1. The root's layout: [optimizer parameters m, m state flags, tensors n, counters c, n
  //    element counts]. Which optimizer state exists on root (this rank creates or drops its
  //    own to match), and the sizes, so that a different program fails naming the tensor
  //    instead of corrupting.
  auto sizesOf = [this](const std::vector<torch::Tensor>& live) {
    std::vector<int64_t> sizes{static_cast<int64_t>(live.size()),
                               static_cast<int64_t>(counters_.size())};
    for (const auto& t : live) sizes.push_back(t.numel());
    return sizes;
  };
  std::vector<int64_t> layout;
  if (isRoot) {
    layout = optimizerStateMask();
    layout.insert(layout.begin(), static_cast<int64_t>(layout.size()));
    const auto sizes = sizesOf(liveTensors());
    layout.insert(layout.end(), sizes.begin(), sizes.end());
  }
  auto length = torch::tensor(std::vector<int64_t>{static_cast<int64_t>(layout.size())}, i64).to(device);
  comm.broadcast(length, root);
  auto theirs = isRoot ? torch::tensor(layout, i64).to(device)
                       : torch::zeros({length.to(torch::kCPU).item<int64_t>()}, i64).to(device);
  comm.broadcast(theirs, root);
  theirs = theirs.to(torch::kCPU);
  const auto* a = theirs.data_ptr<int64_t>();
  const int64_t n = theirs.numel();
  std::string problem;
  if (!isRoot) {
    const auto mask = optimizerStateMask();
    const int64_t rootCount = n > 0 ? a[0] : -1;
    if (rootCount != static_cast<int64_t>(mask.size()) || n < 3 + rootCount) {
      problem = "elastic state: rank " + std::to_string(root) + " has " + std::to_string(rootCount) +
                " optimizer parameters, rank " + std::to_string(comm.rank()) + " " +
                std::to_string(mask.size()) + " (the ranks must register the same state)";
    } else {
      matchOptimizerState(std::vector<int64_t>(a + 1, a + 1 + rootCount));
      const auto live = liveTensors();
      const auto sizes = sizesOf(live);
      const int64_t* r = a + 1 + rootCount;  // the root's sizes
      const int64_t rootSizes = n - 1 - rootCount;
      if (rootSizes != static_cast<int64_t>(sizes.size())) {
        problem = "elastic state: rank " + std::to_string(comm.rank()) + " holds " +
                  std::to_string(live.size()) + " tensors and " + std::to_string(counters_.size()) +
                  " counters, rank " + std::to_string(root) + " another number";
      }
      for (size_t i = 0; i < sizes.size() && problem.empty(); ++i) {
        if (r[i] == sizes[i]) continue;
        problem = "elastic state: rank " + std::to_string(comm.rank()) +
                  "'s tensors differ from rank " + std::to_string(root) + "'s";
        if (i < 2) {
          problem += " (" + std::to_string(r[0]) + " tensors and " + std::to_string(r[1]) +
                     " counters there, " + std::to_string(sizes[0]) + " and " +
                     std::to_string(sizes[1]) + " here)";
        } else {
          problem += " (tensor " + std::to_string(i - 2) + ": " + std::to_string(r[i]) +
                     " elements there, " + std::to_string(sizes[i]) + " here)";
        }
      }
    }
  }
  agree(problem);
  // 2. The values; the root copies its live state into its commit's buffers first.
  const auto live = liveTensors();
  fitSaved(live);
  if (isRoot) {
    for (size_t i = 0; i < live.size(); ++i) saved_[i].copy_(live[i]);
  }
  broadcastValues(comm, root, live);
  if (!counters_.empty()) {
    auto c = torch::tensor(counterValues(), i64).to(device);
    comm.broadcast(c, root);
    auto cpu = c.to(torch::kCPU);
    setCounters(std::vector<int64_t>(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel()));
  }
  adoptAsCommit();
  if (!isRoot) groupCommit_ = -1;  // not carried here: the next heal moves the values
}

std::optional<int> ElasticState::heal(Communicator& comm) {
  torch::NoGradGuard noGrad;
  const auto device = comm.device();
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  // 1. Who holds a commit, and whether every rank registered what the others did.
  //    With each: its group commit number and its commit's counters' digest, to see whether
  //    every rank holds the same commit.
  std::string counterText;
  for (const int64_t v : savedCounters_) counterText += std::to_string(v) + ",";
  constexpr int kFields = 4;
  const auto mine = torch::tensor(
      std::vector<int64_t>{committed() ? 1 : 0, structureDigest(), committed() ? groupCommit_ : -1,
                           textDigest(counterText)},
      i64);
  const auto all = comm.allgather(mine.to(device)).to(torch::kCPU).reshape({comm.size(), kFields});
  const auto* a = all.data_ptr<int64_t>();
  auto field = [&](int r, int f) { return a[kFields * r + f]; };
  int root = -1;
  for (int r = 0; r < comm.size() && root < 0; ++r) {
    if (field(r, 0) != 0) root = r;
  }
  if (root < 0) return std::nullopt;
  std::string differing;
  bool sameCommit = field(root, 2) >= 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (field(r, 1) != field(root, 1)) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
    sameCommit = sameCommit && field(r, 0) != 0 && field(r, 2) == field(root, 2) &&
                 field(r, 3) == field(root, 3);
  }
  if (!differing.empty()) {
    throw ConfigError("elastic state: rank(s) " + differing + " registered other state than rank " +
                      std::to_string(root) + ", which holds the commit (the modules' parameter or "
                      "buffer names, dtypes or shapes, the optimizers' parameters or the "
                      "counters differ: the ranks must run the same program)");
  }
  if (sameCommit) {  // every rank's commit is the root's: nothing to move
    restore();
    return root;
  }
  // 2. The root's optimizer state mask, counters and group commit number, as of its commit.
  //    Their lengths are the same on every rank (the digests are equal). A survivor that is
  //    not the root skips its own rollback: every value it holds is overwritten from the root's.
  const bool isRoot = comm.rank() == root;
  if (isRoot) restore();
  std::vector<int64_t> head = optimizerStateMask();
  const size_t m = head.size();
  if (isRoot) {
    const auto c = counterValues();
    head.insert(head.end(), c.begin(), c.end());
    head.push_back(groupCommit_);
  } else {
    head.assign(m + counters_.size() + 1, 0);
  }
  if (!head.empty()) {
    auto wire = torch::tensor(head, i64).to(device);
    comm.broadcast(wire, root);
    wire = wire.to(torch::kCPU);
    head.assign(wire.data_ptr<int64_t>(), wire.data_ptr<int64_t>() + wire.numel());
  }
  if (!isRoot) {
    matchOptimizerState(std::vector<int64_t>(head.begin(), head.begin() + static_cast<ptrdiff_t>(m)));
    setCounters(std::vector<int64_t>(head.begin() + static_cast<ptrdiff_t>(m), head.end() - 1));
    groupCommit_ = head.back();
  }
  // 3. The values: the root's commit buffers hold its commit already (it just restored it).
  const auto live = liveTensors();
  fitSaved(live);
  broadcastValues(comm, root, live);
  adoptAsCommit();
  return root;
}

int64_t ElasticState::structureDigest() const {
  std::string text;
  for (const auto& m : modules_) {
    for (const auto& line : describeModel(*m)) text += line + "\n";
  }
  auto deviceType = [](const torch::Tensor& t) {  // not its index: each rank has its own GPU
    return std::string(c10::DeviceTypeName(t.device().type()));
  };
  for (const auto& m : modules_) {
    for (const auto& t : m->parameters()) text += deviceType(t) + "\n";
    for (const auto& t : m->buffers()) text += deviceType(t) + "\n";
  }
  for (const auto& o : optimizers_) {
    text += "optimizer " + std::to_string(o.params.size()) + "\n";
    for (const auto& p : o.params) {
      std::ostringstream os;
      os << c10::toString(p.scalar_type()) << "|" << p.sizes() << "|" << deviceType(p) << "\n";
      text += os.str();
    }
  }
  for (const auto& c : counters_) text += (c.i ? "int64 " : "double ") + c.name + "\n";
  return textDigest(text);
}

void ElasticState::broadcastValues(Communicator& comm, int root,
                                   const std::vector<torch::Tensor>& live) {
  // One broadcast per flat buffer of the commit's (one per dtype and device): the others receive
  // into theirs and copy out. These buffers are warm -- every commit writes them -- where a
  // buffer allocated for the heal would be touched for the first time inside it (each new page
  // costs microseconds on some machines, on every rank, on the recovery's critical path); a
  // replacement, which never committed, allocates them here.
  const auto device = comm.device();
  for (auto& flat : flats_) {
    if (flat.numel() == 0) continue;
    torch::Tensor wire = flat.device() == device ? flat : flat.to(device);
    comm.broadcast(wire, root);
    if (!wire.is_same(flat)) flat.copy_(wire);
  }
  if (comm.rank() != root) {
    for (size_t i = 0; i < live.size(); ++i) live[i].copy_(saved_[i]);
  }
}

void ElasticState::adoptAsCommit() {
  // A commit, when commits are enabled: a healed replacement holds the state as the survivors do.
  if (!enabled_) return;
  savedMask_ = optimizerStateMask();
  savedCounters_ = counterValues();
  commits_ = std::max<int64_t>(commits_, 1);
}

}  // namespace ddprun::runtime
