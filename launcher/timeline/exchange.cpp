#include "launcher/timeline/exchange.h"

#include "base/log.h"
#include "base/timeline.h"
#include "rendezvous/clock_offset.h"

namespace ddprun::launcher::timeline {
namespace {

using rendezvous::TcpStore;
using rendezvous::TcpStoreOptions;

// Short bounds: the timeline's calls come at a job's start and end, and must not hold them up.
constexpr std::chrono::milliseconds kCallTimeout{10'000};

TcpStoreOptions bounded(TcpStoreOptions o) {
  o.timeout = std::min(o.timeout, kCallTimeout);
  o.connectTimeout = std::min(o.connectTimeout, kCallTimeout);
  return o;
}

}  // namespace

std::string bundleKey(const std::string& group, int nodeRank) {
  return "ddprun/timeline/" + group + "/node/" + std::to_string(nodeRank);
}

namespace {
std::string collectedKey(const std::string& group) {
  return "ddprun/timeline/" + group + "/collected";
}
}  // namespace

bool awaitCollected(const TcpStoreOptions& sharedStore, const std::string& group,
                    std::chrono::milliseconds wait) {
  try {
    TcpStore store(bounded(sharedStore));
    store.wait({collectedKey(group)}, wait);
    return true;
  } catch (const std::exception& e) {
    DDPRUN_LOG(DEBUG, "launcher") << "timeline: the writer did not say it read the bundles ("
                                  << e.what() << ")";
    return false;
  }
}

void measureClock(const TcpStoreOptions& workerStore) {
  try {
    TcpStore store(bounded(workerStore));
    if (const auto c = rendezvous::measureClockOffset(store)) {
      ddprun::timeline::recordClockOffset(c->offsetUs, c->boundUs, c->rttUs, c->samples,
                                          store.address());
      DDPRUN_LOG(DEBUG, "launcher") << "timeline: clock offset to " << store.address() << " "
                                    << c->offsetUs << " us (+-" << c->boundUs << " us)";
    }
  } catch (const std::exception& e) {
    DDPRUN_LOG(WARN, "launcher") << "timeline: no clock offset to " << workerStore.host << ":"
                                 << workerStore.port << " (" << e.what()
                                 << "); this node's ranks measure their own";
  }
}

bool ship(const TcpStoreOptions& sharedStore, const std::string& key, const BundleOptions& o) {
  try {
    const Bundle b = nodeBundle(o);
    if (b.droppedEvents > 0) {
      DDPRUN_LOG(WARN, "launcher") << "timeline: " << b.droppedEvents << " of this node's "
                                   << b.events + b.droppedEvents << " events left out of the "
                                   << "trace (its share is capped at " << (o.capBytes >> 20)
                                   << " MiB); " << o.partsDir << " keeps them all";
    }
    TcpStore store(bounded(sharedStore));
    store.set(key, b.text);
    return true;
  } catch (const std::exception& e) {
    DDPRUN_LOG(WARN, "launcher") << "timeline: this node's events did not reach the trace's "
                                 << "writer (" << e.what() << "); " << o.partsDir
                                 << " keeps them";
    return false;
  }
}

Collected collect(const TcpStoreOptions& sharedStore, const std::string& group, int nodeCount,
                  std::chrono::milliseconds wait, uint64_t maxBytes) {
  Collected c;
  uint64_t held = 0;
  std::vector<int> pending;
  for (int k = 1; k < nodeCount; ++k) pending.push_back(k);
  try {
    TcpStore store(bounded(sharedStore));
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
      std::vector<int> still;
      for (int k : pending) {
        const std::string key = bundleKey(group, k);
        if (store.check({key})) {
          ReceivedBundle b{.from = "node rank " + std::to_string(k), .nodeRank = k,
                           .text = store.get(key)};
          b.bytes = b.text.size();
          if (b.bytes > maxBytes || held + b.bytes > kMaxCollectedBytes) {
            b.text = std::string();  // the merge names it by its size
            b.text.shrink_to_fit();
          }
          held += b.text.size();
          c.bundles.push_back(std::move(b));
        } else {
          still.push_back(k);
        }
      }
      pending = std::move(still);
      if (pending.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    store.set(collectedKey(group), "");  // a store host that is leaving may go now
  } catch (const std::exception& e) {
    DDPRUN_LOG(WARN, "launcher") << "timeline: cannot read the other nodes' events ("
                                 << e.what() << "); the trace has this node's only";
  }
  for (int k : pending) c.missing.push_back("node rank " + std::to_string(k));
  if (!c.missing.empty()) {
    DDPRUN_LOG(WARN, "launcher") << "timeline: " << c.missing.size() << " node(s) sent no events "
                                 << "for the trace (they died, or could not reach the store)";
  }
  return c;
}

ExchangeThread::ExchangeThread() : thread_([this] { main(); }) {}

ExchangeThread::~ExchangeThread() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ExchangeThread::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> g(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void ExchangeThread::main() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    try {
      job();
    } catch (...) {
    }
    lock.lock();
  }
}

}  // namespace ddprun::launcher::timeline
