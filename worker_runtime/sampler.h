#pragma once
// DistributedSampler: each rank's share of a dataset's indices, with the semantics of PyTorch's
// torch.utils.data.distributed.DistributedSampler, index for index:
//   - shuffle: the permutation is torch.randperm(datasetSize, generator seeded with seed + epoch),
//     computed with LibTorch's own CPU generator and randperm, so it equals Python's for the same
//     seed and epoch (tests/worker_runtime/sampler_vs_torch.py checks it against torch 1.13);
//     without shuffle the order is 0..datasetSize-1;
//   - dropLast=false: the list is padded by repeating its beginning until it divides evenly, so every
//     rank gets ceil(datasetSize / numReplicas) indices; dropLast=true: the tail is dropped and
//     every rank gets floor(datasetSize / numReplicas);
//   - rank r takes positions r, r + numReplicas, r + 2 * numReplicas, ... of that list, so the
//     ranks' indices are disjoint (up to the padding) and together cover the dataset.
// setEpoch() must be called at the start of each epoch, as in PyTorch, or every epoch repeats the
// same order.
//
// It is also a torch::data sampler (usable with torch::data::make_data_loader): next(n) hands out
// the epoch's indices in order, reset() rewinds to the start of the current epoch, and the
// position can be saved in a checkpoint (state() / restore()) to resume mid-epoch.
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

// What a checkpoint stores to resume a sampler: the epoch and how many of this epoch's indices
// were already handed out.
struct SamplerState {
  int64_t epoch = 0;
  size_t position = 0;
};

class DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  // Throws ConfigError for numReplicas < 1 or rank outside [0, numReplicas). (dropLast with fewer
  // samples than replicas gives every rank 0 indices, as PyTorch does.)
  explicit DistributedSampler(DistributedSamplerOptions options);

  void setEpoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // The number of indices this rank gets per epoch (PyTorch's len(sampler)).
  size_t size() const { return numSamples_; }
  // This rank's indices for the current epoch.
  const std::vector<size_t>& indices() const { return indices_; }

  // torch::data::samplers::Sampler (LibTorch 1.13 uses c10::optional): rewind to the start of the epoch (`newSize` changes the
  // dataset size), hand out up to `batchSize` next indices (nullopt at the end of the epoch).
  void reset(c10::optional<size_t> newSize = c10::nullopt) override;
  c10::optional<std::vector<size_t>> next(size_t batchSize) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  SamplerState state() const { return {epoch_, position_}; }
  // Sets the epoch and the position within it (throws ConfigError when beyond the epoch's end).
  void restore(const SamplerState& s);

  const DistributedSamplerOptions& options() const { return options_; }

 private:
  void computeIndices();

  DistributedSamplerOptions options_;
  int64_t epoch_ = 0;
  size_t numSamples_ = 0;
  size_t position_ = 0;
  std::vector<size_t> indices_;
};

// The whole (unsplit, padded or truncated) index list of one epoch, before rank r takes every
// numReplicas-th element: exposed for tests and for tools that want the global order.
std::vector<int64_t> distributedEpochOrder(const DistributedSamplerOptions& options,
                                           int64_t epoch);

}  // namespace ddprun::runtime
