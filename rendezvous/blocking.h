#pragma once
// Blocking: how the rendezvous client code waits, replaceable for one thread.
//
// A real agent blocks in the kernel: TcpStore waits for its socket with poll() and socket
// timeouts, DynamicRendezvous waits on condition variables and runs its round watcher on a
// std::thread, the etcd backend's HTTP connections run their own Asio io_context. Nothing
// here changes that: with no Blocking installed on a thread (the only case outside the
// simulator), pollFd, CondVar, Background and sleepFor are exactly poll(),
// std::condition_variable, std::thread and std::this_thread::sleep_for, and the etcd
// connection runs its io_context as it always has.
//
// The simulated agents of `ddprun-bench rendezvous --simulate` (bench/fiber_scheduler.h) run
// ten thousand agents' real code -- DynamicRendezvous, the slot join, TcpStore, or the etcd
// backend (EtcdStore, EtcdWatch, EtcdLiveness's lease keeper and watcher) -- on fibers of
// one thread. Their scheduler installs itself as the thread's Blocking; then each of these
// waits parks the fiber (the socket is watched by the scheduler's epoll, the deadline by its
// timer) and another fiber runs, instead of the thread blocking. The waits are the only
// difference: the same requests go over the same sockets in the same order.
//
// Contract of an installed Blocking: everything that waits on or notifies one CondVar, and a
// Background and its joiner, run on that one thread (fibers of one scheduler). A fiber never
// yields while it holds a std::mutex another fiber may take, except through CondVar, which
// releases it (the rendezvous code holds its mutexes only around short, non-blocking steps).
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "rendezvous/store.h"

namespace ddprun::rendezvous {

class Blocking {
 public:
  virtual ~Blocking() = default;
  // The calling thread's, or nullptr: the OS's (the default).
  static Blocking* current();
  // Installs `b` (nullptr: none) for the calling thread.
  static void install(Blocking* b);

  // Waits until `fd` is ready for `events` (POLLIN, POLLOUT) or `deadline`: 1 when ready (or in
  // error, which the next read or write reports), 0 at the deadline.
  virtual int poll(int fd, short events, Clock::time_point deadline) = 0;
  // Releases `lock` (when given), waits until wake(channel) or `deadline`, re-takes the lock.
  // False at the deadline. May return early (callers re-check their condition).
  virtual bool park(std::unique_lock<std::mutex>* lock, const void* channel,
                    Clock::time_point deadline) = 0;
  // Wakes everything parked on `channel`, and every pollOrWake() on it.
  virtual void wake(const void* channel) = 0;
  // poll(), also ended by wake(channel) (from a fiber of this thread): returns 0 then, as at
  // the deadline, and the caller re-checks why it woke. For a wait on a socket that another
  // fiber may cut short (the etcd HTTP connection's cancel() and wake()).
  virtual int pollOrWake(int fd, short events, Clock::time_point deadline,
                         const void* channel) = 0;
  // Runs `body` concurrently with the caller (a fiber); the returned function waits for it.
  virtual std::function<void()> start(std::function<void()> body) = 0;
  // `fd`, which poll() may have seen, is about to be closed: a Blocking that keeps state per
  // descriptor (the fiber scheduler keeps each socket registered with its epoll) drops it,
  // since the number may next name another socket. Whoever closes a descriptor that was
  // polled through a Blocking calls this first (closeFd does), on the thread that polled it.
  virtual void forget(int fd) { (void)fd; }
};

// poll() on one descriptor, or the installed Blocking's. `timeout` < 0: none. Returns poll's
// result (errno set when < 0).
int pollFd(int fd, short events, Millis timeout);
// Blocking::forget(fd) on the installed Blocking, if any (no-op otherwise).
void forgetFd(int fd);
// forgetFd(fd), then ::close(fd).
void closeFd(int fd);
// std::this_thread::sleep_for, or parking the fiber (nothing wakes it early).
void sleepFor(Clock::duration d);

// std::condition_variable, or parking on the installed Blocking (see the contract above).
class CondVar {
 public:
  template <typename Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred pred) {
    while (!pred()) waitOnce(lock, Clock::time_point::max());
  }
  // False when `deadline` passed with pred() still false.
  template <typename Pred>
  bool waitUntil(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, Pred pred) {
    while (!pred()) {
      if (!waitOnce(lock, deadline)) return pred();
    }
    return true;
  }
  template <typename Pred>
  bool waitFor(std::unique_lock<std::mutex>& lock, Clock::duration d, Pred pred) {
    return waitUntil(lock, Clock::now() + d, pred);
  }
  void notifyAll();

 private:
  bool waitOnce(std::unique_lock<std::mutex>& lock, Clock::time_point deadline);
  std::condition_variable cv_;
};

// A background task: a std::thread, or a fiber of the installed Blocking.
class Background {
 public:
  Background() = default;
  explicit Background(std::function<void()> body);
  Background(Background&&) = default;
  Background& operator=(Background&&) = default;
  ~Background();  // joins, as std::thread must be joined before
  bool joinable() const { return thread_.joinable() || static_cast<bool>(join_); }
  void join();

 private:
  std::thread thread_;
  std::function<void()> join_;  // a fiber's
};

}  // namespace ddprun::rendezvous
