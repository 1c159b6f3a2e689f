#pragma once
// WorkQueue: runs collectives one at a time, in submission order, on one communication thread.
//
// Collectives must be issued in the same order on every rank, and a communicator runs one at a
// time, so the queue is strictly FIFO. submit() returns at once with a Work that completes when the
// job has run; the thread lets communication overlap the caller's computation (DDP's buckets
// during backward). A thread hop costs a wake-up, though, which on a loaded machine can take
// milliseconds, so nobody waits for one needlessly:
//   - runInline() runs a blocking collective on the caller's thread once everything submitted
//     before it has finished;
//   - Work::wait() on a job that has not started yet runs the queued jobs up to and including it
//     on the waiting thread (in order), instead of sleeping until the communication thread does.
// A job's exception is stored in its Work and rethrown by wait(), never thrown on the
// communication thread.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "worker_runtime/work.h"

namespace ddprun::runtime {

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

  struct State;  // shared with the Works, which may outlive the queue

 private:
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace ddprun::runtime
