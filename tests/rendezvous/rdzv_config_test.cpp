// Values of --nnodes, --rdzv-endpoint and --rdzv-conf: accepted forms and the messages for bad ones.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <random>

#include "rendezvous/rendezvous_config.h"

using namespace ddprun;
using namespace ddprun::rendezvous;

TEST_CASE("nnodes values: N or MIN:MAX", "[rdzv][config]") {
  CHECK(parseNnodes("2").minNodes == 2);
  CHECK(parseNnodes("2").maxNodes == 2);
  CHECK(parseNnodes("1:3").minNodes == 1);
  CHECK(parseNnodes("1:3").maxNodes == 3);
  for (const char* bad : {"", "0", "3:1", "a", "1:", ":2", "1:2:3", "-1", "1.5"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parseNnodes(bad), Catch::Contains("--nnodes='" + std::string(bad) + "'") &&
                                            Catch::Contains("MIN:MAX"));
  }
}

TEST_CASE("rdzv-endpoint values: HOST[:PORT] and bracketed IPv6", "[rdzv][config]") {
  CHECK(parseEndpoint("node1").host == "node1");
  CHECK(parseEndpoint("node1").port == 29400);
  CHECK(parseEndpoint("10.1.2.3:1234").port == 1234);
  CHECK(parseEndpoint("[::1]").host == "::1");
  CHECK(parseEndpoint("[::1]:5000").port == 5000);
  for (const char* bad : {"", ":80", "h:", "h:0", "h:70000", "h:x", "::1", "[::1", "[::1]x"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parseEndpoint(bad), Catch::Contains("--rdzv-endpoint='" + std::string(bad)));
  }
}

// parseSecondsValue rounds as std::llround did (ddprun no longer links libm for it): halves up,
// and values just below a half down, over the whole range it accepts.
TEST_CASE("rdzv-conf seconds round to the nearest millisecond as llround does",
          "[rdzv][config]") {
  CHECK(parseSecondsValue("0.5")->count() == 500);
  CHECK(parseSecondsValue("0.0005")->count() == 1);   // a half (a hair above, in binary)
  CHECK(parseSecondsValue("0.0004999")->count() == 0);
  CHECK(parseSecondsValue("0.00049999999999999994")->count() == 0);  // + 0.5 would round up
  CHECK(parseSecondsValue("999999999.9995")->count() == std::llround(999999999.9995 * 1000));
  CHECK_FALSE(parseSecondsValue("1e9"));
  CHECK_FALSE(parseSecondsValue("-0.5"));
  CHECK_FALSE(parseSecondsValue("nan"));
  CHECK_FALSE(parseSecondsValue("0.5s"));
  std::mt19937_64 rng(20);
  std::uniform_real_distribution<double> any(0, 1e9), small(0, 10);
  char text[64];
  for (int i = 0; i < 100'000; ++i) {
    const double s = i % 2 ? any(rng) : small(rng);
    std::snprintf(text, sizeof text, "%.17g", s);
    const double parsed = std::stod(text);
    INFO(text);
    REQUIRE(parseSecondsValue(text)->count() == std::llround(parsed * 1000));
    // and the halves: k + 0.5 ms exactly
    std::snprintf(text, sizeof text, "%.17g", (std::floor(s * 1000) + 0.5) / 1000);
    REQUIRE(parseSecondsValue(text)->count() == std::llround(std::stod(text) * 1000));
  }
}

TEST_CASE("rdzv-conf values: torchrun keys, in seconds", "[rdzv][config]") {
  auto c = parseRdzvConf("join_timeout=5,last_call_timeout=0.5,keep_alive_interval=0.2,"
                         "keep_alive_max_attempt=4,read_timeout=7,is_host=true,close_timeout=1");
  CHECK(c.joinTimeout == Millis(5000));
  CHECK(c.lastCallTimeout == Millis(500));
  CHECK(c.heartbeatInterval == Millis(200));
  CHECK(c.missedHeartbeats == 4);
  CHECK(c.isHost == true);
  DynamicRendezvousOptions o;
  applyRdzvConf(c, o);
  CHECK(o.joinTimeout == Millis(5000));
  CHECK(o.heartbeat.timeout() == Millis(800));
  CHECK(o.store.timeout == Millis(7000));
  CHECK(o.closeTimeout == Millis(1000));
  CHECK(o.isHost);
  CHECK(parseRdzvConf("").joinTimeout == std::nullopt);
  CHECK(parseRdzvConf("heartbeat=1,missed_heartbeats=2").missedHeartbeats == 2);

  CHECK_THROWS_WITH(parseRdzvConf("join_timeout=soon"),
                    Catch::Contains("join_timeout='soon'") && Catch::Contains("seconds"));
  CHECK_THROWS_WITH(parseRdzvConf("colour=blue"),
                    Catch::Contains("key 'colour' is unknown") && Catch::Contains("join_timeout"));
  CHECK_THROWS_WITH(parseRdzvConf("is_host=maybe"), Catch::Contains("is_host='maybe'"));
  CHECK_THROWS_WITH(parseRdzvConf("missed_heartbeats=0"), Catch::Contains(">= 1"));
  CHECK_THROWS_WITH(parseRdzvConf("novalue"), Catch::Contains("key=value"));
  // rank_order: arrival (the default: every agent's store work per round is O(1)) or stable
  // (node ranks kept from the round before) (DynamicRendezvousOptions::arrivalRanks).
  DynamicRendezvousOptions ro;
  CHECK(ro.arrivalRanks);
  applyRdzvConf(parseRdzvConf("heartbeat=1"), ro);  // a conf without rank_order keeps it
  CHECK(ro.arrivalRanks);
  applyRdzvConf(parseRdzvConf("rank_order=stable"), ro);
  CHECK_FALSE(ro.arrivalRanks);
  applyRdzvConf(parseRdzvConf("rank_order=arrival"), ro);
  CHECK(ro.arrivalRanks);
  CHECK_THROWS_WITH(parseRdzvConf("rank_order=random"),
                    Catch::Contains("rank_order='random'") && Catch::Contains("stable, arrival"));
}

TEST_CASE("rdzv-conf for etcd-v3: key_prefix, lease_ttl, protocol, TLS files", "[rdzv][config]") {
  auto c = parseRdzvConf("key_prefix=/team/a,lease_ttl=7,protocol=https,cacert=/ca.pem,"
                         "cert=/c.pem,key=/k.pem");
  CHECK(c.keyPrefix == "/team/a");
  CHECK(c.leaseTtl == Millis(7000));
  CHECK(c.protocol == "https");
  CHECK(c.cacert == "/ca.pem");
  CHECK(c.cert == "/c.pem");
  CHECK(c.key == "/k.pem");
  CHECK(c.hasEtcdKeys());
  CHECK_FALSE(parseRdzvConf("join_timeout=5").hasEtcdKeys());
  CHECK_THROWS_WITH(parseRdzvConf("protocol=ftp"),
                    Catch::Contains("protocol='ftp'") && Catch::Contains("http, https"));
  CHECK_THROWS_WITH(parseRdzvConf("lease_ttl=soon"), Catch::Contains("lease_ttl='soon'"));
  CHECK_THROWS_WITH(parseRdzvConf("key_prefix="), Catch::Contains("key_prefix=''"));
  CHECK_THROWS_WITH(parseRdzvConf("cacert="), Catch::Contains("cacert=''"));
}

TEST_CASE("rdzv-endpoint lists: every member of an etcd cluster", "[rdzv][config]") {
  auto eps = parseEndpoints("10.0.0.1,10.0.0.2:22379,[::1]:2380", 2379);
  REQUIRE(eps.size() == 3);
  CHECK(eps[0].host == "10.0.0.1");
  CHECK(eps[0].port == 2379);
  CHECK(eps[1].port == 22379);
  CHECK(eps[2].host == "::1");
  CHECK_THROWS_WITH(parseEndpoints("h1,,h2", 2379), Catch::Contains("empty host"));
  CHECK_THROWS_AS(parseEndpoints("", 2379), ddprun::ConfigError);
}

TEST_CASE("rdzv-conf store_* keys set the hosted store's limits", "[rdzv][config]") {
  const auto conf = parseRdzvConf(
      "store_max_connections=100,store_max_stored_bytes=64M,store_frame_timeout=2.5,"
      "store_idle_timeout=0,join_timeout=5");
  const ServerLimits l = storeLimitsFrom(conf);
  CHECK(l.maxConnections == 100);
  CHECK(l.maxStoredBytes == 64ull << 20);
  CHECK(l.frameTimeout == std::chrono::milliseconds(2500));
  CHECK(l.idleTimeout == std::chrono::milliseconds(0));
  CHECK(l.maxWaiters == ServerLimits{}.maxWaiters);  // the others keep their defaults
  CHECK_THROWS_WITH(parseRdzvConf("store_max_keys=many"),
                    Catch::Contains("--rdzv-conf store_max_keys='many' is not valid") &&
                        Catch::Contains("K, M or G suffix"));
  CHECK_THROWS_WITH(parseRdzvConf("store_max_connections=0"), Catch::Contains("1 or more"));
  CHECK_THROWS_WITH(parseRdzvConf("store_frame_timeout=-1"),
                    Catch::Contains("store_frame_timeout='-1' is not valid"));
  CHECK_THROWS_WITH(parseRdzvConf("store_max_everything=1"),
                    Catch::Contains("store_max_everything is not a store limit") &&
                        Catch::Contains("max_connections"));
}
