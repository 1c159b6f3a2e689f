#pragma once
// Internal to the store server: one client connection.
//
// Data flows one way: socket bytes -> input buffer -> parseRequest() -> handle() (one switch
// over Op, mutating the shared KeyTable) -> reply bytes -> socket. Frames are handled in
// order. A held WAIT does not stop the connection: later frames are handled meanwhile, as
// torch's servers do (torch 1.13 clients go on after a WAIT timeout, having no CANCEL_WAIT);
// a second WAIT replaces the first, which is never answered. Nothing here throws on the I/O
// thread: a protocol violation becomes close(reason).
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>

#include "rendezvous/key_table.h"
#include "rendezvous/protocol.h"

namespace ddprun::rendezvous {

// Shared state of the server that connections work on (owned by StoreServer::Impl).
struct ServerCore {
  KeyTable table;
  protocol::Limits limits;
  std::optional<std::string> authToken;
  std::string instanceId;  // random, per server: INFO tells a client which store it reached
  std::string jobId;       // the run id of the agent hosting it; empty for ddprun-store
  // Completes the WAITs of woken connections (their ids are waiter ids).
  virtual void wake(const KeyTable::Woken& woken) = 0;
  virtual void forget(uint64_t connectionId) = 0;
  virtual ~ServerCore() = default;
};

class StoreConnection : public std::enable_shared_from_this<StoreConnection> {
 public:
  StoreConnection(uint64_t id, boost::asio::ip::tcp::socket socket, ServerCore& core);
  void start();
  // Called by the server when this connection's WAIT became complete.
  void completeWait();
  // Closes the socket and forgets every waiter; logs `reason` when not empty.
  void close(const std::string& reason);
  bool waiting() const { return waitKind_ != WaitKind::None; }
  uint64_t id() const { return id_; }

 private:
  enum class WaitKind : uint8_t { None, Wait, WaitGet };

  void readMore();
  void onRead(size_t n);
  // Handles every complete frame in the input; then flushes replies.
  void process();
  // Handles one frame; returns false when the connection was closed.
  bool handle(protocol::Request& req);
  bool allowedBeforeAuth(protocol::Op op) const;
  // The write-once key a request would change (KeyTable::writeOnce), or nullptr.
  const char* writeOnceViolation(const protocol::Request& req) const;
  void replyWaitDone();
  void abandonWait();
  void flush();
  void onWritten();

  uint64_t id_;
  boost::asio::ip::tcp::socket socket_;
  ServerCore& core_;
  std::string peer_;

  // Input: bytes [start_, end_) of buf_ are received and not yet handled.
  std::unique_ptr<char[]> buf_;
  size_t cap_ = 0, start_ = 0, end_ = 0;
  size_t needAtLeast_ = 0;  // don't parse again before this many bytes are buffered
  std::optional<protocol::Dialect> dialect_;
  protocol::Request req_;  // reused to keep its allocations

  // Output: replies accumulate in pending_ while inflight_ is being written.
  std::string pending_, inflight_;
  bool writing_ = false;
  bool closed_ = false;
  bool closeAfterFlush_ = false;
  bool processPosted_ = false;

  WaitKind waitKind_ = WaitKind::None;
  std::string waitGetKey_;
  bool authenticated_ = false;
  std::string nonce_;
  std::string channel_;  // our socket address, as auth::channelName writes it
};

}  // namespace ddprun::rendezvous
