// The client meets servers that are not ddprun stores, and what crosses the wire when it
// authenticates, on real sockets:
//   - torch's own TCPStore server (Debian's python3-torch, a process of its own), a server that
//     answers garbage, one that hangs up, one that never answers: each is recognised as "not a
//     ddprun store" with the address named, in a StoreError, and the foreign server's data is
//     untouched;
//   - a relay between client and store: authentication through it is refused (proofs are bound
//     to the store's address), and the captured bytes hold the token in neither direction.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <regex>
#include <thread>

#include "base/errors.h"
#include "relay.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"
#include "tests/support/process.h"
#include "tests/support/skip.h"
#include "tests/support/temp_dir.h"

using namespace ddprun;
using namespace ddprun::rendezvous;
using ddprun::test::Relay;

namespace {

// A listener on 127.0.0.1 that hands each accepted connection to `serve` on its own thread.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd)> serve) : serve_(std::move(serve)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener_, 16) == 0);
    REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{listener_, POLLIN, 0};
        if (::poll(&p, 1, 50) != 1) continue;
        const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        serve_(fd);
        ::close(fd);
        ++served_;
      }
    });
  }
  ~FakeServer() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  uint16_t port() const { return port_; }
  int served() const { return served_; }

 private:
  std::function<void(int)> serve_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> served_{0};
  std::thread thread_;
};

// Reads what the client sends for a moment (so its handshake is on the wire), returns it.
std::string readSome(int fd) {
  std::string got;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, 200) == 1) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

TcpStoreOptions ddprunClient(uint16_t port) {
  return TcpStoreOptions{.host = "127.0.0.1", .port = port, .timeout = Millis(2'000),
                         .connectTimeout = Millis(10'000), .tokenFromEnvironment = false};
}

// The client's verdict on a server that is not a ddprun store: a StoreError naming the address
// and saying what it expected.
void checkRecognised(uint16_t port) {
  const std::string address = "127.0.0.1:" + std::to_string(port);
  CHECK_THROWS_MATCHES(TcpStore(ddprunClient(port)), StoreError,
                       Catch::Matchers::Predicate<StoreError>(
                           [&](const StoreError& e) {
                             const std::string m = e.what();
                             return m.find(address) != std::string::npos &&
                                    (m.find("not a ddprun store") != std::string::npos ||
                                     m.find("ddprun-store") != std::string::npos);
                           },
                           "names " + address + " and says it is not a ddprun store"));
}

std::string hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

}  // namespace

TEST_CASE("a server that is not a ddprun store is recognised", "[server][foreign]") {
  SECTION("torch's own TCPStore server (python3-torch)") {
#ifndef DDPRUN_TORCH_PYTHON
    return ddprun::testing::skipUnlessCi("no python3 with torch (Debian python3-torch) was found");
#else
    ddprun::testing::TempDir dir;
    ddprun::testing::Process torch({.argv = {DDPRUN_TORCH_PYTHON, "-u", DDPRUN_TEST_SOURCE_DIR
                                             "/torch_store_server.py"},
                                    .stdoutPath = dir / "torch.out"});
    uint16_t port = 0;
    REQUIRE(ddprun::testing::waitUntil(
        [&] {
          std::smatch m;
          const std::string out = torch.output();
          if (!std::regex_search(out, m, std::regex("PORT (\\d+)"))) return false;
          port = static_cast<uint16_t>(std::stoi(m[1]));
          return true;
        },
        std::chrono::seconds(60)));
    checkRecognised(port);
    // It is torch's store, and what it holds is untouched: torch 1.13 clients speak the legacy
    // dialect, and its Python client stored its key under "/".
    TcpStore legacy({.host = "127.0.0.1", .port = port, .timeout = Millis(10'000),
                     .dialect = StoreDialect::Legacy});
    CHECK(legacy.get("/written-by-torch") == "yes");
    CHECK(legacy.numKeys() == 1);
#endif
  }
  SECTION("a server that answers garbage") {
    FakeServer server([](int fd) {
      readSome(fd);
      const std::string garbage =
          "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n\xde\xad\xbe\xef\x01\x02\x03\x04"
          "\xff\xff\xff\xff\xff\xff\xff\x7f" + std::string(64, '\x5a');
      ::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
      readSome(fd);
    });
    checkRecognised(server.port());
    CHECK(ddprun::testing::waitUntil([&] { return server.served() >= 1; }));
  }
  SECTION("a server that hangs up at once") {
    FakeServer server([](int) {});
    checkRecognised(server.port());
  }
  SECTION("a server that accepts and never answers (the handshake deadline)") {
    FakeServer server([](int fd) {
      pollfd p{fd, POLLRDHUP, 0};
      ::poll(&p, 1, 30'000);  // until the client gives up and closes
    });
    checkRecognised(server.port());
  }
}

TEST_CASE("a relay between client and store is refused, and the token never crosses it",
          "[server][auth]") {
  // Proofs are bound to the store's socket address (rendezvous/auth.h): the client proves the
  // token for the relay's address, which the store does not accept as its own.
  const std::string token = "relay-test-token-7f3a9c2e5b1d4068";
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0, .authToken = token});
  TcpStore direct({.host = "127.0.0.1", .port = server.port(), .authToken = token});
  direct.set("stored-before", "intact");
  Relay relay(server.port());
  for (int session = 0; session < 2; ++session) {
    CHECK_THROWS_MATCHES(
        TcpStore({.host = "127.0.0.1", .port = relay.port(), .connectTimeout = Millis(5'000),
                  .authToken = token}),
        AuthError, Catch::Matchers::Predicate<AuthError>([](const AuthError& e) {
          return std::string(e.what()).find("refused our authentication token") !=
                 std::string::npos;
        }));
  }
  // The store still serves its direct clients, and what it held is intact.
  CHECK(direct.get("stored-before") == "intact");
  CHECK(TcpStore({.host = "127.0.0.1", .port = server.port(), .authToken = token})
            .get("stored-before") == "intact");

  REQUIRE(ddprun::testing::waitUntil([&] { return relay.captures().size() >= 2; }));
  const auto captures = relay.captures();
  for (size_t i = 0; i < 2; ++i) {
    INFO("session " << i);
    const auto& c = captures[i];
    // The capture is real: the AUTH frame (client nonce and proof) went through it...
    CHECK(c.up.find(static_cast<char>(protocol::ExtensionCommand::Auth)) != std::string::npos);
    CHECK(c.up.size() > 64);
    // ...and the token did not, in either direction, raw or in hex.
    for (const std::string& bytes : {c.up, c.down}) {
      CHECK(bytes.find(token) == std::string::npos);
      CHECK(bytes.find(hex(token)) == std::string::npos);
      CHECK(bytes.find(token.substr(0, 16)) == std::string::npos);
    }
  }
  // Fresh nonces: two sessions never send the same bytes (no proof is a replayable copy).
  CHECK(captures[0].up != captures[1].up);
}
