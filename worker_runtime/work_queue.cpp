#include "worker_runtime/work_queue.h"

namespace ddprun::runtime {

void CompletionWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool CompletionWork::completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void CompletionWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

WorkQueue::WorkQueue() : thread_([this] { loop(); }) {}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Work> WorkQueue::submit(std::function<void()> job) {
  auto work = std::make_shared<CompletionWork>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(job), work});
  }
  cv_.notify_all();
  return work;
}

void WorkQueue::runInline(const std::function<void()>& job) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    busy_ = true;
  }
  struct Release {
    WorkQueue* q;
    ~Release() {
      {
        std::lock_guard<std::mutex> lock(q->mu_);
        q->busy_ = false;
      }
      q->cv_.notify_all();
    }
  } release{this};
  job();
}

void WorkQueue::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void WorkQueue::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty()); });
    if (queue_.empty()) return;  // stop_ and nothing left
    Item item = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      item.job();
    } catch (...) {
      error = std::current_exception();
    }
    item.work->finish(error);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace ddprun::runtime
