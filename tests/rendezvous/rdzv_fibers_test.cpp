// The fibers the simulated agents run on (bench/fiber_scheduler.h) and the seam that lets the
// real rendezvous code wait on them (rendezvous/blocking.h): sockets, condition variables,
// background tasks, timeouts, and exceptions handled across fiber switches -- against real
// sockets and a real ddprun-store.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>

#include "bench/fiber_scheduler.h"
#include "bench/rendezvous_swarm.h"
#include "rendezvous/tcp_store.h"

using namespace ddprun::bench;
using namespace ddprun::rendezvous;

TEST_CASE("fibers: an exception being handled survives other fibers throwing meanwhile") {
  FiberScheduler s;
  std::vector<std::string> seen;
  for (int i = 0; i < 3; ++i) {
    s.spawn([&, i] {
      try {
        throw std::runtime_error("fiber " + std::to_string(i));
      } catch (const std::exception&) {
        s.sleepUntil(Clock::now() + Millis(20 * (3 - i)));  // others throw and catch meanwhile
        try {
          throw;  // the exception this fiber is handling, not the last one thrown anywhere
        } catch (const std::exception& again) {
          seen.push_back(again.what());
        }
      }
      CHECK(std::uncaught_exceptions() == 0);
    });
  }
  s.run();
  REQUIRE(seen.size() == 3);
  CHECK(seen[0] == "fiber 2");  // woke first: slept least
  CHECK(seen[2] == "fiber 0");
  CHECK(Blocking::current() == nullptr);  // uninstalled after run()
}

TEST_CASE("fibers: CondVar, Background and pollFd park fibers instead of the thread") {
  FiberScheduler s;
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  std::mutex mu;
  CondVar cv;
  bool ready = false;
  int polled = -1, timedOut = -1;
  bool timedWait = true;
  s.spawn([&] {
    Background reader([&] {
      timedOut = pollFd(fds[0], POLLIN, Millis(30));  // nothing yet: the deadline
      polled = pollFd(fds[0], POLLIN, Millis(10'000));
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return ready; });
    });
    {
      std::unique_lock<std::mutex> lock(mu);
      timedWait = cv.waitFor(lock, Millis(50), [&] { return ready; });  // nobody sets it
    }
    // A second fiber writes while this one and the reader are parked.
    Background writer([&] { CHECK(::write(fds[1], "x", 1) == 1); });
    writer.join();
    {
      std::lock_guard<std::mutex> g(mu);
      ready = true;
    }
    cv.notifyAll();
    reader.join();
  });
  const auto t0 = Clock::now();
  s.run();
  CHECK(timedOut == 0);
  CHECK(polled == 1);
  CHECK_FALSE(timedWait);
  CHECK(Clock::now() - t0 < Millis(5'000));
  ::close(fds[0]);
  ::close(fds[1]);
}

// Many TcpStore clients on one thread: their waits overlap (a thread per client would be needed
// otherwise), their timeouts are the scheduler's, and their values are right.
TEST_CASE("fibers: hundreds of TcpStore clients on one thread wait at once against a real store") {
  StoreProcess store(std::string(DDPRUN_BIN_DIR) + "/ddprun-store");
  const TcpStoreOptions o{.host = "127.0.0.1", .port = store.port(), .timeout = Millis(30'000)};
  constexpr int kClients = 300;
  FiberPool pool(2);
  std::atomic<int> timeouts{0}, ok{0};
  for (int i = 0; i < kClients; ++i) {
    pool.spawn(i, [&, i] {
      TcpStore c(o);
      // Each waits 300 ms for a key nobody writes: serially that is 90 s, overlapped 0.3 s.
      if (!c.waitGet("never", Millis(300))) ++timeouts;
      c.add("count", 1);
      // Every client waits for the last one's key: a get woken by another client's write.
      if (c.add("arrived", 1) == kClients) c.set("all", "here");
      if (c.get("all") == "here") ++ok;
    });
  }
  const auto t0 = Clock::now();
  pool.start();
  pool.join();
  const auto took = Clock::now() - t0;
  CHECK(timeouts == kClients);
  CHECK(ok == kClients);
  TcpStore check(o);
  CHECK(check.add("count", 0) == kClients);
  INFO("took " << std::chrono::duration<double>(took).count() << " s");
  CHECK(took < Millis(20'000));  // far below the 90 s of waits one after another
}
