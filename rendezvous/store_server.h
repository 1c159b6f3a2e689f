#pragma once
// StoreServer: the TCP key-value server (ddprun-store, and the store an agent hosts).
//
// It speaks both TCPStore dialects, chosen per connection from its first bytes, plus ddprun's
// extensions (HELLO, AUTH, WAIT_GET); see rendezvous/protocol.h and docs/protocol.md.
// It runs on the io_context it is given, never blocks it, and never throws from a handler:
// a connection that sends a malformed, oversized or unknown frame, or a request beyond one of
// the limits (rendezvous/store_limits.h), is closed with one log line naming the peer and the
// reason, and nothing else is touched. A WAIT is held on the server until its keys exist; a
// client that disconnects mid-WAIT leaves no waiter behind. Past maxConnections, or out of
// file descriptors, a new connection is accepted and closed at once (a spare descriptor is
// kept for that), so the client learns it instead of hanging in the backlog; those log lines
// are rate-limited. Connections already queued by the kernel are accepted in batches, so that
// thousands connecting at once do not overflow its accept queue (somaxconn).
//
//   boost::asio::io_context io;
//   StoreServer server(io, {.host = "127.0.0.1", .port = 0});
//   std::cout << server.port();
//   io.run();
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "rendezvous/store_limits.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::rendezvous {

struct StoreServerOptions {
  std::string host = "0.0.0.0";           // address to bind; "::" for IPv6 + IPv4
  uint16_t port = 0;                      // 0 picks a free port; see StoreServer::port()
  std::optional<std::string> authToken;   // when set, clients must prove it (HMAC challenge)
  // The run id of the agent hosting this store (INFO tells clients; empty for ddprun-store).
  std::string jobId;
  ServerLimits limits{};
  int backlog = 65535;                    // capped by the kernel's somaxconn
};

struct StoreServerStats {
  size_t connections = 0;  // open now
  uint64_t accepted = 0;   // connections taken so far (closed ones and reconnects included)
  size_t waiters = 0;      // connections held in a WAIT
  int64_t keys = 0;
  uint64_t storedBytes = 0;        // keys + values + queued items
  uint64_t unsentReplyBytes = 0;   // replies not yet written, over all connections
  size_t pausedConnections = 0;    // not read until their replies drain (backpressure)
};

class StoreServer {
 public:
  // Binds and listens at once, so port() is valid on return; serves while `io` runs.
  // Throws NetworkError naming the address when it cannot bind.
  StoreServer(boost::asio::io_context& io, StoreServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  const std::string& host() const;
  // Random per server, told to clients by INFO: an agent checks through the endpoint that it
  // reached the store it hosts (no split brain).
  const std::string& instanceId() const;
  // Closes the listening socket and every connection. Call on the io_context's thread.
  void stop();
  StoreServerStats stats() const;

  // The host's own access to the keys, without a connection: for the process that runs the
  // server (an agent publishing to its workers). Call on the io_context's thread only; a SET
  // wakes the clients waiting for the key, as a client's would.
  void set(const std::string& key, const std::string& value);
  std::optional<std::string> get(const std::string& key) const;
  // `fn(key)` after each SET of a client, on the io_context's thread, inside the request's
  // handling: it must not block, nor call back into the server (post what it does). Empty: none.
  void setObserver(std::function<void(const std::string& key)> fn);

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Raises the soft RLIMIT_NOFILE to the hard limit (a store holds one descriptor per client).
// Returns the new soft limit.
uint64_t raiseFileLimit();

}  // namespace ddprun::rendezvous
