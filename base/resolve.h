#pragma once
// Name resolution for every layer: a host name or IP literal to the TCP addresses it stands
// for, through the system resolver (getaddrinfo(3), by way of Boost.Asio's resolver) -- one
// place for what every call site used to do by hand with getaddrinfo and freeaddrinfo. No Boost
// in this header: the addresses are plain sockaddr storage that bind, connect and getnameinfo
// take directly.
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun {

// One resolved TCP address (IPv4 or IPv6) with its port.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  // The address as inet_ntop(3) writes it, without port or scope: "127.0.0.1", "::1".
  std::string ip() const;
  uint16_t port() const;
};

struct ResolveOptions {
  // For bind(2) (AI_PASSIVE): an empty host means every interface instead of loopback.
  bool passive = false;
};

// The TCP addresses `host` resolves to, each with `port`, in the order getaddrinfo(3) gives
// them for AF_UNSPEC and SOCK_STREAM; never empty. No AI_ADDRCONFIG: "::1" and "localhost"
// resolve on a machine whose only IPv6 address is loopback, as they did with the hand-written
// calls this replaces. Blocks for as long as the system resolver takes (DNS included).
// Throws NetworkError "cannot resolve 'HOST': <the resolver's message>" when it does not
// resolve -- a name that does not exist and a DNS server that does not answer look alike, so a
// caller that retries may retry this; a caller for whom the host is user input rethrows it as
// ConfigError with its context.
std::vector<SocketAddress> resolveTcp(const std::string& host, uint16_t port = 0,
                                      ResolveOptions options = {});

}  // namespace ddprun
