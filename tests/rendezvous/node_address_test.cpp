// Automatic address detection (rendezvous/node_address.h), without --local-addr and without
// root: what an agent advertises to the other nodes, and whether an endpoint names this node.
// Only local addresses are used: a UDP connect sends nothing and a bind sends nothing, so the
// one non-local address below (TEST-NET-2, RFC 5737) is never contacted.
#include <catch2/catch.hpp>

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "rendezvous/node_address.h"

using namespace ddprun::rendezvous;

namespace {

// Every IPv4 address of this machine's interfaces that are up, as getifaddrs reports them.
std::vector<std::string> localIpv4Addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char host[NI_MAXHOST] = {};
    if (::getnameinfo(a->ifa_addr, sizeof(sockaddr_in), host, sizeof host, nullptr, 0,
                      NI_NUMERICHOST) == 0)
      out.push_back(host);
  }
  ::freeifaddrs(list);
  return out;
}

std::string hostName() {
  char buf[256] = {};
  REQUIRE(::gethostname(buf, sizeof buf - 1) == 0);
  return buf;
}

}  // namespace

TEST_CASE("addressToward: the address of the interface that routes to the endpoint",
          "[node_address]") {
  SECTION("another loopback address is reached from 127.0.0.1") {
    CHECK(addressToward("127.0.0.2", 29500) == "127.0.0.1");
  }
  SECTION("an address of this machine is reached from itself") {
    for (const auto& a : localIpv4Addresses()) {
      INFO("interface address " << a);
      CHECK(addressToward(a, 29500) == a);
    }
  }
  SECTION("a name that does not resolve falls back to the host name") {
    CHECK(addressToward("no-such-host.invalid", 29500) == hostName());
  }
}

TEST_CASE("endpointIsThisNode without --local-addr: any address of this machine",
          "[node_address]") {
  CHECK(endpointIsThisNode("localhost", ""));
  CHECK(endpointIsThisNode(hostName(), ""));
  CHECK(endpointIsThisNode("127.0.0.1", ""));
  CHECK(endpointIsThisNode("127.0.0.3", ""));  // all of 127/8 is local on Linux
  for (const auto& a : localIpv4Addresses()) {
    INFO("interface address " << a);
    CHECK(endpointIsThisNode(a, ""));
  }
  // Not an address of this machine (the bind fails; nothing is sent).
  CHECK_FALSE(endpointIsThisNode("198.51.100.7", ""));
  CHECK_FALSE(endpointIsThisNode("no-such-host.invalid", ""));
}

TEST_CASE("endpointIsThisNode with --local-addr: only that address counts", "[node_address]") {
  // Several "nodes" share this machine on loopback aliases: node .2 must not take .3's
  // endpoint for its own, although .3 is an address of this machine too.
  CHECK(endpointIsThisNode("127.0.0.2", "127.0.0.2"));
  CHECK_FALSE(endpointIsThisNode("127.0.0.3", "127.0.0.2"));
  CHECK_FALSE(endpointIsThisNode("localhost", "127.0.0.2"));
  CHECK(endpointIsThisNode("localhost", "127.0.0.1"));  // resolves to the same address
}

TEST_CASE("pickFreePort: a port nobody listens on", "[node_address]") {
  const uint16_t port = pickFreePort();
  REQUIRE(port > 0);
  // Free on the wildcard address: a listener can take it there.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  CHECK(::listen(fd, 1) == 0);
  ::close(fd);
}
