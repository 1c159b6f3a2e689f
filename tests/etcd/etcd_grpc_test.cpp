// The gRPC transport (rendezvous/etcd/grpc/) against a real etcd (one member on loopback,
// Debian's etcd-server): an agent's watches share its one HTTP/2 connection and still get their
// events; etcd's refusals come back as EtcdError naming the method and the status; a member
// that goes away fails calls and watches with errors naming it, within the client's timeout.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <thread>

#include "etcd_cluster.h"
#include "rendezvous/etcd/etcd_watch.h"

using namespace etcdtest;
using namespace ddprun;
using namespace ddprun::rendezvous::etcd;
using Clock = std::chrono::steady_clock;

namespace {
std::string prefix() { return "/ddprun-grpc-test/" + std::to_string(::getpid()) + "/"; }
}  // namespace

TEST_CASE("etcd grpc: 200 watches on one connection, each gets its own events", "[etcd][grpc]") {
  EtcdCluster cluster(1);
  EtcdClientOptions o = cluster.clientOptions(Millis(5'000));
  o.channels = std::make_shared<grpc::ChannelPool>();
  REQUIRE(usesGrpc(o));
  EtcdClient c(o);
  const std::string p = prefix();
  const int64_t rev = c.put({.key = p + "start", .value = "x"}).header.revision;
  std::vector<std::unique_ptr<EtcdWatch>> watches;
  for (int i = 0; i < 200; ++i) {
    watches.push_back(std::make_unique<EtcdWatch>(
        o, WatchCreate{.key = p + "k" + std::to_string(i), .startRevision = rev + 1}));
  }
  for (auto& w : watches) CHECK(w->next(Clock::now() + Millis(20)).empty());  // open, no event
  c.put({.key = p + "k42", .value = "v42"});
  c.deleteRange({.key = p + "k7"});  // absent: no event
  c.put({.key = p + "k7", .value = "v7"});
  c.deleteRange({.key = p + "k7"});
  auto e42 = watches[42]->next(Clock::now() + Millis(5'000));
  REQUIRE(e42.size() == 1);
  CHECK(e42[0].type == Event::Type::Put);
  CHECK(e42[0].kv.key == p + "k42");
  CHECK(e42[0].kv.value == "v42");
  std::vector<Event> e7;
  while (e7.size() < 2) {
    auto more = watches[7]->next(Clock::now() + Millis(5'000));
    REQUIRE_FALSE(more.empty());
    e7.insert(e7.end(), more.begin(), more.end());
  }
  CHECK(e7[0].type == Event::Type::Put);
  CHECK(e7[1].type == Event::Type::Delete);
  CHECK(watches[41]->next(Clock::now() + Millis(200)).empty());
  // One TCP connection carried the client's calls and all 200 watch streams.
  CHECK(o.channels->connectionsMade() == 1);
  // A wake() ends a wait at once, the stream intact.
  const auto t0 = Clock::now();
  watches[3]->wake();
  CHECK(watches[3]->next(Clock::now() + Millis(5'000)).empty());
  CHECK(Clock::now() - t0 < Millis(1'000));
  // That wake was answered: the next wait is for an event, even one that comes later.
  std::thread later([&] {
    std::this_thread::sleep_for(Millis(200));
    c.put({.key = p + "k3", .value = "v3"});
  });
  const auto e3 = watches[3]->next(Clock::now() + Millis(5'000));
  later.join();
  REQUIRE(e3.size() == 1);
  CHECK(e3[0].kv.value == "v3");
  // Closing watches resets their streams; the connection goes on serving.
  watches.clear();
  CHECK(c.range({.key = p + "k42"}).kvs.at(0).value == "v42");
  CHECK(o.channels->connectionsMade() == 1);
}

TEST_CASE("etcd grpc: etcd's refusal names the method and the status", "[etcd][grpc]") {
  EtcdCluster cluster(1);
  EtcdClient c(cluster.clientOptions(Millis(5'000)));
  try {
    c.leaseRevoke(12345);
    FAIL("revoked a lease that does not exist");
  } catch (const EtcdError& e) {
    CHECK(e.code() == 5);  // NotFound
    CHECK_THAT(e.what(), Catch::Contains("/etcdserverpb.Lease/LeaseRevoke refused by member 127.0.0.1:"));
    CHECK_THAT(e.what(), Catch::Contains("requested lease not found (code 5)"));
  }
  // A lease that expired is a keep-alive reply of TTL 0, not an error.
  const LeaseReply l = c.leaseGrant(5);
  c.leaseRevoke(l.id);
  CHECK(c.leaseKeepAlive(l.id).ttl == 0);
}

TEST_CASE("etcd grpc: a member that dies fails calls and watches with a clear error", "[etcd][grpc]") {
  EtcdCluster cluster(1);
  EtcdClientOptions o = cluster.clientOptions(Millis(2'000));
  const std::string member = o.endpoints.at(0).text();
  EtcdClient c(o);
  const std::string p = prefix();
  const int64_t rev = c.put({.key = p + "a", .value = "1"}).header.revision;
  EtcdWatch w(c.options(), {.key = p + "b", .startRevision = rev + 1});  // shares c's connection
  CHECK(w.next(Clock::now() + Millis(50)).empty());
  cluster.kill(0);
  const auto t0 = Clock::now();
  try {
    w.next(Clock::time_point::max());
    FAIL("the watch outlived its member");
  } catch (const NetworkError& e) {
    CHECK_THAT(e.what(), Catch::Contains("could not be re-established on any member within 2.0 s"));
    CHECK_THAT(e.what(), Catch::Contains(member));
  }
  try {
    c.range({.key = p + "a"});
    FAIL("a call succeeded on a dead member");
  } catch (const NetworkError& e) {
    CHECK_THAT(e.what(), Catch::Contains("/etcdserverpb.KV/Range failed on every member for 2.0 s"));
    CHECK_THAT(e.what(), Catch::Contains("etcd member " + member));
  }
  CHECK(Clock::now() - t0 < Millis(8'000));
}
