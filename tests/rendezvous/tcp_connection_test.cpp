// The store client's socket (TcpStore::Connection) and its deadlines, on a socket pair: what
// has arrived is taken even when the deadline has passed (this process may have been paused
// past it), and nothing is waited for beyond it.
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "rendezvous/tcp_connection.h"

namespace ddprun::rendezvous {
namespace {

struct Pair {
  Pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0); }
  ~Pair() { ::close(fds[1]); }  // fds[0] is owned by the Connection
  int fds[2];
};

bool timedOut(TcpStore::Connection& c, void (*op)(TcpStore::Connection&)) {
  try {
    op(c);
  } catch (const IoFailure& f) {
    return f.timeout;
  }
  return false;
}

TEST_CASE("a reply that arrived before a passed deadline is still read", "[tcp_connection]") {
  Pair p;
  TcpStore::Connection c(p.fds[0]);
  const char reply[] = {7, 9};
  REQUIRE(::send(p.fds[1], reply, sizeof reply, 0) == 2);
  c.setDeadline(Clock::now() - std::chrono::seconds(1));
  c.awaitReadable();  // threw "no reply in time" before looking at the socket
  CHECK(c.u8() == 7);
  CHECK(c.u8() == 9);
}

TEST_CASE("past the deadline with nothing arrived, reads and waits time out at once", "[tcp_connection]") {
  Pair p;
  TcpStore::Connection c(p.fds[0]);
  c.setDeadline(Clock::now() - std::chrono::milliseconds(1));
  CHECK(timedOut(c, [](TcpStore::Connection& x) { x.awaitReadable(); }));
  CHECK(timedOut(c, [](TcpStore::Connection& x) { (void)x.u8(); }));
  // The connection still works afterwards: a byte sent later is read with a new deadline.
  const char b = 5;
  REQUIRE(::send(p.fds[1], &b, 1, 0) == 1);
  c.setDeadline(Clock::now() + std::chrono::seconds(30));
  CHECK(c.u8() == 5);
}

TEST_CASE("a wait with a deadline ahead ends no earlier than the deadline", "[tcp_connection]") {
  Pair p;
  TcpStore::Connection c(p.fds[0]);
  const auto start = Clock::now();
  c.setDeadline(start + std::chrono::milliseconds(200));
  CHECK(timedOut(c, [](TcpStore::Connection& x) { x.awaitReadable(); }));
  CHECK(Clock::now() - start >= std::chrono::milliseconds(200));
}

TEST_CASE("a write past its deadline still goes out when the socket has room", "[tcp_connection]") {
  Pair p;
  TcpStore::Connection c(p.fds[0]);
  c.setDeadline(Clock::now() - std::chrono::seconds(1));
  c.write("abc");  // threw "deadline passed" without trying
  char got[3] = {};
  REQUIRE(::recv(p.fds[1], got, 3, MSG_WAITALL) == 3);
  CHECK(std::string(got, 3) == "abc");
}

}  // namespace
}  // namespace ddprun::rendezvous
