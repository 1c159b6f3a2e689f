#include "worker_runtime/shm/segment.h"

#include <unistd.h>

#include <new>

#include "base/errors.h"

namespace ddprun::runtime::shm {
namespace {

constexpr uint64_t kMagic = 0x64647072756e7368ULL;  // "ddprunsh"
constexpr size_t kPage = 4096;

struct Header {
  uint64_t magic;
  uint64_t slotBytes;
  uint32_t ranks;
};
static_assert(sizeof(Header) <= kPage);

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

Segment::Segment(rendezvous::Store& store, const SegmentOptions& o)
    : rank_(o.rank), size_(o.size), slotBytes_(roundUp(o.slotBytes, kPage)) {
  DDPRUN_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "rank " << rank_ << " of " << size_);
  const size_t controlBytes = roundUp(sizeof(RankControl) * size_, kPage);
  const size_t bytes = kPage + controlBytes + 2 * static_cast<size_t>(size_) * slotBytes_;
  auto initialize = [&](char* base) {
    // The file is zero-filled: every counter starts at 0.
    auto* control = reinterpret_cast<RankControl*>(base + kPage);
    for (int r = 0; r < size_; ++r) new (&control[r]) RankControl{};
    auto* header = reinterpret_cast<Header*>(base);
    header->slotBytes = slotBytes_;
    header->ranks = static_cast<uint32_t>(size_);
    std::atomic_thread_fence(std::memory_order_release);
    header->magic = kMagic;
  };
  auto verify = [&](char* base) {
    const auto* header = reinterpret_cast<const Header*>(base);
    if (header->magic != kMagic || header->ranks != static_cast<uint32_t>(size_) ||
        header->slotBytes != slotBytes_) {
      throw BackendError("shm: segment does not match this communicator (" +
                         std::to_string(header->ranks) + " ranks, " +
                         std::to_string(header->slotBytes) + "-byte slots)");
    }
  };
  // Our pid goes in before the others can start waiting on us ("mapped" is published after).
  auto verifyAndMark = [&](char* base) {
    if (rank_ == 0) {
      initialize(base);
    } else {
      verify(base);
    }
    reinterpret_cast<RankControl*>(base + kPage)[rank_].pid.store(static_cast<int32_t>(::getpid()));
  };
  mapping_ = std::make_unique<SharedMapping>(
      store,
      MappingOptions{.rank = rank_, .size = size_, .bytes = bytes, .namePrefix = o.namePrefix,
                     .timeout = o.timeout, .what = "segment"},
      verifyAndMark, verifyAndMark);
  control_ = reinterpret_cast<RankControl*>(mapping_->data() + kPage);
  data_ = mapping_->data() + kPage + controlBytes;
}

Segment::~Segment() = default;

}  // namespace ddprun::runtime::shm
