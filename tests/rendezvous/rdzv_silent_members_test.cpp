// SilentMembers (rendezvous/silent_members.h): the exit barrier's one-pass judgment of which
// nodes stopped beating, on real beat counters in a MemoryStore and real time.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <thread>

#include "rendezvous/heartbeat.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/silent_members.h"

using namespace ddprun;
using namespace ddprun::rendezvous;

namespace {
constexpr HeartbeatOptions kBeats{.interval = Millis(20), .missedBeats = 3};  // bound 60 ms

void beat(Store& s, const std::string& id) { s.add(heartbeatCounterKey(id), 1); }

// Calls silent() every interval for `span`, beating `beating` (and this node, when
// `selfBeats`) before each call; returns the first non-empty answer, or an empty one.
std::vector<std::string> watch(SilentMembers& sm, Store& s, const std::vector<std::string>& ids,
                               const std::vector<std::string>& beating, bool selfBeats,
                               Millis span) {
  const auto end = Clock::now() + span;
  while (Clock::now() < end) {
    if (selfBeats) beat(s, "self");
    for (const auto& id : beating) beat(s, id);
    auto out = sm.silent(s, ids);
    if (!out.empty()) return out;
    std::this_thread::sleep_for(kBeats.interval);
  }
  return {};
}
}  // namespace

TEST_CASE("silent members: every node silent for the bound is found in one pass, a beating one never") {
  MemoryStore s;
  for (const char* id : {"self", "a", "b", "c", "d"}) beat(s, id);
  SilentMembers sm("self", kBeats);
  const std::vector<std::string> ids{"a", "b", "c", "d"};
  // All beat: nobody is silent, however long.
  CHECK(watch(sm, s, ids, ids, true, Millis(200)).empty());
  // a, b and c stop together; d goes on: the three are found in the same pass, not before
  // the bound, and d never (generous limits for a loaded machine).
  for (const auto& id : ids) beat(s, id);  // their last beats
  const auto stopped = Clock::now();
  auto gone = watch(sm, s, ids, {"d"}, true, Millis(5'000));
  CHECK(Clock::now() - stopped >= kBeats.timeout());
  std::sort(gone.begin(), gone.end());
  CHECK(gone == std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE("silent members: while this node's own counter stands still (its store or its writer stalled), nobody is judged") {
  MemoryStore s;
  for (const char* id : {"self", "a", "b"}) beat(s, id);
  SilentMembers sm("self", kBeats);
  // Nothing beats, this node included, for many bounds: a stalled store, not dead nodes.
  CHECK(watch(sm, s, {"a", "b"}, {}, false, 5 * kBeats.timeout()).empty());
  // Once this node's own beats go through again and the others stay silent, they are.
  CHECK(watch(sm, s, {"a", "b"}, {}, true, Millis(5'000)).size() == 2);
}

TEST_CASE("silent members: a node whose counter is gone (it left, deleting its keys) is silent") {
  MemoryStore s;
  for (const char* id : {"self", "a", "b"}) beat(s, id);
  SilentMembers sm("self", kBeats);
  s.deleteKey(heartbeatCounterKey("a"));
  CHECK(watch(sm, s, {"a", "b"}, {"b"}, true, Millis(5'000)) ==
        std::vector<std::string>{"a"});
}

TEST_CASE("silent members: a beat count is ADD's decimal text and nothing else") {
  CHECK(beatCount("12") == 12);
  CHECK(beatCount("-5") == -5);
  CHECK(beatCount("9223372036854775807") == INT64_MAX);
  for (const char* forged : {"", "garbage", "1x", " 1", "99999999999999999999", "0x10"})
    CHECK_FALSE(beatCount(forged).has_value());
  CHECK(forgedCounter("hb/a", std::string(100, 'x'), "why") ==
        "rendezvous key 'hb/a' holds '" + std::string(64, 'x') +
            "...', which is corrupt or forged (why)");
}

TEST_CASE("silent members: while this node's own counter is forged (no count), nobody is judged, and once it counts again the silent are") {
  MemoryStore s;
  for (const char* id : {"self", "a", "b"}) beat(s, id);
  SilentMembers sm("self", kBeats);
  // A client of the store wrote bytes that are no count: this node cannot tell that it beats.
  s.set(heartbeatCounterKey("self"), "not a count");
  CHECK(watch(sm, s, {"a", "b"}, {}, false, 5 * kBeats.timeout()).empty());
  // Its writer restores it (heartbeat.h) and beats on: a and b, silent all along, are found.
  s.set(heartbeatCounterKey("self"), "7");
  CHECK(watch(sm, s, {"a", "b"}, {}, true, Millis(5'000)).size() == 2);
}

TEST_CASE("silent members: a member's forged counter is compared as it is: changing, it is not silent") {
  MemoryStore s;
  for (const char* id : {"self", "a"}) beat(s, id);
  SilentMembers sm("self", kBeats);
  const auto end = Clock::now() + 5 * kBeats.timeout();
  for (int i = 0; Clock::now() < end; ++i) {
    beat(s, "self");
    s.set(heartbeatCounterKey("a"), i % 2 ? "" : "garbage");
    CHECK(sm.silent(s, {"a"}).empty());
    std::this_thread::sleep_for(kBeats.interval);
  }
}
