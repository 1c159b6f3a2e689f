#pragma once
// Liveness: how the nodes of a job learn, without polling, that one of them is gone.
//
// The signal depends on the backend: on a ddprun store, a heartbeat ring (heartbeat.h: each
// node bumps its beat keys, each watches its successor's); on etcd, a key per node bound to
// that node's lease, which etcd deletes when the lease is not kept alive, each agent watching
// its ring successor's (etcd/etcd_liveness.h). Either way a node found dead is evicted with
// transition::remove, a compare-set on the state log that opens a new round for the
// survivors, whose round watchers then fire at once.
//
// A Liveness announces this node before it joins a round (so every node a state mentions has
// announced itself), then runs on threads of its own with connections of its own; store
// failures go to onError, never thrown on those threads.
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "rendezvous/state_log.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

// A store connection that another thread can cut short.
struct InterruptibleStore {
  std::shared_ptr<Store> store;
  std::function<void()> interrupt;   // for good: every later call fails (stop)
  std::function<void()> cancelCall;  // only the call in progress, if any
  // TcpStore::setWaitsCancelled: while on, WAITs end at once and the connection is kept, so
  // that one thread can take back a connection another is waiting on. Empty when the backend
  // cannot (etcd).
  std::function<void(bool)> cancelWaits;
};

// Opens a new connection to the job's keys (each thread uses its own).
using ConnectFn = std::function<InterruptibleStore()>;

struct LivenessContext {
  std::string runId;  // the job (--rdzv-id)
  std::string self;   // this node's id
  JobLimits limits;
  StateView& view;    // the newest state this agent knows: whom to watch
  Store& first;       // this agent's own connection: the first announcement is made on it
  ConnectFn connect;  // connections for the liveness threads
  std::function<void(std::exception_ptr)> onError;  // the store is lost
  bool spill = false;  // evictions write versions with spilled lists (state_log.h; the slot join)
};

class Liveness {
 public:
  virtual ~Liveness() = default;
  // Stops watching the other nodes (this node is leaving: it must evict nobody meanwhile).
  virtual void stopWatching() = 0;
  // The same without waiting for the watching thread: callable from any thread, the liveness's
  // own included (its onError). The watcher's connection is cut for good, so no eviction is
  // written after this returns (one the store has already received stands). For a node that
  // has declared the store lost: it may be the one cut off, and must judge nobody else.
  virtual void haltWatching() = 0;
  // Stops announcing this node. `withdraw`: the node leaves a job that goes on, so the others
  // must learn it at once rather than after a timeout; otherwise the job is over.
  virtual void stop(bool withdraw) = 0;
};

}  // namespace ddprun::rendezvous
