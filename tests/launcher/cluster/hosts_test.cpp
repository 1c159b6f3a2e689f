// Host lists of an ssh launch: --hosts h1:2,h2:2 and hostfiles ("host slots=N", # comments).
#include <catch2/catch.hpp>

#include "base/errors.h"
#include "launcher/cluster/hosts.h"

using namespace ddprun;
using namespace ddprun::launcher::cluster;

namespace {
template <typename Fn>
std::string errorOf(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST_CASE("hosts: --hosts with and without slots", "[cluster][hosts]") {
  auto h = parseHosts("h1:2,user@h2:4,h3,[fd00::1]:8,[fd00::2],10.0.0.5:1");
  REQUIRE(h.size() == 6);
  CHECK(h[0].host == "h1");
  CHECK(h[0].slots == 2);
  CHECK(h[1].host == "user@h2");
  CHECK(h[1].slots == 4);
  CHECK(h[2].host == "h3");
  CHECK_FALSE(h[2].slots);
  CHECK(h[3].host == "[fd00::1]");
  CHECK(h[3].slots == 8);
  CHECK(h[4].host == "[fd00::2]");
  CHECK_FALSE(h[4].slots);
  CHECK(h[5].host == "10.0.0.5");
  CHECK(hostAddress("user@h2") == "h2");
  CHECK(hostAddress("[fd00::1]") == "fd00::1");
  CHECK(hostAddress("h1") == "h1");
}

TEST_CASE("hosts: bad --hosts values are named", "[cluster][hosts]") {
  CHECK_THAT(errorOf([] { parseHosts("h1:2,,h2"); }),
             Catch::Contains("--hosts=h1:2,,h2: '' is empty"));
  CHECK_THAT(errorOf([] { parseHosts("h1:two"); }),
             Catch::Contains("'h1:two' has slots that are not a number in 1..65536"));
  CHECK_THAT(errorOf([] { parseHosts("h1:0"); }), Catch::Contains("not a number in 1..65536"));
  CHECK_THAT(errorOf([] { parseHosts("fd00::1:2"); }),
             Catch::Contains("an IPv6 address without brackets"));
  CHECK_THAT(errorOf([] { parseHosts("-oProxyCommand=x"); }),
             Catch::Contains("is not a host name or address"));
  CHECK_THAT(errorOf([] { parseHosts("h1;rm"); }), Catch::Contains("is not a host name"));
  CHECK_THAT(errorOf([] { parseHosts("h1:2,h1:2"); }),
             Catch::Contains("host 'h1' is listed twice"));
}

TEST_CASE("hosts: hostfiles as DeepSpeed and Open MPI write them", "[cluster][hosts]") {
  auto h = parseHostfile(
      "# the job's hosts\n"
      "worker-1 slots=4\n"
      "\n"
      "   worker-2   slots=8   max_slots=8  # trailing comment\n"
      "worker-3\n",
      "hosts.txt");
  REQUIRE(h.size() == 3);
  CHECK(h[0].host == "worker-1");
  CHECK(h[0].slots == 4);
  CHECK(h[1].host == "worker-2");
  CHECK(h[1].slots == 8);
  CHECK_FALSE(h[2].slots);
  CHECK_THAT(errorOf([] { parseHostfile("a slots=1\nb slots=x\n", "f"); }),
             Catch::Contains("--hostfile f:2: 'slots=x': expected slots=N"));
  CHECK_THAT(errorOf([] { parseHostfile("a cpus=3\n", "f"); }),
             Catch::Contains("--hostfile f:1: unexpected 'cpus=3'"));
  CHECK_THAT(errorOf([] { parseHostfile("# nothing\n\n", "f"); }),
             Catch::Contains("--hostfile f: names no host"));
  CHECK_THAT(errorOf([] { readHostfile("/nonexistent/hosts"); }),
             Catch::Contains("--hostfile /nonexistent/hosts: cannot read it"));
}
