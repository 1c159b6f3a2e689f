#include "rendezvous/etcd/etcd_client.h"

#include <algorithm>
#include <random>

#include "base/log.h"

namespace ddprun::rendezvous::etcd {

namespace {

constexpr int kUnavailable = 14;       // gRPC: no leader, leader changed, request timed out
constexpr int kDeadlineExceeded = 4;
constexpr Millis kMinAttempt{2'000};   // one member's share of a call, at least

// The failure of one attempt on one member, and whether another member may do better.
struct AttemptFailed {
  std::string what;
  bool maybeApplied;
  bool timedOut = false;  // cut by the deadline: says less than an earlier, real error
};

}  // namespace

std::string secondsText(Millis m) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", m.count() / 1000.0);
  return b;
}

std::string describeCluster(const EtcdClientOptions& o) {
  std::string s = std::string("etcd at ") + (o.tls ? "https://" : "http://");
  for (size_t i = 0; i < o.endpoints.size(); ++i) s += (i ? "," : "") + o.endpoints[i].text();
  return s;
}

EtcdClient::EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {
  DDPRUN_CHECK(!options_.endpoints.empty(), "an etcd client needs at least one endpoint");
  // Spread the agents of a job over the members.
  std::random_device rd;
  current_ = std::uniform_int_distribution<size_t>(0, options_.endpoints.size() - 1)(rd);
}

EtcdClient::~EtcdClient() = default;

void EtcdClient::interrupt() {
  interrupted_ = true;
  cancelCall();
}

void EtcdClient::cancelCall() {
  {
    std::lock_guard<std::mutex> g(mu_);
    ++cancels_;
    if (conn_) conn_->cancel();
    if (borrowed_) borrowed_->cancel();
    cv_.notifyAll();
  }
  if (SharedConnections* s = options_.shared.get()) {
    { std::lock_guard<std::mutex> g(s->mu_); }  // a waiter has checked, or will see, cancels_
    s->cv_.notifyAll();
  }
}

void EtcdClient::pause(Millis d) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t c = cancels_;
  cv_.waitFor(lock, d, [&] { return cancels_ != c; });
}

HttpConnection& EtcdClient::connectionTo(size_t member) {
  const MemberAddress& m = options_.endpoints[member];
  if (!conn_ || conn_->member().host != m.host || conn_->member().port != m.port) {
    auto c = std::make_unique<HttpConnection>(m, options_.tls);
    std::lock_guard<std::mutex> g(mu_);
    conn_ = std::move(c);
  }
  return *conn_;
}

HttpConnection::Reply EtcdClient::postShared(size_t member, const std::string& target,
                                             const std::string& body, Clock::time_point deadline,
                                             uint64_t cancels) {
  SharedConnections& s = *options_.shared;
  auto stopped = [&] { return interrupted_ || cancels_ != cancels; };
  HttpConnection* c = nullptr;
  {
    std::unique_lock<std::mutex> lock(s.mu_);
    s.cv_.wait(lock, [&] { return !s.busy_ || stopped(); });
    if (stopped()) throw NetworkError(describe() + ": " + target + ": interrupted");
    s.busy_ = true;
    if (s.conns_.size() < options_.endpoints.size()) s.conns_.resize(options_.endpoints.size());
    auto& slot = s.conns_[member];
    try {
      if (!slot) slot = std::make_unique<HttpConnection>(options_.endpoints[member], options_.tls);
    } catch (...) {
      s.busy_ = false;
      lock.unlock();
      s.cv_.notifyAll();
      throw;
    }
    c = slot.get();
  }
  struct Release {
    EtcdClient& client;
    SharedConnections& s;
    ~Release() {
      {
        std::lock_guard<std::mutex> g(client.mu_);
        client.borrowed_ = nullptr;
      }
      {
        std::lock_guard<std::mutex> g(s.mu_);
        s.busy_ = false;
      }
      s.cv_.notifyAll();
    }
  } release{*this, s};
  {
    std::lock_guard<std::mutex> g(mu_);
    borrowed_ = c;
  }
  if (stopped()) throw NetworkError(describe() + ": " + target + ": interrupted");
  return c->post(target, body, deadline);
}

std::string EtcdClient::callOnce(size_t member, const std::string& target,
                                 const std::string& body, Clock::time_point deadline,
                                 uint64_t cancels) {
  const std::string who = "member " + options_.endpoints[member].text();
  HttpConnection::Reply r;
  ++requests_;
  try {
    r = options_.shared ? postShared(member, target, body, deadline, cancels)
                        : connectionTo(member).post(target, body, deadline);
  } catch (const HttpConnection::Failure& f) {
    throw AttemptFailed{who + ": " + f.what(), f.maybeSent()};
  } catch (const TimeoutError& e) {
    throw AttemptFailed{e.what(), true, true};
  }
  if (r.status == 200) return std::move(r.body);
  const auto err = parseError(r.body);
  const int code = err ? err->code : 0;
  const std::string message = err ? err->message : "HTTP " + std::to_string(r.status) + ": " +
                                                        r.body.substr(0, 200);
  if (code == kUnavailable || code == kDeadlineExceeded || r.status == 502 ||
      r.status == 503 || r.status == 504) {
    // "no leader" is refused before anything is proposed; the others may have been applied.
    const bool applied = message.find("no leader") == std::string::npos;
    throw AttemptFailed{who + ": " + message, applied};
  }
  throw EtcdError(describe() + ": " + target + " refused by " + who + ": " + message +
                      " (code " + std::to_string(code) + ")",
                  code);
}

std::string EtcdClient::call(const std::string& target, const std::string& body,
                             bool idempotent) {
  const uint64_t cancels = cancels_;
  const auto start = Clock::now();
  const auto deadline = start + options_.timeout;
  const Millis perAttempt = std::max(kMinAttempt, options_.timeout / 3);
  const size_t n = options_.endpoints.size();
  Millis backoff{20};
  std::string lastError;
  for (size_t attempt = 0;; ++attempt) {
    if (interrupted_ || cancels_ != cancels) {
      throw NetworkError(describe() + ": " + target + ": interrupted");
    }
    try {
      return callOnce(current_, target, body, std::min(deadline, Clock::now() + perAttempt),
                      cancels);
    } catch (const AttemptFailed& f) {
      if (interrupted_ || cancels_ != cancels) {
        throw NetworkError(describe() + ": " + target + ": interrupted");
      }
      if (f.maybeApplied && !idempotent) {
        throw AmbiguousError(describe() + ": " + target + ": " + f.what +
                             " (the request may have been applied)");
      }
      if (!f.timedOut || lastError.empty()) lastError = f.what;
      DDPRUN_LOG(DEBUG, "etcd") << target << " failed on " << f.what << "; trying the next member";
    }
    current_ = (current_ + 1) % n;
    if (Clock::now() >= deadline) break;
    if ((attempt + 1) % n == 0) {  // every member failed once more: wait a little
      pause(std::min(backoff, std::chrono::duration_cast<Millis>(deadline - Clock::now())));
      backoff = std::min(backoff * 2, Millis(500));
    }
    if (Clock::now() >= deadline) break;
  }
  throw NetworkError(describe() + ": " + target + " failed on every member for " +
                     secondsText(options_.timeout) + " (last error: " + lastError + ")");
}

RangeReply EtcdClient::range(const RangeRequest& r) {
  return parseRange(call("/v3/kv/range", encodeRange(r), true));
}

PutReply EtcdClient::put(const PutRequest& p) {
  return parsePut(call("/v3/kv/put", encodePut(p), true));
}

DeleteReply EtcdClient::deleteRange(const DeleteRequest& d) {
  return parseDelete(call("/v3/kv/deleterange", encodeDelete(d), true));
}

TxnReply EtcdClient::txn(const TxnRequest& t, bool idempotent) {
  return parseTxn(call("/v3/kv/txn", encodeTxn(t), idempotent));
}

LeaseReply EtcdClient::leaseGrant(int64_t ttlSeconds) {
  return parseLeaseGrant(call("/v3/lease/grant", encodeLeaseGrant(ttlSeconds), true));
}

LeaseReply EtcdClient::leaseKeepAlive(int64_t id) {
  return parseLeaseKeepAlive(call("/v3/lease/keepalive", encodeLeaseId(id), true));
}

void EtcdClient::leaseRevoke(int64_t id) {
  call("/v3/lease/revoke", encodeLeaseId(id), true);
}

StatusReply EtcdClient::status(size_t member) {
  DDPRUN_CHECK(member < options_.endpoints.size(), "no member " << member);
  const auto deadline = Clock::now() + options_.timeout;
  try {
    return parseStatus(
        callOnce(member, "/v3/maintenance/status", "{}", deadline, cancels_.load()));
  } catch (const AttemptFailed& f) {
    throw NetworkError(describe() + ": status: " + f.what);
  }
}

}  // namespace ddprun::rendezvous::etcd
