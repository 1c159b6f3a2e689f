// The round watcher's races, made deterministic: an agent's store writes held at a chosen
// moment (a store decorator on its connections) and the watcher held where it lets go of a watch
// (DynamicRendezvous::onWatcherDisarmedForTest), against a real StoreServer on loopback.
#include <condition_variable>
#include <mutex>

#include "rdzv_agents.h"
#include "rendezvous/rendezvous_backend.h"
#include "tests/support/forwarding_store.h"

using namespace rdzvtest;

namespace {

// Where the test holds an agent's thread and its watcher, one flag each.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool holdWrites = false;       // the agent's next state write waits for watcherDisarmed
  bool watcherDisarmed = false;  // the watcher's watch ended because the agent disarmed it
  bool rearmed = false;          // the agent is back from its call (it re-armed the watcher)

  void set(bool Gate::*flag, bool value = true) {
    {
      std::lock_guard<std::mutex> g(mu);
      this->*flag = value;
    }
    cv.notify_all();
  }
  bool get(bool Gate::*flag) {
    std::lock_guard<std::mutex> g(mu);
    return this->*flag;
  }
  bool waitFor(bool Gate::*flag, Millis timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return this->*flag; });
  }
};

// Passes every call through; a compare-set-and-set that wrote (a state log version) returns only
// once the watcher let go while the gate holds writes: the write is on the store, the agent not
// yet back.
class HoldingStore final : public ddprun::testing::ForwardingStore {
 public:
  HoldingStore(std::shared_ptr<Store> inner, std::shared_ptr<Gate> gate)
      : ForwardingStore(std::move(inner)), gate_(std::move(gate)) {}

  std::string compareSetAndSet(const std::string& k, const std::string& e, const std::string& d,
                               const std::vector<std::string>& keys,
                               const std::vector<std::string>& values) override {
    std::string got = inner().compareSetAndSet(k, e, d, keys, values);
    // Only a write that won: a lost compare-set (the agent's state was older) wakes nobody.
    if (got == d && gate_->get(&Gate::holdWrites)) {
      gate_->waitFor(&Gate::watcherDisarmed, Millis(5'000));
    }
    return got;
  }

 private:
  std::shared_ptr<Gate> gate_;
};

// The TCP store backend (c10d: the slot join, heartbeats) whose agent and watcher connections
// go through a HoldingStore; the heartbeat ring's connections are its own, untouched.
class HoldingBackend final : public RendezvousBackend {
 public:
  HoldingBackend(TcpStoreOptions store, HeartbeatOptions heartbeat, std::shared_ptr<Gate> gate)
      : inner_(std::move(store), heartbeat, "c10d"), gate_(std::move(gate)) {}
  std::string name() const override { return inner_.name(); }
  std::string describe() const override { return inner_.describe(); }
  InterruptibleStore connect(const std::string& runId) const override {
    InterruptibleStore c = inner_.connect(runId);
    c.store = std::make_shared<HoldingStore>(c.store, gate_);
    return c;
  }
  std::unique_ptr<Liveness> startLiveness(LivenessContext ctx) const override {
    return inner_.startLiveness(std::move(ctx));
  }
  std::string localAddress() const override { return inner_.localAddress(); }
  bool slotJoin() const override { return inner_.slotJoin(); }

 private:
  TcpStoreBackend inner_;
  std::shared_ptr<Gate> gate_;
};

}  // namespace

// Node rank 0's reportNodeLoss(inProcess) disarms its watcher, writes the recovery, and re-arms
// it for the same round. The watcher (on its own connection) wakes on that very write: here it
// finds itself disarmed, and the agent re-arms it before it decides what to wait on next. It
// must go on reading the round's versions, not fall back to the round's `over` marker: a member
// lost in process later writes no marker, so node rank 0 would never hear of it (stop 39's
// flake of "a node lost in process: only node rank 0 hears of it ...", forced).
TEST_CASE("node rank 0 re-armed for the same round as its watcher let go still hears the next "
          "node lost in process", "[rdzv][failures]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 3, .maxRestarts = 2,
                      .keepRoundOnNodeLoss = true};
  std::vector<std::unique_ptr<Agent>> agents;
  std::vector<std::shared_ptr<Gate>> gates;
  for (int n : {2, 3, 4}) {
    auto o = agentOptions(server.port(), "rearm", n, lim);
    auto gate = std::make_shared<Gate>();
    o.backend = std::make_shared<HoldingBackend>(o.store, o.heartbeat, gate);
    agents.push_back(makeAgent(std::move(o)));
    // Once: held until the agent is back from its call, which re-armed the watcher meanwhile.
    agents.back()->rdzv->onWatcherDisarmedForTest([gate] {
      if (!gate->get(&Gate::holdWrites) || gate->get(&Gate::watcherDisarmed)) return;
      gate->set(&Gate::watcherDisarmed);
      gate->waitFor(&Gate::rearmed, Millis(5'000));
    });
    gates.push_back(gate);
  }
  auto r = allNextRound({agents[0].get(), agents[1].get(), agents[2].get()});
  const auto byRank = checkOneRound(r, {2, 3, 4}, {1, 1, 1});
  std::unique_ptr<Agent> a = std::move(agents[byRank[0]]);
  std::unique_ptr<Agent> b = std::move(agents[byRank[1]]);
  std::unique_ptr<Agent> c = std::move(agents[byRank[2]]);
  const auto gate = gates[byRank[0]];
  b.reset();
  auto e = a->events.next(Millis(5'000));
  REQUIRE(e);
  CHECK(e->kind == RoundEvent::Kind::NodeLost);
  CHECK(e->lostNodeRank == 1);
  // The recovery's write is on the store, and a's thread held, until its watcher has let go.
  gate->set(&Gate::holdWrites);
  CHECK(a->rdzv->reportNodeLoss("node rank 1 was lost", true) ==
        DynamicRendezvous::AfterRecovery::Recover);
  gate->set(&Gate::holdWrites, false);
  REQUIRE(gate->get(&Gate::watcherDisarmed));  // the race was run, not skipped
  gate->set(&Gate::rearmed);
  // c leaves while the round runs: lost in process, which only a's reading of versions sees.
  const std::string cId = c->rdzv->self().id;
  c->rdzv->leave("SIGTERM");
  auto e2 = a->events.next(Millis(5'000));
  REQUIRE(e2);
  CHECK(e2->kind == RoundEvent::Kind::NodeLost);
  CHECK(e2->lostId == cId);
  CHECK(e2->lostNodeRank == 2);
  CHECK(e2->round == r[0].round);
}
