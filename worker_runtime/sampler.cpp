#include "worker_runtime/sampler.h"

#include "base/errors.h"

namespace ddprun::runtime {
namespace {

// PyTorch's len(sampler): with drop_last and an uneven split, ceil((N - R) / R), else ceil(N / R).
size_t samplesPerReplica(const DistributedSamplerOptions& o) {
  const size_t n = o.datasetSize;
  const size_t r = static_cast<size_t>(o.numReplicas);
  if (o.dropLast && n % r != 0) return n < r ? 0 : (n - r + r - 1) / r;  // ceil of < 0 is 0
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

std::vector<int64_t> distributedEpochOrder(const DistributedSamplerOptions& o, int64_t epoch) {
  validate(o);
  const int64_t n = static_cast<int64_t>(o.datasetSize);
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
  const size_t total = samplesPerReplica(o) * static_cast<size_t>(o.numReplicas);
  if (!o.dropLast) {
    // Pad by repeating the list from its start (more than once when it is very short).
    const size_t original = order.size();
    for (size_t i = 0; order.size() < total && original > 0; ++i) {
      order.push_back(order[i % original]);
    }
  } else {
    order.resize(total);
  }
  return order;
}

DistributedSampler::DistributedSampler(DistributedSamplerOptions options)
    : options_(std::move(options)) {
  validate(options_);
  computeIndices();
}

void DistributedSampler::computeIndices() {
  numSamples_ = samplesPerReplica(options_);
  const std::vector<int64_t> order = distributedEpochOrder(options_, epoch_);
  indices_.clear();
  indices_.reserve(numSamples_);
  for (size_t i = static_cast<size_t>(options_.rank); i < order.size();
       i += static_cast<size_t>(options_.numReplicas)) {
    indices_.push_back(static_cast<size_t>(order[i]));
  }
  DDPRUN_CHECK(indices_.size() == numSamples_, indices_.size() << " != " << numSamples_);
}

void DistributedSampler::setEpoch(int64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  computeIndices();
}

void DistributedSampler::reset(c10::optional<size_t> newSize) {
  if (newSize && *newSize != options_.datasetSize) {
    options_.datasetSize = *newSize;
    validate(options_);
    computeIndices();
  }
  position_ = 0;
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batchSize) {
  if (position_ >= indices_.size()) return c10::nullopt;
  const size_t end = std::min(indices_.size(), position_ + batchSize);
  std::vector<size_t> batch(indices_.begin() + position_, indices_.begin() + end);
  position_ = end;
  return batch;
}

void DistributedSampler::restore(const SamplerState& s) {
  if (s.epoch != epoch_) setEpoch(s.epoch);
  if (s.position > indices_.size()) {
    throw ConfigError("DistributedSampler: saved position " + std::to_string(s.position) +
                      " is beyond the " + std::to_string(indices_.size()) +
                      " indices of this rank's epoch (different dataset size or world size?)");
  }
  position_ = s.position;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", torch::tensor(epoch_, torch::kInt64), /*is_buffer=*/true);
  archive.write("position", torch::tensor(static_cast<int64_t>(position_), torch::kInt64),
                /*is_buffer=*/true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor epoch, position;
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  restore({epoch.item<int64_t>(), static_cast<size_t>(position.item<int64_t>())});
}

}  // namespace ddprun::runtime
