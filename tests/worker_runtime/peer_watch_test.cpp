// The peer watch (worker_runtime/elastic/peer_watch.h): the pid exchange through a real ddprun
// store over TCP, and the death of real processes (a zombie not yet reaped counts as dead, a
// stopped process does not). It is what tells NCCL of a local peer's death under in-process
// recovery; this part needs no GPU.
#include "tests/support/catch_torch.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/errors.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"
#include "tests/worker_runtime/rank_threads.h"
#include "worker_runtime/elastic/peer_watch.h"

using namespace ddprun::rendezvous;
using ddprun::runtime::elastic::PeerWatch;

namespace {

pid_t spawnSleep() {
  char arg0[] = "sleep", arg1[] = "30";
  char* argv[] = {arg0, arg1, nullptr};
  pid_t pid = -1;
  REQUIRE(posix_spawnp(&pid, "sleep", nullptr, nullptr, argv, environ) == 0);
  return pid;
}

TcpStoreOptions optionsFor(const ThreadedStoreServer& server) {
  return {.host = "127.0.0.1", .port = server.port(), .timeout = std::chrono::seconds(10)};
}

}  // namespace

TEST_CASE("peer watch: every rank learns every rank's pid through the store", "[peer_watch]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const int P = 3;
  std::vector<std::vector<int32_t>> seen(P);
  ddprun::runtime::test::runRanks(P, [&](int r) {
    TcpStore store(optionsFor(server));
    const PeerWatch w = PeerWatch::exchange(store, r, P, std::chrono::seconds(10));
    seen[r] = w.pids();
    CHECK(w.lost().empty());
  });
  for (int r = 0; r < P; ++r) CHECK(seen[r] == std::vector<int32_t>(P, ::getpid()));
}

TEST_CASE("peer watch: a killed peer is reported (zombie or reaped) and a stopped one is not",
          "[peer_watch]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const pid_t one = spawnSleep(), two = spawnSleep();
  TcpStore others(optionsFor(server));  // ranks 1 and 2 publish their pids as exchange() does
  others.set("pids/1", std::to_string(one));
  others.set("pids/2", std::to_string(two));
  TcpStore mine(optionsFor(server));
  const PeerWatch w = PeerWatch::exchange(mine, 0, 3, std::chrono::seconds(10));
  CHECK(w.pids() == std::vector<int32_t>{::getpid(), one, two});
  CHECK(w.lost().empty());

  ::kill(two, SIGSTOP);
  CHECK(w.lost().empty());  // frozen is not dead: the progress heartbeats catch that

  ::kill(one, SIGKILL);
  // Not reaped yet: a zombie, which is dead (a worker stays one until its guard waits for it).
  for (int i = 0; i < 100 && w.lost().empty(); ++i) ::usleep(10'000);
  CHECK(w.lost() == "rank 1 (pid " + std::to_string(one) + ") died");
  REQUIRE(::waitpid(one, nullptr, 0) == one);
  CHECK(w.lost() == "rank 1 (pid " + std::to_string(one) + ") died");

  ::kill(two, SIGKILL);
  REQUIRE(::waitpid(two, nullptr, 0) == two);
  CHECK(w.lost() == "rank 1 (pid " + std::to_string(one) + ") died");  // the lowest rank first
}

TEST_CASE("peer watch: a value that is not a pid and a missing rank are errors, not hangs",
          "[peer_watch]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  TcpStore store(optionsFor(server));
  store.set("pids/1", "12x");
  CHECK_THROWS_WITH(PeerWatch::exchange(store, 0, 2, std::chrono::seconds(5)),
                    Catch::Contains("'pids/1'") && Catch::Contains("'12x', not a process id"));
  store.set("pids/1", "-5");
  CHECK_THROWS_AS(PeerWatch::exchange(store, 0, 2, std::chrono::seconds(5)), ddprun::BackendError);
  CHECK_THROWS_AS(PeerWatch::exchange(store, 0, 3, std::chrono::milliseconds(300)),
                  ddprun::TimeoutError);
}
