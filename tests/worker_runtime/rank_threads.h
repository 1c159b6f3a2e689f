#pragma once
// runRanks(P, fn): runs fn(rank) for rank 0..P-1, each on its own thread, and rethrows the first
// exception any rank threw. N ranks as threads on one rendezvous::MemoryStore is how the
// communicator tests run without a launcher (as Gloo's own tests do).
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ddprun::runtime::test {

inline void runRanks(int P, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(P);
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace ddprun::runtime::test
