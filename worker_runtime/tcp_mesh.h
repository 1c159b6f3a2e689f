#pragma once
// TcpMesh: one TCP connection from this rank to every other rank, and a single-threaded engine
// that moves byte ranges over all of them at once.
//
// Why not Gloo's transport for the allreduce data: Gloo funnels every receive through one event
// thread that, whenever the caller's thread holds a connection's lock (while writing), spins on
// a try-lock; on a 2-core machine with several ranks that costs milliseconds per message. Here
// the collective's own thread does everything with non-blocking sockets and poll(): no other
// thread, no lock, no per-message notification (both ends know the message order, so the wire
// carries payload only).
//
// Set-up goes through the store, as Gloo's does: each rank listens on a free port, publishes
// "host port" under <prefix>/<rank>, and connects to every lower rank (announcing its rank); the
// lower rank accepts. All of it is bounded by the timeout.
//
// Use: post sends and receives (per peer, each direction strictly in posting order), then
// progress(deadline) until everything posted is done. A receive's callback may post more. A
// closed or reset connection throws BackendError naming the peer; the deadline throws
// TimeoutError. After an error the mesh must not be used again.
#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace ddprun::runtime {

class TcpMesh {
 public:
  using Clock = std::chrono::steady_clock;

  // `host`: the address other ranks use to reach this one (also where it listens).
  TcpMesh(rendezvous::Store& store, const std::string& prefix, int rank, int size,
          const std::string& host, std::chrono::milliseconds timeout);
  ~TcpMesh();
  TcpMesh(const TcpMesh&) = delete;
  TcpMesh& operator=(const TcpMesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  void postSend(int peer, const void* data, size_t bytes);
  void postRecv(int peer, void* data, size_t bytes, std::function<void()> done = {});
  // Moves data until every posted send and receive completed.
  void progress(Clock::time_point deadline);

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
  bool pump(int peer);  // non-blocking reads and writes; true when anything moved
  [[noreturn]] void fail(int peer, const std::string& what);

  int rank_;
  int size_;
  std::vector<Peer> peers_;
  size_t pending_ = 0;  // posted operations not completed
};

}  // namespace ddprun::runtime
