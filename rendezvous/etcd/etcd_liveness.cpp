#include "rendezvous/etcd/etcd_liveness.h"

#include <algorithm>

#include "base/errors.h"
#include "base/log.h"

namespace ddprun::rendezvous::etcd {

namespace {
constexpr const char* kAlivePrefix = "alive/";
constexpr auto kForever = std::chrono::hours(24 * 365);
}  // namespace

std::string aliveKey(const std::string& id) { return kAlivePrefix + id; }

std::string evictorOf(const std::vector<std::string>& ids, const std::set<std::string>& deadIds,
                      const std::string& dead) {
  auto it = std::lower_bound(ids.begin(), ids.end(), dead);
  const size_t n = ids.size();
  size_t start = static_cast<size_t>(it - ids.begin());  // where `dead` is (or would be)
  for (size_t step = 1; step <= n; ++step) {
    const std::string& candidate = ids[(start + n - step) % n];
    if (candidate != dead && !deadIds.count(candidate)) return candidate;
  }
  return {};
}

EtcdLiveness::EtcdLiveness(EtcdLivenessOptions options, const LivenessContext& ctx)
    : options_(std::move(options)), self_(ctx.self), limits_(ctx.limits), spill_(ctx.spill),
      view_(ctx.view),
      connect_(ctx.connect), onError_(ctx.onError) {
  EtcdClient c(options_.client);
  announce(c);
  view_.onChange([this] {
    std::lock_guard<std::mutex> g(mu_);
    if (watch_) watch_->wake();
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
  EtcdClient c(o);
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
    const std::string prefix = options_.prefix + kAlivePrefix;
    for (;;) {
      RangeReply r = client->range({.key = prefix, .rangeEnd = prefixEnd(prefix)});
      alive_.clear();
      for (const auto& kv : r.kvs) alive_.insert(kv.key.substr(prefix.size()));
      EtcdWatch w(options_.client, {.key = prefix, .rangeEnd = prefixEnd(prefix),
                                    .startRevision = r.header.revision + 1});
      {
        std::lock_guard<std::mutex> g(mu_);
        if (stopWatching_) return;
        watch_ = &w;
      }
      struct Clear {
        EtcdLiveness* l;
        ~Clear() {
          std::lock_guard<std::mutex> g(l->mu_);
          l->watch_ = nullptr;
        }
      } clear{this};
      try {
        for (;;) {
          evaluate(*client, *conn.store, log);
          for (const Event& e : w.next(Clock::now() + kForever)) {
            const std::string id = e.kv.key.substr(prefix.size());
            if (e.type == Event::Type::Put) {
              alive_.insert(id);
              dead_.erase(id);
            } else {
              alive_.erase(id);
              dead_.insert(id);
            }
          }
        }
      } catch (const CompactedError&) {
        continue;  // history gone: read alive/ again
      }
    }
  } catch (const Error&) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool report = !stopWatching_;
    lock.unlock();
    if (report) this->report(std::current_exception());
  }
}

bool EtcdLiveness::isDead(EtcdClient& c, const std::string& id) {
  if (dead_.count(id)) return true;
  if (alive_.count(id)) return false;
  const bool alive = c.range({.key = options_.prefix + aliveKey(id), .countOnly = true}).count > 0;
  (alive ? alive_ : dead_).insert(id);
  return !alive;
}

void EtcdLiveness::evaluate(EtcdClient& c, Store& store, StateLog& log) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopWatching_) return;
  }
  const Versioned v = view_.get();
  if (v.state.phase == Phase::Finished || v.state.phase == Phase::Failed) return;
  if (v.state.compact()) {
    // The versions name their lists: each agent watches its successor in list order, as the
    // heartbeat ring does, O(1) reads per version. Two dead in a row: evicting the first
    // makes the second this agent's successor in the next version, evaluated in turn.
    if (ringVersion_ != v.version) {  // alive/ events come often; versions rarely
      ringTarget_ = ringTarget(store, v.state, self_);
      ringVersion_ = v.version;
    }
    const std::string target = ringTarget_;
    if (target.empty() || !isDead(c, target)) return;
    const std::string reason = "node " + target + " was evicted: its etcd lease expired (lease_ttl=" +
                               secondsText(options_.leaseTtl) + ")";
    auto r = log.update(v, [&](const RoundState& s) {
      return transition::remove(s, target, reason, limits_);
    });
    if (r.wrote) DDPRUN_LOG(WARN, "rendezvous") << reason << " (round " << r.now.state.round << ")";
    view_.offer(r.now);
    return;
  }
  const std::vector<std::string> ids = v.state.allIds();
  // Nodes we have no news of yet (their key's PUT may still be on its way in the watch): each
  // announced itself before joining, so one fresh read of alive/ tells, for all of them.
  std::vector<std::string> unknown;
  for (const auto& id : ids)
    if (id != self_ && !dead_.count(id) && !alive_.count(id)) unknown.push_back(id);
  if (!unknown.empty()) {
    const std::string prefix = options_.prefix + kAlivePrefix;
    std::set<std::string> now;
    for (const auto& kv : c.range({.key = prefix, .rangeEnd = prefixEnd(prefix)}).kvs)
      now.insert(kv.key.substr(prefix.size()));
    for (const auto& id : unknown) (now.count(id) ? alive_ : dead_).insert(id);
  }
  std::vector<std::string> gone;
  for (const auto& id : ids)
    if (id != self_ && dead_.count(id)) gone.push_back(id);
  for (const auto& id : gone) {
    if (evictorOf(ids, dead_, id) != self_) continue;
    const std::string reason = "node " + id + " was evicted: its etcd lease expired (lease_ttl=" +
                               secondsText(options_.leaseTtl) + ")";
    auto r = log.update(view_.get(), [&](const RoundState& s) {
      return transition::remove(s, id, reason, limits_);
    });
    if (r.wrote) DDPRUN_LOG(WARN, "rendezvous") << reason << " (round " << r.now.state.round << ")";
    view_.offer(r.now);
  }
}

void EtcdLiveness::stopWatching() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopWatching_ = true;
    if (watch_) watch_->cancel();
    if (watcherClient_) watcherClient_->interrupt();
    if (evictConn_.interrupt) evictConn_.interrupt();
  }
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
