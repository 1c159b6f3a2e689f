#pragma once
// checkCallerThread(comms): the blocking collectives of a CPU communicator group (ranks as
// threads) run on the calling thread, never handed off to the communication thread, and only
// after the async collectives queued before them (communicator.h's contract). Returns what went
// wrong, one line each; empty when all is right. Catch's CHECK is not used from the rank threads
// (it is not thread-safe), so the caller checks the returned lines.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/worker_runtime/rank_threads.h"
#include "worker_runtime/communicator.h"

namespace ddprun::runtime::test {

inline std::vector<std::string> checkCallerThread(
    const std::vector<std::shared_ptr<Communicator>>& comms) {
  const int P = static_cast<int>(comms.size());
  std::vector<std::vector<std::string>> errors(P);
  auto fail = [&](int r, const std::string& what) {
    errors[r].push_back("rank " + std::to_string(r) + ": " + what);
  };

  // 1. Blocking allreduces and broadcasts with nothing queued: all on the caller's thread.
  runRanks(P, [&](int r) {
    const ThreadCounts before = comms[r]->threadCounts();
    for (int i = 0; i < 50; ++i) {
      torch::Tensor t = torch::full({3}, float(r + i));
      comms[r]->allreduce(t);
      if (!torch::all(t == float(P * i + P * (P - 1) / 2)).item<bool>()) fail(r, "allreduce sum");
      comms[r]->broadcast(t, i % P);
    }
    const ThreadCounts after = comms[r]->threadCounts();
    if (after.onCaller - before.onCaller != 100 || after.handedOff != before.handedOff) {
      fail(r, "100 blocking collectives: " + std::to_string(after.onCaller - before.onCaller) +
                  " on the caller, " + std::to_string(after.handedOff - before.handedOff) +
                  " handed off");
    }
  });

  // 2. Rank 0's communication thread is inside an async allreduce (the peers have not joined
  // it yet) when rank 0 calls a blocking one: that one must wait for the async one and then run
  // on rank 0's thread. (Async + wait would leave it to the communication thread, which takes
  // the next queued job as soon as it finishes one.)
  std::atomic<bool> rank0Blocking{false};
  runRanks(P, [&](int r) {
    const ThreadCounts before = comms[r]->threadCounts();
    torch::Tensor first = torch::full({1000}, float(r + 1));
    torch::Tensor second = torch::full({1000}, float(10 * r));
    if (r == 0) {
      auto work = comms[r]->allreduceAsync(first, ReduceOp::Sum);
      const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (comms[r]->threadCounts().handedOff == before.handedOff) {
        if (std::chrono::steady_clock::now() > giveUp) {
          fail(r, "the communication thread never started the async allreduce");
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      rank0Blocking = true;
      comms[r]->allreduce(second);
      if (!work->completed()) fail(r, "the blocking allreduce returned before the async one");
      work->wait();
      const ThreadCounts after = comms[r]->threadCounts();
      if (after.handedOff - before.handedOff != 1 || after.onCaller - before.onCaller != 1) {
        fail(r, "async then blocking: " + std::to_string(after.onCaller - before.onCaller) +
                    " on the caller, " + std::to_string(after.handedOff - before.handedOff) +
                    " handed off (expected 1 and 1)");
      }
    } else {
      while (!rank0Blocking) std::this_thread::sleep_for(std::chrono::microseconds(200));
      // Give rank 0 time to enter its blocking call before the async allreduce can finish.
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      comms[r]->allreduceAsync(first, ReduceOp::Sum)->wait();
      comms[r]->allreduce(second);
    }
    if (!torch::all(first == float(P * (P + 1) / 2)).item<bool>()) fail(r, "async allreduce");
    if (!torch::all(second == float(10 * P * (P - 1) / 2)).item<bool>()) {
      fail(r, "blocking allreduce after the async one");
    }
  });

  std::vector<std::string> all;
  for (auto& e : errors) all.insert(all.end(), e.begin(), e.end());
  return all;
}

}  // namespace ddprun::runtime::test
