// resolveTcp against the system resolver: IP literals of both families, localhost, the port in
// every address, and a name that cannot exist (RFC 6761's .invalid) as a typed error naming it.
#include "base/resolve.h"

#include <netinet/in.h>

#include <catch2/catch.hpp>
#include <string>

#include "base/errors.h"

namespace {

using ddprun::resolveTcp;
using ddprun::SocketAddress;

bool isLoopback(const SocketAddress& a) {
  return a.ip() == "::1" || a.ip().rfind("127.", 0) == 0;
}

}  // namespace

TEST_CASE("resolveTcp: an IPv4 literal is that address with the port", "[resolve]") {
  const auto all = resolveTcp("127.0.0.1", 29500);
  REQUIRE(all.size() == 1);
  CHECK(all[0].family() == AF_INET);
  CHECK(all[0].length == sizeof(sockaddr_in));
  CHECK(all[0].ip() == "127.0.0.1");
  CHECK(all[0].port() == 29500);
  CHECK(all[0].get()->sa_family == AF_INET);
}

TEST_CASE("resolveTcp: an IPv6 literal is that address with the port", "[resolve]") {
  const auto all = resolveTcp("::1", 65535);
  REQUIRE(all.size() == 1);
  CHECK(all[0].family() == AF_INET6);
  CHECK(all[0].length == sizeof(sockaddr_in6));
  CHECK(all[0].ip() == "::1");
  CHECK(all[0].port() == 65535);
}

TEST_CASE("resolveTcp: localhost is loopback only and every address has the port",
          "[resolve]") {
  const auto all = resolveTcp("localhost", 4242);
  REQUIRE_FALSE(all.empty());
  for (const auto& a : all) {
    INFO("address " << a.ip());
    CHECK(isLoopback(a));
    CHECK(a.port() == 4242);
  }
}

TEST_CASE("resolveTcp: no port is port 0 and passive with no host is the wildcard",
          "[resolve]") {
  CHECK(resolveTcp("127.0.0.2").at(0).port() == 0);
  const auto any = resolveTcp("", 0, {.passive = true});
  REQUIRE_FALSE(any.empty());
  for (const auto& a : any) {
    INFO("address " << a.ip());
    CHECK((a.ip() == "0.0.0.0" || a.ip() == "::"));
  }
  // Not passive, no host: loopback (getaddrinfo's rule for a client).
  for (const auto& a : resolveTcp("", 0)) CHECK(isLoopback(a));
}

TEST_CASE("resolveTcp: a name that does not resolve is a NetworkError naming it",
          "[resolve]") {
  CHECK_THROWS_AS(resolveTcp("no-such-host.invalid", 80), ddprun::NetworkError);
  CHECK_THROWS_WITH(resolveTcp("no-such-host.invalid", 80),
                    Catch::StartsWith("cannot resolve 'no-such-host.invalid': ") &&
                        !Catch::EndsWith(": "));
  // Not an address of either family, nor a name.
  CHECK_THROWS_WITH(resolveTcp("300.1.2.3.4", 80), Catch::Contains("'300.1.2.3.4'"));
}
