#pragma once
// The timeline's traffic between nodes (docs/timeline.md, "One time axis"). All calls block on
// the network, so the agent runs them on an ExchangeThread, never on its I/O thread (which may
// host the very store they talk to). None throws: a timeline never fails the job.
//
//   - measureClock: an agent that does not write the trace pings the workers' store (on node
//     rank 0's machine, the reference) with CLOCK and records its offset in its own part file.
//     Its ranks measure too (worker_runtime); the node's best estimate aligns all its tracks.
//   - ship: such an agent puts its node's bundle (merge.h nodeBundle) under bundleKey() in the
//     job's shared store (the rendezvous store): before the exit barrier, so that the writer
//     finds it once the barrier completes, and again when the job ends.
//   - collect: the writer reads the bundles of the other nodes of the round, waiting at most
//     `wait` for the ones not there yet (a node that died sends nothing: the trace says so).
//     Any client of the store can write those keys, so it holds at most `maxBytes` of each
//     (a bigger value is dropped as soon as it is read, its size kept for the trace to name)
//     and kMaxCollectedBytes in all; mergeTimeline() reads what it holds as hostile input.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "launcher/timeline/merge.h"
#include "rendezvous/tcp_store.h"

namespace ddprun::launcher::timeline {

// The store key of node `nodeRank`'s bundle in worker group `group` ("<run id>/<round>", as
// DDPRUN_TIMELINE_GROUP): a node rank names a node within one round only, so a bundle shipped
// in an earlier round (a node that left) is never read as another node's of a later one.
std::string bundleKey(const std::string& group, int nodeRank);

void measureClock(const rendezvous::TcpStoreOptions& workerStore);

// Returns whether the bundle was stored.
bool ship(const rendezvous::TcpStoreOptions& sharedStore, const std::string& key,
          const BundleOptions& bundle);

// After reading, collect() sets the group's "collected" key: an agent that ships on its way out
// and hosts the store itself (c10d) waits for it (at most `wait`) before it takes the store
// down. Returns whether the key came.
bool awaitCollected(const rendezvous::TcpStoreOptions& sharedStore, const std::string& group,
                    std::chrono::milliseconds wait);

constexpr uint64_t kMaxCollectedBytes = 512ull << 20;

struct Collected {
  std::vector<ReceivedBundle> bundles;
  std::vector<std::string> missing;  // "node rank K" for each key that never arrived
};
Collected collect(const rendezvous::TcpStoreOptions& sharedStore, const std::string& group,
                  int nodeCount, std::chrono::milliseconds wait,
                  uint64_t maxBytes = kBundleCapBytes);

// One thread that runs jobs in order; the destructor runs what is queued, then joins.
class ExchangeThread {
 public:
  ExchangeThread();
  ~ExchangeThread();
  ExchangeThread(const ExchangeThread&) = delete;
  ExchangeThread& operator=(const ExchangeThread&) = delete;
  void post(std::function<void()> job);

 private:
  void main();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ddprun::launcher::timeline
