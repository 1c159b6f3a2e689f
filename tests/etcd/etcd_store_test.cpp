// The Store on a real 3-member etcd cluster (Debian's etcd-server on loopback): the Store
// semantics the rendezvous relies on, races between threads, WAIT without polling, and what
// happens when members die: failover, quorum loss (a clear error, never a hang), a member
// restarted. Leases as the liveness signal uses them.
#include <catch2/catch.hpp>

#include <atomic>
#include <boost/asio/ssl/context.hpp>
#include <cstdlib>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "etcd_cluster.h"
#include "rendezvous/etcd/etcd_store.h"

using ddprun::rendezvous::Store;
using namespace etcdtest;
using namespace ddprun;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

EtcdCluster& sharedCluster() {
  static EtcdCluster cluster(3);
  return cluster;
}

std::string uniquePrefix() {
  static std::atomic<int> n{0};
  return "/ddprun-test/" + std::to_string(::getpid()) + "/" + std::to_string(n++) + "/";
}

}  // namespace

TEST_CASE("etcd store: the Store semantics", "[etcd][store]") {
  EtcdStore s(sharedCluster().clientOptions(), uniquePrefix());
  s.set("a", "1");
  CHECK(s.get("a") == "1");
  const std::string binary("x\0y\xff\n", 5);
  s.set("bin", binary);
  CHECK(s.get("bin") == binary);
  CHECK(s.add("n", 5) == 5);
  CHECK(s.add("n", -2) == 3);
  CHECK(s.get("n") == "3");
  CHECK_THROWS_AS(s.add("bin", 1), StoreError);
  // compareSet as c10d's: create on "", swap on equal, else return the current value.
  CHECK(s.compareSet("c", "", "first") == "first");
  CHECK(s.compareSet("c", "", "second") == "first");
  CHECK(s.compareSet("c", "first", "third") == "third");
  CHECK(s.compareSet("c", "nope", "fourth") == "third");
  CHECK(s.compareSet("missing", "something", "x") == "something");  // the quirk
  CHECK_FALSE(s.check({"missing"}));
  s.set("empty", "");
  CHECK(s.compareSet("empty", "", "filled") == "filled");
  CHECK(s.check({"a", "c"}));
  CHECK_FALSE(s.check({"a", "zzz"}));
  s.multiSet({"m1", "m2", "m3"}, {"x", "", "z"});
  CHECK(s.multiGet({"m3", "m2", "m1"}) == std::vector<std::string>{"z", "", "x"});
  s.append("log", "ab");
  s.append("log", "cd");
  CHECK(s.get("log") == "abcd");
  const int64_t before = s.numKeys();
  CHECK(s.deleteKey("a"));
  CHECK_FALSE(s.deleteKey("a"));
  CHECK(s.numKeys() == before - 1);
  const auto t0 = Clock::now();
  CHECK_THROWS_AS(s.wait({"never"}, Millis(300)), TimeoutError);
  CHECK(since(t0) >= 0.29);
  s.setTimeout(Millis(200));
  CHECK_THROWS_WITH(s.get("never"), Catch::Contains("never") && Catch::Contains("etcd at"));
}

TEST_CASE("etcd store: racing writers -- adds never lost, one compare-set winner",
          "[etcd][store]") {
  const std::string prefix = uniquePrefix();
  constexpr int kThreads = 6, kAdds = 40;
  std::vector<std::thread> threads;
  std::atomic<int> winners{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      EtcdStore s(sharedCluster().clientOptions(), prefix);
      for (int i = 0; i < kAdds; ++i) s.add("counter", 1);
      const std::string mine = "writer-" + std::to_string(t);
      if (s.compareSet("state/1", "", mine) == mine) ++winners;
    });
  }
  for (auto& th : threads) th.join();
  EtcdStore s(sharedCluster().clientOptions(), prefix);
  CHECK(s.get("counter") == std::to_string(kThreads * kAdds));
  CHECK(winners == 1);
}

TEST_CASE("etcd store: tickets -- k members at once get 1..k with one request each, the "
          "same number again on a retry, a forged ticket refused",
          "[etcd][store][tickets]") {
  const std::string prefix = uniquePrefix();
  constexpr int k = 24;
  std::vector<std::unique_ptr<EtcdStore>> stores;
  for (int i = 0; i < k; ++i)
    stores.push_back(std::make_unique<EtcdStore>(sharedCluster().clientOptions(), prefix));
  std::vector<int64_t> got(k), requests(k);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < k; ++i) {
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      const int64_t before = stores[i]->client().requests();
      got[i] = stores[i]->takeTicket("r/1/count", "node-" + std::to_string(i));
      requests[i] = stores[i]->client().requests() - before;
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  std::set<int64_t> numbers(got.begin(), got.end());
  CHECK(numbers.size() == static_cast<size_t>(k));  // unique ...
  CHECK(*numbers.begin() == 1);                     // ... and dense: 1..k
  CHECK(*numbers.rbegin() == k);
  for (int i = 0; i < k; ++i) CHECK(requests[i] == 1);  // no retry, however many at once
  CHECK(stores[0]->ticketCount("r/1/count") == k);
  CHECK(stores[0]->ticketCount("r/2/count") == 0);
  // Asked again (a retried request), a member gets its own number back.
  CHECK(stores[7]->takeTicket("r/1/count", "node-7") == got[7]);
  CHECK(stores[0]->ticketCount("r/1/count") == k);
  // A ticket key holding another value is a forgery, named.
  stores[0]->set("r/1/count.t/intruder", "someone-else");
  CHECK_THROWS_WITH(stores[0]->takeTicket("r/1/count", "intruder"),
                    Catch::Contains("corrupt or forged") && Catch::Contains("r/1/count.t/intruder"));
}

TEST_CASE("etcd store: weighted tickets -- k members at once get 1..k and the running sum of "
          "the weights in ticket order, with one request each, and createAll creates all or none",
          "[etcd][store][tickets]") {
  const std::string prefix = uniquePrefix();
  constexpr int k = 16;
  std::vector<std::unique_ptr<EtcdStore>> stores;
  for (int i = 0; i < k; ++i)
    stores.push_back(std::make_unique<EtcdStore>(sharedCluster().clientOptions(), prefix));
  // Weights with several bits set, the largest allowed among them.
  auto weightOf = [](int i) -> int64_t { return i == 5 ? Store::kMaxTicketWeight : 1 + 7 * i; };
  std::vector<Store::Ticket> got(k);
  std::vector<int64_t> requests(k);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < k; ++i) {
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      const int64_t before = stores[i]->client().requests();
      got[i] = stores[i]->takeWeightedTicket("r/1/count", "node-" + std::to_string(i), weightOf(i));
      requests[i] = stores[i]->client().requests() - before;
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  // In ticket order, each one's running sum is the one before plus its own weight.
  std::vector<int> byNumber(k + 1, -1);
  for (int i = 0; i < k; ++i) {
    REQUIRE(got[i].number >= 1);
    REQUIRE(got[i].number <= k);
    byNumber[static_cast<size_t>(got[i].number)] = i;
    CHECK(requests[i] == 1);
  }
  int64_t sum = 0;
  for (int n = 1; n <= k; ++n) {
    const int i = byNumber[static_cast<size_t>(n)];
    REQUIRE(i >= 0);  // dense and unique
    sum += weightOf(i);
    INFO("ticket " << n << " of member " << i);
    CHECK(got[i].weightThrough == sum);
  }
  CHECK(stores[0]->ticketCount("r/1/count") == k);
  // A retried request gets the same ticket and sum back.
  const Store::Ticket again = stores[9]->takeWeightedTicket("r/1/count", "node-9", weightOf(9));
  CHECK(again.number == got[9].number);
  CHECK(again.weightThrough == got[9].weightThrough);
  CHECK(stores[0]->ticketCount("r/1/count") == k);
  // A weight outside 1..2^16 is refused, named, and takes nothing.
  CHECK_THROWS_WITH(stores[0]->takeWeightedTicket("r/1/count", "heavy", Store::kMaxTicketWeight + 1),
                    Catch::Contains("weighing 65537"));
  CHECK_THROWS_WITH(stores[0]->takeWeightedTicket("r/1/count", "empty", 0),
                    Catch::Contains("weighing 0"));
  CHECK(stores[0]->ticketCount("r/1/count") == k);

  // createAll: all at once; again with the same values (a retry) is no error; a key holding
  // another value is named, and the keys it would have created stay absent.
  EtcdStore& s = *stores[0];
  s.createAll({"c/a", "c/b"}, {"1", "2"});
  CHECK(s.get("c/a") == "1");
  CHECK(s.get("c/b") == "2");
  s.createAll({"c/a", "c/b"}, {"1", "2"});
  CHECK_THROWS_WITH(s.createAll({"c/new", "c/b"}, {"3", "forged"}),
                    Catch::Contains("c/b") && Catch::Contains("corrupt or forged"));
  CHECK_FALSE(s.check({"c/new"}));
  CHECK(s.get("c/b") == "2");
}

// The two calls that keep an agent within issue 20's round trips on etcd (store.h): each one
// request, whatever the number of keys.
TEST_CASE("etcd store: readAll reads several keys in one request without waiting, "
          "compareSetAndSet sets its keys only when it wins, in the same request",
          "[etcd][store]") {
  EtcdStore s(sharedCluster().clientOptions(), uniquePrefix());
  s.set("a", "1");
  s.set("c", "3");
  int64_t before = s.client().requests();
  const auto got = s.readAll({"a", "b", "c"});
  CHECK(s.client().requests() - before == 1);
  REQUIRE(got.size() == 3);
  CHECK(got[0] == std::optional<std::string>("1"));
  CHECK_FALSE(got[1].has_value());  // missing: no wait
  CHECK(got[2] == std::optional<std::string>("3"));

  before = s.client().requests();
  CHECK(s.compareSetAndSet("state/1", "", "v1", {"m/1", "latest"}, {"1", "1"}) == "v1");
  CHECK(s.client().requests() - before == 1);
  CHECK(s.get("m/1") == "1");
  CHECK(s.get("latest") == "1");
  // A loser gets the winner's value back and sets nothing.
  before = s.client().requests();
  CHECK(s.compareSetAndSet("state/1", "", "v1-other", {"m/2", "latest"}, {"2", "2"}) == "v1");
  CHECK(s.client().requests() - before == 1);
  CHECK_FALSE(s.check({"m/2"}));
  CHECK(s.get("latest") == "1");
  // Expecting a value: swapped, with the keys.
  CHECK(s.compareSetAndSet("state/1", "v1", "v1b", {"m/3"}, {"3"}) == "v1b");
  CHECK(s.get("m/3") == "3");
}

TEST_CASE("etcd store: a WAIT returns when another client sets the key", "[etcd][store]") {
  const std::string prefix = uniquePrefix();
  EtcdStore waiter(sharedCluster().clientOptions(), prefix);
  // t0 is taken here, not on the waiting thread, which a loaded machine may start late.
  const auto t0 = Clock::now();
  auto done = std::async(std::launch::async, [&] {
    waiter.wait({"k1", "k2"}, Millis(10'000));
    return since(t0);
  });
  std::this_thread::sleep_for(Millis(300));
  EtcdStore writer(sharedCluster().clientOptions(), prefix);
  writer.set("k2", "");
  std::this_thread::sleep_for(Millis(100));
  // One of the two keys is not enough.
  CHECK(done.wait_for(Millis(0)) == std::future_status::timeout);
  writer.set("k1", "");
  const double took = done.get();
  CHECK(took >= 0.4);
  CHECK(took < 3.0);
}

TEST_CASE("etcd store: interrupt() ends a WAIT at once", "[etcd][store]") {
  EtcdStore s(sharedCluster().clientOptions(), uniquePrefix());
  auto r = std::async(std::launch::async, [&] {
    const auto t0 = Clock::now();
    try {
      s.wait({"never"}, Millis(20'000));
    } catch (const NetworkError&) {
      return since(t0);
    }
    return -1.0;
  });
  std::this_thread::sleep_for(Millis(200));
  s.interrupt();
  const double took = r.get();
  CHECK(took > 0);
  CHECK(took < 2.0);
  CHECK_THROWS_AS(s.set("x", "y"), NetworkError);
}

TEST_CASE("etcd leases: keepalive, bound keys, revoke, expiry seen by a watch",
          "[etcd][lease]") {
  const std::string prefix = uniquePrefix();
  EtcdClient c(sharedCluster().clientOptions());
  LeaseReply g = c.leaseGrant(2);
  CHECK(g.id != 0);
  CHECK(g.ttl == 2);
  CHECK(c.leaseKeepAlive(g.id).ttl == 2);
  c.put({.key = prefix + "alive/x", .value = "", .lease = g.id});
  const int64_t rev = c.range({.key = prefix + "alive/x"}).header.revision;
  c.leaseRevoke(g.id);
  CHECK(c.range({.key = prefix + "alive/x"}).kvs.empty());
  CHECK(c.leaseKeepAlive(g.id).ttl == 0);  // gone
  CHECK_THROWS_AS(c.put({.key = prefix + "y", .value = "", .lease = g.id}), EtcdError);

  // Expiry: a watch sees the DELETE within the TTL plus etcd's check interval.
  LeaseReply l = c.leaseGrant(2);
  c.put({.key = prefix + "alive/y", .value = "", .lease = l.id});
  EtcdWatch w(sharedCluster().clientOptions(),
              {.key = prefix + "alive/", .rangeEnd = prefixEnd(prefix + "alive/"),
               .startRevision = rev + 1});
  const auto t0 = Clock::now();
  bool deleted = false;
  while (!deleted && since(t0) < 10) {
    for (const Event& e : w.next(Clock::now() + Millis(10'000))) {
      if (e.type == Event::Type::Delete && e.kv.key == prefix + "alive/y") deleted = true;
    }
  }
  CHECK(deleted);
  CHECK(since(t0) < 4.5);
}

TEST_CASE("etcd failover: kill -9 of the leader is invisible to a client and its watch",
          "[etcd][failover]") {
  EtcdCluster cluster(3);
  const std::string prefix = uniquePrefix();
  EtcdStore s(cluster.clientOptions(), prefix);
  s.set("before", "1");
  EtcdStore waiter(cluster.clientOptions(), prefix);
  auto waited = std::async(std::launch::async, [&] { waiter.wait({"after"}, Millis(20'000)); });
  std::this_thread::sleep_for(Millis(200));
  const int leader = cluster.leader();
  REQUIRE(leader >= 0);
  cluster.kill(leader);
  const auto t0 = Clock::now();
  s.set("after", "2");  // served once the other two have elected a leader
  CHECK(s.add("n", 1) == 1);
  CHECK(s.get("before") == "1");
  waited.get();  // the waiter's watch moved to a live member and saw the PUT
  INFO("writes resumed " << since(t0) << " s after the leader was killed");
  CHECK(since(t0) < 8);

  // A member restarted on its data directory rejoins; the cluster then survives losing another.
  cluster.restart(leader);
  std::this_thread::sleep_for(Millis(1500));
  const int next = cluster.leader();
  REQUIRE(next >= 0);
  cluster.kill(next);
  s.set("after-restart", "3");
  CHECK(s.get("after") == "2");
}

TEST_CASE("etcd quorum lost: calls and watches fail in bounded time naming every endpoint",
          "[etcd][failover]") {
  EtcdCluster cluster(3);
  EtcdClientOptions opts = cluster.clientOptions(Millis(3'000));
  EtcdStore s(opts, uniquePrefix());
  s.set("k", "v");
  EtcdStore waiter(opts, s.prefix());
  auto waited = std::async(std::launch::async, [&]() -> std::string {
    try {
      waiter.wait({"never"}, Millis(60'000));
    } catch (const TimeoutError& e) {
      return std::string("TimeoutError: ") + e.what();
    } catch (const NetworkError& e) {
      return e.what();
    }
    return "returned";
  });
  std::this_thread::sleep_for(Millis(300));
  cluster.kill(0);
  cluster.kill(1);
  const auto t0 = Clock::now();
  std::string error;
  try {
    s.set("k", "w");
  } catch (const NetworkError& e) {
    error = e.what();
  }
  const double callTook = since(t0);
  INFO(error);
  CHECK(callTook < 3.0 + 2.5);
  for (const auto& ep : cluster.endpoints()) CHECK_THAT(error, Catch::Contains(ep.text()));
  CHECK_THAT(error, Catch::Contains("etcd at"));
  const std::string werr = waited.get();
  INFO(werr);
  CHECK(since(t0) < 3.0 + 10.0);
  CHECK_THAT(werr, Catch::Contains("etcd at") && !Catch::Contains("TimeoutError"));
}

namespace {

// A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl.
struct Certificates {
  std::string dir;
  explicit Certificates(const std::string& d) : dir(d) {
    const std::string script =
        "set -e; cd '" + dir + "'; "
        "k='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'; "
        "openssl req -x509 $k -keyout ca.key -out ca.pem -days 2 -subj /CN=ddprun-test-ca; "
        "openssl req -x509 $k -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=other; "
        "for who in server client; do "
        "  openssl req $k -keyout $who.key -out $who.csr -subj /CN=127.0.0.1; "
        "  printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > $who.ext; "
        "  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "    -extfile $who.ext -out $who.pem; "
        "done";
    std::ofstream(dir + "/make.sh") << script << "\n";
    if (std::system(("sh '" + dir + "/make.sh' > '" + dir + "/openssl.log' 2>&1").c_str()) != 0)
      FAIL("openssl could not make the test certificates: see " + dir + "/openssl.log");
  }
  std::string path(const std::string& f) const { return dir + "/" + f; }
};

}  // namespace

TEST_CASE("etcd over TLS: client certificates, a wrong CA or none is refused clearly",
          "[etcd][tls]") {
  char tmpl[] = "/tmp/ddprun-etcd-tls-XXXXXX";
  Certificates certs(::mkdtemp(tmpl));
  auto tls = makeTlsContext({certs.path("ca.pem"), certs.path("client.pem"), certs.path("client.key")});
  EtcdCluster cluster(3,
                      {"--cert-file", certs.path("server.pem"), "--key-file", certs.path("server.key"),
                       "--trusted-ca-file", certs.path("ca.pem"), "--client-cert-auth"},
                      tls);
  EtcdStore s(cluster.clientOptions(), uniquePrefix());
  s.set("secret", "v");
  CHECK(s.get("secret") == "v");
  CHECK_THAT(s.describe(), Catch::StartsWith("etcd at https://127.0.0.1:"));

  auto refused = [&](std::shared_ptr<boost::asio::ssl::context> ctx) -> std::string {
    EtcdClientOptions o = cluster.clientOptions(Millis(1'500));
    o.tls = std::move(ctx);
    EtcdStore other(o, s.prefix());
    try {
      other.get("secret");
    } catch (const NetworkError& e) {
      return e.what();
    }
    return "served";
  };
  const std::string noCert = refused(makeTlsContext({certs.path("ca.pem"), "", ""}));
  INFO(noCert);
  CHECK_THAT(noCert, Catch::Contains("etcd at https://") && Catch::Contains("bad certificate"));
  const std::string wrongCa = refused(
      makeTlsContext({certs.path("other-ca.pem"), certs.path("client.pem"), certs.path("client.key")}));
  INFO(wrongCa);
  CHECK_THAT(wrongCa, Catch::Contains("TLS connect failed") && Catch::Contains("certificate verify failed"));
  std::error_code ec;
  std::filesystem::remove_all(certs.dir, ec);
}
