#pragma once
// ThreadedStoreServer: a StoreServer on its own thread and io_context, for processes that
// have no event loop of their own (a worker whose rank 0 hosts the store, tests, benchmarks),
// and for the agent that hosts a job's rendezvous store: there the store must answer every
// node's heartbeat within the keep-alive bound whatever the agent itself is doing (forking its
// workers' guards, the page faults that follow a fork, writing logs), so it gets a thread of
// its own rather than the agent's io_context (docs/rendezvous.md, "The store host's thread").
// The server is listening when the constructor returns; the destructor stops it and joins.
// Its thread is named "ddprun-store" (/proc/PID/task/TID/comm, top -H).
#include <memory>
#include <string>
#include <thread>

#include "rendezvous/store_server.h"

namespace ddprun::rendezvous {

struct ThreadedStoreServerOptions {
  // > 0: the server's thread asks for this much less niceness than the process has (its CPU
  // share under load: with hundreds of runnable threads on a machine, a thread at the default
  // gets 1/N of a core). Allowed with CAP_SYS_NICE or an RLIMIT_NICE that permits it;
  // otherwise the thread stays at the process's niceness (priorityRaised() says which).
  // Only this thread: processes the host forks from its other threads do not inherit it.
  int raisePriority = 0;
  // true: first the lowest real-time priority (SCHED_RR 1, reset on fork), allowed with
  // CAP_SYS_NICE or RLIMIT_RTPRIO >= 1; where refused, raisePriority as above. A real-time
  // thread runs whenever it is runnable, ahead of every normal thread: at nice -10 among ~500
  // runnable threads (256 agents on two cores) the store's thread still waited 60-90 ms of
  // every 100 ms for a CPU after the round closed. Its work per request is bounded (the
  // store's limits), and the kernel's real-time throttling (sched_rt_runtime_us, 95% by
  // default) leaves every CPU a share for the other threads even under a flood.
  bool realtime = false;
};

class ThreadedStoreServer {
 public:
  explicit ThreadedStoreServer(StoreServerOptions options,
                               ThreadedStoreServerOptions threadOptions = {});
  ~ThreadedStoreServer();
  ThreadedStoreServer(const ThreadedStoreServer&) = delete;
  ThreadedStoreServer& operator=(const ThreadedStoreServer&) = delete;

  uint16_t port() const { return port_; }
  // The server's instance id (StoreServer::instanceId), fixed at its start: any thread.
  const std::string& instanceId() const { return instanceId_; }
  // Whether the thread got a higher priority than the process's: real-time or niceness
  // (false when none was asked, or none was allowed).
  bool priorityRaised() const { return priorityRaised_; }
  // Whether that priority is real time (ThreadedStoreServerOptions::realtime).
  bool realtime() const { return realtime_; }
  // A snapshot taken on the server's thread.
  StoreServerStats stats();

 private:
  struct State;
  std::unique_ptr<State> state_;
  uint16_t port_ = 0;
  std::string instanceId_;
  bool priorityRaised_ = false;
  bool realtime_ = false;
};

}  // namespace ddprun::rendezvous
