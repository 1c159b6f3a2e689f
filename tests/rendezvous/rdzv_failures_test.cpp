// Agents as threads against a real StoreServer: dead nodes, worker failures, the exit
// barrier, a lost store, and endpoints that are not this job's store.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "rdzv_agents.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/rendezvous_backend.h"
#include "silent_listener.h"

using namespace rdzvtest;
using ddprun::AuthError;
using ddprun::StoreError;

// In both rank orders; with rank_order=stable the survivors keep their node ranks.
TEST_CASE("a node whose heartbeats stop is evicted, survivors re-form", "[rdzv][failures]") {
  const bool arrival = GENERATE(true, false);
  INFO((arrival ? "rank_order=arrival (default)" : "rank_order=stable"));
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 3};
  auto opts = [&](int n) {
    auto o = agentOptions(server.port(), "hb", n, lim);
    o.arrivalRanks = arrival;
    return o;
  };
  auto a = makeAgent(opts(2));
  auto b = makeAgent(opts(3));
  auto c = makeAgent(opts(4));
  allNextRound({a.get(), b.get(), c.get()});
  // Destroying the object stops its heartbeats without a leave: to the others it is dead.
  const auto t0 = Clock::now();
  b.reset();
  for (Agent* x : {a.get(), c.get()}) {
    auto e = x->events.next(Millis(5'000));
    REQUIRE(e);
    CHECK(e->kind == RoundEvent::Kind::Superseded);
    CHECK(e->message.find("no heartbeat") != std::string::npos);
  }
  const auto detected = std::chrono::duration_cast<Millis>(Clock::now() - t0);
  // Detection within the heartbeat bound (plus scheduling slack).
  CHECK(detected <= kHeartbeatBound + Millis(400));
  auto r = allNextRound({a.get(), c.get()});
  CHECK(r[0].nodeCount == 2);
  checkOneRound(r, {2, 4}, {1, 1});
  if (!arrival) {
    CHECK(r[0].nodeRank == 0);  // kept
    CHECK(r[1].nodeRank == 1);  // rank 2 is gone: the free rank 1
  }
  CHECK(r[0].restartCount == 0);
}

TEST_CASE("worker failures restart every node and spend the budget once per job",
          "[rdzv][failures]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 2, .maxNodes = 2, .maxRestarts = 1};
  auto a = makeAgent(agentOptions(server.port(), "fail", 2, lim));
  auto b = makeAgent(agentOptions(server.port(), "fail", 3, lim));
  allNextRound({a.get(), b.get()});

  CHECK(b->rdzv->reportFailure(3, "exit code 3") == DynamicRendezvous::AfterFailure::Restart);
  auto e = a->events.next(Millis(5'000));
  REQUIRE(e);
  CHECK(e->kind == RoundEvent::Kind::Superseded);
  CHECK(e->message.find("exit code 3") != std::string::npos);
  // a's workers die of the same cause a moment later: round 0 is already over, no spend.
  auto r1 = allNextRound({a.get(), b.get()});
  CHECK(r1[0].restartCount == 1);
  CHECK(r1[1].restartCount == 1);

  CHECK(a->rdzv->reportFailure(7, "exit code 7") == DynamicRendezvous::AfterFailure::JobFailed);
  CHECK(a->rdzv->jobExitCode() == 7);
  auto f = b->events.next(Millis(5'000));
  REQUIRE(f);
  CHECK(f->kind == RoundEvent::Kind::JobFailed);
  CHECK(f->exitCode == 7);
  CHECK(f->message.find("no restart is left") != std::string::npos);
  CHECK_THROWS_AS(b->rdzv->nextRound(), JobEndedError);
}

TEST_CASE("the exit barrier: finished only when every node's workers succeeded",
          "[rdzv][failures]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 2, .maxNodes = 2, .maxRestarts = 2};
  auto ho = agentOptions(server.port(), "exit", 2, lim);
  ho.isHost = true;
  auto host = makeAgent(ho);
  auto b = makeAgent(agentOptions(server.port(), "exit", 3, lim));
  allNextRound({host.get(), b.get()});

  // The host finishes first, then b's workers fail: the host rejoins instead of finishing.
  auto fh = std::async(std::launch::async, [&] { return host->rdzv->finishRound(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(b->rdzv->reportFailure(1, "exit code 1") == DynamicRendezvous::AfterFailure::Restart);
  CHECK(fh.get() == DynamicRendezvous::AfterSuccess::Rejoin);

  allNextRound({host.get(), b.get()});
  auto fh2 = std::async(std::launch::async, [&] { return host->rdzv->finishRound(); });
  CHECK(fh2.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
  CHECK(b->rdzv->finishRound() == DynamicRendezvous::AfterSuccess::Finished);
  CHECK(fh2.get() == DynamicRendezvous::AfterSuccess::Finished);
  CHECK(host->events.size() == 0);
  CHECK(b->events.size() == 0);
  // A node arriving now learns that the job is over.
  auto late = makeAgent(agentOptions(server.port(), "exit", 4, lim));
  CHECK_THROWS_WITH(late->rdzv->nextRound(), Catch::Contains("already finished"));
}

TEST_CASE("losing the store is reported to every agent, naming the endpoint",
          "[rdzv][failures]") {
  auto server = std::make_unique<ThreadedStoreServer>(StoreServerOptions{.host = "127.0.0.1"});
  const uint16_t port = server->port();
  const JobLimits lim{.minNodes = 2, .maxNodes = 2};
  auto oa = agentOptions(port, "lost", 2, lim);
  auto ob = agentOptions(port, "lost", 3, lim);
  oa.store.timeout = ob.store.timeout = Millis(500);  // read_timeout
  auto a = makeAgent(oa);
  auto b = makeAgent(ob);
  allNextRound({a.get(), b.get()});
  const auto t0 = Clock::now();
  server.reset();
  for (Agent* x : {a.get(), b.get()}) {
    auto e = x->events.next(Millis(5'000));
    REQUIRE(e);
    CHECK(e->kind == RoundEvent::Kind::StoreLost);
    CHECK(e->message.find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  }
  CHECK(Clock::now() - t0 < Millis(500 + 100 + 1'000));  // within read_timeout + a beat
}

TEST_CASE("an endpoint that is not a ddprun store, or has another token, is refused",
          "[rdzv][failures]") {
  // A listener that accepts and closes at once, as a foreign service on the port would.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::listen(fd, 8);
  std::thread closer([fd] {
    for (int i = 0; i < 1; ++i) {
      int c = ::accept(fd, nullptr, nullptr);
      if (c >= 0) {
        const char junk[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
        (void)!::write(c, junk, sizeof junk - 1);
        ::close(c);
      }
    }
  });
  auto o = agentOptions(ntohs(addr.sin_port), "foreign", 2, {});
  CHECK_THROWS_AS(makeAgent(o), StoreError);
  closer.join();
  ::close(fd);

  ThreadedStoreServer secured({.host = "127.0.0.1", .port = 0, .authToken = "right-token"});
  auto w = agentOptions(secured.port(), "tok", 2, {});
  w.store.authToken = "wrong-token";
  CHECK_THROWS_AS(makeAgent(w), AuthError);
  w.store.authToken = "right-token";
  CHECK_NOTHROW(makeAgent(w));
}

// The heartbeat writer makes its own connection at its second beat, not at the agent's start
// (fewer connects while a round forms); a store that stopped answering before that connect
// must still be reported within the keep-alive bound, not after the handshake's 10 s.
TEST_CASE("a store silent before the heartbeat writer's own connect is reported within the "
          "keep-alive bound", "[rdzv][failures]") {
  // A listener that never accepts: as a store whose process is stopped.
  const SilentListener listener;
  // Per call and connect 20 s: unbounded, the writer's handshake would wait its 10 s.
  const TcpStoreOptions silent = listener.storeOptions();
  std::atomic<int> connects{0};
  std::promise<std::string> failed;
  MemoryStore first;  // the agent's own connection, where the first beat goes
  const auto t0 = Clock::now();
  HeartbeatWriter writer(
      [&](Millis within) {
        ++connects;
        return interruptible(std::make_shared<TcpStore>(boundedLazyConnection(silent, within)));
      },
      first, "n1", HeartbeatOptions{.interval = Millis(100), .missedBeats = 3},
      [&](std::exception_ptr e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          failed.set_value(x.what());
        }
      });
  CHECK(first.add(heartbeatCounterKey("n1"), 0) == 1);  // beaten once, before any join
  CHECK(connects == 0);                                 // no connection of its own yet
  auto f = failed.get_future();
  REQUIRE(f.wait_for(Millis(15'000)) == std::future_status::ready);
  const auto reported = std::chrono::duration_cast<Millis>(Clock::now() - t0);
  CHECK(connects == 1);
  const std::string what = f.get();
  CHECK_THAT(what, Catch::Contains("stopped answering"));
  // It names the call that got no reply (here the writer's connect to the silent listener).
  CHECK_THAT(what, Catch::Contains("; the beat's call that failed, after "));
  CHECK_THAT(what, Catch::Contains("127.0.0.1:" + std::to_string(listener.port())));
  // The keep-alive bound is 300 ms from the first beat (a retry may add an interval); slack
  // for a loaded machine, far below the unbounded handshake's 10 s.
  CHECK(reported < Millis(3'000));
  writer.stop(false);
}

TEST_CASE("interrupt() cancels a waiting join, the agent can still leave", "[rdzv][failures]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 2, .maxNodes = 2};
  auto a = makeAgent(agentOptions(server.port(), "cancel", 2, lim));
  auto f = std::async(std::launch::async, [&] { return a->rdzv->nextRound(); });
  CHECK(f.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
  const auto t0 = Clock::now();
  a->rdzv->interrupt();
  CHECK_THROWS_AS(f.get(), ddprun::NetworkError);
  CHECK(Clock::now() - t0 < Millis(500));
  a->rdzv->leave("SIGINT");  // on a new connection: the departure reaches the store
  auto b = makeAgent(agentOptions(server.port(), "cancel", 3, lim));
  auto c = makeAgent(agentOptions(server.port(), "cancel", 4, lim));
  auto r = allNextRound({b.get(), c.get()});
  CHECK(r[0].nodeCount == 2);  // a is gone: b and c form the round by themselves
}

// Issue 20's waiting list by counters (rendezvous/scalable/waiting_list.h): a node waiting for
// a place in a full round is named by no version, so its departure writes none; the re-form
// that expects it (the members and the round's waiting nodes) closes without it once its
// heartbeats are missed or the last call runs out.
TEST_CASE("a waiting node that leaves writes no version and the re-form that expects it closes without it",
          "[rdzv][failures]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 2};
  auto a = makeAgent(agentOptions(server.port(), "waitleave", 2, lim));
  auto b = makeAgent(agentOptions(server.port(), "waitleave", 3, lim));
  const auto first = allNextRound({a.get(), b.get()});
  auto c = makeAgent(agentOptions(server.port(), "waitleave", 4, lim));
  auto fc = std::async(std::launch::async, [&] { return c->rdzv->nextRound(); });
  TcpStore client({.host = "127.0.0.1", .port = server.port(), .timeout = Millis(2'000)});
  const std::string job = "ddprun/rdzv/waitleave/";
  const std::string r = std::to_string(first[0].round);
  const auto deadline = Clock::now() + Millis(5'000);
  while (!client.check({job + "r/" + r + "/waiting.written"}) && Clock::now() < deadline)
    std::this_thread::sleep_for(Millis(10));
  REQUIRE(client.add(job + "r/" + r + "/waiting.written", 0) == 1);
  CHECK_FALSE(client.check({job + "state/2"}));  // c registered without a version
  c->rdzv->interrupt();
  CHECK_THROWS_AS(fc.get(), ddprun::NetworkError);
  c->rdzv->leave("SIGINT");
  CHECK_FALSE(client.check({job + "state/2"}));  // nor did its departure write one
  CHECK_FALSE(a->events.next(Millis(200)));      // and nobody restarted
  b->rdzv->leave("scaled down");
  REQUIRE(a->events.next(Millis(5'000)));
  CHECK(client.get(job + "state/2").find(" waiting 1") != std::string::npos);
  const auto t0 = Clock::now();
  const RoundInfo again = a->rdzv->nextRound();
  CHECK(again.nodeCount == 1);
  CHECK(again.worldSize == 1);
  CHECK(Clock::now() - t0 < Millis(5'000));
}

TEST_CASE("a node arriving during the exit barrier does not make finished nodes redo work",
          "[rdzv][failures]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 3};
  auto a = makeAgent(agentOptions(server.port(), "late", 2, lim));
  auto b = makeAgent(agentOptions(server.port(), "late", 3, lim));
  allNextRound({a.get(), b.get()});
  auto fa = std::async(std::launch::async, [&] { return a->rdzv->finishRound(); });
  CHECK(fa.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
  auto c = makeAgent(agentOptions(server.port(), "late", 4, lim));
  auto fc = std::async(std::launch::async, [&] { return c->rdzv->nextRound(); });
  CHECK(fc.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);  // waits
  CHECK(b->events.size() == 0);  // b's workers were not restarted for c
  CHECK(b->rdzv->finishRound() == DynamicRendezvous::AfterSuccess::Finished);
  CHECK(fa.get() == DynamicRendezvous::AfterSuccess::Finished);
  CHECK_THROWS_WITH(fc.get(), Catch::Contains("already finished"));
}

TEST_CASE("a node lost in the exit barrier: the job finishes, no round is re-formed",
          "[rdzv][failures]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 3, .maxRestarts = 3};
  auto ho = agentOptions(server.port(), "lostend", 2, lim);
  ho.isHost = true;
  auto a = makeAgent(ho);
  auto b = makeAgent(agentOptions(server.port(), "lostend", 3, lim));
  auto c = makeAgent(agentOptions(server.port(), "lostend", 4, lim));
  allNextRound({a.get(), b.get(), c.get()});
  auto fa = std::async(std::launch::async, [&] { return a->rdzv->finishRound(); });
  CHECK(fa.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
  // b dies (its heartbeats stop) while a waits in the exit barrier: lost, not re-formed.
  b.reset();
  CHECK(fa.wait_for(kHeartbeatBound + Millis(400)) == std::future_status::timeout);
  CHECK(c->events.size() == 0);  // c's workers keep running: nobody restarts them
  CHECK(c->rdzv->finishRound() == DynamicRendezvous::AfterSuccess::Finished);
  CHECK(fa.get() == DynamicRendezvous::AfterSuccess::Finished);
  CHECK(a->rdzv->state().reason.find("lost in the exit barrier") != std::string::npos);
  CHECK(a->events.size() == 0);
  // A late arrival cannot start anything either.
  auto late = makeAgent(agentOptions(server.port(), "lostend", 5, lim));
  CHECK_THROWS_WITH(late->rdzv->nextRound(), Catch::Contains("already finished"));
}

TEST_CASE("closeJob: the store host waits until every node knows the job ended",
          "[rdzv][failures]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 2, .maxNodes = 2};
  auto ho = agentOptions(server.port(), "close", 2, lim);
  ho.isHost = true;
  ho.closeTimeout = Millis(60'000);
  auto host = makeAgent(ho);
  auto b = makeAgent(agentOptions(server.port(), "close", 3, lim));
  allNextRound({host.get(), b.get()});
  CHECK(b->rdzv->reportFailure(4, "exit code 4") == DynamicRendezvous::AfterFailure::JobFailed);
  auto e = host->events.next(Millis(5'000));
  REQUIRE(e);
  CHECK(e->kind == RoundEvent::Kind::JobFailed);
  auto closing = std::async(std::launch::async, [&] { host->rdzv->closeJob(); });
  CHECK(closing.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  const auto t0 = Clock::now();
  b->rdzv->closeJob();
  closing.get();
  CHECK(Clock::now() - t0 < Millis(30'000));  // released by b's acknowledgement, not the timeout
}

TEST_CASE("a node lost in process: only node rank 0 hears of it, the round goes on or re-forms "
          "as it answers", "[rdzv][failures]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 3, .maxRestarts = 2,
                      .keepRoundOnNodeLoss = true};
  std::vector<std::unique_ptr<Agent>> agents;
  for (int n : {2, 3, 4}) agents.push_back(makeAgent(agentOptions(server.port(), "lostproc", n, lim)));
  auto r = allNextRound({agents[0].get(), agents[1].get(), agents[2].get()});
  // Node ranks in arrival order (the default): a is whoever holds node rank 0, b 1 and c 2.
  const auto byRank = checkOneRound(r, {2, 3, 4}, {1, 1, 1});
  std::unique_ptr<Agent> a = std::move(agents[byRank[0]]);
  std::unique_ptr<Agent> b = std::move(agents[byRank[1]]);
  std::unique_ptr<Agent> c = std::move(agents[byRank[2]]);
  const std::string bId = b->rdzv->self().id;
  // b's heartbeats stop: node rank 0 (a) hears NodeLost, c hears nothing, the round goes on.
  b.reset();
  auto e = a->events.next(Millis(5'000));
  REQUIRE(e);
  CHECK(e->kind == RoundEvent::Kind::NodeLost);
  CHECK(e->lostId == bId);
  CHECK(e->lostNodeRank == 1);
  CHECK(e->round == r[0].round);
  CHECK(e->message.find("lost in process") != std::string::npos);
  CHECK_FALSE(c->events.next(Millis(300)).has_value());
  // In process: one restart, the same round; still nothing for c.
  CHECK(a->rdzv->reportNodeLoss("node rank 1 was lost", true) ==
        DynamicRendezvous::AfterRecovery::Recover);
  CHECK(a->rdzv->state().round == r[0].round);
  CHECK(a->rdzv->state().restarts == 1);
  CHECK_FALSE(c->events.next(Millis(300)).has_value());
  CHECK_FALSE(a->events.next(Millis(100)).has_value());  // once per lost node
  // c leaves the job for good while the round runs: lost in process too, and this time node
  // rank 0 re-forms without it (no restart spent), which every running agent hears.
  c->rdzv->leave("SIGTERM");
  auto e2 = a->events.next(Millis(5'000));
  REQUIRE(e2);
  CHECK(e2->kind == RoundEvent::Kind::NodeLost);
  CHECK(e2->lostNodeRank == 2);
  CHECK(a->rdzv->reportNodeLoss("node rank 2 was lost", false) ==
        DynamicRendezvous::AfterRecovery::Restart);
  CHECK(a->rdzv->state().round == r[0].round + 1);
  CHECK(a->rdzv->state().restarts == 1);
  // The next round: a alone, without b and c (neither is expected back).
  auto next = allNextRound({a.get()});
  CHECK(next[0].nodeCount == 1);
  CHECK(next[0].nodeRank == 0);
  CHECK(next[0].restartCount == 1);
}

namespace {

// A TCP relay on loopback between agents and their store that can be cut: after cut(), the
// next bytes a client sends close its connection (the store's host went away in the middle of
// a call) and new connections are refused (the port is closed).
class CuttableRelay {
 public:
  explicit CuttableRelay(uint16_t target) : target_(target) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listen_, 16) == 0);
    REQUIRE(::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~CuttableRelay() {
    stop_ = true;
    thread_.join();
    for (auto [c, s] : pairs_) {
      ::close(c);
      ::close(s);
    }
    if (listen_ >= 0) ::close(listen_);
  }
  uint16_t port() const { return port_; }
  void cut() { cut_ = true; }

 private:
  void run() {
    char buf[65536];
    while (!stop_) {
      if (cut_ && listen_ >= 0) {
        ::close(listen_);
        listen_ = -1;
      }
      std::vector<pollfd> fds;
      if (listen_ >= 0) fds.push_back({listen_, POLLIN, 0});
      for (auto [c, s] : pairs_) {
        fds.push_back({c, POLLIN, 0});
        fds.push_back({s, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      for (const auto& p : fds) {
        if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        if (p.fd == listen_) {
          const int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
          const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          sockaddr_in t{};
          t.sin_family = AF_INET;
          t.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          t.sin_port = htons(target_);
          if (c >= 0 && ::connect(s, reinterpret_cast<sockaddr*>(&t), sizeof t) == 0) {
            pairs_.emplace_back(c, s);
          } else {
            if (c >= 0) ::close(c);
            ::close(s);
          }
          continue;
        }
        for (size_t i = 0; i < pairs_.size(); ++i) {
          auto [c, s] = pairs_[i];
          if (p.fd != c && p.fd != s) continue;
          const ssize_t n = ::read(p.fd, buf, sizeof buf);
          const bool fromClient = p.fd == c;
          if (n <= 0 || (fromClient && cut_) ||
              ::write(fromClient ? s : c, buf, static_cast<size_t>(n)) != n) {
            ::close(c);
            ::close(s);
            pairs_.erase(pairs_.begin() + static_cast<std::ptrdiff_t>(i));
          }
          break;
        }
        break;  // the fd list changed or was served: poll again
      }
    }
  }

  uint16_t target_;
  int listen_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> cut_{false}, stop_{false};
  std::vector<std::pair<int, int>> pairs_;
  std::thread thread_;
};

}  // namespace

TEST_CASE("a leave after the store's host is gone returns within its bound, not after the "
          "store's connect timeout", "[rdzv][failures]") {
  // Every node of a job gets Ctrl-C at once: the agent that hosts the store exits, and another
  // one leaves the job at that moment. Its departure is best effort: it must not hold the node
  // for the store's connect timeout (20 s here) while the store's port refuses. The relay
  // closes the agent's connections at their next request and refuses the reconnects, as a
  // store host that has just exited does.
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  CuttableRelay relay(server.port());
  const JobLimits lim{.minNodes = 2, .maxNodes = 2};
  auto opts = [&](int n) {
    auto o = agentOptions(relay.port(), "leave-gone", n, lim);
    o.store.connectTimeout = Millis(20'000);
    o.store.timeout = Millis(20'000);
    o.heartbeat = {};  // no other connection that could see the cut first
    return o;
  };
  auto a = makeAgent(opts(2));
  auto b = makeAgent(opts(3));
  allNextRound({a.get(), b.get()});
  relay.cut();
  // A call of this agent's fails first (its connection is closed under it): the next one
  // reconnects, as the leave in the middle of a re-join does after the host's departure.
  CHECK_THROWS_AS(a->rdzv->roundMembers(), ddprun::Error);
  const auto t0 = Clock::now();
  std::string error;
  try {
    a->rdzv->leave("SIGINT");
  } catch (const ddprun::Error& e) {
    error = e.what();  // a failed departure is reported; the others evict it
  }
  const auto took = std::chrono::duration_cast<Millis>(Clock::now() - t0);
  INFO("the leave took " << took.count() << " ms: " << error);
  CHECK(took < Millis(8'000));  // at most 2 s per store call; without the bound 20 s
}
