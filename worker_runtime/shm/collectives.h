#pragma once
// The collectives of one node's ranks on a Segment, run on the calling thread. Large messages go
// through in chunks of the slot size; each chunk uses the slots of one parity, alternating, so a
// rank refills its slot only after every peer has posted a later phase (and so has finished
// reading the chunk before).
//   allreduce, small (chunk bytes <= directMaxBytes): every rank copies its chunk into its slot,
//     one phase, then every rank reduces the P inputs in rank order (its own read in place, the
//     others' from their slots): one synchronisation, and a rank's only wait is for its peers'
//     flags (RankControl::step), nothing handed to another thread.
//   allreduce, large: reduce-scatter then all-gather. Rank r copies the parts the others own into
//     its slot; phase; r reduces its own slice of the chunk from every slot (its own input read in
//     place) in rank order, writes it to its buffer and its slot; phase; r copies the others'
//     reduced slices. Each element is computed once, by its owner: the same bits everywhere.
//   broadcast: the root copies a chunk into its slot; phase; the others copy it out.
//   allgather: every rank copies its chunk into its slot; phase; every rank copies all slots out.
//   barrier: one phase.
//   allreduce in lent memory (larger than directMaxBytes, when the tensor lies at the same place
//     in memory lent by Communicator::lendSharedBuffer on every rank): no copy in. Each rank
//     publishes where its tensor lies (RankControl::lentAt) with the phase that says its input is
//     ready; when all agree, r reduces its own slice of the whole tensor reading every rank's
//     tensor directly (its own in place) and, in the same pass, a block at a time, writes the
//     result into that slice of every rank's tensor (so no rank reads or writes a slice another
//     one touches); phase, and every tensor holds the whole result: two synchronisations for the
//     whole tensor, no chunks, no separate copy. When they do not agree, that first phase
//     was a barrier and the chunked algorithm above follows, on every rank alike.
// ReduceOp::Avg divides once the sum is complete (on the owner, before it is shared). Errors:
// TimeoutError / BackendError from PhaseSync; after one, the caller must abort() (sync.h).
#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include <c10/core/ScalarType.h>

#include "worker_runtime/communicator.h"
#include "worker_runtime/shm/segment.h"
#include "worker_runtime/shm/sync.h"

namespace ddprun::runtime::shm {

struct CollectiveOptions {
  size_t directMaxBytes = 16u << 10;
  // In a message of at least streamMinBytes, bytes meant for peers (a slot's, a peer's tensor in
  // lent memory) are stored with streamCopy (reduce.h), not through this core's cache: the peers'
  // copies of those lines are then not fetched line by line first, and a message larger than the
  // caches does not evict the rest. A smaller message stays in the caches, where the peer reads
  // it fastest: on this machine class (2 ranks, quiet) streaming made 64 KiB..1 MiB 1.3-1.6x
  // slower, was even at 4 MiB and 1.4x faster from 16 MiB on. False: never (for A/B runs).
  bool streamStores = true;
  size_t streamMinBytes = 8u << 20;
  SyncOptions sync;
};

class Collectives {
 public:
  Collectives(Segment& segment, CollectiveOptions options);

  int rank() const { return segment_.rank(); }
  int size() const { return segment_.size(); }

  void allreduce(void* data, size_t count, c10::ScalarType type, ReduceOp op,
                 Clock::time_point deadline);
  void broadcast(void* data, size_t bytes, int root, Clock::time_point deadline);
  // `out` holds size() * bytes: rank j's input at out + j * bytes.
  void allgather(const void* in, size_t bytes, void* out, Clock::time_point deadline);
  void barrier(Clock::time_point deadline);
  void abort() { sync_.abort(); }

  // Memory lent to the caller: `mapping` holds one region of regionBytes per rank, rank j's at
  // data() + j * regionBytes. Every rank adds its lends in the same order (all ranks or none:
  // whether any exist decides, alike on every rank, whether an allreduce asks where its tensor
  // lies). Only a weak reference is kept: the lent tensors own the memory.
  void addLent(const std::shared_ptr<SharedMapping>& mapping, size_t regionBytes);

  // Allreduce bytes copied into the slots (and reduced from there), and bytes reduced in place in
  // lent memory, since construction. For tests and benchmarks; any thread may read them.
  uint64_t stagedBytes() const { return staged_.load(std::memory_order_relaxed); }
  uint64_t inPlaceBytes() const { return inPlace_.load(std::memory_order_relaxed); }

 private:
  // Posts the next phase and waits for every peer to post it.
  void phase(Clock::time_point deadline) { sync_.waitAll(sync_.post(), deadline); }
  int nextParity() { return static_cast<int>(chunks_++ & 1); }
  // Whether a message of `bytes` streams what it stores for peers (streamMinBytes).
  bool streams(size_t bytes) const {
    return options_.streamStores && bytes >= options_.streamMinBytes;
  }
  // Copies into a slot (stream: streamCopy, else memcpy).
  static void copyOut(char* slot, const void* from, size_t bytes, bool stream);
  void allreduceDirect(char* data, size_t count, c10::ScalarType type, ReduceOp op,
                       Clock::time_point deadline);
  void allreduceScatterGather(char* data, size_t count, c10::ScalarType type, ReduceOp op,
                              bool stream, Clock::time_point deadline);
  // The allreduce in lent memory; false (after one phase, on every rank alike) when the ranks'
  // tensors do not all lie at the same place in it.
  bool allreduceInPlace(char* data, size_t count, c10::ScalarType type, ReduceOp op,
                        bool stream, Clock::time_point deadline);

  struct Lent {
    std::weak_ptr<SharedMapping> mapping;
    size_t regionBytes = 0;
  };

  Segment& segment_;
  CollectiveOptions options_;
  PhaseSync sync_;
  uint64_t chunks_ = 0;  // chunks moved so far: the parity of the next one
  std::vector<Lent> lent_;
  std::atomic<uint64_t> staged_{0};
  std::atomic<uint64_t> inPlace_{0};
};

}  // namespace ddprun::runtime::shm
