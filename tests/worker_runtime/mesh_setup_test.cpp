// The allreduce mesh's set-up (worker_runtime/tcp_mesh.h) against strangers on its listening
// port: real sockets on loopback, ranks as threads on one MemoryStore. No LibTorch headers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <sstream>
#include <thread>

#include "base/errors.h"
#include "rendezvous/memory_store.h"
#include "worker_runtime/tcp_mesh.h"

using ddprun::rendezvous::MemoryStore;
using ddprun::runtime::meshSecret;
using ddprun::runtime::TcpMesh;
using namespace std::chrono_literals;

namespace {

int connectTo(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// True when the other side closed `fd` (EOF) within 20 s.
bool closedByPeer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 20000) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, 0) == 0;
}

// Reads exactly n bytes within 20 s; false on EOF, error or timeout.
bool readExactly(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 20000) <= 0) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// "host port id" as a rank published it.
struct Entry {
  std::string host, id;
  int port = 0;
};
Entry entryOf(MemoryStore& store, const std::string& key) {
  std::istringstream in(store.get(key));
  Entry e;
  in >> e.host >> e.port >> e.id;
  return e;
}

// Sends 8 bytes each way between two connected meshes; true when both arrived intact.
bool exchangeWorks(TcpMesh& m0, TcpMesh& m1) {
  uint64_t a = 0xA0A0, b = 0xB1B1, gotA = 0, gotB = 0;
  std::thread t0([&] {
    m0.postSend(1, &a, sizeof a);
    m0.postRecv(1, &gotB, sizeof gotB);
    m0.progress(TcpMesh::Clock::now() + 20s);
  });
  m1.postSend(0, &b, sizeof b);
  m1.postRecv(0, &gotA, sizeof gotA);
  m1.progress(TcpMesh::Clock::now() + 20s);
  t0.join();
  return gotA == a && gotB == b;
}

}  // namespace

TEST_CASE("mesh set-up drops an intruder claiming rank 1 and outlasts silent strangers",
          "[mesh][hostile]") {
  auto store = std::make_shared<MemoryStore>(20s);
  std::unique_ptr<TcpMesh> m0, m1;
  std::thread rank0([&] { m0 = std::make_unique<TcpMesh>(*store, "mesh", 0, 2, "127.0.0.1", 20s); });
  // Rank 0 published "host port id"; the strangers know host and port, not the id.
  std::istringstream entry(store->get("mesh/0"));
  std::string host, id;
  int port = 0;
  entry >> host >> port >> id;
  REQUIRE(id.size() == 32);
  const int silent = connectTo(host, port);  // first, and never says a word
  const int closer = connectTo(host, port);
  ::close(closer);  // connects and goes away
  const int intruder = connectTo(host, port);
  const uint32_t forged[14] = {0xDD9A11ED, 1};  // magic, rank 1, a wrong id (zeros), no nonce
  REQUIRE(::send(intruder, forged, sizeof forged, MSG_NOSIGNAL) == sizeof forged);
  CHECK(closedByPeer(intruder));  // dropped while set-up goes on
  std::thread rank1([&] { m1 = std::make_unique<TcpMesh>(*store, "mesh", 1, 2, "127.0.0.1", 20s); });
  rank0.join();
  rank1.join();
  REQUIRE(m0);
  REQUIRE(m1);
  CHECK(closedByPeer(silent));  // closed when set-up ended
  ::close(silent);
  ::close(intruder);

  // The real ranks are connected to each other.
  CHECK(exchangeWorks(*m0, *m1));
}

// With a job token the hello is a mutual challenge-response. The intruder here has read the
// store (as a local process can when the workers' store is the agent's, which PyTorch clients
// cannot authenticate to): it presents the right id, gets a challenge, and fails the proof.
TEST_CASE("with a token, mesh set-up drops an intruder that knows the id but not the token",
          "[mesh][hostile]") {
  const std::string secret = meshSecret("a-job-token-of-32-bytes-or-so-xx", "run-7", 0);
  REQUIRE(secret.size() == 32);
  CHECK(secret != meshSecret("a-job-token-of-32-bytes-or-so-xx", "run-7", 1));  // per attempt
  CHECK(secret != meshSecret("a-job-token-of-32-bytes-or-so-xx", "run-8", 0));  // per job
  auto store = std::make_shared<MemoryStore>(20s);
  std::unique_ptr<TcpMesh> m0, m1;
  std::thread rank0([&] {
    m0 = std::make_unique<TcpMesh>(*store, "mesh", 0, 2, "127.0.0.1", 20s, secret);
  });
  const Entry e = entryOf(*store, "mesh/0");
  REQUIRE(e.id.size() == 32);
  const int silent = connectTo(e.host, e.port);
  // A hello with the right id and a nonce, claiming rank 1 (the wire layout of tcp_mesh.cpp).
  uint8_t hello[56] = {};
  const uint32_t head[2] = {0xDD9A11EE, 1};
  std::memcpy(hello, head, sizeof head);
  for (size_t i = 0; i < 16; ++i) hello[8 + i] = static_cast<uint8_t>(std::stoi(e.id.substr(2 * i, 2), nullptr, 16));
  for (size_t i = 0; i < 32; ++i) hello[24 + i] = static_cast<uint8_t>(i * 7 + 1);
  const int intruder = connectTo(e.host, e.port);
  REQUIRE(::send(intruder, hello, sizeof hello, MSG_NOSIGNAL) == sizeof hello);
  uint8_t challenge[64];
  REQUIRE(readExactly(intruder, challenge, sizeof challenge));  // rank 0's nonce and proof
  const uint8_t wrongProof[32] = {1, 2, 3};
  REQUIRE(::send(intruder, wrongProof, sizeof wrongProof, MSG_NOSIGNAL) == sizeof wrongProof);
  CHECK(closedByPeer(intruder));  // dropped while set-up goes on
  // A hello without the token's magic is dropped too.
  const int plain = connectTo(e.host, e.port);
  hello[0] = 0xED;  // kHello, little-endian low byte
  REQUIRE(::send(plain, hello, sizeof hello, MSG_NOSIGNAL) == sizeof hello);
  CHECK(closedByPeer(plain));
  std::thread rank1([&] {
    m1 = std::make_unique<TcpMesh>(*store, "mesh", 1, 2, "127.0.0.1", 20s, secret);
  });
  rank0.join();
  rank1.join();
  REQUIRE(m0);
  REQUIRE(m1);
  CHECK(closedByPeer(silent));
  for (int fd : {silent, intruder, plain}) ::close(fd);
  CHECK(exchangeWorks(*m0, *m1));
}

// The connecting rank checks the accepting one too: a rank 0 with another token (or a process
// that published itself as rank 0) is refused with AuthError, before rank 1 proves anything.
TEST_CASE("with a token, a rank refuses a peer that cannot prove it", "[mesh][hostile]") {
  auto store = std::make_shared<MemoryStore>(20s);
  std::string error0, error1;
  std::thread rank0([&] {
    try {
      TcpMesh m(*store, "mesh", 0, 2, "127.0.0.1", 3s, meshSecret("token-one-token-one", "run", 0));
    } catch (const ddprun::Error& e) {
      error0 = e.what();
    }
  });
  try {
    TcpMesh m(*store, "mesh", 1, 2, "127.0.0.1", 3s, meshSecret("token-two-token-two", "run", 0));
  } catch (const ddprun::AuthError& e) {
    error1 = e.what();
  }
  rank0.join();
  CHECK_THAT(error1, Catch::Contains("rank 0 at 127.0.0.1:") &&
                         Catch::Contains("did not prove this job's token"));
  CHECK_THAT(error0, Catch::Contains("waited in vain for 1 higher rank"));
}

// A restart's mesh: a proof of attempt 0 does not open attempt 1 (another secret).
TEST_CASE("with a token, ranks of different attempts do not connect", "[mesh][hostile]") {
  auto store = std::make_shared<MemoryStore>(20s);
  std::string error1;
  std::thread rank0([&] {
    try {
      TcpMesh m(*store, "mesh", 0, 2, "127.0.0.1", 3s, meshSecret("token-one-token-one", "run", 1));
    } catch (const ddprun::Error&) {
    }
  });
  try {
    TcpMesh m(*store, "mesh", 1, 2, "127.0.0.1", 3s, meshSecret("token-one-token-one", "run", 0));
  } catch (const ddprun::AuthError& e) {
    error1 = e.what();
  }
  rank0.join();
  CHECK_THAT(error1, Catch::Contains("did not prove this job's token"));
}

TEST_CASE("mesh set-up names a published address it cannot use and its own that does not resolve",
          "[mesh]") {
  auto store = std::make_shared<MemoryStore>(20s);
  const std::string id(32, 'a');  // a well-formed id: only the address is wrong
  auto rank1 = [&] { TcpMesh(*store, "mesh", 1, 2, "127.0.0.1", 20s); };
  SECTION("a port that is no port") {
    for (const char* port : {"70000", "-1", "0", "29500x"}) {
      INFO("port " << port);
      store->set("mesh/0", std::string("127.0.0.1 ") + port + " " + id);
      CHECK_THROWS_AS(rank1(), ddprun::NetworkError);
      CHECK_THROWS_WITH(rank1(), Catch::Contains("rank 0 published no valid port and id under mesh/0"));
    }
  }
  SECTION("a host that does not resolve") {
    store->set("mesh/0", "no-such-host.invalid 29500 " + id);
    CHECK_THROWS_AS(rank1(), ddprun::NetworkError);
    CHECK_THROWS_WITH(rank1(), Catch::Contains("mesh: rank 0: cannot resolve 'no-such-host.invalid'"));
  }
  SECTION("this rank's own address") {
    CHECK_THROWS_AS(TcpMesh(*store, "mesh", 0, 1, "no-such-host.invalid", 20s), ddprun::ConfigError);
    CHECK_THROWS_WITH(TcpMesh(*store, "mesh", 0, 1, "no-such-host.invalid", 20s),
                      Catch::Contains("this rank's address: cannot resolve 'no-such-host.invalid'"));
  }
}
