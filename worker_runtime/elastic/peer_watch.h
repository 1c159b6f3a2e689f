#pragma once
// Peer watch: which rank of this node's group has died, for a communicator that does not see a
// peer's death by itself.
//
// In-process recovery (docs/recovery.md) needs every survivor's collective in flight to fail
// soon after a peer dies. Our transports see it (the shm segment checks its peers' pids, the TCP
// mesh a closed connection); NCCL does not: on one node its collectives may wait for a dead peer
// until the collective timeout (30 min by default). In-process recovery runs on one node only,
// so every peer is a process of this machine: at the communicator's set-up each rank publishes
// its pid through the generation's store, and the NCCL watchdog polls lost() (a kill(0) and up
// to three /proc reads per peer: base/process.h processExiting, so a SIGKILLed peer counts from
// its kill, not from its zombie, which waits for its memory to be freed) and aborts the
// communicator when a peer is gone.
#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace ddprun::runtime::elastic {

using rendezvous::Millis;

class PeerWatch {
 public:
  // `pids[r]`: the pid of rank r; `self`: this rank (never reported).
  PeerWatch(std::vector<int32_t> pids, int self);

  // Collective over `store` (every rank of the group calls it, the store scoped to this
  // generation): sets `pids/<rank>` to this process's pid and reads the others', waiting up to
  // `timeout` (TimeoutError naming the missing keys). BackendError when a value is not a pid.
  static PeerWatch exchange(rendezvous::Store& store, int rank, int size, Millis timeout);

  // "" while every peer lives; else "rank R (pid P) died" for the lowest such rank.
  std::string lost() const;

  const std::vector<int32_t>& pids() const { return pids_; }

 private:
  std::vector<int32_t> pids_;
  int self_;
};

}  // namespace ddprun::runtime::elastic
