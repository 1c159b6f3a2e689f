// WorkerStoreLink (launcher/worker_store_link.h): an agent's link to the workers' store of a job
// on several nodes -- jobs run on its thread with their result back on the I/O thread, the
// generation records followed in order, and a destructor that does not wait out a connect to
// a store that is gone (node 0's agent ended first: every other agent's exit waited 10 s).
#include <catch2/catch.hpp>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "launcher/worker_store_link.h"
#include "rendezvous/node_address.h"
#include "rendezvous/recovery_keys.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"

using namespace ddprun;
namespace rdzv = ddprun::rendezvous;
using Clock = std::chrono::steady_clock;

namespace {

rdzv::TcpStoreOptions storeAt(uint16_t port) {
  return {.host = "127.0.0.1", .port = port, .timeout = rdzv::Millis(30'000),
          .connectTimeout = rdzv::Millis(30'000), .dialect = rdzv::StoreDialect::Ddprun,
          .tokenFromEnvironment = false};
}

// Runs `io` until `done` or 10 s.
template <typename Pred>
bool runUntil(boost::asio::io_context& io, Pred done) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!done() && Clock::now() < deadline) {
    io.restart();
    io.run_for(std::chrono::milliseconds(20));
  }
  return done();
}

}  // namespace

TEST_CASE("worker store link: jobs run against the attempt's keys and generation records "
          "arrive in order on the I/O thread") {
  rdzv::ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  boost::asio::io_context io;
  const std::string prefix = rdzv::recovery::attemptPrefix(3);
  std::vector<std::pair<int, std::string>> records;
  launcher::WorkerStoreLink link(io, storeAt(server.port()), prefix,
                                 [&](int g, const std::string& text) { records.emplace_back(g, text); });
  std::string error = "not run";
  link.run([](rdzv::Store& s) { s.set("k", "v"); }, [&](const std::string& e) { error = e; });
  REQUIRE(runUntil(io, [&] { return error != "not run"; }));
  CHECK(error.empty());
  rdzv::TcpStore direct(storeAt(server.port()));
  CHECK(direct.get(prefix + "/k") == "v");  // under the attempt's prefix
  // Records 1 and 2, written out of order: handed over as 1, 2.
  direct.set(prefix + "/" + rdzv::recovery::generationKey(2), "second");
  direct.set(prefix + "/" + rdzv::recovery::generationKey(1), "first");
  REQUIRE(runUntil(io, [&] { return records.size() == 2; }));
  CHECK(records == std::vector<std::pair<int, std::string>>{{1, "first"}, {2, "second"}});
  // A job's failure comes back as a message, not an exception on the I/O thread.
  error = "not run";
  link.run([](rdzv::Store& s) { (void)s.get("never set, and the wait is cut short"); },
           [&](const std::string& e) { error = e; });
  // (get waits for the key up to the store's timeout; the destructor below interrupts it)
}

TEST_CASE("worker store link: a store that is gone does not hold the link's destruction for "
          "the connect timeout") {
  boost::asio::io_context io;
  const uint16_t port = rdzv::pickFreePort();  // nothing listens there: refused, retried
  const auto start = Clock::now();
  {
    launcher::WorkerStoreLink link(io, storeAt(port), rdzv::recovery::attemptPrefix(0),
                                   [](int, const std::string&) {});
    link.waitFor({"some/key"}, [] {});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // its threads retry
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  INFO("destroyed after " << seconds << " s (connect timeout 30 s)");
  CHECK(seconds < 5.0);
}
