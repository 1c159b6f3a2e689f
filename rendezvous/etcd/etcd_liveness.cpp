#include "rendezvous/etcd/etcd_liveness.h"

#include "base/errors.h"
#include "base/log.h"

namespace ddprun::rendezvous::etcd {

namespace {
constexpr const char* kAlivePrefix = "alive/";
constexpr auto kForever = std::chrono::hours(24 * 365);
}  // namespace

std::string aliveKey(const std::string& id) { return kAlivePrefix + id; }

EtcdLiveness::EtcdLiveness(EtcdLivenessOptions options, const LivenessContext& ctx)
    : options_(std::move(options)), self_(ctx.self), limits_(ctx.limits), spill_(ctx.spill),
      view_(ctx.view),
      connect_(ctx.connect), onError_(ctx.onError) {
  EtcdClient c(options_.client);
  announce(c);
  view_.onChange([this] {
    {
      std::lock_guard<std::mutex> g(mu_);
      ++viewChanges_;
      if (watch_) watch_->wake();
    }
    cv_.notifyAll();
  });
  keeper_ = Background([this] { keep(); });
  watcher_ = Background([this] { watch(); });
}

EtcdLiveness::~EtcdLiveness() { stop(false); }

void EtcdLiveness::announce(EtcdClient& c) {
  const int64_t ttl = std::max<int64_t>(1, (options_.leaseTtl.count() + 999) / 1000);
  LeaseReply l = c.leaseGrant(ttl);
  c.put({.key = options_.prefix + aliveKey(self_), .value = self_, .lease = l.id});
  lease_ = l.id;
  DDPRUN_LOG(DEBUG, "rendezvous") << "node " << self_ << " alive under etcd lease " << l.id
                                  << " (TTL " << l.ttl << " s)";
}

void EtcdLiveness::report(std::exception_ptr e) {
  if (onError_) onError_(e);
}

// Refreshes the lease every TTL/3; takes a new one if it was lost; gives up (store lost) when
// no member answers for min(read_timeout, TTL).
void EtcdLiveness::keep() {
  EtcdClientOptions o = options_.client;
  o.timeout = std::min(o.timeout, options_.leaseTtl);
  EtcdClient c(o);  // connects at its first call (inside the try below)
  std::unique_lock<std::mutex> lock(mu_);
  if (stopKeeping_) return;
  keeperClient_ = &c;
  while (!cv_.waitFor(lock, options_.leaseTtl / 3, [&] { return stopKeeping_; })) {
    lock.unlock();
    try {
      if (c.leaseKeepAlive(lease_).ttl == 0) {
        DDPRUN_LOG(WARN, "rendezvous") << "node " << self_ << ": its etcd lease expired (a pause "
                                       << "longer than lease_ttl?): announcing it again";
        announce(c);
      }
    } catch (const Error&) {
      lock.lock();
      keeperClient_ = nullptr;
      lost_ = true;
      const bool report = !stopKeeping_;
      lock.unlock();
      if (report) this->report(std::current_exception());
      return;
    }
    lock.lock();
  }
  keeperClient_ = nullptr;
}

void EtcdLiveness::setWatch(EtcdWatch* w) {
  std::lock_guard<std::mutex> g(mu_);
  watch_ = w;
  if (w && stopWatching_) w->cancel();  // stopWatching() came before it could see this one
}

const std::string& EtcdLiveness::targetIn(Store& store, const Versioned& v) {
  if (ringVersion_ != v.version) {  // the ring changes only with the version
    ringTarget_ = v.state.phase == Phase::Finished || v.state.phase == Phase::Failed
                      ? std::string()
                      : ringTarget(store, v.state, self_, &view_.lists());
    ringVersion_ = v.version;
  }
  return ringTarget_;
}

void EtcdLiveness::evict(StateLog& log, const std::string& target) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopWatching_) return;  // halted: this node judges nobody (its connections are cut too)
  }
  const std::string reason = "node " + target + " was evicted: its etcd lease expired (lease_ttl=" +
                             secondsText(options_.leaseTtl) + ")";
  auto r = removeNode(log, view_.get(), target, reason);  // O(1) store work with spilled lists
  if (r.wrote) DDPRUN_LOG(WARN, "rendezvous") << reason << " (round " << r.now.state.round << ")";
  view_.offer(r.now);
}

// Watches the ring successor's key (see the header); re-targets when a newer version moves
// the ring, evicts the successor when its key is missing or deleted.
void EtcdLiveness::watch() {
  try {
    auto client = std::make_shared<EtcdClient>(options_.client);
    InterruptibleStore conn = connect_();
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stopWatching_) return;
      watcherClient_ = client;
      evictConn_ = conn;
    }
    StateLog log(*conn.store, limits_, spill_);
    std::string target;               // whose key `w` watches
    std::unique_ptr<EtcdWatch> w;
    // Unpublished before `w` goes, however this function ends: the view's callback and
    // stopWatching() reach the watch through watch_.
    struct Unpublish {
      EtcdLiveness* l;
      ~Unpublish() { l->setWatch(nullptr); }
    } unpublish{this};
    bool dead = false;                // `target`'s key is gone
    int64_t evictedAt = -1;           // the version `target` was last evicted from
    auto drop = [&] {
      setWatch(nullptr);
      w.reset();
      target.clear();
      dead = false;
    };
    for (;;) {
      uint64_t changes;
      {
        std::lock_guard<std::mutex> g(mu_);
        if (stopWatching_) return;
        changes = viewChanges_;
      }
      const Versioned v = view_.get();
      const std::string next = targetIn(*conn.store, v);
      if (next != target) {
        drop();
        target = next;
        evictedAt = -1;
        if (!target.empty()) {
          // Read, then watch from the revision after the read: no death is lost in between.
          const std::string key = options_.prefix + aliveKey(target);
          const RangeReply r = client->range({.key = key, .countOnly = true});
          dead = r.count == 0;
          if (!dead) {
            w = std::make_unique<EtcdWatch>(
                options_.client, WatchCreate{.key = key, .startRevision = r.header.revision + 1});
            setWatch(w.get());
          }
        }
      }
      if (dead && evictedAt != v.version) {
        evict(log, target);
        evictedAt = v.version;  // again only from a newer version that still names it
        continue;
      }
      if (!w) {  // nobody to watch (or already evicted): wait for a newer version
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopWatching_ || viewChanges_ != changes; });
        continue;
      }
      try {
        // Empty when woken by a newer version: the loop re-reads the ring.
        for (const Event& e : w->next(Clock::now() + kForever))
          dead = e.type == Event::Type::Delete;  // the last event says (a re-announce puts it back)
        if (dead) {
          setWatch(nullptr);
          w.reset();
        }
      } catch (const CompactedError&) {
        drop();  // history gone: read the key again
      }
    }
  } catch (const Error&) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool report = !stopWatching_;
    lock.unlock();
    if (report) this->report(std::current_exception());
  }
}

void EtcdLiveness::haltWatching() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopWatching_ = true;
    if (watch_) watch_->cancel();
    if (watcherClient_) watcherClient_->interrupt();
    if (evictConn_.interrupt) evictConn_.interrupt();
  }
  cv_.notifyAll();  // a watcher waiting for a newer version
}

void EtcdLiveness::stopWatching() {
  haltWatching();
  view_.onChange(nullptr);
  if (watcher_.joinable()) watcher_.join();
}

void EtcdLiveness::stop(bool withdraw) {
  stopWatching();
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopKeeping_ && !keeper_.joinable()) return;
    stopKeeping_ = true;
    if (keeperClient_) keeperClient_->interrupt();
  }
  cv_.notifyAll();
  if (keeper_.joinable()) keeper_.join();
  // A clean exit revokes the lease either way: the key goes now, not after the TTL. Not when
  // the keeper has already found etcd unreachable: that would only delay the exit.
  if (lost_) return;
  EtcdClientOptions o = options_.client;
  o.timeout = std::min(o.timeout, Millis(2'000));
  try {
    EtcdClient c(o);
    c.leaseRevoke(lease_);
  } catch (const Error& e) {
    // The lease then runs out by itself; the others learn of a withdrawal only after the TTL.
    DDPRUN_LOG(WARN, "rendezvous") << "could not revoke the etcd lease of node " << self_
                                   << (withdraw ? " (the others evict it after lease_ttl)" : "")
                                   << ": " << e.what();
  }
}

}  // namespace ddprun::rendezvous::etcd
