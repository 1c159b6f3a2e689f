#pragma once
// Internal to the store server: one client connection.
//
// Data flows one way: socket bytes -> input buffer -> RequestParser -> handle() (one switch
// over Op, mutating the shared KeyTable) -> reply bytes -> socket. Frames are handled in
// order. A held WAIT does not stop the connection: later frames are handled meanwhile, as
// torch's servers do (torch 1.13 clients go on after a WAIT timeout, having no CANCEL_WAIT);
// a second WAIT replaces the first, which is never answered. Nothing here throws on the I/O
// thread: a protocol violation or a request beyond a limit becomes close(reason).
//
// Bounds (rendezvous/store_limits.h): while its unsent replies exceed maxUnsentReplyBytes the
// connection is not read (backpressure: a client that pipelines GETs without reading replies
// holds one reply's worth of memory, not all of them). One timer per connection enforces the
// handshake deadline, the frame deadline and the idle limit; it is armed only when one of
// them applies, and re-armed lazily when it fires, so the common path reads no clock.
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <functional>

#include "rendezvous/key_table.h"
#include "rendezvous/protocol.h"
#include "rendezvous/store_limits.h"

namespace ddprun::rendezvous {

// Shared state of the server that connections work on (owned by StoreServer::Impl).
struct ServerCore {
  KeyTable table;
  ServerLimits limits;
  std::optional<std::string> authToken;
  LogThrottle closeLog;  // "closing connection from ..." lines, which a flood repeats
  std::string instanceId;  // random, per server: INFO tells a client which store it reached
  std::string jobId;       // the run id of the agent hosting it; empty for ddprun-store
  // Told every key a client SETs (StoreServer::setObserver), after the table has it.
  std::function<void(const std::string& key)> onSet;
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
  size_t unsentReplyBytes() const { return unsentBytes(); }
  bool paused() const { return paused_; }

 private:
  enum class WaitKind : uint8_t { None, Wait, WaitGet };
  using Clock = std::chrono::steady_clock;

  void readMore();
  void onRead(size_t n);
  // Handles what can be handled, flushes, reads on unless paused, and arms the deadlines.
  void pump();
  // Handles every complete frame in the input (until paused); then flushes replies.
  void process();
  // Handles one frame; returns false when the connection was closed.
  bool handle(protocol::Request& req);
  bool allowedBeforeAuth(protocol::Op op) const;
  // False (after closing with a reason naming the limit) when `req` would pass a global cap.
  bool withinCaps(const protocol::Request& req);
  size_t unsentBytes() const { return pending_.size() + inflight_.size(); }
  // The deadline that applies now (one at a time: handshake, else replies unread while paused,
  // else frame, else idle).
  enum class DeadlineKind : uint8_t { None, Handshake, Frame, Drain, Idle };
  struct Deadline {
    DeadlineKind kind = DeadlineKind::None;
    Clock::time_point at{};
  };
  Deadline nextDeadline() const;
  void armTimer();
  void onTimer();
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
  protocol::RequestParser parser_;
  protocol::Request req_;  // reused to keep its allocations
  bool reading_ = false;   // an async read is outstanding
  bool paused_ = false;    // not read until unsent replies drain below the cap

  // Output: replies accumulate in pending_ while inflight_ is being written.
  std::string pending_, inflight_;
  bool writing_ = false;
  bool closed_ = false;
  bool closeAfterFlush_ = false;
  bool processPosted_ = false;

  WaitKind waitKind_ = WaitKind::None;
  std::string waitGetKey_;
  bool authenticated_ = false;
  int handshakeFrames_ = 0;
  std::string nonce_;

  // Deadlines (each applies only when its limit is set).
  boost::asio::steady_timer timer_;
  bool timerArmed_ = false;
  Clock::time_point acceptedAt_;             // handshake deadline (with a token)
  std::optional<Clock::time_point> partialSince_;  // a frame is partly received since
  uint64_t framesDone_ = 0, partialFrameNo_ = 0;   // which frame partialSince_ is about
  Clock::time_point lastFrameAt_;            // idle limit
  Clock::time_point pausedSince_;            // replies unread since (frame_timeout applies)
  std::string channel_;  // our socket address, as auth::channelName writes it
};

}  // namespace ddprun::rendezvous
