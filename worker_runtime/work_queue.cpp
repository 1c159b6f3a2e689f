#include "worker_runtime/work_queue.h"

namespace ddprun::runtime {

namespace {
class QueuedWork;
}

struct WorkQueue::State {
  struct Item {
    std::function<void()> job;
    std::shared_ptr<QueuedWork> work;
  };
  std::mutex mu;
  // Two condition variables, so that a blocking collective run on the caller's thread never wakes
  // the queue's thread (a futex wake and a context switch per call, which on a loaded 2-core
  // machine costs more than a small collective): `callers` is notified when a job finishes or
  // busy clears (Work::wait, runInline and drain wait on it; glibc's notify is free without
  // waiters); `worker` only when the thread has something to do (a job it may start, or stop).
  std::condition_variable callers;
  std::condition_variable worker;
  std::deque<Item> queue;
  bool busy = false;  // a job is running (on the thread or on a caller's)
  bool stop = false;
  ThreadCounts counts;

  // With `mu` held and busy false: takes the front job and runs it without the lock. `onCaller`:
  // this is not the queue's thread.
  void runFront(std::unique_lock<std::mutex>& lock, bool onCaller);
  // With `mu` held, busy just cleared: wakes whoever may go on now.
  void released() {
    callers.notify_all();
    if (!queue.empty() || stop) worker.notify_one();
  }
};

namespace {

class QueuedWork final : public Work {
 public:
  explicit QueuedWork(std::weak_ptr<WorkQueue::State> queue) : queue_(std::move(queue)) {}

  void wait() override {
    if (auto q = queue_.lock()) {
      std::unique_lock<std::mutex> lock(q->mu);
      while (!done_) {
        if (!q->busy && !q->queue.empty()) {
          q->runFront(lock, true);  // ours or one before it: run it here rather than wait for a hop
        } else {
          q->callers.wait(lock);
        }
      }
    }
    // done_ is written under the queue's lock; the queue is gone only after finishing all.
    if (error_) std::rethrow_exception(error_);
  }
  bool completed() override {
    if (auto q = queue_.lock()) {
      std::lock_guard<std::mutex> lock(q->mu);
      return done_;
    }
    return true;
  }
  // Called with the queue's lock held.
  void finish(std::exception_ptr error) {
    error_ = std::move(error);
    done_ = true;
  }

 private:
  std::weak_ptr<WorkQueue::State> queue_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

void WorkQueue::State::runFront(std::unique_lock<std::mutex>& lock, bool onCaller) {
  Item item = std::move(queue.front());
  queue.pop_front();
  busy = true;
  ++(onCaller ? counts.onCaller : counts.handedOff);
  lock.unlock();
  std::exception_ptr error;
  try {
    item.job();
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  item.work->finish(error);
  busy = false;
  released();
}

WorkQueue::WorkQueue() : state_(std::make_shared<State>()) {
  thread_ = std::thread([s = state_] {
    std::unique_lock<std::mutex> lock(s->mu);
    for (;;) {
      while (!((!s->queue.empty() && !s->busy) || (s->stop && s->queue.empty()))) {
        s->worker.wait(lock);
        ++s->counts.wakeups;
      }
      if (s->queue.empty()) return;  // stop, and nothing left
      s->runFront(lock, false);
    }
  });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->worker.notify_one();
  thread_.join();
}

std::shared_ptr<Work> WorkQueue::submit(std::function<void()> job) {
  auto work = std::make_shared<QueuedWork>(state_);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->queue.push_back({std::move(job), work});
  }
  state_->worker.notify_one();
  return work;
}

namespace {
// Runs queued jobs on this thread (in order) or waits, until the queue is empty and idle.
void helpDrain(WorkQueue::State& s, std::unique_lock<std::mutex>& lock) {
  while (!s.queue.empty() || s.busy) {
    if (!s.busy) {
      s.runFront(lock, true);
    } else {
      s.callers.wait(lock);
    }
  }
}
}  // namespace

void WorkQueue::runInline(const std::function<void()>& job) {
  std::unique_lock<std::mutex> lock(state_->mu);
  helpDrain(*state_, lock);
  state_->busy = true;
  ++state_->counts.onCaller;
  lock.unlock();
  struct Release {
    State& s;
    ~Release() {
      std::lock_guard<std::mutex> lock(s.mu);
      s.busy = false;
      s.released();
    }
  } release{*state_};
  job();
}

ThreadCounts WorkQueue::counts() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->counts;
}

void WorkQueue::drain() {
  std::unique_lock<std::mutex> lock(state_->mu);
  helpDrain(*state_, lock);
}

}  // namespace ddprun::runtime
