// The store's bounds (rendezvous/store_limits.h), each attacked on a real server on loopback:
// what a peer can make the server hold in memory and in time. Every case checks that what was
// stored before is intact and that another client is still served. The same attacks against
// the ddprun-store binary, with RSS measured, are in store_attacks.py.
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>

#include "base/errors.h"
#include "raw_socket.h"
#include "rendezvous/key_table.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"

using namespace ddprun;
using namespace ddprun::rendezvous;
using namespace std::chrono_literals;
using ddprun::test::RawSocket;
using protocol::CurrentCommand;
using protocol::FrameWriter;

namespace {

TcpStore client(uint16_t port, std::optional<std::string> token = std::nullopt) {
  return TcpStore({.host = "127.0.0.1", .port = port, .timeout = Millis(5000), .authToken = token});
}

std::string handshake() {
  std::string f;
  FrameWriter(f).u8(0).u32(protocol::kValidateMagic);
  return f;
}

uint8_t cmd(CurrentCommand c) { return static_cast<uint8_t>(c); }

template <typename Pred>
bool eventually(ThreadedStoreServer& s, Pred pred, int tries = 3000) {  // 30 s: only a hang fails
  for (int i = 0; i < tries; ++i) {
    if (pred(s.stats())) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Stores "before" = "intact" and waits until it is (SET has no reply; another connection could
// otherwise overtake it).
void storeBefore(uint16_t port, std::optional<std::string> token = std::nullopt) {
  auto s = client(port, token);
  s.set("before", "intact");
  REQUIRE(s.check({"before"}));
}

// The keys stored before an attack are intact and a fresh client is served.
void storedAndServed(uint16_t port, std::optional<std::string> token = std::nullopt) {
  auto s = client(port, token);
  CHECK(s.get("before") == "intact");
  s.set("after", "served");
  CHECK(s.get("after") == "served");
}

}  // namespace

TEST_CASE("a client that pipelines GETs without reading is paused, and loses nothing",
          "[limits]") {
  // The attack of issue 9: a big value, then GETs of it without reading the replies.
  constexpr size_t kValue = 1 << 20;
  constexpr int kGets = 200;
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0,
                              .limits = {.maxUnsentReplyBytes = 1 << 20}});
  {
    auto c = client(server.port());
    c.set("before", "intact");
    c.set("big", std::string(kValue, 'b'));
    REQUIRE(c.check({"before", "big"}));  // a round trip: both are stored before the flood
  }
  RawSocket flood(server.port());
  // A small receive buffer, so that the kernel cannot absorb the replies for the server.
  int small = 64 * 1024;
  ::setsockopt(flood.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  std::string gets = handshake();
  for (int i = 0; i < kGets; ++i) FrameWriter(gets).u8(cmd(CurrentCommand::Get)).str("big");
  flood.send(gets);
  REQUIRE(eventually(server, [](auto st) { return st.pausedConnections == 1; }));
  // Held: at most the cap plus one reply, not 200 MiB of replies.
  const auto st = server.stats();
  INFO("unsent reply bytes " << st.unsentReplyBytes);
  CHECK(st.unsentReplyBytes <= (1u << 20) + kValue + 8);
  storedAndServed(server.port());
  // Once the client reads, every reply arrives whole and in order.
  for (int i = 0; i < kGets; ++i) {
    const std::string r = flood.read(8 + kValue, 10'000);
    REQUIRE(r.size() == 8 + kValue);
    uint64_t len;
    std::memcpy(&len, r.data(), 8);
    CHECK(len == kValue);
    CHECK(r[8 + kValue - 1] == 'b');
  }
  CHECK(eventually(server, [](auto s) { return s.pausedConnections == 0; }));
}

TEST_CASE("a client that never reads its replies is cut after frame_timeout", "[limits]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0,
                              .limits = {.maxUnsentReplyBytes = 1 << 16,
                                         .frameTimeout = 500ms}});
  {
    auto c = client(server.port());
    c.set("before", "intact");
    c.set("big", std::string(1 << 20, 'b'));
    REQUIRE(c.check({"before", "big"}));
  }
  RawSocket flood(server.port());
  int small = 64 * 1024;
  ::setsockopt(flood.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  std::string gets = handshake();
  for (int i = 0; i < 100; ++i) FrameWriter(gets).u8(cmd(CurrentCommand::Get)).str("big");
  flood.send(gets);
  REQUIRE(eventually(server, [](auto st) { return st.pausedConnections == 1; }));
  storedAndServed(server.port());
  // Not reading for 0.5 s: closed, and what it held is released.
  CHECK(eventually(server, [](auto st) { return st.connections == 0 && st.unsentReplyBytes == 0; }));
  storedAndServed(server.port());
}

TEST_CASE("global caps refuse the request beyond them, naming the limit, and keep the rest",
          "[limits]") {
  SECTION("max_keys") {
    ThreadedStoreServer server({.host = "127.0.0.1", .port = 0, .limits = {.maxKeys = 3}});
    auto s = client(server.port());
    s.set("before", "intact");
    s.set("k2", "v");
    s.set("k3", "v");
    s.set("k3", "overwritten");  // not a new key: allowed at the cap
    REQUIRE(s.get("k3") == "overwritten");  // a round trip: all stored before the next client
    {
      auto over = client(server.port());
      over.set("k4", "one too many");  // SET has no reply: the server closes the connection
      CHECK(eventually(server, [](auto st) { return st.connections == 1; }));
    }
    CHECK(server.stats().keys == 3);
    auto fresh = client(server.port());  // served, and the keys are intact
    CHECK(fresh.get("before") == "intact");
    CHECK(fresh.get("k3") == "overwritten");
  }
  SECTION("max_stored_bytes") {
    ThreadedStoreServer server({.host = "127.0.0.1", .port = 0,
                                .limits = {.maxStoredBytes = 4096}});
    storeBefore(server.port());
    {
      auto over = client(server.port());
      over.set("huge", std::string(5000, 'x'));  // no reply: the connection is closed
      auto q = client(server.port());
      q.append("before", std::string(5000, 'x'));
      CHECK(eventually(server, [](auto st) { return st.connections == 0; }));
    }
    CHECK(server.stats().storedBytes == std::string("before").size() + 6);
    CHECK_FALSE(client(server.port()).check({"huge"}));
    storedAndServed(server.port());
  }
  SECTION("max_waiters") {
    ThreadedStoreServer server({.host = "127.0.0.1", .port = 0, .limits = {.maxWaiters = 2}});
    storeBefore(server.port());
    std::string wait = handshake();
    FrameWriter(wait).u8(cmd(CurrentCommand::Wait)).u64(1).str("never");
    RawSocket w1(server.port()), w2(server.port()), w3(server.port());
    w1.send(wait);
    w2.send(wait);
    REQUIRE(eventually(server, [](auto st) { return st.waiters == 2; }));
    w3.send(wait);
    CHECK(w3.closedByPeer());
    CHECK(server.stats().waiters == 2);
    storedAndServed(server.port());
  }
  SECTION("max_connections") {
    ThreadedStoreServer server({.host = "127.0.0.1", .port = 0,
                                .limits = {.maxConnections = 2}});
    auto s = client(server.port());
    s.set("before", "intact");
    RawSocket second(server.port());
    REQUIRE(eventually(server, [](auto st) { return st.connections == 2; }));
    RawSocket third(server.port());
    CHECK(third.closedByPeer());  // closed at once, not left hanging in the backlog
    CHECK(s.get("before") == "intact");  // the open ones are still served
  }
  SECTION("a MULTI_GET reply is bounded like one value") {
    ThreadedStoreServer server({.host = "127.0.0.1", .port = 0,
                                .limits = {.frame = {.maxValueBytes = 1000}}});
    auto s = client(server.port());
    s.set("before", "intact");
    s.set("v", std::string(600, 'v'));
    REQUIRE(s.check({"before", "v"}));
    auto m = client(server.port());
    CHECK_THROWS(m.multiGet({"v", "v"}));
    storedAndServed(server.port());
  }
}

TEST_CASE("before authenticating only a small handshake is read, within a deadline",
          "[limits][auth]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0, .authToken = "0123456789abcdef",
                              .limits = {.handshakeTimeout = 300ms}});
  storeBefore(server.port(), "0123456789abcdef");
  SECTION("a SET announcing a huge value is closed on its command byte") {
    RawSocket raw(server.port());
    std::string f = handshake();
    FrameWriter(f).u8(cmd(CurrentCommand::Set)).str("k").u64(60ull << 20);
    raw.send(f);
    CHECK(raw.closedByPeer());
  }
  SECTION("an AUTH frame over 1 KiB is closed from its length field") {
    RawSocket raw(server.port());
    std::string f = handshake();
    FrameWriter(f).u8(static_cast<uint8_t>(protocol::ExtensionCommand::Auth)).u64(2048);
    raw.send(f);
    CHECK(raw.closedByPeer());
  }
  SECTION("HELLO after HELLO is cut after a few (no amplification)") {
    RawSocket raw(server.port());
    raw.send(handshake() + std::string(1000, static_cast<char>(protocol::ExtensionCommand::Hello)));
    CHECK(raw.closedByPeer());
    // What it got back is a few HELLO replies, not a thousand.
    std::string got;
    for (std::string r; !(r = raw.read(65536, 500)).empty();) got += r;
    CHECK(got.size() < 1024);
  }
  SECTION("a connection that does not authenticate in time is closed") {
    RawSocket silent(server.port());
    CHECK(silent.closedByPeer(5000));
  }
  storedAndServed(server.port(), "0123456789abcdef");
  CHECK(eventually(server, [](auto st) { return st.connections == 0; }));
}

TEST_CASE("a slow sender is cut at the frame deadline, others are served meanwhile", "[limits]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0,
                              .limits = {.frameTimeout = 500ms}});
  storeBefore(server.port());
  RawSocket slow(server.port());
  std::string f = handshake();
  FrameWriter(f).u8(cmd(CurrentCommand::Set)).str("slow").u64(100);
  slow.send(f);
  bool closed = false;
  for (int i = 0; i < 40 && !closed; ++i) {  // a byte every 100 ms: never completes in time
    slow.send("x");
    storedAndServed(server.port());
    closed = slow.closedByPeer(100);
  }
  CHECK(closed);
  CHECK_FALSE(client(server.port()).check({"slow"}));
}

TEST_CASE("the idle limit cuts silent connections, never a held WAIT", "[limits]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0,
                              .limits = {.idleTimeout = 300ms}});
  storeBefore(server.port());
  RawSocket idle(server.port());
  RawSocket waiter(server.port());
  std::string wait = handshake();
  FrameWriter(wait).u8(cmd(CurrentCommand::Wait)).u64(1).str("go");
  waiter.send(wait);
  CHECK(idle.closedByPeer(5000));
  std::this_thread::sleep_for(600ms);  // twice the idle limit
  CHECK(server.stats().waiters == 1);
  client(server.port()).set("go", "1");
  CHECK(waiter.read(1, 5000) == std::string(1, '\0'));  // STOP_WAITING
  storedAndServed(server.port());
}

TEST_CASE("KeyTable: WAIT on many keys, duplicates and many waiters stay linear", "[limits]") {
  KeyTable t;
  KeyTable::Woken woken;
  // 100k distinct keys, each listed twice: registered once each.
  std::vector<std::string> keys;
  for (int i = 0; i < 100'000; ++i) keys.push_back("k" + std::to_string(i));
  std::vector<std::string> twice = keys;
  twice.insert(twice.end(), keys.begin(), keys.end());
  CHECK_FALSE(t.wait(1, twice));
  // 50k waiters on one key, cancelled one by one (each cancel is O(its keys)).
  for (KeyTable::WaiterId id = 2; id < 50'002; ++id) CHECK_FALSE(t.wait(id, {"shared"}));
  for (KeyTable::WaiterId id = 2; id < 50'001; ++id) CHECK(t.cancel(id));
  t.set("shared", "x", woken);
  CHECK(woken == KeyTable::Woken{50'001});
  woken.clear();
  for (size_t i = 0; i + 1 < keys.size(); ++i) t.set(keys[i], "", woken);
  CHECK(woken.empty());
  t.set(keys.back(), "", woken);
  CHECK(woken == KeyTable::Woken{1});
  CHECK(t.waiterCount() == 0);
}

TEST_CASE("KeyTable counts the bytes of keys, values and queued items", "[limits]") {
  KeyTable t;
  KeyTable::Woken w;
  t.set("ab", "1234", w);
  CHECK(t.bytes() == 6);
  t.set("ab", "12", w);
  CHECK(t.bytes() == 4);
  t.append("ab", "345", w);
  CHECK(t.bytes() == 7);
  CHECK(t.add("n", 10, w) == 10);
  CHECK(t.bytes() == 10);
  t.compareSet("n", "10", "1000", w);
  CHECK(t.bytes() == 12);
  t.queuePush("q", "item", w);
  CHECK(t.bytes() == 17);
  CHECK(t.keyCount() == 3);
  t.queuePop("q");
  CHECK(t.bytes() == 12);
  CHECK(t.erase("ab"));
  CHECK(t.bytes() == 5);
  CHECK(t.keyCount() == 1);
}
