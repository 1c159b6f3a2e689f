// Descriptors passed over a real unix socket pair (base/fd_passing.h): they arrive with their
// header, close-on-exec, and any beyond what the receiver takes are closed, not leaked: checked by
// a pipe whose read end sees EOF only once every copy of its write end is closed.
#include "base/fd_passing.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>

namespace {

struct Head {
  uint32_t magic;
  int32_t value;
};

struct Pipe {
  int read = -1, write = -1;
  Pipe() {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    read = p[0];
    write = p[1];
  }
  ~Pipe() {
    if (read >= 0) ::close(read);
    if (write >= 0) ::close(write);
  }
  void closeWrite() {
    ::close(write);
    write = -1;
  }
  // EOF now: every copy of the write end is closed.
  bool atEof() const {
    pollfd p{read, POLLIN, 0};
    if (::poll(&p, 1, 0) != 1) return false;
    char c;
    return ::read(read, &c, 1) == 0;
  }
};

struct SocketPair {
  int a = -1, b = -1;
  SocketPair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    a = sv[0];
    b = sv[1];
  }
  ~SocketPair() {
    ::close(a);
    ::close(b);
  }
};

}  // namespace

TEST_CASE("descriptors passed with a header arrive with it, close-on-exec, and work",
          "[fd_passing]") {
  SocketPair s;
  Pipe p1, p2;
  const Head sent{0x64647471, 7};
  const int fds[2] = {p1.write, p2.write};
  REQUIRE(ddprun::sendWithFds(s.a, &sent, sizeof sent, fds) == sizeof sent);
  Head got{};
  int in[2] = {-1, -1};
  size_t count = 0;
  REQUIRE(ddprun::receiveWithFds(s.b, &got, sizeof got, in, count) == sizeof got);
  CHECK(std::memcmp(&got, &sent, sizeof got) == 0);
  REQUIRE(count == 2);
  CHECK((::fcntl(in[0], F_GETFD) & FD_CLOEXEC) != 0);
  // The received descriptor is the pipe's write end: what goes in comes out of p1.
  REQUIRE(::write(in[0], "x", 1) == 1);
  char c = 0;
  CHECK(::read(p1.read, &c, 1) == 1);
  CHECK(c == 'x');
  ::close(in[0]);
  ::close(in[1]);
  p1.closeWrite();
  CHECK(p1.atEof());  // the received copy was the last one open
}

TEST_CASE("descriptors beyond what the receiver takes are closed, not leaked", "[fd_passing]") {
  SocketPair s;
  Pipe kept, extra;
  const Head sent{1, 2};
  const int fds[2] = {kept.write, extra.write};
  REQUIRE(ddprun::sendWithFds(s.a, &sent, sizeof sent, fds) == sizeof sent);
  Head got{};
  int in[1] = {-1};
  size_t count = 0;
  REQUIRE(ddprun::receiveWithFds(s.b, &got, sizeof got, in, count) == sizeof got);
  REQUIRE(count == 1);
  kept.closeWrite();
  extra.closeWrite();
  CHECK(!kept.atEof());  // the receiver holds its copy
  CHECK(extra.atEof());  // the one it could not take was closed on arrival
  ::close(in[0]);
  CHECK(kept.atEof());
}

TEST_CASE("a header without descriptors, EOF, and too many descriptors to send", "[fd_passing]") {
  SocketPair s;
  const Head sent{3, 4};
  REQUIRE(ddprun::sendWithFds(s.a, &sent, sizeof sent, {}) == sizeof sent);
  Head got{};
  int in[4] = {-1, -1, -1, -1};
  size_t count = 9;
  REQUIRE(ddprun::receiveWithFds(s.b, &got, sizeof got, in, count) == sizeof got);
  CHECK(count == 0);
  CHECK(got.value == 4);

  int many[ddprun::kMaxPassedFds + 1];
  for (int& f : many) f = s.a;
  CHECK(ddprun::sendWithFds(s.a, &sent, sizeof sent, many) == -1);
  CHECK(errno == EINVAL);

  ::shutdown(s.a, SHUT_WR);
  CHECK(ddprun::receiveWithFds(s.b, &got, sizeof got, in, count) == 0);
  CHECK(count == 0);
}

TEST_CASE("sendAll and readAll move every byte, and readAll reports a short stream",
          "[fd_passing]") {
  SocketPair s;
  char data[32768];  // under one socket buffer: nobody reads while it is sent
  for (size_t i = 0; i < sizeof data; ++i) data[i] = static_cast<char>(i * 7);
  REQUIRE(ddprun::sendAll(s.a, data, sizeof data));
  char back[sizeof data];
  REQUIRE(ddprun::readAll(s.b, back, sizeof back));
  CHECK(std::memcmp(back, data, sizeof data) == 0);
  REQUIRE(ddprun::sendAll(s.a, data, 10));
  ::shutdown(s.a, SHUT_WR);
  CHECK(!ddprun::readAll(s.b, back, 11));  // 10 bytes, then EOF
  ::close(s.b);
  s.b = ::dup(s.a);  // the pair's other end gone: a send fails, no SIGPIPE
  CHECK(!ddprun::sendAll(s.a, data, 10));
}
