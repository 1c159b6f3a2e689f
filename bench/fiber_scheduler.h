#pragma once
// FiberScheduler: many blocking call stacks on one thread, for the simulated agents of
// `ddprun-bench rendezvous --simulate` (bench/rendezvous_swarm.h).
//
// Each simulated agent runs the real, blocking rendezvous code (DynamicRendezvous, the slot
// join, TcpStore) on a fiber of its own: a ucontext with a small mmap'd stack (a guard page
// below it). The scheduler is the thread's rendezvous::Blocking (rendezvous/blocking.h), so
// where that code would block -- a socket read, a condition variable, its watcher thread --
// the fiber parks and the next runnable one runs: sockets are watched by one epoll, deadlines
// by one timer heap. Ten thousand agents then cost ten thousand small stacks and a switch per
// wait, instead of twenty thousand OS threads (an agent and its watcher) and their wake-ups.
//
// Use: spawn() the fibers, then run() on the thread that owns the scheduler; it returns when
// every fiber has ended. Other threads talk to the fibers only through post(), which runs a
// function on the scheduler's thread between fibers (it must not block; it may wake()).
// A fiber's uncaught exception ends the process (std::terminate), as a thread's would.
#include <sys/types.h>
#include <ucontext.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>
#include <vector>

#include "rendezvous/blocking.h"

// x86-64 switches fibers with a few instructions of its own (fiber_scheduler.cpp); elsewhere
// swapcontext(), which also saves and restores the signal mask (a syscall per switch).
#if defined(__x86_64__) && defined(__linux__)
#define DDPRUN_FIBER_ASM_SWITCH 1
#else
#define DDPRUN_FIBER_ASM_SWITCH 0
#endif

namespace ddprun::bench {

class FiberScheduler final : public rendezvous::Blocking {
 public:
  explicit FiberScheduler(size_t stackBytes = 128 * 1024);
  ~FiberScheduler() override;
  FiberScheduler(const FiberScheduler&) = delete;
  FiberScheduler& operator=(const FiberScheduler&) = delete;

  // A new fiber, runnable; from the scheduler's thread (before or during run()).
  void spawn(std::function<void()> body);
  // Runs the fibers until none is left. Installs this scheduler as the thread's Blocking.
  void run();
  // Runs `fn` on the scheduler's thread, between fibers. Thread-safe.
  void post(std::function<void()> fn);

  // Parks the calling fiber until `t`.
  void sleepUntil(rendezvous::Clock::time_point t);

  // rendezvous::Blocking
  int poll(int fd, short events, rendezvous::Clock::time_point deadline) override;
  bool park(std::unique_lock<std::mutex>* lock, const void* channel,
            rendezvous::Clock::time_point deadline) override;
  void wake(const void* channel) override;
  int pollOrWake(int fd, short events, rendezvous::Clock::time_point deadline,
                 const void* channel) override;
  std::function<void()> start(std::function<void()> body) override;
  void forget(int fd) override;

  // Context switches so far (each park and resume counts one), for the report.
  uint64_t switches() const { return switches_; }

 private:
  struct Fiber;
  enum class Woken : uint8_t { No, Ready, Timer, Channel };
  // Parks the current fiber until made runnable by a waker holding its generation.
  Woken suspend(rendezvous::Clock::time_point deadline);
  // False when the waker was stale (the fiber was woken otherwise, or ended).
  bool resume(Fiber* f, Woken why, uint32_t generation);
  // poll() and pollOrWake(): `channel` null, or also woken by wake(channel).
  int waitFd(int fd, short events, rendezvous::Clock::time_point deadline, const void* channel);
  // Drops the parked_ entry of a fiber woken otherwise than through its channel.
  void unpark(const void* channel, uint32_t id, uint32_t generation);
  void onSocketEvent(int fd, uint32_t events);
  void switchTo(Fiber* f);
  static void trampoline(unsigned hi, unsigned lo);  // makecontext's entry
  [[noreturn]] static void entry(void* scheduler);   // runs the current fiber's body, ends it
  void drainPosts();
  void fireTimers();

  size_t stackBytes_;
  int epoll_ = -1;
  int event_ = -1;  // eventfd: post() wakes epoll_wait
  ucontext_t main_{};     // the scheduler's context (swapcontext)
  void* mainSp_ = nullptr;  // its stack pointer (the x86-64 switch)
  Fiber* current_ = nullptr;
  std::vector<std::unique_ptr<Fiber>> fibers_;  // by id
  std::vector<Fiber*> freeFibers_;              // ended, their stacks reused
  std::deque<Fiber*> runnable_;
  size_t live_ = 0;
  struct Timer {
    rendezvous::Clock::time_point at;
    uint32_t id, generation;
    bool operator>(const Timer& o) const { return at > o.at; }
  };
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  std::unordered_multimap<const void*, std::pair<uint32_t, uint32_t>> parked_;  // channel: id, gen
  // Per descriptor polled: registered once with the epoll, edge-triggered for both directions,
  // until forget(fd); readiness that arrived with no fiber waiting is kept in ready* until a
  // poll() takes it (it may be stale: callers retry their read or write, and wait again).
  struct FdState {
    bool registered = false, waiting = false, readyIn = false, readyOut = false;
    short want = 0;
    uint32_t fiber = 0, generation = 0;
  };
  std::vector<FdState> fds_;  // by descriptor
  std::mutex postMu_;
  std::vector<std::function<void()>> posts_;
  uint64_t switches_ = 0;
};

// Several FiberSchedulers, each run by a thread of its own: the simulated agents spread over
// the machine's cores (fiber i on scheduler i % count). A fiber stays on its scheduler; fibers
// of different schedulers share nothing but what the caller makes thread-safe.
class FiberPool {
 public:
  explicit FiberPool(int count, size_t stackBytes = 128 * 1024);
  ~FiberPool();  // joins the threads (start() must have been called, or none were)
  int size() const { return static_cast<int>(schedulers_.size()); }
  FiberScheduler& of(int i) { return *schedulers_[static_cast<size_t>(i) % schedulers_.size()]; }
  // Fiber `i`, on of(i); before start().
  void spawn(int i, std::function<void()> body) { of(i).spawn(std::move(body)); }
  // Starts one thread per scheduler.
  void start();
  // post(fn) on every scheduler: fn(scheduler) runs on its thread.
  void postAll(const std::function<void(FiberScheduler&)>& fn);
  // Waits until every fiber of every scheduler has ended.
  void join();

 private:
  std::vector<std::unique_ptr<FiberScheduler>> schedulers_;
  std::vector<std::thread> threads_;
};

}  // namespace ddprun::bench
