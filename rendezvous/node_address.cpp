#include "rendezvous/node_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "base/errors.h"
#include "base/resolve.h"
#include "base/unique_fd.h"

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

// The addresses `host` resolves to, each with `port` (empty when it does not resolve).
std::vector<SocketAddress> resolveAll(const std::string& host, uint16_t port = 0) {
  try {
    return resolveTcp(host, port);
  } catch (const NetworkError&) {
    return {};
  }
}

}  // namespace

std::string addressToward(const std::string& host, uint16_t port) {
  for (const auto& to : resolveAll(host, port)) {
    const UniqueFd fd(::socket(to.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd.get(), to.get(), to.length) == 0 &&
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      std::string out = numeric(reinterpret_cast<sockaddr*>(&local), len);
      if (!out.empty()) return out;
    }
  }
  return hostName();
}

uint16_t pickFreePort() {
  const UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw NetworkError(std::string("cannot create a socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw NetworkError(std::string("cannot find a free port: ") + std::strerror(errno));
  }
  return ntohs(a.sin_port);
}

bool endpointIsThisNode(const std::string& endpointHost, const std::string& localAddr) {
  const auto endpoint = resolveAll(endpointHost);
  if (!localAddr.empty()) {
    if (endpointHost == localAddr) return true;
    const auto local = resolveAll(localAddr);
    for (const auto& e : endpoint)
      for (const auto& l : local)
        if (numeric(e.get(), e.length) == numeric(l.get(), l.length)) return true;
    return false;
  }
  if (endpointHost == "localhost" || endpointHost == hostName()) return true;
  for (const auto& e : endpoint) {  // port 0: binding it succeeds where the address is ours
    const UniqueFd fd(::socket(e.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd && ::bind(fd.get(), e.get(), e.length) == 0) return true;
  }
  return false;
}

}  // namespace ddprun::rendezvous
