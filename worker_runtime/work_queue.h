#pragma once
// WorkQueue: runs collectives one at a time, in submission order, on one communication thread.
//
// Collectives must be issued in the same order on every rank, and a backend's transport allows one
// collective at a time, so the queue is strictly FIFO. submit() returns at once with a Work that
// completes when the job has run; runInline() runs a job on the caller's thread once everything
// submitted before it has finished, which saves a thread hop for blocking calls. A job's
// exception is stored in its Work and rethrown by wait(), never thrown on the communication thread.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "worker_runtime/communicator.h"

namespace ddprun::runtime {

// A Work that some thread completes by calling finish().
class CompletionWork final : public Work {
 public:
  void wait() override;
  bool completed() override;
  void finish(std::exception_ptr error);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class WorkQueue {
 public:
  WorkQueue();
  // Runs the jobs still queued, then joins the thread.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  std::shared_ptr<Work> submit(std::function<void()> job);
  // Waits for every earlier job, then runs `job` here; exceptions propagate to the caller.
  void runInline(const std::function<void()>& job);
  // Blocks until every job submitted so far has run.
  void drain();

 private:
  struct Item {
    std::function<void()> job;
    std::shared_ptr<CompletionWork> work;
  };
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool busy_ = false;  // a job is running (on the thread or inline)
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddprun::runtime
