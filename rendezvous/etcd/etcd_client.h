#pragma once
// EtcdClient: etcd's v3 API (kv, lease, maintenance), with failover between the members of a
// cluster. Two transports carry the same calls: etcd's gRPC API over HTTP/2 (grpc/, the
// default for http://: an agent's clients and watches share one connection per member), and
// the JSON gateway over HTTP/1.1 (gateway.h, http_connection.h: https://, or asked for).
//
// Every call is bounded by options.timeout, retries on other members included. A call that
// fails on one member -- connection refused or reset, the member has no leader, the leader
// changed under the request -- is tried on the next member (round robin from a random start,
// with a short backoff once every member has failed), so losing any minority of the cluster
// is invisible to the caller beyond a leader election. When no member serves the call within
// the timeout it throws NetworkError naming every endpoint and the last error (never
// TimeoutError: that one means "the key did not appear" to Store users).
// A write that is not idempotent is not retried once it may have reached a member; that
// failure throws AmbiguousError, and the caller decides (EtcdStore re-reads the key).
// Requests etcd refuses (a bad request, a lease that does not exist) throw EtcdError.
//
// One thread uses a client at a time; interrupt() and cancelCall() may come from any thread
// (under a rendezvous::Blocking: from a fiber of the thread that uses it, rendezvous/blocking.h;
// its waits -- the HTTP connection's, the backoff between members -- then park the fiber).
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rendezvous/blocking.h"
#include "rendezvous/etcd/gateway.h"
#include "rendezvous/etcd/grpc/connection.h"
#include "rendezvous/etcd/http_connection.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous::etcd {

class SharedConnections;

// How the client reaches etcd. Auto: gRPC over HTTP/2 cleartext for http://, the JSON gateway
// (HTTP/1.1, TLS) for https:// -- TLS with ALPN h2 is not done.
enum class Transport { Auto, Grpc, Gateway };

struct EtcdClientOptions {
  std::vector<MemberAddress> endpoints;                // every member of the cluster
  std::shared_ptr<boost::asio::ssl::context> tls;      // null: http
  Millis timeout{60'000};                              // each call, failover included
  // Null (a real agent): each client has its own connection. Otherwise the clients made with
  // these options take turns on the connections of `shared` (see SharedConnections).
  std::shared_ptr<SharedConnections> shared;  // the gateway only
  Transport transport = Transport::Auto;
  // gRPC: the connections (one per member) shared by every client and watch made with these
  // options -- EtcdBackend makes one per agent. Null: a client makes its own and puts it in
  // its options(), so that watches made from those share it.
  std::shared_ptr<grpc::ChannelPool> channels;
};

// Whether calls made with `o` go over gRPC (else the JSON gateway).
bool usesGrpc(const EtcdClientOptions& o);

// The HTTP connections (one per member) that several EtcdClients take turns on: each
// simulated agent of `ddprun-bench rendezvous --simulate --backend etcd-v3` gives its clients
// -- its store's, its round watcher's, its lease keeper's and liveness watcher's -- one, so
// that it holds one connection for its requests instead of one per client (watches have
// their own: a stream holds its connection). A client holds it for one request; another that
// needs it meanwhile waits (CondVar), and cancelCall()/interrupt() end that wait too. A real
// agent does not share: its clients run on threads of their own and must not wait for one
// another (the keeper's keep-alive behind a slow request).
class SharedConnections {
 private:
  friend class EtcdClient;
  std::mutex mu_;
  CondVar cv_;
  bool busy_ = false;
  std::vector<std::unique_ptr<HttpConnection>> conns_;  // by member, made at first use
};

// "etcd at http://127.0.0.1:2379,127.0.0.1:22379": how errors name the cluster.
std::string describeCluster(const EtcdClientOptions& o);
// "2.5 s", for messages.
std::string secondsText(Millis m);

// etcd refused a request (it was served, and the answer is no).
class EtcdError : public StoreError {
 public:
  EtcdError(const std::string& what, int code) : StoreError(what), code_(code) {}
  int code() const { return code_; }  // the gRPC status code

 private:
  int code_;
};

// A write that is not idempotent failed after it may have been applied.
class AmbiguousError : public NetworkError {
 public:
  using NetworkError::NetworkError;
};

class EtcdClient {
 public:
  explicit EtcdClient(EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  RangeReply range(const RangeRequest& r);
  PutReply put(const PutRequest& p);
  DeleteReply deleteRange(const DeleteRequest& d);
  // `idempotent`: whether applying it twice equals applying it once (then it is retried
  // after an ambiguous failure; otherwise that throws AmbiguousError).
  TxnReply txn(const TxnRequest& t, bool idempotent);
  LeaseReply leaseGrant(int64_t ttlSeconds);
  // Refreshes the lease; the reply's ttl is 0 when the lease has expired.
  LeaseReply leaseKeepAlive(int64_t id);
  void leaseRevoke(int64_t id);
  // maintenance/status of one member (no failover): which member leads.
  StatusReply status(size_t member);

  // Any thread: the call in progress and every later call fail with NetworkError.
  void interrupt();
  // Any thread: the call in progress fails with NetworkError; later calls work.
  void cancelCall();

  const EtcdClientOptions& options() const { return options_; }
  // HTTP requests sent so far (every attempt, failover included): the cost a test bounds.
  int64_t requests() const { return requests_.load(); }
  void setTimeout(Millis t) { options_.timeout = t; }
  std::string describe() const { return describeCluster(options_); }

 private:
  // Sends the call to the members in turn until one serves it (see the header comment).
  // `target`: the gateway's path, or the gRPC method; `body`: encoded for that transport.
  std::string call(const std::string& target, const std::string& body, bool idempotent);
  // One attempt; `cancels`: cancels_ when the call began (a later cancel ends a wait for
  // the shared connection).
  std::string callOnce(size_t member, const std::string& target, const std::string& body,
                       Clock::time_point deadline, uint64_t cancels);
  std::string grpcOnce(size_t member, const std::string& method, const std::string& body,
                       Clock::time_point deadline, uint64_t cancels);
  HttpConnection& connectionTo(size_t member);
  // POSTs on the shared connection to `member`, waiting for it as long as another client
  // holds it.
  HttpConnection::Reply postShared(size_t member, const std::string& target,
                                   const std::string& body, Clock::time_point deadline,
                                   uint64_t cancels);
  void pause(Millis d);

  EtcdClientOptions options_;
  size_t current_ = 0;
  std::mutex mu_;  // guards conn_ (replaced by the calling thread, cancelled by any)
  CondVar cv_;  // the backoff's wait: cancelCall() cuts it short
  std::unique_ptr<HttpConnection> conn_;
  HttpConnection* borrowed_ = nullptr;  // the shared connection while this client holds it
  const bool grpc_;
  grpc::Call* grpcCall_ = nullptr;  // the gRPC call in progress (guarded by mu_)
  std::atomic<bool> interrupted_{false};
  std::atomic<uint64_t> cancels_{0};
  std::atomic<int64_t> requests_{0};
};

}  // namespace ddprun::rendezvous::etcd
