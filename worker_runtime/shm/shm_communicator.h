#pragma once
// The shared-memory communicator: every rank of the job on one node, collectives through one
// Segment (segment.h) with the algorithms of collectives.h, on the calling thread.
//
// Contract: communicator.h's, with backend() == "shm". allgather() and barrier() run on the
// caller's thread; allreduce and broadcast queue on a communication thread (work_queue.h) so that
// DDP's buckets overlap backward, and the blocking allreduce()/broadcast() (= async + wait) run
// the job on the caller's thread when the communication thread has not picked it up yet, which is
// the common case: no hand-off, so small messages cost a few cache-line transfers. A peer
// that dies or freezes mid-collective makes every rank's call throw BackendError / TimeoutError
// within timeout (PhaseSync checks its pid while waiting); the rank that fails first marks itself
// aborted so the others fail at once. The segment's name is gone from /dev/shm once all ranks
// mapped it, so nothing is left behind however the processes end.
#include <memory>

#include "rendezvous/store.h"
#include "worker_runtime/communicator.h"

namespace ddprun::runtime::shm {

struct ShmOptions {
  int rank = 0;
  int size = 1;
  Millis timeout = kDefaultCollectiveTimeout;
  // Bytes per rank and chunk: a message goes through in chunks of this size (two sets of slots,
  // 2 * size * slotBytes of shared memory in all).
  size_t slotBytes = 1u << 20;
  // Chunks up to this size are reduced by every rank from all slots (one synchronisation);
  // larger ones by reduce-scatter + all-gather (two, but each rank reduces only 1/size).
  size_t directMaxBytes = 16u << 10;
  // Busy-wait before sleeping on a peer's flag; -1: 50 us when the ranks do not outnumber the
  // online CPUs, else 2 us (a spinning rank would hold the core its peer needs).
  int spinMicros = -1;
  int pollMillis = 10;  // liveness and deadline checks while asleep
  std::string namePrefix = "ddprun";  // of the segment's name in /dev/shm (segment.h)
};

// Every rank of the group calls it with the same store (keys under "shm/"), size and slotBytes.
// Throws BackendError when the segment cannot be set up, TimeoutError when a rank never comes.
std::shared_ptr<Communicator> makeShmCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                  ShmOptions options);

// True when every rank runs on this host (same boot id and host name), as each rank told the
// store under "shm/host/". Every rank must call it; all get the same answer.
bool allRanksOnOneHost(rendezvous::Store& store, int rank, int size);

}  // namespace ddprun::runtime::shm
