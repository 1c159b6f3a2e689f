#include "worker_runtime/sampler.h"

#include "base/errors.h"

namespace ddprun::runtime {
namespace {

// PyTorch's len(sampler) for `n` samples: with drop_last and an uneven split, ceil((n - R) / R)
// (= floor(n / R)), else ceil(n / R).
size_t samplesPerReplica(size_t n, int replicas, bool dropLast) {
  const size_t r = static_cast<size_t>(replicas);
  if (dropLast) return n / r;
  return (n + r - 1) / r;
}

void validate(const DistributedSamplerOptions& o) {
  if (o.numReplicas < 1) {
    throw ConfigError("DistributedSampler: numReplicas=" + std::to_string(o.numReplicas) +
                      " must be >= 1");
  }
  if (o.rank < 0 || o.rank >= o.numReplicas) {
    throw ConfigError("DistributedSampler: rank=" + std::to_string(o.rank) +
                      " must be in [0, " + std::to_string(o.numReplicas - 1) + "]");
  }
}

}  // namespace

std::vector<int64_t> distributedEpochOrder(const DistributedSamplerOptions& o, int64_t epoch,
                                           size_t start) {
  validate(o);
  const int64_t n = static_cast<int64_t>(o.datasetSize);
  DDPRUN_CHECK(start <= o.datasetSize, "start " << start << " > " << o.datasetSize);
  std::vector<int64_t> order;
  if (o.shuffle) {
    // Exactly PyTorch's: g = torch.Generator(); g.manual_seed(seed + epoch); torch.randperm(n, g).
    auto gen = at::detail::createCPUGenerator(o.seed + static_cast<uint64_t>(epoch));
    torch::Tensor perm = torch::randperm(n, gen, torch::kLong);
    const int64_t* p = perm.data_ptr<int64_t>();
    order.assign(p, p + n);
  } else {
    order.resize(n);
    for (int64_t i = 0; i < n; ++i) order[i] = i;
  }
  const size_t rest = order.size() - start;
  const size_t total = samplesPerReplica(rest, o.numReplicas, o.dropLast) *
                       static_cast<size_t>(o.numReplicas);
  std::vector<int64_t> segment(order.begin() + static_cast<std::ptrdiff_t>(start), order.end());
  if (segment.size() > total) {
    segment.resize(total);
  } else {
    // Pad by repeating the epoch's order from its start (more than once when it is very short),
    // as PyTorch pads a whole epoch.
    for (size_t i = 0; segment.size() < total && !order.empty(); ++i) {
      segment.push_back(order[i % order.size()]);
    }
  }
  return segment;
}

DistributedSampler::DistributedSampler(DistributedSamplerOptions options)
    : options_(std::move(options)) {
  validate(options_);
  computeIndices();
}

void DistributedSampler::computeIndices() {
  const std::vector<int64_t> segment = distributedEpochOrder(options_, epoch_, start_);
  const size_t replicas = static_cast<size_t>(options_.numReplicas);
  indices_.clear();
  indices_.reserve(segment.size() / replicas);
  for (size_t i = static_cast<size_t>(options_.rank); i < segment.size(); i += replicas) {
    indices_.push_back(static_cast<size_t>(segment[i]));
  }
  DDPRUN_CHECK(indices_.size() * replicas == segment.size(),
               indices_.size() << " x " << replicas << " != " << segment.size());
  taken_ = 0;
}

void DistributedSampler::setEpoch(int64_t epoch) {
  epoch_ = epoch;
  start_ = 0;
  computeIndices();
}

void DistributedSampler::reset(c10::optional<size_t> newSize) {
  if (newSize) {
    options_.datasetSize = *newSize;
    validate(options_);
  }
  start_ = 0;
  computeIndices();
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batchSize) {
  if (taken_ >= indices_.size()) return c10::nullopt;
  const size_t end = std::min(indices_.size(), taken_ + batchSize);
  std::vector<size_t> batch(indices_.begin() + static_cast<std::ptrdiff_t>(taken_),
                            indices_.begin() + static_cast<std::ptrdiff_t>(end));
  taken_ = end;
  return batch;
}

SamplerState DistributedSampler::state() const {
  const size_t consumed = start_ + taken_ * static_cast<size_t>(options_.numReplicas);
  return {.epoch = epoch_,
          .position = std::min(consumed, options_.datasetSize),
          .datasetSize = options_.datasetSize};
}

void DistributedSampler::restore(const SamplerState& s) {
  if (s.datasetSize != 0 && s.datasetSize != options_.datasetSize) {
    throw ConfigError("DistributedSampler: the saved position is for a dataset of " +
                      std::to_string(s.datasetSize) + " samples, this one has " +
                      std::to_string(options_.datasetSize) +
                      " (a different dataset or train_limit?)");
  }
  if (s.position > options_.datasetSize) {
    throw ConfigError("DistributedSampler: saved position " + std::to_string(s.position) +
                      " is beyond the " + std::to_string(options_.datasetSize) +
                      " samples of the epoch (a different dataset size?)");
  }
  epoch_ = s.epoch;
  start_ = s.position;
  computeIndices();
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  const SamplerState s = state();
  archive.write("epoch", torch::tensor(s.epoch, torch::kInt64), /*is_buffer=*/true);
  archive.write("position", torch::tensor(static_cast<int64_t>(s.position), torch::kInt64),
                /*is_buffer=*/true);
  archive.write("dataset_size", torch::tensor(static_cast<int64_t>(s.datasetSize), torch::kInt64),
                /*is_buffer=*/true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor epoch, position, datasetSize;
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  archive.read("dataset_size", datasetSize, /*is_buffer=*/true);
  restore({.epoch = epoch.item<int64_t>(),
           .position = static_cast<size_t>(position.item<int64_t>()),
           .datasetSize = static_cast<size_t>(datasetSize.item<int64_t>())});
}

}  // namespace ddprun::runtime
