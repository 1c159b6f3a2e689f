#pragma once
// Segment: the shared memory the ranks of one node meet in, one per communicator and attempt.
//
// Lifetime: a SharedMapping (mapping.h): local rank 0 creates it under a random name, the others
// map it through the store, and the name is unlinked once all have, so no path leaves anything
// behind in /dev/shm (the one window: every rank dying between create and the last map).
//
// Layout: a header, one RankControl per rank (each in its own pair of cache lines), then two sets
// ("parities") of one slot per rank, slotBytes each. Collectives alternate the two sets chunk by
// chunk, which is what lets a rank refill its slot without a third synchronisation (sync.h).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "rendezvous/store.h"
#include "worker_runtime/shm/mapping.h"

namespace ddprun::runtime::shm {

// Per rank, written by that rank (step, aborted) or by its waiters (sleepers).
struct alignas(128) RankControl {
  std::atomic<uint32_t> step;      // phases this rank has posted: the futex word its peers wait on
  std::atomic<uint32_t> sleepers;  // peers sleeping (futex) on step: post() wakes them when > 0
  std::atomic<uint32_t> aborted;   // 1: this rank gave up on a collective; peers fail at once
  std::atomic<int32_t> pid;        // for liveness checks (kill(pid, 0), zombie state)
  // Where this rank's tensor of the allreduce in progress lies in lent memory (collectives.h):
  // (lend number + 1) << 40 | offset in its region, 0 when it is not in lent memory; its bytes.
  std::atomic<uint64_t> lentAt;
  std::atomic<uint64_t> lentBytes;
  // A random value this rank also wrote at the start of its region of a carried lent buffer
  // (lent_carry.h): a peer that reads another value there maps other memory.
  std::atomic<uint64_t> lentCheck;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct SegmentOptions {
  int rank = 0;   // local rank; 0 creates the segment
  int size = 1;   // local world size
  size_t slotBytes = 256u << 10;  // ShmOptions::slotBytes
  // The name is "/<namePrefix>-<32 random hex digits>". Tests give a prefix of their own to find
  // anything left behind; [A-Za-z0-9_.-], at most 64 characters.
  std::string namePrefix = "ddprun";
  std::chrono::milliseconds timeout{300'000};  // bound of the set-up (store waits)
};

class Segment {
 public:
  // Creates (rank 0) or maps (others) the segment through `store`, whose keys must be private to
  // this communicator (the caller passes a scoped store). Throws BackendError (shm_open, mmap or
  // space failures, naming the call and errno) or TimeoutError (a rank never mapped it).
  Segment(rendezvous::Store& store, const SegmentOptions& options);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slotBytes() const { return slotBytes_; }
  RankControl* control() const { return control_; }
  char* slot(int parity, int rank) const {
    return data_ + (static_cast<size_t>(parity) * size_ + rank) * slotBytes_;
  }
  const std::string& name() const { return mapping_->name(); }

 private:
  int rank_;
  int size_;
  size_t slotBytes_;
  std::unique_ptr<SharedMapping> mapping_;
  RankControl* control_ = nullptr;
  char* data_ = nullptr;
};

}  // namespace ddprun::runtime::shm
