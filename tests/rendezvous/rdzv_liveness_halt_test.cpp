// A node that has declared the store lost evicts nobody: DynamicRendezvous::onBackgroundError
// halts its liveness (Liveness::haltWatching) from the liveness's own thread. The heartbeat ring
// of node a here, against a real StoreServer: its writer's connection goes to a listener that
// never answers (to a, the store stopped answering), its monitor's to the real store, where node
// b beats and then stops. Halted from onError as DynamicRendezvous does, the monitor leaves b in
// the round; not halted (the control), it evicts b: the check can fail.
#include <atomic>
#include <thread>

#include "rdzv_agents.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/rendezvous_backend.h"
#include "rendezvous/tcp_store.h"
#include "silent_listener.h"

using namespace rdzvtest;

namespace {

InterruptibleStore interruptible(const TcpStoreOptions& o) {
  return rdzvtest::interruptible(std::make_shared<TcpStore>(o));
}

}  // namespace

TEST_CASE("a heartbeat ring halted when its writer declares the store lost evicts nobody",
          "[rdzv][failures]") {
  const bool halt = GENERATE(true, false);
  INFO((halt ? "halted from onError (as DynamicRendezvous)" : "not halted (the control)"));
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const TcpStoreOptions real{.host = "127.0.0.1", .port = server.port(),
                             .timeout = Millis(5'000), .connectTimeout = Millis(2'000)};
  auto setup = interruptible(real);
  const JobLimits lim{.minNodes = 2, .maxNodes = 2};
  StateLog log(*setup.store, lim);
  Versioned v = log.latest();
  for (const char* id : {"a", "b"}) {
    const NodeInfo me{.id = id, .addr = std::string("127.0.0.") + (id[0] == 'a' ? "2" : "3")};
    v = log.update(v, [&](const RoundState& s) { return transition::join(s, me, lim); }).now;
  }
  REQUIRE(v.state.phase == Phase::Closed);

  // b beats every 50 ms until told to stop (8 beats of 100 ms may be missed before eviction).
  std::atomic<bool> beating{true};
  std::thread b([&] {
    auto c = interruptible(real);
    while (beating) {
      const int64_t k = c.store->add(heartbeatCounterKey("b"), 1);
      c.store->set(heartbeatKey("b", k), "");
      std::this_thread::sleep_for(Millis(50));
    }
  });
  // A listener that never accepts: the kernel completes the TCP handshake, nothing answers.
  const SilentListener listener;
  const TcpStoreOptions silent = listener.storeOptions();

  StateView view;
  view.offer(v);
  std::mutex mu;
  std::condition_variable cv;
  bool lost = false;
  HeartbeatRing* ring = nullptr;
  std::unique_ptr<HeartbeatRing> owned;
  {
    std::lock_guard<std::mutex> g(mu);  // onError waits for `ring` to be set
    owned = std::make_unique<HeartbeatRing>(
        LivenessContext{.runId = "halt",
                        .self = "a",
                        .limits = lim,
                        .view = view,
                        .first = *setup.store,
                        .connect = [real] { return interruptible(real); },
                        .onError =
                            [&](std::exception_ptr) {
                              std::lock_guard<std::mutex> l(mu);
                              if (lost) return;
                              lost = true;
                              if (halt) ring->haltWatching();  // on the writer's own thread
                              cv.notify_all();
                            }},
        HeartbeatOptions{.interval = Millis(100), .missedBeats = 8},
        [silent](Millis within) { return interruptible(boundedLazyConnection(silent, within)); });
    ring = owned.get();
  }
  {
    std::unique_lock<std::mutex> l(mu);
    REQUIRE(cv.wait_for(l, Millis(15'000), [&] { return lost; }));
  }
  beating = false;
  b.join();
  // b is silent now: an unhalted monitor evicts it after 8 x 100 ms.
  std::this_thread::sleep_for(Millis(2'500));
  const Versioned now = StateLog(*setup.store, lim).refresh(v);
  if (halt) {
    CHECK(now.version == v.version);  // nobody evicted
  } else {
    CHECK(now.version > v.version);  // b evicted (a's monitor is the only writer)
  }
  owned.reset();
}
