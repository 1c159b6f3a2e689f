// The versioned state log: compare-set appends under contention, markers, the hint.
#include <catch2/catch.hpp>

#include <thread>

#include "rendezvous/memory_store.h"
#include "rendezvous/state_log.h"

using namespace ddprun;
using namespace ddprun::rendezvous;

TEST_CASE("16 threads join through one log: every join lands exactly once", "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 16, .maxNodes = 16};
  std::vector<std::thread> threads;
  std::vector<int> wrote(16, 0);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      StateLog log(*store, lim);
      NodeInfo me{.id = "n" + std::to_string(i), .addr = "10.0.0." + std::to_string(i + 1)};
      auto r = log.update(log.latest(), [&](const RoundState& s) {
        return transition::join(s, me, lim);
      });
      wrote[i] = r.wrote;
    });
  }
  for (auto& t : threads) t.join();
  for (int w : wrote) CHECK(w == 1);

  StateLog log(*store, lim);
  Versioned last = log.refresh(log.latest());
  CHECK(last.version == 16);  // one version per join, no gaps, nothing lost
  CHECK(last.state.phase == Phase::Closed);
  REQUIRE(last.state.members.size() == 16);
  CHECK(last.state.members[0].addr == "10.0.0.1");
  CHECK(last.state.members[15].addr == "10.0.0.16");
  for (int64_t v = 1; v <= 16; ++v) CHECK(log.read(v).state.round == 0);
  // The markers name a version that implies them.
  CHECK(log.waitMarker(closedKey(0), Millis(0)) == std::optional<int64_t>(16));
  auto lc = log.waitMarker(lastCallKey(0), Millis(0));
  REQUIRE(lc);
  CHECK(*lc == 16);
  CHECK_FALSE(log.waitMarker(overKey(0), Millis(0)).has_value());
}

TEST_CASE("a no-op transition is only accepted on the newest version", "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 1, .maxNodes = 4};
  StateLog a(*store, lim), b(*store, lim);
  NodeInfo x{.id = "x", .addr = "x"}, y{.id = "y", .addr = "y"};
  auto joinX = [&](const RoundState& s) { return transition::join(s, x, lim); };
  Versioned v1 = a.update(a.latest(), joinX).now;
  Versioned v2 = b.update(b.latest(), [&](const RoundState& s) {
    return transition::join(s, y, lim);
  }).now;
  CHECK(v2.version == 2);
  // `a` still holds version 1; joining again is a no-op, answered on version 2.
  auto r = a.update(v1, joinX);
  CHECK_FALSE(r.wrote);
  CHECK(r.now.version == 2);
  CHECK(r.now.state.members.size() == 2);
}

TEST_CASE("waitNewer wakes on the next version and times out without one", "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 1, .maxNodes = 2};
  StateLog log(*store, lim);
  Versioned v0 = log.latest();
  CHECK_FALSE(log.waitNewer(v0, Millis(20)).has_value());
  std::thread writer([&] {
    StateLog w(*store, lim);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    w.update(w.latest(), [&](const RoundState& s) {
      return transition::join(s, NodeInfo{.id = "w", .addr = "w"}, lim);
    });
  });
  auto v1 = log.waitNewer(v0, Millis(5000));
  writer.join();
  REQUIRE(v1);
  CHECK(v1->version == 1);
  CHECK(v1->state.members.size() == 1);
}

TEST_CASE("a state key holding garbage is reported, not trusted", "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  store->set("latest", "1");
  store->set("state/1", "not a state");
  StateLog log(*store, JobLimits{});
  CHECK_THROWS_WITH(log.latest(), Catch::Contains("'state/1' is corrupt or forged"));
  store->set("latest", "x1");
  CHECK_THROWS_WITH(log.latest(), Catch::Contains("not a state version"));
}

TEST_CASE("a forged state is refused field by field, a forged hint at once", "[rdzv][log]") {
  const JobLimits lim{.minNodes = 1, .maxNodes = 2, .maxRestarts = 1};
  auto forged = [&](const std::string& records) {
    auto store = std::make_shared<MemoryStore>();
    store->set("latest", "1");
    store->set("state/1", "ddprun-rendezvous-state 1\nround 1\nphase closed\nrestarts 0\nexit 0\n"
                          "reason r\n" + records);
    StateLog log(*store, lim);
    try {
      log.latest();
    } catch (const StoreError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string ok = "member a 127.0.0.2 2 29500 -1 -1\n";
  CHECK(forged(ok) == "accepted");
  CHECK(forged(ok + "member b 127.0.0.3 2 29500 -1 -1\nmember c 127.0.0.4 2 29500 -1 -1\n")
            .find("3 members, more than MAX=2") != std::string::npos);
  CHECK(forged("member a 127.0.0.2 2147483647 29500 -1 -1\n").find("corrupt or forged") !=
        std::string::npos);  // an nproc that would overflow the world size
  CHECK(forged("member a 127.0.0.2;rm 2 29500 -1 -1\n").find("node record") != std::string::npos);
  CHECK(forged("member a 127.0.0.2 2 29500 -7 -1\n").find("node record") != std::string::npos);
  CHECK(forged("member a 127.0.0.2 2 29500 5 -1\n").find("node rank 5 >= MAX=2") !=
        std::string::npos);
  CHECK(forged(ok + ok).find("a member appears twice") != std::string::npos);
  CHECK(forged("").find("closed with no member") != std::string::npos);

  // A hint naming a version nobody wrote: reported at once instead of waiting for it.
  auto store = std::make_shared<MemoryStore>();
  store->set("latest", "7");
  StateLog log(*store, lim);
  CHECK_THROWS_WITH(log.latest(), Catch::Contains("names version 7, which was never written"));
}
