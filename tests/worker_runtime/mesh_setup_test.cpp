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
  const uint32_t forged[6] = {0xDD9A11ED, 1, 0, 0, 0, 0};  // magic, rank 1, a wrong id
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
  uint64_t a = 0xA0A0, b = 0xB1B1, gotA = 0, gotB = 0;
  std::thread t0([&] {
    m0->postSend(1, &a, sizeof a);
    m0->postRecv(1, &gotB, sizeof gotB);
    m0->progress(TcpMesh::Clock::now() + 20s);
  });
  m1->postSend(0, &b, sizeof b);
  m1->postRecv(0, &gotA, sizeof gotA);
  m1->progress(TcpMesh::Clock::now() + 20s);
  t0.join();
  CHECK(gotA == a);
  CHECK(gotB == b);
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
