#pragma once
// DistributedSampler: each rank's share of a dataset's indices, with the semantics of PyTorch's
// torch.utils.data.distributed.DistributedSampler, index for index, and a position that survives
// a change of the world size.
//
// One epoch is one order of the dataset:
//   - shuffle: the permutation is torch.randperm(datasetSize, generator seeded with seed + epoch),
//     computed with LibTorch's own CPU generator and randperm, so it equals Python's for the same
//     seed and epoch (tests/worker_runtime/sampler_vs_torch.py checks it against torch 1.13);
//     without shuffle the order is 0..datasetSize-1.
// Its *position* is how many samples of that order all ranks together have consumed. A segment
// of the epoch starts at a position p (0 at the start of an epoch) and is split as PyTorch splits
// a whole epoch:
//   - the rest of the order, from p, is padded (dropLast=false) by repeating the order from the
//     epoch's start until it divides evenly by numReplicas, or its tail is dropped (dropLast=true)
//     so that it does;
//   - rank r takes positions r, r + numReplicas, r + 2 * numReplicas, ... of that list.
// Because rank r takes every numReplicas-th element, after every rank has taken k indices the
// ranks together have consumed exactly the positions p .. p + k * numReplicas of the order: a
// prefix. So the state to save is (epoch, position), not a per-rank index, and a job resumed at
// another world size continues with the rest of the same epoch: across any sequence of world
// sizes every sample of the epoch is taken exactly once, except the epoch's tail, which is padded
// or dropped by the last segment (fewer than numReplicas samples; a trainer that drops incomplete
// batches, as PyTorch's drop_last DataLoader does, drops fewer than numReplicas x batch).
// At p = 0, an uninterrupted epoch is PyTorch's, index for index, at any world size.
//
// setEpoch() must be called at the start of each epoch, as in PyTorch, or every epoch repeats the
// same order.
//
// It is also a torch::data sampler (usable with torch::data::make_data_loader): next(n) hands out
// the segment's indices in order, reset() rewinds to the start of the epoch, and state() /
// restore() save and resume the position (in a checkpoint, with the epoch).
#include <cstdint>
#include <optional>
#include <vector>

#include <torch/torch.h>

namespace ddprun::runtime {

struct DistributedSamplerOptions {
  size_t datasetSize = 0;
  int numReplicas = 1;  // the world size
  int rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  bool dropLast = false;
};

// What a checkpoint stores to resume a sampler, at any world size.
struct SamplerState {
  int64_t epoch = 0;
  // Samples of this epoch's order consumed by all ranks together (0 .. datasetSize).
  size_t position = 0;
  // The dataset size it was saved with; 0: unknown (restore() does not check it).
  size_t datasetSize = 0;
};

class DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  // Throws ConfigError for numReplicas < 1 or rank outside [0, numReplicas). (dropLast with fewer
  // samples than replicas gives every rank 0 indices, as PyTorch does.)
  explicit DistributedSampler(DistributedSamplerOptions options);

  // Starts epoch `epoch` at its beginning.
  void setEpoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // The number of indices this rank gets in the current segment: PyTorch's len(sampler) for a
  // whole epoch (position 0).
  size_t size() const { return indices_.size(); }
  // Indices of the segment this rank has not taken yet.
  size_t remaining() const { return indices_.size() - taken_; }
  // This rank's indices for the current segment.
  const std::vector<size_t>& indices() const { return indices_; }

  // torch::data::samplers::Sampler (LibTorch 1.13 uses c10::optional): rewind to the start of the
  // epoch (`newSize` changes the dataset size), hand out up to `batchSize` next indices (nullopt
  // at the end of the segment).
  void reset(c10::optional<size_t> newSize = c10::nullopt) override;
  c10::optional<std::vector<size_t>> next(size_t batchSize) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // The epoch and its position, assuming every rank has taken as many indices as this one (as in
  // data-parallel training, where each step takes one batch on every rank). The padding of the
  // epoch's tail does not count: the position is at most datasetSize.
  SamplerState state() const;
  // Continues epoch s.epoch at position s.position, split over this sampler's replicas. Throws
  // ConfigError when the position is beyond the epoch, or the state was saved for a dataset of
  // another size.
  void restore(const SamplerState& s);

  const DistributedSamplerOptions& options() const { return options_; }

 private:
  void computeIndices();

  DistributedSamplerOptions options_;
  int64_t epoch_ = 0;
  size_t start_ = 0;  // the segment's first position in the epoch's order
  size_t taken_ = 0;  // indices of the segment this rank has handed out
  std::vector<size_t> indices_;
};

// The whole (unsplit) list of one segment -- the epoch's order from position `start`, padded or
// truncated to a multiple of numReplicas -- before rank r takes every numReplicas-th element.
// With start 0 this is PyTorch's padded or truncated epoch. Exposed for tests and for tools that
// want the global order.
std::vector<int64_t> distributedEpochOrder(const DistributedSamplerOptions& options,
                                           int64_t epoch, size_t start = 0);

}  // namespace ddprun::runtime
