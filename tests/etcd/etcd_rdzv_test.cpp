// The rendezvous on a real etcd (one member of Debian's etcd-server on loopback): agents on
// --rdzv-backend=etcd-v3 form their rounds by the slot join, as on the ddprun store -- a slot is
// a ticket (one txn, no retry however many join at once), one state version closes the round
// and names its member list instead of carrying it, the etcd requests per agent do not grow with
// the number of agents, and a node whose lease goes is evicted through the ring of the list;
// each agent's lease liveness watches only its ring successor's key (O(1) watch events per
// agent, where every agent watching all of alive/ cost etcd N^2 per formation).
#include <catch2/catch.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <sstream>

#include "etcd_cluster.h"
#include "rendezvous/dynamic_rendezvous.h"
#include "rendezvous/etcd/etcd_backend.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/scalable/slot_join.h"
#include "../rendezvous/rdzv_agents.h"

using namespace etcdtest;
using namespace ddprun::rendezvous;
using rdzvtest::Agent;
using rdzvtest::allNextRound;
using rdzvtest::makeAgent;

namespace {

EtcdCluster& sharedCluster() {
  static EtcdCluster cluster(1);
  return cluster;
}

// The etcd backend, with every store connection of one agent kept so that the test can add up
// the HTTP requests they sent (watch streams not included).
class CountedEtcdBackend final : public RendezvousBackend {
 public:
  explicit CountedEtcdBackend(etcd::EtcdBackendOptions o) : inner_(std::move(o)) {}
  std::string name() const override { return inner_.name(); }
  std::string describe() const override { return inner_.describe(); }
  InterruptibleStore connect(const std::string& runId) const override {
    InterruptibleStore s = inner_.connect(runId);
    std::lock_guard<std::mutex> g(mu_);
    stores_.push_back(std::dynamic_pointer_cast<etcd::EtcdStore>(s.store));
    return s;
  }
  std::unique_ptr<Liveness> startLiveness(LivenessContext ctx) const override {
    return inner_.startLiveness(std::move(ctx));
  }
  std::string localAddress() const override { return inner_.localAddress(); }
  bool slotJoin() const override { return inner_.slotJoin(); }
  int64_t requests() const {
    std::lock_guard<std::mutex> g(mu_);
    int64_t n = 0;
    for (const auto& s : stores_) n += s ? s->client().requests() : 0;
    return n;
  }

 private:
  etcd::EtcdBackend inner_;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<etcd::EtcdStore>> stores_;
};

struct EtcdAgents {
  std::vector<std::shared_ptr<CountedEtcdBackend>> backends;
  std::vector<std::unique_ptr<Agent>> agents;
  std::vector<Agent*> ptrs() const {
    std::vector<Agent*> out;
    for (const auto& a : agents) out.push_back(a.get());
    return out;
  }
};

EtcdAgents startAgents(const std::string& runId, int n, JobLimits lim, bool arrival = false,
                       const std::function<int(int)>& nprocOf = {}) {
  EtcdAgents out;
  for (int i = 0; i < n; ++i) {
    auto backend = std::make_shared<CountedEtcdBackend>(etcd::EtcdBackendOptions{
        .client = sharedCluster().clientOptions(), .keyPrefix = "/ddprun-test-rdzv",
        .leaseTtl = Millis(2'000)});
    auto o = rdzvtest::agentOptions(0, runId, 2 + i, lim);
    o.backend = backend;
    o.store.timeout = Millis(10'000);
    o.joinTimeout = Millis(30'000);
    o.lastCallTimeout = Millis(600'000);  // the round closes at MAX, or not at all
    o.exitBarrierTimeout = Millis(30'000);
    o.heartbeat = {};
    o.arrivalRanks = arrival;
    if (nprocOf) o.nproc = nprocOf(i);
    out.backends.push_back(backend);
    out.agents.push_back(makeAgent(o));
  }
  return out;
}

int64_t median(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Forms round 0 with n agents (MAX = n) and returns each agent's etcd requests for it.
std::vector<int64_t> formAndCount(const std::string& runId, int n) {
  EtcdAgents a = startAgents(runId, n, {.minNodes = 1, .maxNodes = n});
  std::vector<int64_t> before;
  for (const auto& b : a.backends) before.push_back(b->requests());
  auto rounds = allNextRound(a.ptrs());
  std::set<int> ranks;
  for (const auto& r : rounds) ranks.insert(r.nodeRank);
  CHECK(static_cast<int>(ranks.size()) == n);
  std::vector<int64_t> cost;
  for (size_t i = 0; i < a.backends.size(); ++i) cost.push_back(a.backends[i]->requests() - before[i]);
  return cost;
}

// A counter of etcd's /metrics (Prometheus text), read over a plain HTTP/1.0 GET.
double etcdMetric(const MemberAddress& m, const std::string& name) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(m.port);
  ::inet_pton(AF_INET, m.host.c_str(), &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: " + m.text() + "\r\n\r\n";
  REQUIRE(::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  std::string reply;
  char buf[65536];
  for (ssize_t k; (k = ::read(fd, buf, sizeof buf)) > 0;) reply.append(buf, static_cast<size_t>(k));
  ::close(fd);
  std::istringstream in(reply);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  FAIL("etcd's /metrics has no " << name);
  return 0;
}

}  // namespace

TEST_CASE("etcd rendezvous: the lease liveness costs etcd O(1) watch events per agent to form "
          "(each agent watches its ring successor's key, not all of alive/)",
          "[etcd][rdzv][liveness]") {
  const MemberAddress member = sharedCluster().endpoints().front();
  const std::string kEvents = "etcd_debugging_mvcc_events_total";
  auto eventsFor = [&](const std::string& runId, int n) {
    const double before = etcdMetric(member, kEvents);
    EtcdAgents a = startAgents(runId, n, {.minNodes = 1, .maxNodes = n});
    auto rounds = allNextRound(a.ptrs());
    std::set<int> ranks;
    for (const auto& r : rounds) ranks.insert(r.nodeRank);
    CHECK(static_cast<int>(ranks.size()) == n);
    return etcdMetric(member, kEvents) - before;  // before the agents go (their revokes)
  };
  const double small = eventsFor("events4", 4);
  const double large = eventsFor("events32", 32);
  INFO("watch events etcd sent to form: 4 agents " << small << ", 32 agents " << large);
  // Every agent watching alive/ got each later agent's announcement: 32 x 31 / 2 = 496 events
  // at 32 agents on top of the join's own (a few per agent).
  CHECK(large / 32 <= small / 4 + 2);
  CHECK(large <= 32 * 6);
}

TEST_CASE("etcd rendezvous: the slot join forms a round with one compact version, re-forms "
          "after a node's lease goes, and finishes with tickets",
          "[etcd][rdzv][slots]") {
  const JobLimits lim{.minNodes = 4, .maxNodes = 8};
  EtcdAgents a = startAgents("eight", 8, lim);
  auto rounds = allNextRound(a.ptrs());
  std::set<int> ranks;
  for (const auto& r : rounds) {
    ranks.insert(r.nodeRank);
    CHECK(r.nodeCount == 8);
    CHECK(r.worldSize == 8);
    CHECK(r.masterAddr == rounds[0].masterAddr);
  }
  CHECK(ranks.size() == 8);  // dense and unique: 0..7
  CHECK(*ranks.rbegin() == 7);

  etcd::EtcdStore s(sharedCluster().clientOptions(), "/ddprun-test-rdzv/eight/");
  const std::string closed = s.get("state/1");
  CHECK_FALSE(s.check({"state/2"}));  // nobody appended itself
  // "members-list <ref> <count> <world> <master addr> <port>": it names the list ...
  const size_t at = closed.find("\nmembers-list ");
  REQUIRE(at != std::string::npos);
  std::istringstream line(closed.substr(at + 1));
  std::string tag;
  int64_t ref = 0, count = 0, world = 0;
  line >> tag >> ref >> count >> world;
  CHECK(ref > 0);
  CHECK(count == 8);
  CHECK(world == 8);
  CHECK(closed.find("\nmember ") == std::string::npos);  // ... instead of carrying it
  CHECK(s.ticketCount("r/0/count") == 8);  // slots are tickets: no ADD counter was written
  CHECK_FALSE(s.check({"r/0/count"}));
  for (int slot = 1; slot <= 8; ++slot) CHECK(s.check({"r/0/node/" + std::to_string(slot)}));

  // A node goes without leaving (its lease is revoked as its liveness stops): the node before
  // it in the member list evicts it, and the survivors re-form round 1 with 7.
  a.agents[5].reset();
  std::vector<Agent*> rest;
  for (const auto& ag : a.agents)
    if (ag) rest.push_back(ag.get());
  for (Agent* ag : rest) REQUIRE(ag->events.next(Millis(20'000)));
  auto again = allNextRound(rest);
  std::set<int> ranks2;
  for (const auto& r : again) {
    CHECK(r.round == 1);
    CHECK(r.nodeCount == 7);
    ranks2.insert(r.nodeRank);
  }
  CHECK(ranks2.size() == 7);
  CHECK(*ranks2.rbegin() == 6);

  // The exit barrier: each done node takes a ticket of r/1/done; every node sees Finished.
  std::vector<std::future<DynamicRendezvous::AfterSuccess>> done;
  for (Agent* ag : rest)
    done.push_back(std::async(std::launch::async, [ag] { return ag->rdzv->finishRound(); }));
  for (auto& f : done) CHECK(f.get() == DynamicRendezvous::AfterSuccess::Finished);
  CHECK(s.ticketCount("r/1/done") == 7);
  for (int d = 1; d <= 7; ++d) CHECK(s.check({"r/1/done/" + std::to_string(d)}));
}

TEST_CASE("etcd rendezvous: the etcd requests per agent to form a round do not grow with N",
          "[etcd][rdzv][slots]") {
  const auto small = formAndCount("grow4", 4);
  const auto large = formAndCount("grow24", 24);
  INFO("requests per agent, median / max: 4 agents " << median(small) << " / "
       << *std::max_element(small.begin(), small.end()) << ", 24 agents " << median(large)
       << " / " << *std::max_element(large.begin(), large.end()));
  // The median agent: a ticket, its record, the wait for the closing version, its own entry.
  // A contended ADD would cost the median agent about N/2 more (one retry per earlier writer).
  CHECK(median(large) <= median(small) + 1);
  CHECK(median(large) <= 12);
  // The closer reads every record: in txns of 128 keys, so a few more, not N more.
  CHECK(*std::max_element(large.begin(), large.end()) <=
        *std::max_element(small.begin(), small.end()) + 4);
}

TEST_CASE("etcd rendezvous: with rank_order=arrival the round closes from the counters (no agent "
          "reads the records): weighted tickets give each node its first global rank",
          "[etcd][rdzv][slots]") {
  // Nodes of 1, 2 and 3 processes: the first global ranks are running sums of the slots' nproc.
  constexpr int n = 9;
  auto nprocOf = [](int i) { return 1 + i % 3; };
  EtcdAgents a = startAgents("arrival9", n, {.minNodes = 1, .maxNodes = n}, true, nprocOf);
  auto rounds = allNextRound(a.ptrs());
  std::vector<int> nprocAt(n, 0), offsetAt(n, -1);
  int world = 0;
  for (int i = 0; i < n; ++i) {
    const auto& r = rounds[static_cast<size_t>(i)];
    REQUIRE(r.nodeRank >= 0);
    REQUIRE(r.nodeRank < n);
    nprocAt[static_cast<size_t>(r.nodeRank)] = nprocOf(i);
    offsetAt[static_cast<size_t>(r.nodeRank)] = r.rankOffset;
    world += nprocOf(i);
  }
  int sum = 0;
  for (int rank = 0; rank < n; ++rank) {  // dense, unique, and prefix sums in node-rank order
    INFO("node rank " << rank);
    CHECK(offsetAt[static_cast<size_t>(rank)] == sum);
    sum += nprocAt[static_cast<size_t>(rank)];
  }
  for (const auto& r : rounds) {
    CHECK(r.worldSize == world);
    CHECK(r.nodeCount == n);
    CHECK(r.masterAddr == rounds[0].masterAddr);
  }
  etcd::EtcdStore s(sharedCluster().clientOptions(), "/ddprun-test-rdzv/arrival9/");
  // The closing version names the joiners' own list (slotListRef: 10^9 + round), which only the
  // counters' closer writes: the record-reading closer writes a list of its own.
  const std::string closed = s.get("state/1");
  const size_t at = closed.find("\nmembers-list ");
  REQUIRE(at != std::string::npos);
  std::istringstream line(closed.substr(at + 1));
  std::string tag;
  int64_t ref = 0, count = 0, w = 0;
  line >> tag >> ref >> count >> w;
  CHECK(ref == scalable::slotListRef(0));
  CHECK(count == n);
  CHECK(w == world);
  CHECK(s.get("r/0/world") == std::to_string(world));  // written by the target's holder
  CHECK(s.ticketCount("r/0/written") == n);
}

TEST_CASE("etcd rendezvous: arrival ranks refuse a world size written before the round's target "
          "holder (forged), naming the key, and leave it as it was", "[etcd][rdzv][slots]") {
  etcd::EtcdStore s(sharedCluster().clientOptions(), "/ddprun-test-rdzv/forgedworld/");
  s.set("r/0/world", "999");  // a stranger with access to the job's etcd prefix, first
  EtcdAgents a = startAgents("forgedworld", 1, {.minNodes = 1, .maxNodes = 1}, true);
  CHECK_THROWS_WITH(a.agents[0]->rdzv->nextRound(),
                    Catch::Contains("r/0/world") && Catch::Contains("corrupt or forged"));
  CHECK(s.get("r/0/world") == "999");
  // The record and the list entries of that create went with it: all or none.
  CHECK_FALSE(s.check({"r/0/node/1"}));
}
