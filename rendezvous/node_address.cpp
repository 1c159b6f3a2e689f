#include "rendezvous/node_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "base/errors.h"

namespace ddprun::rendezvous {

namespace {

std::string hostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

std::string numeric(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(sa, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return {};
  return host;
}

// The numeric addresses `host` resolves to (empty when it does not resolve).
std::vector<sockaddr_storage> resolveAll(const std::string& host, std::vector<socklen_t>& lens) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  std::vector<sockaddr_storage> out;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) return out;
  for (addrinfo* a = list; a; a = a->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, a->ai_addr, a->ai_addrlen);
    out.push_back(ss);
    lens.push_back(a->ai_addrlen);
  }
  ::freeaddrinfo(list);
  return out;
}

}  // namespace

std::string addressToward(const std::string& host, uint16_t port) {
  std::vector<socklen_t> lens;
  auto addrs = resolveAll(host, lens);
  for (size_t i = 0; i < addrs.size(); ++i) {
    auto* sa = reinterpret_cast<sockaddr*>(&addrs[i]);
    if (sa->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(sa)->sin_port = htons(port);
    if (sa->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(sa)->sin6_port = htons(port);
    int fd = ::socket(sa->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    std::string out;
    if (::connect(fd, sa, lens[i]) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      out = numeric(reinterpret_cast<sockaddr*>(&local), len);
    }
    ::close(fd);
    if (!out.empty()) return out;
  }
  return hostName();
}

uint16_t pickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw NetworkError(std::string("cannot create a socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int err = errno;
    ::close(fd);
    throw NetworkError(std::string("cannot find a free port: ") + std::strerror(err));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

bool endpointIsThisNode(const std::string& endpointHost, const std::string& localAddr) {
  std::vector<socklen_t> lens;
  auto endpoint = resolveAll(endpointHost, lens);
  if (!localAddr.empty()) {
    if (endpointHost == localAddr) return true;
    std::vector<socklen_t> localLens;
    auto local = resolveAll(localAddr, localLens);
    for (size_t i = 0; i < endpoint.size(); ++i)
      for (size_t j = 0; j < local.size(); ++j)
        if (numeric(reinterpret_cast<sockaddr*>(&endpoint[i]), lens[i]) ==
            numeric(reinterpret_cast<sockaddr*>(&local[j]), localLens[j]))
          return true;
    return false;
  }
  if (endpointHost == "localhost" || endpointHost == hostName()) return true;
  for (size_t i = 0; i < endpoint.size(); ++i) {
    auto* sa = reinterpret_cast<sockaddr*>(&endpoint[i]);
    int fd = ::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (sa->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(sa)->sin_port = 0;
    if (sa->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(sa)->sin6_port = 0;
    const bool local = ::bind(fd, sa, lens[i]) == 0;
    ::close(fd);
    if (local) return true;
  }
  return false;
}

}  // namespace ddprun::rendezvous
