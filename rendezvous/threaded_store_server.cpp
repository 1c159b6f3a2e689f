#include "rendezvous/threaded_store_server.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <future>
#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

namespace ddprun::rendezvous {

namespace asio = boost::asio;

struct ThreadedStoreServer::State {
  asio::io_context io{1};
  std::unique_ptr<StoreServer> server;
  std::thread thread;
};

namespace {

// Lowers the calling thread's niceness by `by` (Linux: PRIO_PROCESS with a thread id sets that
// thread only). False when not allowed (EPERM/EACCES): the thread keeps its niceness.
bool raiseThreadPriority(int by) {
  if (by <= 0) return false;
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if (now == -1 && errno != 0) return false;
  const int want = std::max(now - by, -20);
  return want < now && ::setpriority(PRIO_PROCESS, tid, want) == 0;
}

// The calling thread at the lowest real-time priority, its children (were it to fork) back at
// normal scheduling. False when not allowed (EPERM): the thread keeps its policy.
bool makeThreadRealtime() {
  sched_param lowest{};
  lowest.sched_priority = ::sched_get_priority_min(SCHED_RR);
  return ::pthread_setschedparam(::pthread_self(), SCHED_RR | SCHED_RESET_ON_FORK, &lowest) == 0;
}

enum Raised : int { kNotRaised = 0, kNiceRaised = 1, kRealtime = 2 };

}  // namespace

ThreadedStoreServer::ThreadedStoreServer(StoreServerOptions options,
                                         ThreadedStoreServerOptions threadOptions)
    : state_(std::make_unique<State>()) {
  // Bind on the caller's thread so errors surface here as exceptions.
  state_->server = std::make_unique<StoreServer>(state_->io, std::move(options));
  port_ = state_->server->port();
  instanceId_ = state_->server->instanceId();
  // The promise moves into the thread: set_value may still be waking this thread when get()
  // returns, so the shared state must not live on this stack frame.
  std::promise<int> raised;
  auto done = raised.get_future();
  state_->thread = std::thread([s = state_.get(), by = threadOptions.raisePriority,
                                realtime = threadOptions.realtime,
                                raised = std::move(raised)]() mutable {
    // Named, so that top -H, /proc/PID/task/TID/comm and a test that stops only this thread
    // (ptrace) tell it from the agent's other threads.
    ::pthread_setname_np(::pthread_self(), "ddprun-store");
    // Before the first request is served.
    raised.set_value(realtime && makeThreadRealtime() ? kRealtime
                     : raiseThreadPriority(by)        ? kNiceRaised
                                                      : kNotRaised);
    s->io.run();
  });
  const int got = done.get();
  priorityRaised_ = got != kNotRaised;
  realtime_ = got == kRealtime;
}

ThreadedStoreServer::~ThreadedStoreServer() {
  asio::post(state_->io, [s = state_.get()] {
    s->server->stop();
    s->io.stop();
  });
  state_->thread.join();
  state_->server.reset();
}

StoreServerStats ThreadedStoreServer::stats() {
  std::promise<StoreServerStats> p;
  auto f = p.get_future();
  asio::post(state_->io, [&] { p.set_value(state_->server->stats()); });
  return f.get();
}

}  // namespace ddprun::rendezvous
