// ddprun's TcpStore client against a real torch 1.13 TCPStore server (c10d::TCPStore from
// Debian's libtorch, in this process), in the legacy dialect. Note the torch 1.13 client
// prefixes keys with "/", so the same data seen from torch is under "/key".
// Torch first: it pulls in glog, whose CHECK would replace Catch's (and abort instead of
// failing the test); drop it before Catch defines its own.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#undef CHECK
#include <catch2/catch.hpp>

#include "base/errors.h"
#include "rendezvous/tcp_store.h"

using namespace ddprun::rendezvous;

namespace {
std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
}  // namespace

TEST_CASE("ddprun client against torch 1.13's TCPStore server", "[interop][torch]") {
  c10d::TCPStoreOptions opts;
  opts.port = 0;
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = std::chrono::milliseconds(5000);
  c10d::TCPStore torchServer("127.0.0.1", opts);
  const uint16_t port = torchServer.getPort();

  TcpStore s({.host = "127.0.0.1",
              .port = port,
              .timeout = Millis(3000),
              .dialect = StoreDialect::Legacy});

  // What ddprun writes, torch reads (its client adds the "/" prefix itself).
  s.set("/from-ddprun", "hello");
  CHECK(text(torchServer.get("from-ddprun")) == "hello");
  // What torch writes, ddprun reads.
  torchServer.set("from-torch", bytes("world"));
  CHECK(s.get("/from-torch") == "world");

  CHECK(s.add("/n", 5) == 5);
  CHECK(torchServer.add("n", 2) == 7);
  CHECK(s.get("/n") == "7");

  CHECK(s.compareSet("/from-torch", "world", "swapped") == "swapped");
  CHECK(text(torchServer.get("from-torch")) == "swapped");

  CHECK(s.check({"/n", "/from-ddprun"}));
  CHECK_FALSE(s.check({"/absent"}));
  CHECK(s.numKeys() == torchServer.getNumKeys());
  CHECK(s.deleteKey("/n"));
  CHECK_FALSE(torchServer.check({"n"}));

  // multiGet / multiSet / append have no legacy command: emulated with the ones that exist.
  s.multiSet({"/m1", "/m2"}, {"a", "b"});
  CHECK((s.multiGet({"/m1", "/m2"}) == std::vector<std::string>{"a", "b"}));
  s.append("/m1", "c");
  CHECK(text(torchServer.get("m1")) == "ac");

  // WAIT is answered by the torch server when the key arrives.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    torchServer.set("later", bytes("1"));
  });
  s.wait({"/later"}, Millis(3000));
  setter.join();

  // A timed-out WAIT cannot be cancelled in the legacy protocol: the client drops the
  // connection and reconnects on its next call.
  CHECK_THROWS_AS(s.wait({"/never"}, Millis(200)), ddprun::TimeoutError);
  CHECK(s.get("/later") == "1");
  s.ping();
}
