// Slurm's hostlist syntax: ranges, zero padding, lists, several brackets, and one clear error
// naming the input for everything else.
#include <catch2/catch.hpp>

#include "base/errors.h"
#include "launcher/cluster/hostlist.h"

using ddprun::ConfigError;
using ddprun::launcher::cluster::expandHostlist;
using Names = std::vector<std::string>;

namespace {
std::string errorOf(const std::string& list) {
  try {
    expandHostlist(list);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST_CASE("hostlist: plain names and lists", "[cluster][hostlist]") {
  CHECK(expandHostlist("login1") == Names{"login1"});
  CHECK(expandHostlist("a,b,c") == Names{"a", "b", "c"});
  CHECK(expandHostlist("node-7.cluster.example") == Names{"node-7.cluster.example"});
}

TEST_CASE("hostlist: ranges and single numbers in brackets", "[cluster][hostlist]") {
  CHECK(expandHostlist("n[1-3]") == Names{"n1", "n2", "n3"});
  CHECK(expandHostlist("n[1-2,5,7-8]") == Names{"n1", "n2", "n5", "n7", "n8"});
  CHECK(expandHostlist("n[4]") == Names{"n4"});
  CHECK(expandHostlist("n[8-11]") == Names{"n8", "n9", "n10", "n11"});
  CHECK(expandHostlist("127.0.0.[2-3]") == Names{"127.0.0.2", "127.0.0.3"});
}

TEST_CASE("hostlist: zero padding follows the lower bound", "[cluster][hostlist]") {
  CHECK(expandHostlist("gpu[01-04,07],login1") ==
        Names{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"});
  CHECK(expandHostlist("n[08-11]") == Names{"n08", "n09", "n10", "n11"});
  CHECK(expandHostlist("n[001-002]") == Names{"n001", "n002"});
  CHECK(expandHostlist("n[0-1]") == Names{"n0", "n1"});
  CHECK(expandHostlist("n[098-101]") == Names{"n098", "n099", "n100", "n101"});
}

TEST_CASE("hostlist: several brackets and suffixes", "[cluster][hostlist]") {
  CHECK(expandHostlist("r[1-2]-n[1-2]") == Names{"r1-n1", "r1-n2", "r2-n1", "r2-n2"});
  CHECK(expandHostlist("n[1-2]-ib") == Names{"n1-ib", "n2-ib"});
  CHECK(expandHostlist("a[1-2],b[01-02]x,c") == Names{"a1", "a2", "b01x", "b02x", "c"});
  CHECK(expandHostlist("[1-2]") == Names{"1", "2"});
}

TEST_CASE("hostlist: bad input gets a clear error naming the input", "[cluster][hostlist]") {
  CHECK_THAT(errorOf(""), Catch::Contains("hostlist '': empty"));
  CHECK_THAT(errorOf("n[1-3"), Catch::Contains("hostlist 'n[1-3': a '[' without its ']'"));
  CHECK_THAT(errorOf("n1-3]"), Catch::Contains("a ']' without its '['"));
  CHECK_THAT(errorOf("n[[1-2]]"), Catch::Contains("brackets inside brackets"));
  CHECK_THAT(errorOf("n[3-1]"), Catch::Contains("the range '3-1' ends below its start"));
  CHECK_THAT(errorOf("n[a-b]"), Catch::Contains("'[a-b]' has 'a-b', expected N or N-M"));
  CHECK_THAT(errorOf("n[]"), Catch::Contains("expected N or N-M"));
  CHECK_THAT(errorOf("n[1,,2]"), Catch::Contains("expected N or N-M"));
  CHECK_THAT(errorOf("n[1-]"), Catch::Contains("expected N or N-M"));
  CHECK_THAT(errorOf("a,,b"), Catch::Contains("hostlist 'a,,b': an empty item"));
  CHECK_THAT(errorOf("a,"), Catch::Contains("an empty item"));
  CHECK_THAT(errorOf("a b"), Catch::Contains("a blank or control character"));
  CHECK_THAT(errorOf("n[1-99999999]"), Catch::Contains("more than 100000 names"));
  CHECK_THAT(errorOf("a[1-1000]b[1-1000]"), Catch::Contains("more than 100000 names"));
  CHECK_THAT(errorOf("n[1-2]"), Catch::Contains("<no error>"));
  // Every message says what is allowed.
  CHECK_THAT(errorOf("n[3-1]"), Catch::Contains("allowed: NAME, PREFIX[1-4,07]SUFFIX"));
}
