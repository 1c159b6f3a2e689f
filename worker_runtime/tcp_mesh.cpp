#include "worker_runtime/tcp_mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "base/errors.h"
#include "base/log.h"
#include "base/resolve.h"
#include "base/unique_fd.h"
#include "rendezvous/auth.h"

namespace ddprun::runtime {
namespace {

using Clock = TcpMesh::Clock;

int remainingMs(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(ms.count(), 0, 1 << 30));
}

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Blocking-style exact I/O on a non-blocking socket during set-up, bounded by the deadline.
void exchange(int fd, void* buf, size_t n, bool write, Clock::time_point deadline,
              const std::string& who) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) throw NetworkError("mesh set-up: " + who + " closed the connection");
    if (errno != EAGAIN && errno != EINTR) {
      throw NetworkError("mesh set-up with " + who + ": " + std::strerror(errno));
    }
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    if (::poll(&pfd, 1, remainingMs(deadline)) == 0) {
      throw TimeoutError("mesh set-up: no answer from " + who);
    }
  }
}

// The wire protocol of set-up (declared once here; docs/protocol.md "Allreduce mesh").
// A connecting rank q sends a Hello: magic (kHello without a job token, kHelloAuth with one),
// its rank, the id the accepting rank p published for this mesh, and a fresh nonce (zeros
// without a token). Without a token p accepts a hello that is right. With one, p answers a
// right hello with a Challenge -- its own fresh nonce and its proof -- and q, once that proof
// checks, sends its own proof; p accepts q only then. Proofs are HMACs under the mesh secret
// (meshSecret()) over the direction, the mesh's store prefix, both ranks and both nonces, so
// each is fresh, bound to this pair of ranks, and cannot be reflected as the other side's.
using MeshId = std::array<uint8_t, 16>;
using Nonce = std::array<uint8_t, rendezvous::auth::kNonceBytes>;
using Proof = std::array<uint8_t, 32>;  // HMAC-SHA256
constexpr uint32_t kHello = 0xDD9A11ED;
constexpr uint32_t kHelloAuth = 0xDD9A11EE;
struct Hello {
  uint32_t magic;
  uint32_t rank;
  MeshId id;
  Nonce nonce;
};
static_assert(sizeof(Hello) == 56);
struct Challenge {
  Nonce nonce;
  Proof proof;
};
static_assert(sizeof(Challenge) == 64);

// Connections accepted during set-up not yet accepted as a rank; more are not held.
constexpr size_t kMaxPendingHellos = 64;
struct Pending {
  int fd = -1;
  std::string peer;  // "127.0.0.1:40112", for logs
  char bytes[sizeof(Hello)] = {};
  size_t have = 0;
  size_t want = sizeof(Hello);  // then sizeof(Proof) once challenged
  Hello hello{};                // once complete
  Nonce myNonce{};              // sent in the challenge
};

std::string_view view(const auto& a) {
  return {reinterpret_cast<const char*>(a.data()), a.size()};
}

Nonce randomNonce() {
  Nonce n{};
  const std::string r = rendezvous::auth::randomNonce();
  std::memcpy(n.data(), r.data(), n.size());
  return n;
}

// The proof of `from` to `to` on the mesh under `prefix` (see above). Pure.
Proof meshProof(const std::string& secret, bool byAccepter, const std::string& prefix, int from,
                int to, const Nonce& connectorNonce, const Nonce& accepterNonce) {
  const std::string f = std::to_string(from), t = std::to_string(to);
  const std::string mac = rendezvous::auth::hmac(
      secret, {"ddprun-mesh-v1", byAccepter ? "accepter->connector" : "connector->accepter",
               prefix, f, t, view(connectorNonce), view(accepterNonce)});
  Proof p{};
  std::memcpy(p.data(), mac.data(), p.size());
  return p;
}

// Why a complete hello is not acceptable on the mesh of `rank` of `size` (empty: it is).
// Pure; `taken(q)` says whether rank q is connected already.
std::string checkHello(const Hello& h, int rank, int size, const MeshId& myId, bool withToken,
                       const std::function<bool(int)>& taken) {
  const int q = static_cast<int>(h.rank);
  if (h.magic != kHello && h.magic != kHelloAuth) return "sent no mesh hello";
  if (h.magic == kHello && withToken) return "sent a hello without this job's token";
  if (h.magic == kHelloAuth && !withToken) {
    return "sent a hello for a job with a token (this rank has none: DDPRUN_STORE_TOKEN_FILE)";
  }
  if (h.rank <= static_cast<uint32_t>(rank) || h.rank >= static_cast<uint32_t>(size)) {
    return "claimed rank " + std::to_string(h.rank) + ", not a higher rank of " +
           std::to_string(size);
  }
  if (!rendezvous::auth::constantTimeEquals(view(h.id), view(myId))) {
    return "claimed rank " + std::to_string(q) + " without this attempt's id";
  }
  if (taken(q)) return "claimed rank " + std::to_string(q) + ", which is connected already";
  return {};
}

MeshId randomMeshId() {
  MeshId id{};
  std::random_device rd;  // /dev/urandom
  for (size_t i = 0; i < id.size(); i += 4) {
    const uint32_t v = rd();
    std::memcpy(id.data() + i, &v, 4);
  }
  return id;
}

std::string toHex(const MeshId& id) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : id) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

bool fromHex(const std::string& text, MeshId& id) {
  if (text.size() != 2 * id.size()) return false;
  auto nibble = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  for (size_t i = 0; i < id.size(); ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    id[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

// A port as a rank publishes it: decimal, 1..65535.
bool parsePort(const std::string& text, uint16_t& port) {
  const char* end = text.data() + text.size();
  const auto [last, ec] = std::from_chars(text.data(), end, port);
  return ec == std::errc() && last == end && port != 0;
}

std::string describePeer(const sockaddr_storage& from) {
  char text[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (from.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&from);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    port = ntohs(a->sin_port);
  } else if (from.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&from);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    port = ntohs(a->sin6_port);
  }
  return std::string(text) + ":" + std::to_string(port);
}

// A connected, non-blocking socket to host:port, or NetworkError/TimeoutError. The connect
// itself is non-blocking and bounded by the deadline (a black-holed address cannot hold it);
// refusals are retried until then (the peer listens before it publishes, so they are rare).
int connectBefore(const std::string& host, uint16_t port, Clock::time_point deadline,
                  const std::string& who) {
  SocketAddress to;
  try {
    to = resolveTcp(host, port).front();
  } catch (const NetworkError& e) {
    throw NetworkError("mesh: " + who + ": " + e.what());
  }
  int lastErr = ETIMEDOUT;
  while (true) {
    UniqueFd fd(::socket(to.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) throw NetworkError(std::string("mesh: socket failed: ") + std::strerror(errno));
    int err = ::connect(fd.get(), to.get(), to.length) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd pfd{fd.get(), POLLOUT, 0};
      int n;
      while ((n = ::poll(&pfd, 1, remainingMs(deadline))) < 0 && errno == EINTR) {
      }
      socklen_t len = sizeof err;
      if (n == 0) {
        err = ETIMEDOUT;
      } else if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = errno;
      }
    }
    if (err == 0) return fd.release();
    lastErr = err;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw NetworkError("mesh: cannot connect to " + who + " at " + host + ":" +
                     std::to_string(port) + ": " + std::strerror(lastErr));
}

}  // namespace

std::string meshSecret(std::string_view token, std::string_view runId, int attempt) {
  if (token.empty()) return {};
  return rendezvous::auth::hmac(token, {"ddprun-mesh-secret-v1", runId, std::to_string(attempt)});
}

TcpMesh::TcpMesh(rendezvous::Store& store, const std::string& prefix, int rank, int size,
                 const std::string& host, std::chrono::milliseconds timeout,
                 const std::string& secret)
    : rank_(rank), size_(size), peers_(size) {
  const auto deadline = Clock::now() + timeout;
  // Listen on a free port of `host`.
  SocketAddress local;
  try {
    local = resolveTcp(host, 0, {.passive = true}).front();
  } catch (const NetworkError& e) {  // this rank's own address: its configuration
    throw ConfigError("mesh: this rank's address: " + std::string(e.what()));
  }
  const UniqueFd listener(::socket(local.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener) throw NetworkError(std::string("mesh: socket failed: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listener.get(), local.get(), local.length) != 0 ||
      ::listen(listener.get(), size + kMaxPendingHellos) != 0) {
    throw NetworkError("mesh: cannot listen on " + host + ": " + std::strerror(errno));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  const uint16_t port = ntohs(bound.ss_family == AF_INET6
                                  ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                  : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  // This attempt's id of this rank: whoever connects must present it (read from the store).
  const MeshId myId = randomMeshId();
  store.set(prefix + "/" + std::to_string(rank),
            host + " " + std::to_string(port) + " " + toHex(myId));
  setNonBlocking(listener.get());
  std::vector<Pending> pending;  // accepted connections whose hello is not complete
  auto closePending = [&] {
    for (auto& c : pending) ::close(c.fd);
    pending.clear();
  };
  try {
    // Connect to every lower rank; announce who we are and present its id.
    for (int q = 0; q < rank; ++q) {
      const std::string who = "rank " + std::to_string(q);
      std::istringstream addr(store.get(prefix + "/" + std::to_string(q)));
      std::string qhost, qportText, qid;
      addr >> qhost >> qportText >> qid;
      MeshId id{};
      uint16_t qport = 0;
      if (!fromHex(qid, id) || !parsePort(qportText, qport)) {
        throw NetworkError("mesh: " + who + " published no valid port and id under " + prefix +
                           "/" + std::to_string(q) + " (a ddprun of another version?)");
      }
      peers_[q].fd = connectBefore(qhost, qport, deadline, who);
      tune(peers_[q].fd);
      const bool withToken = !secret.empty();
      Hello hello{withToken ? kHelloAuth : kHello, static_cast<uint32_t>(rank), id, {}};
      if (withToken) hello.nonce = randomNonce();
      exchange(peers_[q].fd, &hello, sizeof(hello), true, deadline, who);
      if (withToken) {  // q must prove the secret before we prove it (over both nonces)
        Challenge c{};
        exchange(peers_[q].fd, &c, sizeof c, false, deadline, who);
        const Proof expected = meshProof(secret, true, prefix, q, rank, hello.nonce, c.nonce);
        if (!rendezvous::auth::constantTimeEquals(view(c.proof), view(expected))) {
          throw AuthError("mesh: " + who + " at " + qhost + ":" + std::to_string(qport) +
                          " did not prove this job's token (another token, or not " + who +
                          " of this job on that port)");
        }
        Proof mine = meshProof(secret, false, prefix, rank, q, hello.nonce, c.nonce);
        exchange(peers_[q].fd, mine.data(), mine.size(), true, deadline, who);
      }
    }
    // Accept every higher rank. Several connections are read at once, so a stranger that
    // stays silent holds nothing up; one whose hello is wrong is logged and dropped.
    for (int accepted = 0; accepted < size - 1 - rank;) {
      std::vector<pollfd> fds{{listener.get(), POLLIN, 0}};
      for (const auto& c : pending) fds.push_back({c.fd, POLLIN, 0});
      const int ms = remainingMs(deadline);
      if (ms == 0 || ::poll(fds.data(), fds.size(), ms) == 0) {
        throw TimeoutError("mesh: rank " + std::to_string(rank) + " waited in vain for " +
                           std::to_string(size - 1 - rank - accepted) + " higher rank(s) to connect");
      }
      for (size_t i = fds.size(); i-- > 1;) {  // backwards: erasing keeps lower indices valid
        if (fds[i].revents == 0) continue;
        Pending& c = pending[i - 1];
        const ssize_t k = ::recv(c.fd, c.bytes + c.have, c.want - c.have, 0);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        std::string why;
        if (k <= 0) {
          const char* stage = c.want == sizeof(Hello) ? "its hello" : "its proof";
          why = k == 0 ? std::string("closed before ") + stage
                       : std::string("failed: ") + std::strerror(errno);
        } else if ((c.have += static_cast<size_t>(k)) < c.want) {
          continue;
        } else if (c.want == sizeof(Hello)) {  // a complete hello
          std::memcpy(&c.hello, c.bytes, sizeof c.hello);
          why = checkHello(c.hello, rank, size, myId, !secret.empty(),
                           [&](int q) { return peers_[q].fd >= 0; });
          if (why.empty() && secret.empty()) {
            peers_[c.hello.rank].fd = c.fd;
            ++accepted;
            pending.erase(pending.begin() + static_cast<long>(i - 1));
            continue;
          }
          if (why.empty()) {  // challenge it: our nonce and proof, then wait for its proof
            c.myNonce = randomNonce();
            const Challenge ch{c.myNonce,
                               meshProof(secret, true, prefix, rank, static_cast<int>(c.hello.rank),
                                         c.hello.nonce, c.myNonce)};
            // 64 bytes into a fresh connection's empty send buffer: all or nothing.
            if (::send(c.fd, &ch, sizeof ch, MSG_NOSIGNAL | MSG_DONTWAIT) == sizeof ch) {
              c.have = 0;
              c.want = sizeof(Proof);
              continue;
            }
            why = "could not be sent a challenge";
          }
        } else {  // the connecting rank's proof
          const int q = static_cast<int>(c.hello.rank);
          const Proof expected = meshProof(secret, false, prefix, q, rank, c.hello.nonce, c.myNonce);
          if (!rendezvous::auth::constantTimeEquals(std::string_view(c.bytes, sizeof(Proof)),
                                                    view(expected))) {
            why = "claimed rank " + std::to_string(q) + " without proving this job's token";
          } else if (peers_[q].fd >= 0) {
            why = "claimed rank " + std::to_string(q) + ", which is connected already";
          } else {
            peers_[q].fd = c.fd;
            ++accepted;
            pending.erase(pending.begin() + static_cast<long>(i - 1));
            continue;
          }
        }
        DDPRUN_LOG(WARN, "mesh") << "rank " << rank << " dropped a connection from " << c.peer
                                 << " that " << why;
        ::close(c.fd);
        pending.erase(pending.begin() + static_cast<long>(i - 1));
      }
      if (fds[0].revents != 0) {
        sockaddr_storage from{};
        socklen_t fromLen = sizeof from;
        const int fd = ::accept4(listener.get(), reinterpret_cast<sockaddr*>(&from), &fromLen,
                                 SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) continue;
        tune(fd);
        if (pending.size() >= kMaxPendingHellos) {  // bounded: the oldest stranger goes
          DDPRUN_LOG(WARN, "mesh") << "rank " << rank << " dropped a connection from "
                                   << pending.front().peer << " that sent no hello ("
                                   << kMaxPendingHellos << " connections waiting)";
          ::close(pending.front().fd);
          pending.erase(pending.begin());
        }
        pending.push_back(Pending{.fd = fd, .peer = describePeer(from)});
      }
    }
  } catch (...) {
    closePending();
    for (auto& p : peers_) {
      if (p.fd >= 0) ::close(p.fd);
      p.fd = -1;
    }
    throw;
  }
  for (const auto& c : pending) {
    DDPRUN_LOG(WARN, "mesh") << "rank " << rank << " dropped a connection from " << c.peer
                             << " that did not complete its hello before set-up ended";
  }
  closePending();
}

TcpMesh::~TcpMesh() {
  for (auto& p : peers_) {
    if (p.fd >= 0) ::close(p.fd);
  }
}

void TcpMesh::abort() {
  for (auto& p : peers_) {
    if (p.fd >= 0) ::shutdown(p.fd, SHUT_RDWR);
  }
}

void TcpMesh::postSend(int peer, const void* data, size_t bytes) {
  if (bytes == 0) return;
  peers_[peer].sends.push_back({static_cast<const char*>(data), bytes});
  ++pending_;
}

void TcpMesh::postRecv(int peer, void* data, size_t bytes, std::function<void()> done) {
  if (bytes == 0) {
    if (done) done();
    return;
  }
  peers_[peer].recvs.push_back({static_cast<char*>(data), bytes, std::move(done)});
  ++pending_;
}

void TcpMesh::fail(int peer, const std::string& what) {
  throw BackendError("connection to rank " + std::to_string(peer) + " " + what +
                     " (did that rank exit?)");
}

bool TcpMesh::pumpSends(int q) {
  Peer& p = peers_[q];
  bool moved = false;
  while (!p.sends.empty()) {
    Send& s = p.sends.front();
    const ssize_t k = ::send(p.fd, s.p, s.left, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EAGAIN || errno == EINTR) break;
      fail(q, std::string("failed while sending: ") + std::strerror(errno));
    }
    moved = true;
    s.p += k;
    s.left -= static_cast<size_t>(k);
    if (s.left == 0) {
      p.sends.pop_front();
      --pending_;
    }
  }
  return moved;
}

bool TcpMesh::pumpRecvs(int q) {
  Peer& p = peers_[q];
  bool moved = false;
  while (!p.recvs.empty()) {
    Recv& r = p.recvs.front();
    const ssize_t k = ::recv(p.fd, r.p, r.left, MSG_DONTWAIT);
    if (k == 0) fail(q, "was closed");
    if (k < 0) {
      if (errno == EAGAIN || errno == EINTR) break;
      fail(q, std::string("failed while receiving: ") + std::strerror(errno));
    }
    moved = true;
    r.p += k;
    r.left -= static_cast<size_t>(k);
    if (r.left == 0) {
      auto done = std::move(r.done);
      p.recvs.pop_front();
      --pending_;
      if (done) done();  // may post more work (to this or another peer)
    }
  }
  return moved;
}

void TcpMesh::progress(Clock::time_point deadline) {
  std::vector<pollfd> fds;
  std::vector<int> owners;
  while (pending_ > 0) {
    // Every peer's sends before any receive: a receive callback may throw (a collective's
    // header that does not match), and what this rank queued for the others -- its own
    // header first of all -- must have left by then, so that they can tell too.
    bool moved = false;
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) moved |= pumpSends(q);
    }
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) moved |= pumpRecvs(q);
    }
    if (pending_ == 0) return;
    if (moved) continue;  // try again before sleeping in poll
    fds.clear();
    owners.clear();
    for (int q = 0; q < size_; ++q) {
      const Peer& p = peers_[q];
      if (q == rank_ || (p.sends.empty() && p.recvs.empty())) continue;
      short events = 0;
      if (!p.sends.empty()) events |= POLLOUT;
      if (!p.recvs.empty()) events |= POLLIN;
      fds.push_back({p.fd, events, 0});
      owners.push_back(q);
    }
    const int ms = remainingMs(deadline);
    if (ms == 0) throw TimeoutError("collective did not finish before its deadline");
    const int n = ::poll(fds.data(), fds.size(), ms);
    if (n < 0 && errno != EINTR) throw BackendError(std::string("poll failed: ") + std::strerror(errno));
    if (n == 0) throw TimeoutError("collective did not finish before its deadline");
    for (size_t i = 0; i < fds.size(); ++i) {
      // POLLHUP/POLLERR are diagnosed by the next send/recv in pump().
      if ((fds[i].revents & (POLLERR | POLLHUP)) && peers_[owners[i]].recvs.empty()) {
        fail(owners[i], "was closed or reset");
      }
    }
  }
}

}  // namespace ddprun::runtime
