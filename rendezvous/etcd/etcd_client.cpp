#include "rendezvous/etcd/etcd_client.h"

#include <algorithm>
#include <random>

#include "base/log.h"
#include "rendezvous/etcd/grpc/proto.h"

namespace ddprun::rendezvous::etcd {

namespace {

constexpr int kUnavailable = 14;       // gRPC: no leader, leader changed, request timed out
constexpr int kDeadlineExceeded = 4;
constexpr Millis kMinAttempt{2'000};   // one member's share of a call, at least

// etcd refuses a proposal while its applied index lags the committed one by more than 5,000
// entries ("etcdserver: too many requests"), before proposing it: nothing was applied, and the
// call is worth retrying (after the backoff) whatever it is.
bool overloaded(const std::string& message) {
  return message.find("too many requests") != std::string::npos;
}

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

bool usesGrpc(const EtcdClientOptions& o) {
  switch (o.transport) {
    case Transport::Grpc: return true;
    case Transport::Gateway: return false;
    case Transport::Auto: break;
  }
  return !o.tls;
}

EtcdClient::EtcdClient(EtcdClientOptions options)
    : options_(std::move(options)), grpc_(usesGrpc(options_)) {
  DDPRUN_CHECK(!options_.endpoints.empty(), "an etcd client needs at least one endpoint");
  DDPRUN_CHECK(!(grpc_ && options_.tls), "etcd over gRPC with TLS is not supported (use the gateway)");
  if (grpc_ && !options_.channels) options_.channels = std::make_shared<grpc::ChannelPool>();
  // Spread the agents of a job over the members (over gRPC: the agent's clients all start at
  // its pool's member, sharing its connection).
  if (grpc_) {
    current_ = options_.channels->home(options_.endpoints.size());
  } else {
    std::random_device rd;
    current_ = std::uniform_int_distribution<size_t>(0, options_.endpoints.size() - 1)(rd);
  }
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
    if (grpcCall_) grpcCall_->cancel();
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

std::string EtcdClient::grpcOnce(size_t member, const std::string& method,
                                 const std::string& body, Clock::time_point deadline,
                                 uint64_t cancels) {
  const MemberAddress& m = options_.endpoints[member];
  const std::string who = "member " + m.text();
  ++requests_;
  grpc::Reply r;
  try {
    auto conn = options_.channels->get(member, {.host = m.host, .port = m.port}, deadline);
    auto call = conn->start(method, body, true, kMaxReply);
    struct Clear {  // before `call` goes: cancelCall() may use the pointer until then
      EtcdClient& c;
      ~Clear() {
        std::lock_guard<std::mutex> g(c.mu_);
        c.grpcCall_ = nullptr;
      }
    };
    {
      std::lock_guard<std::mutex> g(mu_);
      grpcCall_ = call.get();
      if (interrupted_ || cancels_ != cancels) call->cancel();
    }
    Clear clear{*this};
    r = call->finish(deadline);
  } catch (const grpc::Failure& f) {
    if (f.descriptorLimit()) throw ConnectionLimitError(f.what());
    throw AttemptFailed{f.what(), f.maybeSent()};  // it names the member
  } catch (const TimeoutError& e) {
    throw AttemptFailed{e.what(), true, true};
  }
  if (r.code == 0) return std::move(r.body);
  const std::string status = "grpc-status " + std::to_string(r.code) + " (" + r.message + ")";
  if (overloaded(r.message)) throw AttemptFailed{who + ": " + method + ": " + status, false};
  if (r.code == kUnavailable || r.code == kDeadlineExceeded) {
    // "no leader" is refused before anything is proposed; the others may have been applied.
    const bool applied = r.message.find("no leader") == std::string::npos;
    throw AttemptFailed{who + ": " + method + ": " + status, applied};
  }
  throw EtcdError(describe() + ": " + method + " refused by " + who + ": " + r.message +
                      " (code " + std::to_string(r.code) + ")",
                  r.code);
}

std::string EtcdClient::callOnce(size_t member, const std::string& target,
                                 const std::string& body, Clock::time_point deadline,
                                 uint64_t cancels) {
  if (grpc_) return grpcOnce(member, target, body, deadline, cancels);
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
  if (overloaded(message)) throw AttemptFailed{who + ": " + message, false};
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

// Each call in both forms: the gRPC method and its protobuf, or the gateway's path and JSON.
RangeReply EtcdClient::range(const RangeRequest& r) {
  if (grpc_) return grpc::decodeRange(call("/etcdserverpb.KV/Range", grpc::encodeRange(r), true));
  return parseRange(call("/v3/kv/range", encodeRange(r), true));
}

PutReply EtcdClient::put(const PutRequest& p) {
  if (grpc_) return grpc::decodePut(call("/etcdserverpb.KV/Put", grpc::encodePut(p), true));
  return parsePut(call("/v3/kv/put", encodePut(p), true));
}

DeleteReply EtcdClient::deleteRange(const DeleteRequest& d) {
  if (grpc_) {
    return grpc::decodeDeleteRange(
        call("/etcdserverpb.KV/DeleteRange", grpc::encodeDeleteRange(d), true));
  }
  return parseDelete(call("/v3/kv/deleterange", encodeDelete(d), true));
}

TxnReply EtcdClient::txn(const TxnRequest& t, bool idempotent) {
  if (grpc_) return grpc::decodeTxn(call("/etcdserverpb.KV/Txn", grpc::encodeTxn(t), idempotent));
  return parseTxn(call("/v3/kv/txn", encodeTxn(t), idempotent));
}

LeaseReply EtcdClient::leaseGrant(int64_t ttlSeconds) {
  if (grpc_) {
    return grpc::decodeLeaseGrant(
        call("/etcdserverpb.Lease/LeaseGrant", grpc::encodeLeaseGrant(ttlSeconds), true));
  }
  return parseLeaseGrant(call("/v3/lease/grant", encodeLeaseGrant(ttlSeconds), true));
}

// LeaseKeepAlive is a bidirectional stream; one request and a half-close get one reply, then
// etcd ends the call: a unary call, as the gateway's one-request stream was.
LeaseReply EtcdClient::leaseKeepAlive(int64_t id) {
  if (grpc_) {
    return grpc::decodeLeaseKeepAlive(
        call("/etcdserverpb.Lease/LeaseKeepAlive", grpc::encodeLeaseId(id), true));
  }
  return parseLeaseKeepAlive(call("/v3/lease/keepalive", encodeLeaseId(id), true));
}

void EtcdClient::leaseRevoke(int64_t id) {
  if (grpc_) call("/etcdserverpb.Lease/LeaseRevoke", grpc::encodeLeaseId(id), true);
  else call("/v3/lease/revoke", encodeLeaseId(id), true);
}

StatusReply EtcdClient::status(size_t member) {
  DDPRUN_CHECK(member < options_.endpoints.size(), "no member " << member);
  const auto deadline = Clock::now() + options_.timeout;
  try {
    if (grpc_) {
      return grpc::decodeStatus(
          callOnce(member, "/etcdserverpb.Maintenance/Status", "", deadline, cancels_.load()));
    }
    return parseStatus(
        callOnce(member, "/v3/maintenance/status", "{}", deadline, cancels_.load()));
  } catch (const AttemptFailed& f) {
    throw NetworkError(describe() + ": status: " + f.what);
  }
}

}  // namespace ddprun::rendezvous::etcd
