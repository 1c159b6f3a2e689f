#pragma once
// ServerLimits: everything a store server bounds, in memory and in time, with its defaults.
//
// Whatever a peer sends, the server holds at most, per connection, one frame being received
// (frame.maxFrameBytes) and its unsent replies (maxUnsentReplyBytes plus one reply of at most
// frame.maxValueBytes: past the cap the connection is not read until its replies drain), and
// in all maxConnections connections, maxWaiters held WAITs, maxKeys keys and maxStoredBytes
// bytes of keys and values. A request beyond a global cap closes its connection (TCPStore's
// wire has no error reply) with one log line naming the peer and the limit; what was stored
// stays. docs/protocol.md ("Limits") and docs/security.md list each with its flag.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/protocol.h"

namespace ddprun::rendezvous {

struct ServerLimits {
  protocol::Limits frame{};                          // one frame: key, value, count, whole frame
  uint64_t maxUnsentReplyBytes = 4ull << 20;         // per connection, then reading pauses
  uint64_t maxStoredBytes = 2ull << 30;              // keys + values + queued items
  uint64_t maxKeys = 1'000'000;                      // keys and queues
  uint64_t maxConnections = 65'536;                  // also bounded by the descriptor limit
  uint64_t maxWaiters = 65'536;                      // connections holding a WAIT or WAIT_GET
  // With a token: from accept to AUTH_OK. Only handshake frames (VALIDATE, PING, HELLO, AUTH)
  // of at most kHandshakeFrameLimits are read before; more than kMaxHandshakeFrames closes.
  std::chrono::milliseconds handshakeTimeout{5'000};
  // A frame whose first byte arrived must be complete within this (slow senders); 0: none.
  // While the connection is paused by its own unread replies this counts instead how long the
  // peer reads none of them.
  std::chrono::milliseconds frameTimeout{30'000};
  // A connection that completes no frame for this long is closed; 0 (default): never.
  // A connection holding a WAIT is never cut for being idle.
  std::chrono::milliseconds idleTimeout{0};
};

// The limits by name, as ddprun-store's flags (--max-connections) and --rdzv-conf keys
// (store_max_connections) spell them: max_connections, max_waiters, max_keys,
// max_stored_bytes, max_unsent_reply_bytes, max_value_bytes, max_frame_bytes (sizes in bytes,
// with an optional K, M or G suffix: powers of 1024), handshake_timeout, frame_timeout,
// idle_timeout (seconds, decimals allowed, 0 turns it off).
const std::vector<std::string>& storeLimitNames();
// Sets the limit `name` from `value`; ConfigError naming `what` (the flag or key as the user
// wrote it), the value and what is allowed when the name or the value is not valid.
void setStoreLimit(ServerLimits& limits, const std::string& name, const std::string& value,
                   const std::string& what);

// `value` as a number of seconds (decimals allowed, >= 0 and < 1e9, e.g. "30" or "0.5") in
// milliseconds, rounded to the nearest (a half up, as std::llround); nullopt when it is not
// one. Rounds without libm's llround, so that ddprun needs no libm.so.6: one shared library
// fewer for the loader at every agent's start (docs/rendezvous.md, "What an agent process
// costs").
std::optional<std::chrono::milliseconds> parseSecondsValue(const std::string& value);

// What an unauthenticated connection may send, frame by frame, when the server has a token.
inline constexpr protocol::Limits kHandshakeFrameLimits{
    .maxKeyBytes = 0, .maxValueBytes = 1024, .maxKeysPerRequest = 0, .maxFrameBytes = 1024};
inline constexpr int kMaxHandshakeFrames = 8;

// Rate limit for log lines about a condition that can repeat thousands of times a second
// (descriptor exhaustion at accept, a flood of bad connections): the first `burst` lines of
// each `window` are logged, the rest only counted, and the next logged line says how many
// were suppressed. Single-threaded: the server's I/O thread owns it.
class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogThrottle(int burst = 10, std::chrono::milliseconds window = std::chrono::seconds(10))
      : burst_(burst), window_(window) {}
  // True when this line may be logged; then `suppressed` is how many were dropped since the
  // last logged one (to append to it).
  bool allow(uint64_t& suppressed) {
    const auto now = Clock::now();
    if (now - windowStart_ >= window_) {
      windowStart_ = now;
      inWindow_ = 0;
    }
    if (inWindow_ >= burst_) {
      ++suppressed_;
      return false;
    }
    ++inWindow_;
    suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 private:
  int burst_;
  std::chrono::milliseconds window_;
  Clock::time_point windowStart_{};
  int inWindow_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace ddprun::rendezvous
