#pragma once
// TcpMesh: one TCP connection from this rank to every other rank, and a single-threaded engine
// that moves byte ranges over all of them at once.
//
// Why not Gloo's transport for the allreduce data: Gloo funnels every receive through one event
// thread that, whenever the caller's thread holds a connection's lock (while writing), spins on
// a try-lock; on a 2-core machine with several ranks that costs milliseconds per message. Here
// the collective's own thread does everything with non-blocking sockets and poll(): no other
// thread, no lock, no per-message notification (both ends know the message order; the
// collectives frame each operation with a small header, mesh_allreduce.h).
//
// Set-up goes through the store, as Gloo's does: each rank listens on a free port, publishes
// "host port id" under <prefix>/<rank> (id: 16 random bytes, new for every mesh, so for every
// attempt), and connects to every lower rank, announcing its rank and presenting that rank's
// id; the lower rank accepts. A connection whose hello is wrong (another magic, a rank that is
// not a higher one or is taken, not the id) is logged and dropped, and set-up goes on; hellos
// are read from all pending connections at once (at most 64), so a stranger that connects and
// stays silent holds nothing up. Connects are non-blocking. All of it is bounded by the
// timeout.
//
// With a job token (DDPRUN_STORE_TOKEN_FILE) the ranks share a per-job, per-attempt secret
// (meshSecret()) and the hello becomes a mutual challenge-response: both sides send a fresh
// nonce and each proves the secret with an HMAC over both nonces, both ranks and the mesh's
// prefix (tcp_mesh.cpp declares the frames; docs/protocol.md). A peer that cannot prove it is
// dropped by the accepting rank; an accepting rank that cannot is refused by the connecting one
// (AuthError). Without a token the id is as secret as the workers' store is (see
// docs/security.md); it keeps out whatever cannot read this attempt's keys. Set-up only: the
// collectives that follow add nothing per message.
//
// Use: post sends and receives (per peer, each direction strictly in posting order), then
// progress(deadline) until everything posted is done. A receive's callback may post more. A
// closed or reset connection throws BackendError naming the peer; the deadline throws
// TimeoutError. After an error the mesh must not be used again.
#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/store.h"

namespace ddprun::runtime {

// The mesh secret of one attempt of one job: HMAC-SHA256(token, "ddprun-mesh-secret-v1", run
// id, attempt); empty for an empty token. A proof made in one attempt is worthless in another.
std::string meshSecret(std::string_view token, std::string_view runId, int attempt);

class TcpMesh {
 public:
  using Clock = std::chrono::steady_clock;

  // `host`: the address other ranks use to reach this one (also where it listens). `secret`:
  // meshSecret() of the job's token, the same on every rank; empty without a token.
  TcpMesh(rendezvous::Store& store, const std::string& prefix, int rank, int size,
          const std::string& host, std::chrono::milliseconds timeout,
          const std::string& secret = {});
  ~TcpMesh();
  TcpMesh(const TcpMesh&) = delete;
  TcpMesh& operator=(const TcpMesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  void postSend(int peer, const void* data, size_t bytes);
  void postRecv(int peer, void* data, size_t bytes, std::function<void()> done = {});
  // Moves data until every posted send and receive completed.
  void progress(Clock::time_point deadline);
  // Shuts every connection down (both directions): a peer blocked on this rank sees the
  // connection end at once. The mesh must not be used afterwards. Never blocks.
  void abort();

 private:
  struct Send {
    const char* p;
    size_t left;
  };
  struct Recv {
    char* p;
    size_t left;
    std::function<void()> done;
  };
  struct Peer {
    int fd = -1;
    std::deque<Send> sends;
    std::deque<Recv> recvs;
  };
  // Non-blocking writes / reads for one peer; true when anything moved.
  bool pumpSends(int peer);
  bool pumpRecvs(int peer);
  [[noreturn]] void fail(int peer, const std::string& what);

  int rank_;
  int size_;
  std::vector<Peer> peers_;
  size_t pending_ = 0;  // posted operations not completed
};

}  // namespace ddprun::runtime
