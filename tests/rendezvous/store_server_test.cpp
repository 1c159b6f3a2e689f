// The store server and the TCP client, on real loopback sockets (server on port 0).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "base/errors.h"
#include "rendezvous/auth.h"
#include "rendezvous/key_table.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"
#include "raw_socket.h"

using namespace ddprun;
using namespace ddprun::rendezvous;
using namespace std::chrono_literals;
using ddprun::test::RawSocket;

namespace {

TcpStore client(uint16_t port, Millis timeout = Millis(5000)) {
  return TcpStore({.host = "127.0.0.1", .port = port, .timeout = timeout});
}

std::string currentHandshake() {
  std::string f;
  protocol::FrameWriter(f).u8(0).u32(protocol::kValidateMagic);
  return f;
}

// Waits until the server's stats satisfy `pred` (the server closes connections asynchronously).
template <typename Pred>
bool eventually(ThreadedStoreServer& s, Pred pred) {
  for (int i = 0; i < 200; ++i) {
    if (pred(s.stats())) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

}  // namespace

// A write-once key: another client's overwrite is refused (the store drops it) and so is its
// delete; the caller then checks that the first value is intact.
static void checkWriteOnce(const TcpStoreOptions& o, const std::string& key,
                           const std::string& forged) {
  TcpStore a(o);
  bool refused = false;
  try {
    a.set(key, forged);
    a.ping();
  } catch (const ddprun::Error&) {
    refused = true;
  }
  CHECK(refused);
  TcpStore d(o);
  CHECK_THROWS_AS(d.deleteKey(key), ddprun::Error);
}

TEST_CASE("basic operations through the TCP client", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  auto s = client(server.port());
  s.set("a", std::string("x\0y", 3));
  CHECK(s.get("a") == std::string("x\0y", 3));
  CHECK(s.add("n", 3) == 3);
  CHECK(s.add("n", 4) == 7);
  CHECK(s.get("n") == "7");
  CHECK(s.compareSet("a", std::string("x\0y", 3), "z") == "z");
  CHECK(s.check({"a", "n"}));
  CHECK_FALSE(s.check({"a", "missing"}));
  CHECK(s.numKeys() == 2);
  CHECK(s.deleteKey("a"));
  CHECK_FALSE(s.deleteKey("a"));
  s.multiSet({"m1", "m2"}, {"v1", "v2"});
  CHECK(s.multiGet({"m2", "m1"}) == std::vector<std::string>{"v2", "v1"});
  s.append("log", "ab");
  s.append("log", "cd");
  CHECK(s.get("log") == "abcd");
  s.ping();
  // A large value crosses in many TCP segments both ways.
  std::string big(8 << 20, 'q');
  big[12345] = 'z';
  s.set("big", big);
  CHECK(s.get("big") == big);
}

TEST_CASE("PrefixStore joins prefix and key with a slash", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  auto inner = std::make_shared<TcpStore>(TcpStoreOptions{.host = "127.0.0.1", .port = server.port()});
  PrefixStore job("job7", inner);
  PrefixStore attempt("attempt_1", std::make_shared<PrefixStore>(job));
  attempt.set("k", "v");
  CHECK(inner->get("job7/attempt_1/k") == "v");
  CHECK(job.get("attempt_1/k") == "v");
  CHECK(attempt.add("c", 2) == 2);
  CHECK(inner->check({"job7/attempt_1/c"}));
}

TEST_CASE("16 threads x 1000 ADDs give exactly 16000", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      auto s = client(server.port());
      for (int i = 0; i < 1000; ++i) s.add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(client(server.port()).get("counter") == "16000");
}

TEST_CASE("WAIT is held until the keys exist, then wakes", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  auto waiter = client(server.port());
  std::atomic<bool> done{false};
  std::thread t([&] {
    waiter.wait({"k1", "k2"}, Millis(10'000));
    done = true;
  });
  auto setter = client(server.port());
  REQUIRE(eventually(server, [](auto st) { return st.waiters == 1; }));
  setter.set("k1", "v");
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(done);
  setter.set("k2", "v");
  t.join();
  CHECK(done);
  // get() also waits for its key
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    setter.set("late", "here");
  });
  CHECK(waiter.get("late") == "here");
  late.join();
}

TEST_CASE("a WAIT that times out is cancelled and the connection stays usable", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  auto s = client(server.port(), Millis(200));
  auto t0 = Clock::now();
  CHECK_THROWS_AS(s.wait({"never"}, Millis(200)), TimeoutError);
  CHECK(Clock::now() - t0 < 2s);
  CHECK(server.stats().waiters == 0);  // CANCEL_WAIT removed it on the server
  CHECK_THROWS_WITH(s.get("never"), Catch::Contains("'never'") && Catch::Contains("127.0.0.1"));
  s.set("after", "1");
  CHECK(s.get("after") == "1");
  CHECK(server.stats().connections == 1);  // the same connection, still in sync
}

TEST_CASE("setWaitsCancelled ends another thread's WAIT and keeps the connection", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  auto s = client(server.port(), Millis(60'000));
  // A WAIT in progress on another thread (a round watcher on its agent's connection).
  std::string ended;
  std::thread waiter([&] {
    try {
      s.wait({"never"}, Millis(600'000));
    } catch (const TimeoutError& e) {
      ended = e.what();
    }
  });
  REQUIRE(eventually(server, [](auto st) { return st.waiters == 1; }));
  s.setWaitsCancelled(true);
  waiter.join();
  CHECK_THAT(ended, Catch::Contains("'never'") && Catch::Contains("was cancelled"));
  // While on, a WAIT or a WAIT_GET started later ends at once too; one whose keys exist does not.
  CHECK_THROWS_AS(s.get("never"), TimeoutError);
  s.set("there", "1");
  s.wait({"there"}, Millis(60'000));
  CHECK(s.get("there") == "1");
  s.setWaitsCancelled(false);
  CHECK(server.stats().waiters == 0);
  // Off again: WAITs wait; the connection is the same one, its replies in step.
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    auto other = client(server.port());
    other.set("later", "2");
  });
  CHECK(s.get("later") == "2");
  later.join();
  CHECK(s.add("n", 5) == 5);
  REQUIRE(eventually(server, [](auto st) { return st.connections == 1; }));
}

TEST_CASE("CANCEL_WAIT on the wire", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  RawSocket raw(server.port());
  std::string f = currentHandshake();
  protocol::FrameWriter(f).u8(static_cast<uint8_t>(protocol::CurrentCommand::Wait)).u64(1).str("w");
  raw.send(f);
  REQUIRE(eventually(server, [](auto st) { return st.waiters == 1; }));
  raw.send(std::string(1, static_cast<char>(protocol::CurrentCommand::CancelWait)));
  CHECK(raw.read(1) == std::string(1, static_cast<char>(protocol::WaitReply::WaitCanceled)));
  CHECK(server.stats().waiters == 0);
}

TEST_CASE("a client that vanishes mid-WAIT leaves no waiter", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  {
    RawSocket raw(server.port());
    std::string f = currentHandshake();
    protocol::FrameWriter(f).u8(static_cast<uint8_t>(protocol::CurrentCommand::Wait)).u64(2).str("a").str("b");
    raw.send(f);
    REQUIRE(eventually(server, [](auto st) { return st.waiters == 1; }));
  }
  CHECK(eventually(server, [](auto st) { return st.waiters == 0 && st.connections == 0; }));
  client(server.port()).set("a", "1");  // waking nobody is fine
}

TEST_CASE("malformed, oversized and unknown frames close only their connection", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1",
                              .port = 0,
                              .limits = {.frame = {.maxKeyBytes = 1024, .maxValueBytes = 1 << 20}}});
  auto good = client(server.port());
  good.set("keep", "me");

  SECTION("unknown command byte") {
    RawSocket raw(server.port());
    raw.send(currentHandshake() + std::string(1, '\x2A'));
    CHECK(raw.closedByPeer());
  }
  SECTION("oversized value length") {
    RawSocket raw(server.port());
    std::string f = currentHandshake();
    protocol::FrameWriter(f).u8(static_cast<uint8_t>(protocol::CurrentCommand::Set)).str("k").u64(1ull << 33);
    raw.send(f);
    CHECK(raw.closedByPeer());
  }
  SECTION("oversized key") {
    RawSocket raw(server.port());
    std::string f;
    protocol::FrameWriter(f).u8(static_cast<uint8_t>(protocol::LegacyCommand::Get)).str(std::string(2000, 'k'));
    raw.send(f);
    CHECK(raw.closedByPeer());
  }
  SECTION("truncated frame then hang-up") {
    RawSocket raw(server.port());
    std::string f = currentHandshake();
    protocol::FrameWriter(f).u8(static_cast<uint8_t>(protocol::CurrentCommand::Set)).str("half").u64(100);
    raw.send(f + "only-some");
    raw.closeNow();
  }
  SECTION("ADD on a value that is not a number") {
    RawSocket raw(server.port());
    std::string f = currentHandshake();
    protocol::FrameWriter(f).u8(static_cast<uint8_t>(protocol::CurrentCommand::Add)).str("keep").i64(1);
    raw.send(f);
    CHECK(raw.closedByPeer());
  }
  CHECK(eventually(server, [](auto st) { return st.connections == 1; }));
  CHECK(good.get("keep") == "me");  // the other connection and the data are untouched
  CHECK(good.numKeys() == 1);
}

TEST_CASE("the legacy dialect on the wire (torch 1.13 numbering)", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  RawSocket raw(server.port());
  std::string f;
  protocol::FrameWriter w(f);
  w.u8(static_cast<uint8_t>(protocol::LegacyCommand::Set)).str("/k").str("v");
  w.u8(static_cast<uint8_t>(protocol::LegacyCommand::Add)).str("/n").i64(41);
  w.u8(static_cast<uint8_t>(protocol::LegacyCommand::GetNumKeys));
  w.u8(static_cast<uint8_t>(protocol::LegacyCommand::Get)).str("/k");
  raw.send(f);
  std::string reply = raw.read(8 + 8 + 8 + 1);
  REQUIRE(reply.size() == 25);
  int64_t added, numKeys;
  uint64_t len;
  std::memcpy(&added, reply.data(), 8);
  std::memcpy(&numKeys, reply.data() + 8, 8);
  std::memcpy(&len, reply.data() + 16, 8);
  CHECK(added == 41);
  CHECK(numKeys == 2);
  CHECK(len == 1);
  CHECK(reply[24] == 'v');
  // The legacy Python client and ours see the same keys.
  CHECK(client(server.port()).get("/n") == "41");
}

TEST_CASE("queues on the wire", "[server]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  RawSocket raw(server.port());
  std::string f = currentHandshake();
  protocol::FrameWriter w(f);
  w.u8(static_cast<uint8_t>(protocol::CurrentCommand::QueuePush)).str("q").str("one");
  w.u8(static_cast<uint8_t>(protocol::CurrentCommand::QueuePush)).str("q").str("two");
  w.u8(static_cast<uint8_t>(protocol::CurrentCommand::QueueLen)).str("q");
  w.u8(static_cast<uint8_t>(protocol::CurrentCommand::QueuePop)).str("q");
  raw.send(f);
  std::string reply = raw.read(8 + 8 + 8 + 3);
  REQUIRE(reply.size() == 27);
  int64_t qlen, before;
  std::memcpy(&qlen, reply.data(), 8);
  std::memcpy(&before, reply.data() + 8, 8);
  CHECK(qlen == 2);
  CHECK(before == 2);
  CHECK(reply.substr(24) == "one");
}

TEST_CASE("authentication: accepted, refused, required", "[server][auth]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0, .authToken = "s3cret"});
  SECTION("the right token works") {
    TcpStore s({.host = "127.0.0.1", .port = server.port(), .authToken = "s3cret"});
    s.set("k", "v");
    CHECK(s.get("k") == "v");
  }
  SECTION("a wrong token is refused with a clear error") {
    CHECK_THROWS_MATCHES(
        TcpStore({.host = "127.0.0.1", .port = server.port(), .authToken = "guess"}), AuthError,
        Catch::Matchers::Predicate<AuthError>([&](const AuthError& e) {
          return std::string(e.what()).find("the store at 127.0.0.1:" +
                                            std::to_string(server.port()) +
                                            " refused our authentication token") == 0;
        }));
  }
  SECTION("no token at all") {
    CHECK_THROWS_AS(TcpStore({.host = "127.0.0.1", .port = server.port()}), AuthError);
  }
  SECTION("an unauthenticated connection can do nothing but authenticate") {
    RawSocket raw(server.port());
    std::string f = currentHandshake();
    protocol::FrameWriter(f).u8(static_cast<uint8_t>(protocol::CurrentCommand::Set)).str("evil").str("1");
    raw.send(f);
    CHECK(raw.closedByPeer());
    TcpStore s({.host = "127.0.0.1", .port = server.port(), .authToken = "s3cret"});
    CHECK_FALSE(s.check({"evil"}));
  }
  SECTION("proofs: fresh per nonce, bound to direction and channel, never the token") {
    namespace a = rendezvous::auth;
    using D = a::Direction;
    const std::string ns(32, 'S'), nc(32, 'C'), ch = "127.0.0.1:29400";
    const std::string p = a::proof("s3cret", D::ClientToServer, ns, nc, ch);
    CHECK(p.size() == 32);
    CHECK(p != a::proof("s3cret", D::ServerToClient, ns, nc, ch));  // not reflectable
    CHECK(p != a::proof("s3cret", D::ClientToServer, std::string(32, 'T'), nc, ch));
    CHECK(p != a::proof("s3cret", D::ClientToServer, ns, std::string(32, 'D'), ch));
    CHECK(p != a::proof("s3cret", D::ClientToServer, ns, nc, "127.0.0.1:29401"));  // relayed
    CHECK(p != a::proof("s3cre", D::ClientToServer, ns, nc, ch));
    CHECK(p.find("s3cret") == std::string::npos);
    CHECK(a::channelName("::ffff:127.0.0.1", 5) == "127.0.0.1:5");
    CHECK(a::channelName("::1", 5) == "::1:5");
  }
}

TEST_CASE("a server that accepts without proving the token is refused", "[server][auth]") {
  // A fake store: it asks for authentication, then answers AUTH_OK with a made-up proof (or
  // with none, hanging up). It cannot compute the real one without the token.
  for (const bool withProof : {true, false}) {
    INFO("with a made-up proof: " << withProof);
    const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(lfd, 4) == 0);
    REQUIRE(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    std::thread fake([&] {
      const int c = ::accept(lfd, nullptr, nullptr);
      char buf[4096];
      auto recvSome = [&] { return ::recv(c, buf, sizeof buf, 0); };
      const ssize_t n = recvSome();  // VALIDATE, PING, HELLO
      std::string reply;
      uint32_t ping = 0;
      if (n >= 10) std::memcpy(&ping, buf + 6, 4);
      protocol::FrameWriter w(reply);
      w.u32(ping).str(protocol::kServerIdentity).u8(1).str(std::string(32, 'n'));
      ::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
      recvSome();  // AUTH
      std::string ok;
      protocol::FrameWriter(ok).u8(0);
      if (withProof) protocol::FrameWriter(ok).str(std::string(32, 'p'));
      ::send(c, ok.data(), ok.size(), MSG_NOSIGNAL);
      ::close(c);
    });
    CHECK_THROWS_MATCHES(
        TcpStore({.host = "127.0.0.1", .port = ntohs(a.sin_port),
                  .connectTimeout = Millis(5'000), .authToken = "s3cret-of-the-job"}),
        AuthError, Catch::Matchers::Predicate<AuthError>([](const AuthError& e) {
          return std::string(e.what()).find("without proving it knows the token") !=
                 std::string::npos;
        }));
    fake.join();
    ::close(lfd);
  }
}

TEST_CASE("written rendezvous state versions are write-once", "[server][writeonce]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const TcpStoreOptions o{.host = "127.0.0.1", .port = server.port(), .timeout = Millis(5'000)};
  TcpStore s(o);
  const std::string v1 = "ddprun/rdzv/job/state/1";
  CHECK(rendezvous::KeyTable::writeOnce(v1));
  CHECK_FALSE(rendezvous::KeyTable::writeOnce("ddprun/rdzv/job/state/latest"));
  CHECK_FALSE(rendezvous::KeyTable::writeOnce("ddprun/rdzv/job/latest"));
  CHECK_FALSE(rendezvous::KeyTable::writeOnce("state/1"));
  CHECK(s.compareSet(v1, "", "first") == "first");  // written once, as agents do
  CHECK(s.compareSet(v1, "first", "second") == "first");  // never rewritten
  // Every other change is refused by closing the connection that asked (the next call on it
  // fails); the version keeps its value.
  const std::vector<std::function<void(TcpStore&)>> attacks = {
      [&](TcpStore& a) { a.deleteKey(v1); },
      [&](TcpStore& a) { a.add(v1, 1); },
      [&](TcpStore& a) { a.set(v1, "overwritten"); },
      [&](TcpStore& a) { a.append(v1, "more"); },
      [&](TcpStore& a) { a.multiSet({"other", v1}, {"x", "y"}); },
  };
  for (size_t i = 0; i < attacks.size(); ++i) {
    INFO("attack " << i);
    TcpStore a(o);
    bool closed = false;  // a call with a reply fails at once, one without on the next call
    try {
      attacks[i](a);
    } catch (const ddprun::Error&) {
      closed = true;
    }
    if (!closed) CHECK_THROWS_AS(a.ping(), ddprun::Error);
    CHECK(s.get(v1) == "first");
  }
  CHECK_FALSE(s.check({"other"}));  // the refused MULTI_SET did nothing at all
  // A version not written yet may be created by SET (agents use COMPARE_SET), and other keys
  // of the job are unaffected.
  s.set("ddprun/rdzv/job/state/2", "two");
  CHECK(s.get("ddprun/rdzv/job/state/2") == "two");
  s.set("ddprun/rdzv/job/latest", "1");
  s.set("ddprun/rdzv/job/latest", "2");
  CHECK(s.get("ddprun/rdzv/job/latest") == "2");
  CHECK(s.deleteKey("ddprun/rdzv/job/latest"));
}

TEST_CASE("the slot join's records and round keys are write-once, its counter is not",
          "[server][writeonce]") {
  using rendezvous::KeyTable;
  CHECK(KeyTable::writeOnce("ddprun/rdzv/job/r/3/node/17"));
  CHECK(KeyTable::writeOnce("ddprun/rdzv/job/r/3/closed"));
  CHECK(KeyTable::writeOnce("ddprun/rdzv/job/r/3/over"));
  CHECK(KeyTable::writeOnce("ddprun/rdzv/job/r/3/done/2"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/r/3/done"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/r/3/count"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/r/x/closed"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/r/3/node/"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/r/3/node/1a"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/r/3/closed/x"));
  CHECK_FALSE(KeyTable::writeOnce("r/3/closed"));
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const TcpStoreOptions o{.host = "127.0.0.1", .port = server.port(), .timeout = Millis(5'000)};
  TcpStore s(o);
  const std::string closed = "ddprun/rdzv/job/r/3/closed", node = "ddprun/rdzv/job/r/3/node/1";
  CHECK(s.compareSet(closed, "", "4 9 127.0.0.2 29500") == "4 9 127.0.0.2 29500");
  CHECK(s.compareSet(closed, "4 9 127.0.0.2 29500", "1 1 evil 1") == "4 9 127.0.0.2 29500");
  CHECK(s.compareSet(node, "", "a 127.0.0.2 2 29500") == "a 127.0.0.2 2 29500");
  for (const auto& key : {closed, node}) checkWriteOnce(o, key, "1 1 evil 1");
  CHECK(s.get(closed) == "4 9 127.0.0.2 29500");
  CHECK(s.get(node) == "a 127.0.0.2 2 29500");
  CHECK(s.add("ddprun/rdzv/job/r/3/count", 5) == 5);  // the counter stays a counter
  CHECK(s.add("ddprun/rdzv/job/r/3/count", 1) == 6);
}

TEST_CASE("connect retries until the server appears, and gives up naming the address", "[server]") {
  // Find a free port, then start the server on it a little later.
  uint16_t port;
  { ThreadedStoreServer probe({.host = "127.0.0.1", .port = 0}); port = probe.port(); }
  std::unique_ptr<ThreadedStoreServer> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    late = std::make_unique<ThreadedStoreServer>(StoreServerOptions{.host = "127.0.0.1", .port = port});
  });
  TcpStore s({.host = "127.0.0.1", .port = port, .connectTimeout = Millis(10'000)});
  starter.join();
  s.set("k", "v");
  CHECK(s.get("k") == "v");
  late.reset();

  auto t0 = Clock::now();
  CHECK_THROWS_WITH(TcpStore({.host = "127.0.0.1", .port = port, .connectTimeout = Millis(300)}),
                    Catch::Contains("cannot connect to the store at 127.0.0.1:" + std::to_string(port)));
  CHECK(Clock::now() - t0 < 3s);
}

TEST_CASE("a leaving client's reconnect gives up at the first refused connection", "[server]") {
  // A store whose server has gone: a plain client's reconnect retries refused connections
  // until its timeout (the server may be restarting); after giveUpWhenRefused() it fails at
  // once, naming the address (an agent leaving after its store's host has left: kill9 over ssh).
  auto server = std::make_unique<ThreadedStoreServer>(StoreServerOptions{.host = "127.0.0.1", .port = 0});
  const uint16_t port = server->port();
  TcpStore patient = client(port, Millis(1500));
  TcpStore leaving = client(port, Millis(1500));
  patient.set("k", "v");
  leaving.set("k", "w");
  server.reset();

  const std::string refused = "cannot connect to the store at 127.0.0.1:" + std::to_string(port);
  auto failsIn = [&](TcpStore& s) {
    // The first call may find the old connection closed; a later one reconnects.
    CHECK_THROWS_AS(s.get("k"), NetworkError);
    const auto t0 = Clock::now();
    CHECK_THROWS_WITH(s.get("k"), Catch::Contains(refused) && Catch::Contains("refused"));
    return Clock::now() - t0;
  };
  CHECK(failsIn(patient) >= 1400ms);
  leaving.giveUpWhenRefused();
  CHECK(failsIn(leaving) < 500ms);
}

TEST_CASE("a server that is not a ddprun store is recognised", "[server]") {
  // A listener that accepts and closes at once, like a foreign service would.
  ThreadedStoreServer store({.host = "127.0.0.1", .port = 0});
  // Torch's servers are covered by the interop tests; here: our server in plain TCPStore mode
  // answers the current handshake, and a client asking for the legacy dialect still works.
  TcpStore legacy({.host = "127.0.0.1", .port = store.port(), .dialect = StoreDialect::Legacy});
  legacy.set("x", "1");
  CHECK(legacy.get("x") == "1");
  legacy.append("x", "2");  // emulated with compare-set in the legacy dialect
  CHECK(legacy.get("x") == "12");
  CHECK(legacy.multiGet({"x"}) == std::vector<std::string>{"12"});
}

TEST_CASE("a held WAIT does not block later frames, a new WAIT replaces it", "[server]") {
  // torch 1.13 clients have no CANCEL_WAIT: after a client-side timeout they just go on.
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  RawSocket raw(server.port());
  std::string f;
  protocol::FrameWriter w(f);
  w.u8(static_cast<uint8_t>(protocol::LegacyCommand::Wait)).u64(1).str("/never");
  w.u8(static_cast<uint8_t>(protocol::LegacyCommand::Add)).str("/n").i64(5);
  w.u8(static_cast<uint8_t>(protocol::LegacyCommand::Wait)).u64(1).str("/n");
  raw.send(f);
  std::string reply = raw.read(9);
  REQUIRE(reply.size() == 9);
  int64_t n;
  std::memcpy(&n, reply.data(), 8);
  CHECK(n == 5);
  CHECK(reply[8] == static_cast<char>(protocol::WaitReply::StopWaiting));
  CHECK(server.stats().waiters == 0);  // the abandoned WAIT on /never is gone
  client(server.port()).set("/never", "now");
  CHECK(raw.read(1, 200).empty());  // and it is never answered
}

TEST_CASE("INFO names the store and its job", "[server][info]") {
  // What an agent uses to tell its own store from another (no split brain) and to recognise
  // the store of its job on the endpoint's port (a second agent on the host joins it).
  ThreadedStoreServer mine({.host = "127.0.0.1", .port = 0, .jobId = "job-a"});
  ThreadedStoreServer other({.host = "127.0.0.1", .port = 0});
  const auto a = TcpStore({.host = "127.0.0.1", .port = mine.port()}).serverInfo();
  const auto a2 = TcpStore({.host = "127.0.0.1", .port = mine.port()}).serverInfo();
  const auto b = TcpStore({.host = "127.0.0.1", .port = other.port()}).serverInfo();
  CHECK(a.job == "job-a");
  CHECK(b.job.empty());  // ddprun-store: any job
  CHECK(a.instance.size() == 16);
  CHECK(a.instance == a2.instance);  // one per server process...
  CHECK(a.instance != b.instance);   // ...and random
  // With a token INFO needs authentication, like every command but the handshake's.
  ThreadedStoreServer secured(
      {.host = "127.0.0.1", .port = 0, .authToken = "s3cret-s3cret-s3cret", .jobId = "job-b"});
  CHECK(TcpStore({.host = "127.0.0.1", .port = secured.port(), .authToken = "s3cret-s3cret-s3cret"})
            .serverInfo()
            .job == "job-b");
  RawSocket raw(secured.port());
  std::string f = currentHandshake();
  protocol::FrameWriter(f).u8(static_cast<uint8_t>(protocol::ExtensionCommand::Info));
  raw.send(f);
  CHECK(raw.closedByPeer());
}

TEST_CASE("spilled lists' entries are write-once, their ref counter is not", "[server][writeonce]") {
  using rendezvous::KeyTable;
  CHECK(KeyTable::writeOnce("ddprun/rdzv/job/l/7/0"));
  CHECK(KeyTable::writeOnce("ddprun/rdzv/job/l/7/255"));
  CHECK(KeyTable::writeOnce("ddprun/rdzv/job/l/7/id/127.0.0.2-1-ab"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/lists"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/l/x/0"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/l/7/"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/l/7/id/"));
  CHECK_FALSE(KeyTable::writeOnce("ddprun/rdzv/job/l/7/1a"));
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const TcpStoreOptions o{.host = "127.0.0.1", .port = server.port(), .timeout = Millis(5'000)};
  TcpStore s(o);
  const std::string entry = "ddprun/rdzv/job/l/7/0", byId = "ddprun/rdzv/job/l/7/id/a";
  s.multiSet({entry, byId}, {"member a 127.0.0.2 2 29500 -1 -1", "0 0"});
  for (const auto& key : {entry, byId}) checkWriteOnce(o, key, "1 1");
  CHECK(s.get(entry) == "member a 127.0.0.2 2 29500 -1 -1");
  CHECK(s.get(byId) == "0 0");
  // The read that agents make of an entry (a compare-set expecting "?") never writes.
  CHECK(s.compareSet(byId, "?", "?") == "0 0");
  CHECK(s.compareSet("ddprun/rdzv/job/l/7/id/b", "?", "?") == "?");
  CHECK_FALSE(s.check({"ddprun/rdzv/job/l/7/id/b"}));
  CHECK(s.add("ddprun/rdzv/job/lists", 1) == 1);
  CHECK(s.add("ddprun/rdzv/job/lists", 1) == 2);
}
