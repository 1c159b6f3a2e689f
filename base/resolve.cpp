#include "base/resolve.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it (C++20)

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "base/errors.h"

namespace ddprun {

std::string SocketAddress::ip() const {
  char text[INET6_ADDRSTRLEN] = {};
  const void* addr = nullptr;
  if (family() == AF_INET) addr = &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr;
  if (family() == AF_INET6) addr = &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr;
  if (addr == nullptr || ::inet_ntop(family(), addr, text, sizeof text) == nullptr) return {};
  return text;
}

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

std::vector<SocketAddress> resolveTcp(const std::string& host, uint16_t port,
                                      ResolveOptions options) {
  namespace ip = boost::asio::ip;
  // A synchronous resolve runs getaddrinfo on this thread; the context starts no thread and
  // opens no descriptor for it.
  boost::asio::io_context io;
  ip::tcp::resolver resolver(io);
  // No address_configured (AI_ADDRCONFIG): see the header. The port is always numeric.
  auto flags = ip::resolver_base::numeric_service;
  if (options.passive) flags |= ip::resolver_base::passive;
  boost::system::error_code ec;
  const auto results = resolver.resolve(host, std::to_string(port), flags, ec);
  if (ec || results.empty()) {
    throw NetworkError("cannot resolve '" + host + "': " +
                       (ec ? ec.message() : std::string("no address")));
  }
  std::vector<SocketAddress> out;
  out.reserve(results.size());
  for (const auto& entry : results) {
    const ip::tcp::endpoint& ep = entry.endpoint();
    SocketAddress a;
    DDPRUN_CHECK(ep.size() <= sizeof a.storage, "endpoint of " << ep.size() << " bytes");
    std::memcpy(&a.storage, ep.data(), ep.size());
    a.length = static_cast<socklen_t>(ep.size());
    out.push_back(a);
  }
  return out;
}

}  // namespace ddprun
