#pragma once
// CountingStore: a Store decorator that counts what one client costs the store -- round
// trips and payload bytes -- so that the rendezvous's cost per agent can be measured, and
// bounded by a test, as a number rather than guessed from wall time (issue 20).
//
// Every Store call is one round trip against ddprun-store (get is WAIT_GET), so each call
// counts 1, counted before it is made (a call that times out was still made). Bytes are the
// payload: keys and values sent, values received; framing (a few bytes per field) and the
// connection's handshake are not counted. Counters are atomics: the threads of one agent
// (its round watcher, heartbeats) may share one StoreTraffic.
//
// CountingBackend is the TCP store backend (rendezvous_backend.h) whose every connection is
// counted into one StoreTraffic: give each simulated agent its own.
#include <atomic>
#include <memory>

#include "rendezvous/heartbeat.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/rendezvous_backend.h"
#include "rendezvous/tcp_store.h"

namespace ddprun::rendezvous {

struct StoreTraffic {
  std::atomic<int64_t> roundTrips{0};
  std::atomic<int64_t> bytes{0};  // payload, both directions

  struct Snapshot {
    int64_t roundTrips = 0;
    int64_t bytes = 0;
    Snapshot operator-(const Snapshot& o) const {
      return {roundTrips - o.roundTrips, bytes - o.bytes};
    }
  };
  Snapshot snapshot() const { return {roundTrips.load(), bytes.load()}; }
};

class CountingStore final : public Store {
 public:
  CountingStore(std::shared_ptr<Store> inner, std::shared_ptr<StoreTraffic> traffic)
      : Store(inner->timeout()), inner_(std::move(inner)), t_(std::move(traffic)) {}

  void set(const std::string& key, const std::string& value) override {
    count(key.size() + value.size());
    inner_->set(key, value);
  }
  std::string get(const std::string& key) override {
    count(key.size());
    return received(inner_->get(key));
  }
  int64_t add(const std::string& key, int64_t delta) override {
    count(key.size() + 8);
    const int64_t v = inner_->add(key, delta);
    t_->bytes += 8;
    return v;
  }
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override {
    count(key.size() + expected.size() + desired.size());
    return received(inner_->compareSet(key, expected, desired));
  }
  bool check(const std::vector<std::string>& keys) override {
    count(sizes(keys));
    return inner_->check(keys);
  }
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    count(sizes(keys));
    inner_->wait(keys, timeout);
  }
  std::optional<std::string> waitGet(const std::string& key, Millis timeout) override {
    count(key.size());
    auto v = inner_->waitGet(key, timeout);
    if (v) t_->bytes += static_cast<int64_t>(v->size());
    return v;
  }
  bool deleteKey(const std::string& key) override {
    count(key.size());
    return inner_->deleteKey(key);
  }
  int64_t numKeys() override {
    count(0);
    return inner_->numKeys();
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    count(sizes(keys));
    auto v = inner_->multiGet(keys);
    t_->bytes += static_cast<int64_t>(sizes(v));
    return v;
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override {
    count(sizes(keys) + sizes(values));
    inner_->multiSet(keys, values);
  }
  void append(const std::string& key, const std::string& value) override {
    count(key.size() + value.size());
    inner_->append(key, value);
  }
  void giveUpWhenRefused() override { inner_->giveUpWhenRefused(); }
  bool hasTickets() const override { return inner_->hasTickets(); }
  int64_t takeTicket(const std::string& counter, const std::string& member) override {
    count(counter.size() + member.size());
    const int64_t v = inner_->takeTicket(counter, member);
    t_->bytes += 8;
    return v;
  }
  int64_t ticketCount(const std::string& counter) override {
    count(counter.size());
    const int64_t v = inner_->ticketCount(counter);
    t_->bytes += 8;
    return v;
  }
  Ticket takeWeightedTicket(const std::string& counter, const std::string& member,
                            int64_t weight) override {
    count(counter.size() + member.size() + 8);
    const Ticket v = inner_->takeWeightedTicket(counter, member, weight);
    t_->bytes += 16;
    return v;
  }
  void createAll(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override {
    count(sizes(keys) + sizes(values));
    inner_->createAll(keys, values);
  }
  // One request on a store with tickets (etcd: one txn); elsewhere the default's calls, each
  // counted (store.h).
  std::vector<std::optional<std::string>> readAll(const std::vector<std::string>& keys) override {
    if (!inner_->hasTickets()) return Store::readAll(keys);
    count(sizes(keys));
    auto v = inner_->readAll(keys);
    for (const auto& x : v)
      if (x) t_->bytes += static_cast<int64_t>(x->size());
    return v;
  }
  std::string compareSetAndSet(const std::string& key, const std::string& expected,
                               const std::string& desired, const std::vector<std::string>& keys,
                               const std::vector<std::string>& values) override {
    if (!inner_->hasTickets()) return Store::compareSetAndSet(key, expected, desired, keys, values);
    count(key.size() + expected.size() + desired.size() + sizes(keys) + sizes(values));
    return received(inner_->compareSetAndSet(key, expected, desired, keys, values));
  }

 private:
  static size_t sizes(const std::vector<std::string>& v) {
    size_t n = 0;
    for (const auto& s : v) n += s.size();
    return n;
  }
  void count(size_t sent) {
    ++t_->roundTrips;
    t_->bytes += static_cast<int64_t>(sent);
  }
  std::string received(std::string v) {
    t_->bytes += static_cast<int64_t>(v.size());
    return v;
  }

  std::shared_ptr<Store> inner_;
  std::shared_ptr<StoreTraffic> t_;
};

// TcpStoreBackend with every connection counted into `traffic`.
class CountingBackend final : public RendezvousBackend {
 public:
  // `slotJoin`: form rounds as the agents on a ddprun store do (the slot join); false: the
  // state-log join they ran before (each joiner appends itself), kept for comparison.
  CountingBackend(TcpStoreOptions store, HeartbeatOptions heartbeat,
                  std::shared_ptr<StoreTraffic> traffic, bool slotJoin = true)
      : store_(std::move(store)), heartbeat_(heartbeat), traffic_(std::move(traffic)),
        slotJoin_(slotJoin) {}
  std::string name() const override { return "c10d"; }
  std::string describe() const override {
    return store_.host + ":" + std::to_string(store_.port);
  }
  InterruptibleStore connect(const std::string& runId) const override {
    return connectWith(store_, traffic_, runId);
  }
  std::unique_ptr<Liveness> startLiveness(LivenessContext ctx) const override {
    if (heartbeat_.interval.count() <= 0) return nullptr;
    return std::make_unique<HeartbeatRing>(
        ctx, heartbeat_, [store = store_, traffic = traffic_, runId = ctx.runId](Millis within) {
          return connectWith(boundedLazyConnection(store, within), traffic, runId);
        });
  }
  std::string localAddress() const override { return "127.0.0.1"; }
  bool slotJoin() const override { return slotJoin_; }

 private:
  static InterruptibleStore connectWith(const TcpStoreOptions& options,
                                        const std::shared_ptr<StoreTraffic>& traffic,
                                        const std::string& runId) {
    auto tcp = std::make_shared<TcpStore>(options);
    auto counted = std::make_shared<CountingStore>(tcp, traffic);
    return {std::make_shared<PrefixStore>("ddprun/rdzv/" + runId, counted),
            [tcp] { tcp->interrupt(); }, [tcp] { tcp->cancelCall(); },
            [tcp](bool on) { tcp->setWaitsCancelled(on); }};
  }

  TcpStoreOptions store_;
  HeartbeatOptions heartbeat_;
  std::shared_ptr<StoreTraffic> traffic_;
  bool slotJoin_;
};

}  // namespace ddprun::rendezvous
