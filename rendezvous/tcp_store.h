#pragma once
// TcpStore: the blocking Store client over TCP.
//
// It talks to ddprun-store (the default, StoreDialect::Ddprun: current framing plus ddprun's
// HELLO/AUTH/WAIT_GET), to a torch >= 2.2 TCPStore server (Current) or to a torch 1.13 one
// (Legacy). The connection is made in the constructor, retried with exponential backoff and
// jitter until connectTimeout; every later call is bounded by the store's timeout().
// After a transport error or timeout the connection is dropped and the next call reconnects.
// get() is one round trip against ddprun-store (WAIT_GET) and two (WAIT, GET) elsewhere.
// Calls are serialized by an internal mutex, so one TcpStore may be shared by threads.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>

#include "rendezvous/blocking.h"
#include "rendezvous/protocol.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

enum class StoreDialect : uint8_t {
  Ddprun,   // ddprun-store: current framing + extensions; authenticates when asked
  Current,  // a torch >= 2.2 TCPStore server
  Legacy,   // a torch 1.13 TCPStore server
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  Millis timeout = kDefaultStoreTimeout;  // per call
  Millis connectTimeout{60'000};          // total time to keep retrying the first connect
  StoreDialect dialect = StoreDialect::Ddprun;
  // Token for an authenticating ddprun-store. When unset, DDPRUN_STORE_TOKEN_FILE is read
  // (if that variable is set).
  std::optional<std::string> authToken;
  // Whether an unset authToken is read from DDPRUN_STORE_TOKEN_FILE (ddprun dialect only).
  // Off for stores that are never authenticated, such as the store workers meet in (PyTorch
  // workers could not authenticate to it).
  bool tokenFromEnvironment = true;
  // false: the constructor does not connect, the first call does (within connectTimeout), and
  // interrupt() from another thread cuts that connect's retries short. For a connection made
  // on a background thread whose owner must be able to stop it at once (a store that is gone
  // would otherwise hold the constructor, and the owner's join, for connectTimeout).
  bool connectInConstructor = true;
  // true: the store has answered this process before, on another connection (the heartbeat
  // writer's, made once the agent has joined through it). A first connect that it accepts and
  // does not answer then says the store stopped answering, as a reconnect does, instead of
  // doubting that a ddprun store listens there.
  bool answeredBefore = false;
};

class TcpStore final : public Store {
 public:
  // Connects and performs the handshake (unless options.connectInConstructor is false: then the
  // first call does). Throws NetworkError/TimeoutError when the server
  // cannot be reached within connectTimeout, AuthError when it refuses our token (or wants
  // one we lack), StoreError when it is not the kind of server `dialect` says.
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::optional<std::string> waitGet(const std::string& key, Millis timeout) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;

  // Which store this is (ddprun dialect only): a random id per server process, and the run id
  // of the agent that hosts it (empty for ddprun-store, which serves any job).
  struct ServerInfo {
    std::string instance;
    std::string job;
  };
  ServerInfo serverInfo();
  // Round trip with no effect (PING in the current dialects, GETNUMKEYS in legacy).
  void ping();
  // The server's clock (CLOCK, ddprun dialect only: StoreError otherwise), system_clock
  // microseconds; rendezvous/clock_offset.h turns a few of them into an offset.
  int64_t serverClockUs();
  // Makes a call blocked in another thread (typically a long WAIT, or a reconnect's backoff)
  // fail at once with NetworkError, and every later call too. Safe to call from any thread;
  // used to stop a background watcher without waiting for its WAIT to time out.
  void interrupt();
  // Makes the call in progress on another thread fail at once with NetworkError (nothing
  // happens when none is in progress). Unlike interrupt(), later calls work (reconnecting).
  void cancelCall();
  // While on, every WAIT on this connection -- the one in progress on another thread, and any
  // started later, WAIT_GET (get) included -- ends at once as if its timeout had run out
  // (TimeoutError; a WAIT that completed meanwhile returns normally), and the connection is
  // kept: the server is told with CANCEL_WAIT. Lets one thread take back a connection another
  // thread is waiting on (a round watcher sharing its agent's connection) without a reconnect.
  // No effect in the legacy dialect, which has no CANCEL_WAIT. Safe from any thread.
  void setWaitsCancelled(bool on);
  void giveUpWhenRefused() override { giveUpWhenRefused_ = true; }
  // "host:port", as used in error messages.
  const std::string& address() const { return address_; }
  const TcpStoreOptions& options() const { return options_; }

 // The socket with its buffer (defined in tcp_store.cpp).
  class Connection;

 private:
  // Runs `fn` on a connected socket, reconnecting first when needed; on any transport error
  // drops the connection and rethrows with the operation and key named.
  template <typename Fn>
  auto call(const char* op, const std::string& what, Fn&& fn);
  void connect();
  void handshake();
  void authenticate(Connection& c, const std::string& serverNonce);
  void waitImpl(const std::vector<std::string>& keys, Millis timeout, const char* op);
  // Reads the reply of the WAIT or WAIT_GET just sent on `c` (the value for WAIT_GET) until
  // `timeout` or setWaitsCancelled(); then cancels it on the server, keeping the connection,
  // and throws TimeoutError (naming `what`).
  std::string awaitWaitReply(Connection& c, bool withValue, Millis timeout, const std::string& what);
  void sendCancelLocked();  // CANCEL_WAIT for the WAIT in progress; needs interruptMu_

  TcpStoreOptions options_;
  std::string address_;
  protocol::Dialect wire_;
  std::mutex mu_;
  std::unique_ptr<Connection> conn_;
  bool connectedOnce_ = false;  // later reconnects are bounded by timeout(), not connectTimeout
  std::atomic<bool> giveUpWhenRefused_{false};  // set from the leaving thread, read in connect()
  // interrupt(): the socket of the call in progress (-1 when none), guarded by interruptMu_.
  std::mutex interruptMu_;
  CondVar interruptCv_;  // wakes a reconnect backoff (rendezvous/blocking.h: a fiber parks)
  int activeFd_ = -1;
  bool interrupted_ = false;
  // setWaitsCancelled(): also guarded by interruptMu_. waitingFd_: the socket of the WAIT in
  // progress (-1 when none); cancelSent_: its CANCEL_WAIT was sent.
  bool waitsCancelled_ = false;
  int waitingFd_ = -1;
  bool cancelSent_ = false;
};

}  // namespace ddprun::rendezvous
