#pragma once
// gRPC over HTTP/2 cleartext (h2c with prior knowledge) to one etcd member: one TCP connection
// that carries many calls at once, each an HTTP/2 stream -- unary KV and Lease calls, and
// Watch streams that stay open. etcd serves gRPC and its JSON gateway on the same client port
// (it tells them apart by the HTTP/2 preface). libnghttp2 does the HTTP/2 framing, HPACK and
// flow control; the socket, the waits and gRPC's message framing are ours.
//
// Why: an HTTP/1.1 stream (the gateway's watch) holds its connection, so an agent held one
// connection per open watch; here an agent's clients and watches share one connection per
// member (ChannelPool), as etcd's own clients do.
//
// Who reads the socket: there is no I/O thread. A caller waiting for its call's reply becomes
// the connection's *driver* when nobody else is: it waits for the socket (poll, or the fiber
// parks through the installed rendezvous::Blocking), reads, feeds nghttp2 -- which may complete
// other callers' calls -- writes what nghttp2 has to send, and lets the next waiter drive.
// Other waiters wait on a CondVar. So the connection costs one descriptor under a Blocking (the
// simulated agents' fibers) and two on threads (an eventfd ends the driver's poll when a
// caller needs it: a cancel, a wake, a write that did not fit). Requests are written by the
// caller that makes them, at once. Nothing here throws inside nghttp2's callbacks: a bad reply
// fails its call, and a broken connection fails every call on it, with errors naming the member.
//
// Bounds on what a member can make us hold: each call's reply messages (the call's maxMessage,
// and as much again queued unread), its headers (64 KiB); beyond them the call is reset and
// fails with ProtocolError.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/errors.h"
#include "rendezvous/blocking.h"

namespace ddprun::rendezvous::etcd::grpc {

using Clock = std::chrono::steady_clock;

// A transport failure: the connection could not be made, broke, or the call was reset or
// cancelled. `maybeSent`: the request may have reached the member. `descriptorLimit`: this
// process is out of file descriptors (no other member would do better).
class Failure : public NetworkError {
 public:
  Failure(const std::string& what, bool maybeSent, bool descriptorLimit = false)
      : NetworkError(what), maybeSent_(maybeSent), descriptorLimit_(descriptorLimit) {}
  bool maybeSent() const { return maybeSent_; }
  bool descriptorLimit() const { return descriptorLimit_; }

 private:
  bool maybeSent_;
  bool descriptorLimit_;
};

// A finished call's gRPC status (grpc-status, grpc-message) and its reply message.
struct Reply {
  int code = 0;  // 0: OK; etcd's errors are gRPC codes (14 Unavailable, 5 NotFound, ...)
  std::string message;
  std::string body;  // the one reply message of a unary call (code 0)
};

class Connection;
struct CallState;

// One call: an HTTP/2 stream on a Connection. One thread (or fiber) uses it; cancel() and
// wake() may come from any (under a Blocking: from a fiber of the same thread). Destroying an
// unfinished call resets its stream (RST_STREAM CANCEL).
class Call {
 public:
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // A unary call (its request was the whole stream): waits for the end, returns the status and
  // the reply. Throws TimeoutError at `deadline` (the stream is reset), Failure.
  Reply finish(Clock::time_point deadline);
  // A streaming call (Watch): the next reply message, or nullopt when `deadline` passes or
  // wake() comes first (the stream stays open). Throws Failure when the stream ends (naming its
  // status) or breaks, ProtocolError when the member sent what gRPC does not allow.
  std::optional<std::string> next(Clock::time_point deadline);

  void cancel();  // the wait in progress and every later one throw Failure ("cancelled")
  void wake();    // a next() in progress returns nullopt (once)
  const std::string& method() const { return method_; }

 private:
  friend class Connection;
  Call(std::shared_ptr<Connection> c, std::shared_ptr<CallState> s, std::string method);
  std::shared_ptr<Connection> conn_;
  std::shared_ptr<CallState> state_;
  std::string method_;
};

struct ConnectionOptions {
  std::string host;
  uint16_t port = 2379;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // Connects (TCP, then the HTTP/2 preface and settings are sent). Throws Failure.
  static std::shared_ptr<Connection> open(const ConnectionOptions& o, Clock::time_point deadline);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts a call of `method` ("/etcdserverpb.KV/Range") sending `request` (one message);
  // `halfClose`: the request is the whole stream (unary calls; a Watch keeps it open).
  // `maxMessage`: the longest reply message accepted. Throws Failure when the connection is
  // broken or cannot start a stream.
  std::unique_ptr<Call> start(const std::string& method, const std::string& request,
                              bool halfClose, size_t maxMessage);
  // False once the connection broke or the member sent GOAWAY: make a new one.
  bool usable();
  // "127.0.0.1:2379"
  const std::string& member() const { return member_; }
  // Streams started so far (a test checks that watches share the connection).
  int64_t streamsStarted();

  struct Impl;

 private:
  friend class Call;
  explicit Connection(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string member_;
};

// One connection per member, made at first use, shared by every EtcdClient and EtcdWatch made
// with the same options (an agent's store, round watcher, lease keeper and lease watcher):
// one TCP connection per agent and member. A broken connection is replaced at the next get().
class ChannelPool {
 public:
  // The connection to member `index` at host:port. Throws Failure.
  std::shared_ptr<Connection> get(size_t index, const ConnectionOptions& o,
                                  Clock::time_point deadline);
  // Connections made so far (every member, replacements included).
  int64_t connectionsMade();
  // The member the pool's users start from (of `members`, chosen at random at the first call):
  // an agent's clients and watches then share one connection, agents spread over the members.
  size_t home(size_t members);

 private:
  std::mutex mu_;
  std::optional<size_t> home_;
  std::vector<std::shared_ptr<Connection>> conns_;
  int64_t made_ = 0;
};

}  // namespace ddprun::rendezvous::etcd::grpc
