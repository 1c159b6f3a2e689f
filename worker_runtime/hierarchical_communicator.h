#pragma once
// The CPU communicator of a job on several nodes with several ranks each: shared memory within a
// node, TCP between nodes (DDPRUN_TRANSPORT=auto|shm, shm/transport.h).
//
// Allreduce, where DDP spends its time, is hierarchical:
//   1. the ranks of each node allreduce through shared memory (shm_communicator.h);
//   2. the node leaders (LOCAL_RANK 0) allreduce the node results over the TCP mesh of a Gloo
//      communicator of leaders (gloo_communicator.h: its direct / halving-doubling / ring
//      algorithms give every leader the same bits); Avg is a sum at both levels, and the leader
//      divides by the world size;
//   3. each leader broadcasts the result to its node through shared memory.
// So every rank holds the leaders' bits: results are bit-identical everywhere. The TCP traffic
// is one node's share instead of every rank's.
// Broadcast, allgather and barrier (rare: start-up, checkpoints) run flat, on a Gloo communicator
// of all ranks, as the tcp transport does.
//
// Contract: communicator.h's, with backend() == "shm+tcp". Collectives run in submission order
// on one queue (work_queue.h): the blocking ones on the caller's thread, which then runs the
// inner communicators' blocking calls inline too. A failure at any level breaks the communicator
// (later calls throw at once); the local peers of a leader that failed learn it when its process
// exits (the shm wait checks the peers' pids) or at the timeout. Each level is bounded by the
// timeout, so a collective that fails late may take up to three timeouts.
#include <memory>
#include <string>

#include "rendezvous/store.h"
#include "worker_runtime/communicator.h"

namespace ddprun::runtime {

struct HierarchicalOptions {
  int rank = 0;
  int size = 1;
  int node = 0;  // GROUP_RANK: 0..nodes-1
  int nodes = 1;
  int localRank = 0;  // LOCAL_RANK: 0..localSize-1; 0 is the node's leader
  int localSize = 1;
  Millis timeout = kDefaultCollectiveTimeout;
  Millis setupTimeout{0};               // of both Gloo communicators (GlooOptions::setupTimeout)
  std::string hostname;                 // where the TCP meshes listen (GlooOptions::hostname)
  std::string meshSecret;               // of both TCP meshes (GlooOptions::meshSecret)
  std::string shmPrefix = "ddprun";     // of the segments' names in /dev/shm (ShmOptions)
};

// Every rank of the job calls it with the same store (keys under "hier/"). The placement must
// have been checked (shm::nodesOnOneHost). Throws BackendError / TimeoutError from set-up.
std::shared_ptr<Communicator> makeHierarchicalCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                           HierarchicalOptions options);

}  // namespace ddprun::runtime
