// --rdzv-backend=etcd-v3 options -> the rendezvous backend: what is accepted, what is refused
// (each with one message naming the key or flag and what to do). No etcd is contacted here.
#include <catch2/catch.hpp>

#include "base/errors.h"
#include "launcher/multinode_rendezvous.h"
#include "launcher/options.h"

using namespace ddprun;
using namespace ddprun::launcher;

namespace {

LaunchOptions etcdJob(std::string endpoint, std::vector<std::pair<std::string, std::string>> conf) {
  LaunchOptions o;
  o.rdzvBackend = "etcd-v3";
  o.rdzvEndpoint = std::move(endpoint);
  o.rdzvId = "job";
  o.minNodes = 1;
  o.maxNodes = 4;
  o.localAddr = "127.0.0.2";
  o.rdzvConf = std::move(conf);
  return o;
}

std::string error(const LaunchOptions& o) {
  bool host = false;
  try {
    multiNodeOptions(o, host);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("etcd-v3: every member, defaults, no agent hosts the rendezvous", "[launcher][etcd]") {
  bool host = true;
  auto r = multiNodeOptions(etcdJob("127.0.0.1:2379,127.0.0.1:22379,node3", {}), host);
  CHECK_FALSE(host);
  REQUIRE(r.backend);
  CHECK(r.backend->name() == "etcd-v3");
  CHECK(r.backend->describe() == "etcd at http://127.0.0.1:2379,127.0.0.1:22379,node3:2379");
  auto tls = multiNodeOptions(
      etcdJob("10.0.0.1:2379", {{"protocol", "https"}, {"lease_ttl", "3"}, {"key_prefix", "/x"}}),
      host);
  CHECK(tls.backend->describe() == "etcd at https://10.0.0.1:2379");
}

TEST_CASE("etcd-v3: refused settings name the key and what to do", "[launcher][etcd]") {
  CHECK_THAT(error(etcdJob("", {})), Catch::Contains("needs --rdzv-endpoint=HOST:PORT"));
  CHECK_THAT(error(etcdJob("h:1", {{"heartbeat", "1"}})), Catch::Contains("lease_ttl"));
  CHECK_THAT(error(etcdJob("h:1", {{"is_host", "true"}})), Catch::Contains("is_host does not apply"));
  CHECK_THAT(error(etcdJob("h:1", {{"cacert", "/ca.pem"}})), Catch::Contains("add protocol=https"));
  CHECK_THAT(error(etcdJob("h:1", {{"protocol", "https"}, {"cacert", "/no/such/ca.pem"}})),
             Catch::Contains("cacert='/no/such/ca.pem'") && Catch::Contains("cannot read"));
  CHECK_THAT(error(etcdJob("h:1", {{"protocol", "https"}, {"cert", "/c.pem"}})),
             Catch::Contains("cert and key go together"));
  CHECK_THAT(error(etcdJob("h:1", {{"lease_ttl", "0.5"}})), Catch::Contains("lease_ttl=0.5 s"));
  CHECK_THAT(error(etcdJob("h:1", {{"key_prefix", "/"}})), Catch::Contains("key_prefix='/'"));
  LaunchOptions c10d = etcdJob("h:29400", {{"lease_ttl", "5"}});
  c10d.rdzvBackend = "c10d";
  CHECK_THAT(error(c10d), Catch::Contains("for --rdzv-backend=etcd-v3") && Catch::Contains("c10d"));
}

// Issue 20: node ranks in arrival order are the default of both dynamic backends (every agent's
// store work per round O(1) on the ddprun store); rank_order=stable is the opt-in for node ranks
// kept from the round before.
TEST_CASE("rank_order: arrival by default on c10d and etcd-v3, stable when asked",
          "[launcher][etcd]") {
  bool host = false;
  CHECK(multiNodeOptions(etcdJob("127.0.0.1:2379", {}), host).arrivalRanks);
  CHECK_FALSE(
      multiNodeOptions(etcdJob("127.0.0.1:2379", {{"rank_order", "stable"}}), host).arrivalRanks);
  LaunchOptions c10d = etcdJob("127.0.0.2:29400", {});
  c10d.rdzvBackend = "c10d";
  CHECK(multiNodeOptions(c10d, host).arrivalRanks);
  c10d.rdzvConf = {{"rank_order", "stable"}};
  CHECK_FALSE(multiNodeOptions(c10d, host).arrivalRanks);
  c10d.rdzvConf = {{"rank_order", "newest"}};
  CHECK_THAT(error(c10d), Catch::Contains("rank_order='newest'") && Catch::Contains("stable, arrival"));
}
