// The pure parsers behind the flags.
#include <catch2/catch.hpp>
#include <csignal>

#include "launcher/option_values.h"

using namespace ddprun::launcher;

TEST_CASE("integers, seconds and booleans are strict", "[launcher][values]") {
  CHECK(parseInt("12", 0, 100) == 12);
  for (const char* bad : {"", " 1", "1 ", "1.0", "0x10", "abc", "101", "-1"}) {
    INFO(bad);
    CHECK_THROWS_AS(parseInt(bad, 0, 100), BadValue);
  }
  CHECK(parseSeconds("0.5") == 0.5);
  CHECK(parseSeconds("30") == 30);
  CHECK_THROWS_AS(parseSeconds("-1"), BadValue);
  CHECK_THROWS_AS(parseSeconds("nan"), BadValue);
  CHECK_THROWS_AS(parseSeconds("5s"), BadValue);
  CHECK(parseBool("TRUE"));
  CHECK_FALSE(parseBool("0"));
  CHECK_THROWS_AS(parseBool("2"), BadValue);
}

TEST_CASE("flag --nnodes: N or MIN:MAX", "[launcher][values]") {
  CHECK(parseNodeRange("3") == std::pair{3, 3});
  CHECK(parseNodeRange("1:4") == std::pair{1, 4});
  for (const char* bad : {"0", "4:1", "1:", ":2", "a", "1:2:3"}) {
    INFO(bad);
    CHECK_THROWS_AS(parseNodeRange(bad), BadValue);
  }
}

TEST_CASE("flag --redirects/--tee: one value or per local rank", "[launcher][values]") {
  auto all = parseStreamSelection("2");
  CHECK(all.forRank(0) == kStdErr);
  CHECK(all.forRank(99) == kStdErr);
  auto per = parseStreamSelection("0:3,2:1");
  CHECK(per.forRank(0) == kStdAll);
  CHECK(per.forRank(1) == kStdNone);
  CHECK(per.forRank(2) == kStdOut);
  for (const char* bad : {"4", "x", "0:4", "a:1", "0:1,", "-1"}) {
    INFO(bad);
    CHECK_THROWS_AS(parseStreamSelection(bad), BadValue);
  }
}

TEST_CASE("rank lists, key=value lists, signal lists", "[launcher][values]") {
  CHECK(parseRankList("") == std::set<int>{});
  CHECK(parseRankList("0, 3,1") == std::set<int>{0, 1, 3});
  CHECK_THROWS_AS(parseRankList("0,x"), BadValue);
  auto kv = parseKeyValues("join_timeout=5, is_host=true");
  REQUIRE(kv.size() == 2);
  CHECK(kv[1] == std::pair<std::string, std::string>{"is_host", "true"});
  CHECK_THROWS_AS(parseKeyValues("novalue"), BadValue);
  CHECK_THROWS_AS(parseKeyValues("a=1,a=2"), BadValue);
  CHECK(parseSignalList("SIGTERM,int,15,hup") == std::vector<int>{SIGTERM, SIGINT, SIGTERM, SIGHUP});
  CHECK_THROWS_AS(parseSignalList("SIGKILL"), BadValue);
  CHECK_THROWS_AS(parseSignalList("SIGNOPE"), BadValue);
  CHECK(signalName(SIGKILL) == "SIGKILL");
  CHECK(signalName(200) == "signal 200");
}

TEST_CASE("endpoints: host[:port] and [ipv6]:port", "[launcher][values]") {
  CHECK(parseEndpoint("node1").host == "node1");
  CHECK_FALSE(parseEndpoint("node1").port);
  CHECK(parseEndpoint("node1:29400").port == 29400);
  CHECK(parseEndpoint("[::1]:5").host == "::1");
  CHECK(parseEndpoint("[::1]:5").port == 5);
  CHECK(parseEndpoint("::1").host == "::1");
  for (const char* bad : {"", ":80", "h:", "h:70000", "[::1", "[::1]x"}) {
    INFO(bad);
    CHECK_THROWS_AS(parseEndpoint(bad), BadValue);
  }
}

TEST_CASE("flag --nproc-per-node: numbers and device kinds", "[launcher][values]") {
  DeviceCounts none{.cpus = [] { return 8; }, .gpus = [] { return 0; }};
  DeviceCounts two{.cpus = [] { return 8; }, .gpus = [] { return 2; }};
  CHECK(parseNproc("4", none) == 4);
  CHECK(parseNproc("cpu", two) == 8);
  CHECK(parseNproc("auto", none) == 8);
  CHECK(parseNproc("auto", two) == 2);
  CHECK(parseNproc("gpu", two) == 2);
  CHECK_THROWS_WITH(parseNproc("gpu", none), Catch::Contains("no CUDA device"));
  CHECK_THROWS_AS(parseNproc("0", none), BadValue);
}
