#pragma once
// ElasticState: what a training loop needs to go back to after a peer's death without leaving
// its process (in-process recovery, docs/recovery.md), in memory.
//
//   runtime::ElasticState state;
//   state.addModule(model);                 // parameters and buffers
//   state.addOptimizer(optimizer);          // torch::optim::SGD: its momentum buffers
//   state.addCounter("step", &step);        // the loop's own counters (sampler position, ...)
//   ... every step, once the step is complete: state.commit();
//
// commit() copies every tensor into buffers of its own, allocated at the first commit (again
// only when the set of tensors changes: an optimizer creates its state at its first step), and
// the counters; restore() copies them back, so the live state is bit for bit what it was at
// the commit. broadcast() makes every rank's live state rank `root`'s: how a replacement heals
// from a survivor's memory over the communicator (never from disk). Commits cost a memory copy
// of the state; they do nothing until enable() (the elastic run enables them only when the
// launcher may recover in process, so a restart-mode job pays nothing).
//
// The set of tensors is read anew at each call, in a fixed order: the modules' parameters and
// buffers (registration order), then each optimizer's per-parameter state, then the counters.
// Every rank must register the same things in the same order. Not thread-safe.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "worker_runtime/communicator.h"

namespace ddprun::runtime {

class ElasticState {
 public:
  void addModule(std::shared_ptr<torch::nn::Module> module);
  // Only torch::optim::SGD is understood (its momentum buffers; its other state is its
  // options, which the program sets itself): anything else is a ConfigError naming it. Its
  // state may appear later (at the first step): commit/restore/broadcast create or drop
  // per-parameter state so that it matches what was committed or what the root holds.
  void addOptimizer(torch::optim::Optimizer& optimizer);
  void addCounter(std::string name, int64_t* value);
  void addCounter(std::string name, double* value);  // bit for bit, as an int64

  void enable() { enabled_ = true; }
  bool enabled() const { return enabled_; }

  // Snapshot of the live state (no-op until enable()). Then the boundary check, if any.
  void commit();
  // Called at the end of every enabled commit(), once the snapshot is complete: a commit is
  // the point where the group may change without a rollback (runElastic installs a check that
  // throws there when the launcher published a new generation: grow back). So a program lets
  // what commit() throws propagate out of its loop body, as it does a collective's error.
  void setBoundary(std::function<void()> check) { boundary_ = std::move(check); }
  // Back to the last commit. Throws ConfigError when there is none.
  void restore();
  bool committed() const { return commits_ > 0; }
  int64_t commits() const { return commits_; }
  // Bytes a commit copies (tensors and counters).
  size_t bytes() const;

  // Every rank's live state becomes rank `root`'s, and once commits are enabled so does every
  // rank's last commit (a replacement that healed holds the state, as the survivors do). It
  // travels through the commit's own buffers (warm: every commit writes them). Collective on
  // `comm`: every rank calls it with the same registrations. A rank whose tensors differ from
  // root's in number or size throws ConfigError naming the first difference (the programs
  // differ).
  void broadcast(Communicator& comm, int root);

  // A recovery's heal (runElastic): the ranks agree on who holds a commit -- the lowest rank
  // that does is the root -- the root rolls back to its commit, and every rank's live state and
  // last commit become the root's. Three collectives where broadcast() takes five plus the
  // root's agreement: one allgather of each rank's flag and state digest (the registered
  // tensors' names, dtypes and shapes, the optimizers' parameters, the counters' names), one
  // broadcast of the root's optimizer state mask and counters, then the values (one per flat
  // buffer). Collective on `comm`. nullopt when no rank holds a commit (nothing was changed);
  // ConfigError on every rank, naming the ranks, when a digest differs from the root's (the
  // ranks run different programs), before any state moved.
  // When every rank holds the root's commit already -- the same group commit number (below) and
  // the same counters: a shrink whose survivors all committed the same step -- each rolls back
  // to its own commit and nothing moves (one allgather): in data parallel training the ranks'
  // commits of one step are bit for bit equal.
  std::optional<int> heal(Communicator& comm);

 private:
  struct Optimizer {
    torch::optim::Optimizer* optimizer;
    std::vector<torch::Tensor> params;  // in param_groups order
  };
  struct Counter {
    std::string name;
    int64_t* i = nullptr;
    double* d = nullptr;
  };
  // Which parameters of each optimizer have state now (1/0 per parameter, all optimizers).
  std::vector<int64_t> optimizerStateMask() const;
  // Creates (zeros) or drops per-parameter state so that it matches `mask`.
  void matchOptimizerState(const std::vector<int64_t>& mask);
  std::vector<torch::Tensor> liveTensors() const;
  // The digest heal() compares: what every rank must register alike (not the mask, which a
  // fresh replacement lacks, nor any value).
  int64_t structureDigest() const;
  // The values step of broadcast() and heal(): the flat buffers from root (whose saved_ must
  // hold what it sends), out into every other rank's `live` tensors (liveTensors(), with
  // saved_ fitted to them).
  void broadcastValues(Communicator& comm, int root, const std::vector<torch::Tensor>& live);
  // After a broadcast or a heal: what restore() goes back to is the root's state.
  void adoptAsCommit();
  std::vector<int64_t> counterValues() const;
  void setCounters(const std::vector<int64_t>& values);

  std::vector<std::shared_ptr<torch::nn::Module>> modules_;
  std::vector<Optimizer> optimizers_;
  std::vector<Counter> counters_;
  bool enabled_ = false;
  int64_t commits_ = 0;
  // The group's commit number: every rank commits at every step boundary, so ranks that
  // started together or healed from one root count alike; a heal gives every rank the root's.
  // -1 after a broadcast() (unknown), which makes the next heal move the values.
  int64_t groupCommit_ = 0;
  // Makes saved_ fit `live` (views of flats_, one flat buffer per dtype and device), allocating
  // anew only when the tensors changed.
  void fitSaved(const std::vector<torch::Tensor>& live);
  std::vector<torch::Tensor> saved_;  // the last commit's tensors: views of flats_
  std::vector<torch::Tensor> flats_;
  std::vector<int64_t> savedMask_;
  std::vector<int64_t> savedCounters_;
  std::function<void()> boundary_;
};

}  // namespace ddprun::runtime
