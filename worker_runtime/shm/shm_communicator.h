#pragma once
// The shared-memory communicator: every rank of the job on one node, collectives through one
// Segment (segment.h) with the algorithms of collectives.h, on the calling thread.
//
// Contract: communicator.h's, with backend() == "shm". Every blocking collective (allreduce,
// broadcast, allgather, barrier) runs on the caller's thread once the async ones queued before it
// have finished (work_queue.h): no hand-off, so a small message costs a few cache-line transfers.
// allreduceAsync / broadcastAsync queue on a communication thread so that DDP's buckets overlap
// backward; Work::wait() runs a job the thread has not picked up yet on the waiter's. A peer
// that dies or freezes mid-collective makes every rank's call throw BackendError / TimeoutError
// within timeout (PhaseSync checks its pid while waiting); the rank that fails first marks itself
// aborted so the others fail at once. The segment's name is gone from /dev/shm once all ranks
// mapped it, so nothing is left behind however the processes end.
// lendSharedBuffer() maps one more piece of shared memory the same way, one region per rank;
// allreduces of tensors that lie at the same place in it on every rank are reduced in place
// (collectives.h), which is where DDP keeps its buckets. Under in-process recovery a later
// generation reuses the buffers its survivors carry (lent_carry.h).
#include <memory>
#include <optional>

#include "rendezvous/store.h"
#include "worker_runtime/communicator.h"
#include "worker_runtime/shm/lent_carry.h"

namespace ddprun::runtime::shm {

struct ShmOptions {
  int rank = 0;
  int size = 1;
  Millis timeout = kDefaultCollectiveTimeout;
  // Bytes per rank and chunk: a message goes through in chunks of this size (two sets of slots,
  // 2 * size * slotBytes of shared memory in all). Every generation of in-process recovery maps
  // a new segment, and each page's first touch is on the recovery's critical path (5-10 us per
  // page on a guest with shadow page tables): 256 KiB slots are 256 pages at 2 ranks where
  // 1 MiB ones were 1024, with no steady-state difference (DDP's buckets are reduced in lent
  // memory, not through the slots; docs/worker_runtime.md).
  size_t slotBytes = 256u << 10;
  // Chunks up to this size are reduced by every rank from all slots (one synchronisation);
  // larger ones by reduce-scatter + all-gather (two, but each rank reduces only 1/size).
  size_t directMaxBytes = 16u << 10;
  // Waiting for a peer (sync.h): busy-wait for spinMicros, then sched_yield between checks until
  // yieldMicros have passed, then sleep. spinMicros -1: 50 us when the ranks do not outnumber
  // the CPUs this process may run on, else 0 (a spinning rank would hold the core its peer needs;
  // yielding hands it over). yieldMicros -1: 2000 us.
  int spinMicros = -1;
  int yieldMicros = -1;
  int pollMillis = 10;  // liveness and deadline checks while asleep
  bool streamStores = true;  // CollectiveOptions::streamStores, streamMinBytes (collectives.h)
  size_t streamMinBytes = 8u << 20;
  std::string namePrefix = "ddprun";  // of the segment's name in /dev/shm (segment.h)
  // In-process recovery (lent_carry.h): this process's carry, where a lent buffer goes once its
  // tensor is freed (none: unmapped), and whether this communicator's lends first ask whether
  // the ranks carry one to reuse. Every rank of a group must pass the same reuseLent (a
  // generation after the first); the carry is the process's own.
  std::shared_ptr<LentCarry> lentCarry;
  bool reuseLent = false;
};

// Every rank of the group calls it with the same store (keys under "shm/"), size and slotBytes.
// Throws BackendError when the segment cannot be set up, TimeoutError when a rank never comes.
std::shared_ptr<Communicator> makeShmCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                  ShmOptions options);

// Where a rank runs, as the launcher says: GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE.
struct NodeMember {
  int rank = 0;
  int size = 1;  // WORLD_SIZE
  int node = 0;
  int localRank = 0;
  int localSize = 1;
};

// True when the ranks of every node run on one host (same boot id and host name), hold the local
// ranks 0..localSize-1 once each, and the nodes are 0..N-1, as each rank told the store under
// "shm/host/". Every rank must call it; all get the same answer.
bool nodesOnOneHost(rendezvous::Store& store, const NodeMember& me);

// nodesOnOneHost(), asked through the store once per attempt of the group rather than in every
// generation of in-process recovery. Processes do not move and the agent starts a replacement on
// its node's host, so the answer holds for the attempt. `known` is what this process learnt
// before (WorkerEnv::onOneHost): when set, it is the answer, with no round trip. Else, in a
// generation after the first (`laterGeneration`), the answer a rank wrote under
// "shm/host/answer" of `attemptStore`, when there is one (a replacement joining the survivors).
// Else every rank asks through `store` (the generation's keys), writes the answer under that key
// of `attemptStore` and keeps it in `known`. Every rank of a generation takes the same path: a
// rank holds an answer only once the key exists, so whenever one skips the question the others
// find the key.
bool nodesOnOneHostOnce(rendezvous::Store& store, rendezvous::Store& attemptStore,
                        const NodeMember& me, bool laterGeneration, std::optional<bool>& known);

}  // namespace ddprun::runtime::shm
