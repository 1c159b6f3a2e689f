// The work queue (worker_runtime/work_queue.h): order, errors, inline runs and shutdown, with
// real threads. No LibTorch headers: runs in the sanitizer trees too (scripts/sanitize).
#include <catch2/catch.hpp>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "worker_runtime/work_queue.h"

using ddprun::runtime::Work;
using ddprun::runtime::WorkQueue;

TEST_CASE("work queue runs jobs in submission order and each Work rethrows its own error",
          "[work_queue]") {
  WorkQueue q;
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 200; ++i) {
    works.push_back(q.submit([&, i] {
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
      }
      if (i % 50 == 7) throw std::runtime_error("job " + std::to_string(i) + " failed");
    }));
  }
  // Waiting from the end and from the middle, from two threads: each job runs once.
  std::thread other([&] { works[120]->wait(); });
  for (int i = 199; i >= 0; --i) {
    if (i % 50 == 7) {
      CHECK_THROWS_WITH(works[i]->wait(), "job " + std::to_string(i) + " failed");
    } else {
      CHECK_NOTHROW(works[i]->wait());
    }
    CHECK(works[i]->completed());
  }
  other.join();
  std::vector<int> expected(200);
  for (int i = 0; i < 200; ++i) expected[i] = i;
  CHECK(order == expected);
}

TEST_CASE("work queue runInline waits for earlier jobs and propagates its error",
          "[work_queue]") {
  WorkQueue q;
  std::atomic<int> done{0};
  for (int i = 0; i < 20; ++i) {
    q.submit([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++done;
    });
  }
  int seen = -1;
  q.runInline([&] { seen = done.load(); });
  CHECK(seen == 20);
  CHECK_THROWS_WITH(q.runInline([] { throw std::runtime_error("inline failed"); }),
                    "inline failed");
  auto after = q.submit([&] { ++done; });  // the queue still works
  after->wait();
  CHECK(done == 21);
}

TEST_CASE("work queue destructor runs what is still queued and Works outlive it",
          "[work_queue]") {
  std::atomic<int> ran{0};
  std::vector<std::shared_ptr<Work>> works;
  {
    WorkQueue q;
    for (int i = 0; i < 50; ++i) works.push_back(q.submit([&] { ++ran; }));
  }
  CHECK(ran == 50);
  for (auto& w : works) {
    CHECK(w->completed());
    CHECK_NOTHROW(w->wait());
  }
}

TEST_CASE("work queue runInline does not wake the communication thread", "[work_queue]") {
  // A blocking collective on the caller's thread must cost no wake-up of the queue's thread (a
  // futex wake and a context switch per call, which dominated small shm allreduces).
  WorkQueue q;
  q.submit([] {})->wait();  // the thread is up and idle
  const auto before = q.counts();
  int ran = 0;
  for (int i = 0; i < 1000; ++i) q.runInline([&] { ++ran; });
  const auto after = q.counts();
  CHECK(ran == 1000);
  CHECK(after.onCaller - before.onCaller == 1000);
  // Spurious wake-ups are allowed, a wake-up per call is not.
  CHECK(after.wakeups - before.wakeups < 10);
  // Submitted work still wakes it.
  std::atomic<int> queued{0};
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 5; ++i) works.push_back(q.submit([&] { ++queued; }));
  while (queued.load() < 5) std::this_thread::yield();
  for (auto& w : works) w->wait();
  CHECK(q.counts().handedOff - after.handedOff >= 1);
}
