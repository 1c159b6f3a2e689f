#include "rendezvous/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "rendezvous/auth.h"
#include "base/errors.h"
#include "base/log.h"
#include "rendezvous/tcp_connection.h"

namespace ddprun::rendezvous {

using protocol::FrameReader;
using protocol::FrameWriter;
using protocol::Op;

namespace {

constexpr uint64_t kMaxReply = uint64_t{1} << 30;
constexpr Millis kHandshakeTimeout{10'000};

std::string frame(Op op, protocol::Dialect d) {
  std::string s;
  auto b = protocol::encodeCommand(op, d);
  DDPRUN_CHECK(b.has_value(), protocol::opName(op) << " has no byte in the "
                                                   << protocol::dialectName(d) << " dialect");
  s.push_back(static_cast<char>(*b));
  return s;
}

std::optional<std::string> tokenFromEnvironment() {
  const char* f = std::getenv("DDPRUN_STORE_TOKEN_FILE");
  if (f == nullptr || *f == '\0') return std::nullopt;
  return auth::readTokenFile(f);
}
}  // namespace

TcpStore::TcpStore(TcpStoreOptions options)
    : Store(options.timeout),
      options_(std::move(options)),
      address_(options_.host + ":" + std::to_string(options_.port)),
      wire_(options_.dialect == StoreDialect::Legacy ? protocol::Dialect::Legacy
                                                     : protocol::Dialect::Current) {
  if (!options_.authToken && options_.tokenFromEnvironment &&
      options_.dialect == StoreDialect::Ddprun) {
    options_.authToken = tokenFromEnvironment();
  }
  if (options_.authToken && options_.dialect != StoreDialect::Ddprun) {
    throw ConfigError("store at " + address_ +
                      ": an authentication token needs the ddprun dialect (torch's TCPStore "
                      "has no authentication)");
  }
  if (!options_.connectInConstructor) return;
  std::lock_guard<std::mutex> g(mu_);
  connect();
}

TcpStore::~TcpStore() = default;

void TcpStore::connect() {
  conn_.reset();
  const auto start = Clock::now();
  const Millis budget = connectedOnce_ ? std::min(options_.connectTimeout, timeout())
                                       : options_.connectTimeout;
  const auto deadline = start + budget;
  std::optional<std::mt19937_64> rng;  // seeded at the first retry: most connects need none
  auto backoff = std::chrono::milliseconds(10);
  std::string lastError;
  int attempts = 0;
  for (;;) {
    ++attempts;
    bool refused = false;  // an address answered that nobody listens there
    try {
      for (const auto& a : resolveTcp(options_.host, options_.port)) {
        auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
        int fd = tryConnect(a, std::max(Millis(1), std::min(left, Millis(5000))));
        if (fd >= 0) {
          conn_ = std::make_unique<Connection>(fd);
          handshake();
          connectedOnce_ = true;
          return;
        }
        const int err = errno;
        lastError = std::strerror(err);
        refused = refused || err == ECONNREFUSED;
      }
    } catch (const NetworkError& e) {  // resolution failure: may be transient, retry
      lastError = e.what();
    }
    const auto now = Clock::now();
    if (now >= deadline || (refused && giveUpWhenRefused_)) break;
    // Exponential backoff with jitter in [0.5, 1.5), so that many clients do not retry in step.
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    if (!rng) rng.emplace(std::random_device{}());
    auto sleep = std::chrono::duration_cast<Clock::duration>(backoff * jitter(*rng));
    sleep = std::min(sleep, deadline - now);
    {
      // Sleeps, unless interrupt() cuts the backoff short.
      std::unique_lock<std::mutex> lock(interruptMu_);
      if (interruptCv_.waitFor(lock, sleep, [&] { return interrupted_; }))
        throw NetworkError("store at " + address_ + ": interrupted while reconnecting");
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  const auto ms = std::chrono::duration_cast<Millis>(Clock::now() - start).count();
  throw NetworkError("cannot connect to the store at " + address_ + " (" +
                     std::to_string(attempts) + " attempts over " + std::to_string(ms) +
                     " ms): " + lastError);
}

void TcpStore::handshake() {
  if (options_.dialect == StoreDialect::Legacy) return;
  Connection& c = *conn_;
  c.setDeadline(Clock::now() + std::min(timeout(), kHandshakeTimeout));
  const bool ddprun = options_.dialect == StoreDialect::Ddprun;
  try {
    std::string out = frame(Op::Validate, wire_);
    FrameWriter w(out);
    w.u32(protocol::kValidateMagic);
    const uint32_t nonce = static_cast<uint32_t>(::getpid());
    out += frame(Op::Ping, wire_);
    w.u32(nonce);
    if (ddprun) out += frame(Op::Hello, wire_);
    c.write(out);
    if (c.u32() != nonce) {
      throw StoreError("the server at " + address_ + " answered PING wrongly: it is not a " +
                       (ddprun ? "ddprun-store" : "TCPStore"));
    }
    if (!ddprun) return;
    const std::string identity = c.str(1024);
    const bool authRequired = c.u8() != 0;
    const std::string challenge = c.str(1024);
    if (identity != protocol::kServerIdentity) {
      throw StoreError("the server at " + address_ + " is not a ddprun store (it says '" +
                       identity + "')");
    }
    if (authRequired && !options_.authToken) {
      throw AuthError("the store at " + address_ +
                      " requires an authentication token: set DDPRUN_STORE_TOKEN_FILE");
    }
    if (!authRequired && options_.authToken) {
      throw AuthError("the store at " + address_ +
                      " does not use authentication but we have a token: it is not this "
                      "job's store");
    }
    if (authRequired) authenticate(c, challenge);
  } catch (const IoFailure& f) {
    conn_.reset();
    if (f.timeout && (connectedOnce_ || options_.answeredBefore)) {
      // It answered this client (or this process) before: the kernel still accepts connections
      // for it (its listen backlog), but nothing replies. Stopped (SIGSTOP), hung, or its
      // machine is.
      throw TimeoutError("the store at " + address_ + " stopped answering: it accepted a new "
                         "connection but did not reply to the handshake within " +
                         std::to_string(std::min(timeout(), kHandshakeTimeout).count()) +
                         " ms (it answered before; is its process stopped or hung?)");
    }
    // A store past its connection limit, or out of descriptors, accepts and closes at once.
    const std::string hint =
        f.timeout ? (ddprun ? ": is it a ddprun-store, and is its process running (not stopped)?"
                            : "")
                  : ": the store may be at its connection or descriptor limit (max_connections, "
                    "ulimit -n; see its log)" + std::string(ddprun ? ", or it is not a ddprun-store" : "");
    throw StoreError("the server at " + address_ + " did not complete the " +
                     (ddprun ? "ddprun" : "TCPStore") + " handshake (" + f.what() + ")" + hint);
  } catch (...) {
    conn_.reset();
    throw;
  }
}

// Mutual, channel-bound authentication (rendezvous/auth.h): we prove the token over both
// nonces and the store's address as we reached it; the store must prove it back.
void TcpStore::authenticate(Connection& c, const std::string& serverNonce) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  char ip[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (::getpeername(c.fd(), reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      ::inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
      port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      ::inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
      port = ntohs(a->sin6_port);
    }
  }
  const std::string channel = auth::channelName(ip, port);
  const std::string clientNonce = auth::randomNonce();
  const std::string& token = *options_.authToken;
  std::string a = frame(Op::Auth, wire_);
  FrameWriter(a).str(clientNonce).str(
      auth::proof(token, auth::Direction::ClientToServer, serverNonce, clientNonce, channel));
  c.write(a);
  if (c.u8() != static_cast<uint8_t>(protocol::AuthReply::Ok)) {
    throw AuthError("the store at " + address_ + " refused our authentication token (another "
                    "token, or something between us: a relay, NAT or port forward -- proofs are "
                    "bound to the store's address, here " + channel + ")");
  }
  std::string theirs;
  try {
    theirs = c.str(1024);
  } catch (const IoFailure&) {
    theirs.clear();  // it answered AUTH_OK and then nothing: as good as a wrong proof
  }
  const std::string expected =
      auth::proof(token, auth::Direction::ServerToClient, serverNonce, clientNonce, channel);
  if (!auth::constantTimeEquals(theirs, expected)) {
    throw AuthError("the server at " + address_ + " accepted us without proving it knows the "
                    "token: it is not this job's store (refused)");
  }
}

void TcpStore::interrupt() {
  {
    std::lock_guard<std::mutex> g(interruptMu_);
    interrupted_ = true;
    if (activeFd_ >= 0) ::shutdown(activeFd_, SHUT_RDWR);
  }
  interruptCv_.notifyAll();
}

void TcpStore::cancelCall() {
  std::lock_guard<std::mutex> g(interruptMu_);
  if (activeFd_ >= 0) ::shutdown(activeFd_, SHUT_RDWR);
}

template <typename Fn>
auto TcpStore::call(const char* op, const std::string& what, Fn&& fn) {
  std::lock_guard<std::mutex> g(mu_);
  {
    std::lock_guard<std::mutex> i(interruptMu_);
    if (interrupted_) throw NetworkError("store at " + address_ + ": interrupted");
  }
  if (!conn_) connect();
  // Publishes the socket to interrupt() for the duration of the call (conn_ cannot be
  // destroyed meanwhile: that needs mu_, which we hold).
  struct Active {
    TcpStore& s;
    Active(TcpStore& st, int fd) : s(st) {
      std::lock_guard<std::mutex> g(s.interruptMu_);
      if (s.interrupted_) throw NetworkError("store at " + s.address_ + ": interrupted");
      s.activeFd_ = fd;
    }
    ~Active() {
      std::lock_guard<std::mutex> g(s.interruptMu_);
      s.activeFd_ = -1;
    }
  } active(*this, conn_->fd());
  try {
    conn_->setDeadline(Clock::now() + timeout());
    return fn(*conn_);
  } catch (const IoFailure& f) {
    conn_.reset();
    const std::string msg = "store at " + address_ + ": " + op + " " + what + ": " + f.what();
    if (f.timeout) {
      throw TimeoutError(msg + " (timeout " + std::to_string(timeout().count()) + " ms)");
    }
    throw NetworkError(msg);
  }
}

void TcpStore::set(const std::string& key, const std::string& value) {
  call("SET", "'" + key + "'", [&](Connection& c) {
    std::string f = frame(Op::Set, wire_);
    FrameWriter(f).str(key).str(value);
    c.write(f);
  });
}

void TcpStore::setWaitsCancelled(bool on) {
  std::lock_guard<std::mutex> g(interruptMu_);
  waitsCancelled_ = on;
  if (on) sendCancelLocked();
}

void TcpStore::sendCancelLocked() {
  if (waitingFd_ < 0 || cancelSent_ || wire_ == protocol::Dialect::Legacy) return;
  const std::string f = frame(Op::CancelWait, wire_);
  // One byte into a socket that has nothing else to send: it does not block. Should it fail,
  // the waiting thread's read reports the broken connection.
  (void)::send(waitingFd_, f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  cancelSent_ = true;
}

// A WAIT ends with STOP_WAITING (the keys exist), or with WAIT_CANCELED once a CANCEL_WAIT was
// sent (by our own timeout, or by setWaitsCancelled on another thread), or with both when the
// two raced. Exactly one CANCEL_WAIT is sent per wait at most; its answer is always read, so
// the connection is left with nothing in flight.
std::string TcpStore::awaitWaitReply(Connection& c, bool withValue, Millis timeout,
                                     const std::string& what) {
  {
    std::lock_guard<std::mutex> g(interruptMu_);
    waitingFd_ = c.fd();
    cancelSent_ = false;
    if (waitsCancelled_) sendCancelLocked();
  }
  // After this no other thread sends a CANCEL_WAIT; returns whether one was sent.
  auto stopWaiting = [&] {
    std::lock_guard<std::mutex> g(interruptMu_);
    waitingFd_ = -1;
    return cancelSent_;
  };
  constexpr auto kStop = static_cast<uint8_t>(protocol::WaitReply::StopWaiting);
  constexpr auto kCanceled = static_cast<uint8_t>(protocol::WaitReply::WaitCanceled);
  c.setDeadline(Clock::now() + timeout);
  std::optional<uint8_t> first;
  try {
    c.awaitReadable();
    first = c.u8();
  } catch (const IoFailure& f) {
    if (!f.timeout || wire_ == protocol::Dialect::Legacy) {  // legacy: drop the socket
      stopWaiting();
      throw;
    }
  }
  const bool cancelled = stopWaiting();
  bool done = false;
  std::string value;
  if (first && *first == kStop) {
    done = true;
    if (withValue) value = c.str(kMaxReply);
    if (!cancelled) return value;
  } else if (first && !(*first == kCanceled && cancelled)) {
    throw IoFailure{false, "unexpected WAIT reply " + std::to_string(*first)};
  }
  c.setDeadline(Clock::now() + kHandshakeTimeout);
  if (!cancelled) c.write(frame(Op::CancelWait, wire_));  // our own timeout
  if (!first || *first != kCanceled) {
    uint8_t r = c.u8();
    if (!done && r == kStop) {  // raced: done after all
      done = true;
      if (withValue) value = c.str(kMaxReply);
      r = c.u8();
    }
    if (r != kCanceled) throw IoFailure{false, "unexpected CANCEL_WAIT reply " + std::to_string(r)};
  }
  if (done) return value;
  throw TimeoutError("store at " + address_ + ": " +
                     (first ? "the wait for " + what + " was cancelled"
                            : "timed out after " + std::to_string(timeout.count()) +
                                  " ms waiting for " + what));
}

std::string TcpStore::get(const std::string& key) {
  if (options_.dialect == StoreDialect::Ddprun) {
    return call("GET", "'" + key + "'", [&](Connection& c) {
      std::string f = frame(Op::WaitGet, wire_);
      FrameWriter(f).str(key);
      c.write(f);
      return awaitWaitReply(c, true, timeout(), "'" + key + "'");
    });
  }
  waitImpl({key}, timeout(), "GET");
  return call("GET", "'" + key + "'", [&](Connection& c) {
    std::string f = frame(Op::Get, wire_);
    FrameWriter(f).str(key);
    c.write(f);
    return c.str(kMaxReply);
  });
}

std::optional<std::string> TcpStore::waitGet(const std::string& key, Millis timeout) {
  if (options_.dialect != StoreDialect::Ddprun) return Store::waitGet(key, timeout);
  try {
    return call("GET", "'" + key + "'", [&](Connection& c) {
      std::string f = frame(Op::WaitGet, wire_);
      FrameWriter(f).str(key);
      c.write(f);
      return awaitWaitReply(c, true, timeout, "'" + key + "'");
    });
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return call("ADD", "'" + key + "'", [&](Connection& c) {
    std::string f = frame(Op::Add, wire_);
    FrameWriter(f).str(key).i64(delta);
    c.write(f);
    return c.i64();
  });
}

std::string TcpStore::compareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) {
  return call("COMPARE_SET", "'" + key + "'", [&](Connection& c) {
    std::string f = frame(Op::CompareSet, wire_);
    FrameWriter(f).str(key).str(expected).str(desired);
    c.write(f);
    return c.str(kMaxReply);
  });
}

static void writeKeyList(std::string& f, const std::vector<std::string>& keys) {
  FrameWriter w(f);
  w.u64(keys.size());
  for (const auto& k : keys) w.str(k);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return call("CHECK", quoteKeys(keys), [&](Connection& c) {
    std::string f = frame(Op::Check, wire_);
    writeKeyList(f, keys);
    c.write(f);
    return c.u8() == static_cast<uint8_t>(protocol::CheckReply::Ready);
  });
}

void TcpStore::waitImpl(const std::vector<std::string>& keys, Millis timeout, const char* op) {
  call(op, quoteKeys(keys), [&](Connection& c) {
    std::string f = frame(Op::Wait, wire_);
    writeKeyList(f, keys);
    c.write(f);
    awaitWaitReply(c, false, timeout, quoteKeys(keys));
  });
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  waitImpl(keys, timeout, "WAIT");
}

bool TcpStore::deleteKey(const std::string& key) {
  return call("DELETE_KEY", "'" + key + "'", [&](Connection& c) {
    std::string f = frame(Op::DeleteKey, wire_);
    FrameWriter(f).str(key);
    c.write(f);
    return c.i64() > 0;
  });
}

int64_t TcpStore::numKeys() {
  return call("GETNUMKEYS", "", [&](Connection& c) {
    c.write(frame(Op::GetNumKeys, wire_));
    return c.i64();
  });
}

std::vector<std::string> TcpStore::multiGet(const std::vector<std::string>& keys) {
  if (options_.dialect == StoreDialect::Legacy) {  // torch 1.13 has no MULTI_GET
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(get(k));
    return out;
  }
  waitImpl(keys, timeout(), "MULTI_GET");
  return call("MULTI_GET", quoteKeys(keys), [&](Connection& c) {
    std::string f = frame(Op::MultiGet, wire_);
    writeKeyList(f, keys);
    c.write(f);
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) out.push_back(c.str(kMaxReply));
    return out;
  });
}

void TcpStore::multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("store at " + address_ + ": multiSet with " + std::to_string(keys.size()) +
                     " keys but " + std::to_string(values.size()) + " values");
  }
  if (options_.dialect == StoreDialect::Legacy) {
    for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
    return;
  }
  call("MULTI_SET", quoteKeys(keys), [&](Connection& c) {
    std::string f = frame(Op::MultiSet, wire_);
    FrameWriter w(f);
    w.u64(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) w.str(keys[i]).str(values[i]);
    c.write(f);
  });
}

void TcpStore::append(const std::string& key, const std::string& value) {
  if (options_.dialect == StoreDialect::Legacy) {
    // torch 1.13 has no APPEND: emulate it with compare-and-set until it sticks.
    std::string current = check({key}) ? get(key) : std::string();
    for (;;) {
      std::string want = current + value;
      std::string now = compareSet(key, current, want);
      if (now == want) return;
      current = now;
    }
  }
  call("APPEND", "'" + key + "'", [&](Connection& c) {
    std::string f = frame(Op::Append, wire_);
    FrameWriter(f).str(key).str(value);
    c.write(f);
  });
}

void TcpStore::ping() {
  call("PING", "", [&](Connection& c) {
    if (wire_ == protocol::Dialect::Legacy) {
      c.write(frame(Op::GetNumKeys, wire_));
      c.i64();
      return;
    }
    std::string f = frame(Op::Ping, wire_);
    FrameWriter(f).u32(42);
    c.write(f);
    if (c.u32() != 42) throw IoFailure{false, "PING answered wrongly"};
  });
}

int64_t TcpStore::serverClockUs() {
  if (options_.dialect != StoreDialect::Ddprun) {
    throw StoreError("store at " + address_ + ": CLOCK needs a ddprun store");
  }
  return call("CLOCK", "", [&](Connection& c) {
    c.write(frame(Op::Clock, wire_));
    return c.i64();
  });
}

TcpStore::ServerInfo TcpStore::serverInfo() {
  if (options_.dialect != StoreDialect::Ddprun) {
    throw StoreError("store at " + address_ + ": INFO needs a ddprun store");
  }
  return call("INFO", "", [&](Connection& c) {
    c.write(frame(Op::Info, wire_));
    ServerInfo info;
    info.instance = c.str(1024);
    info.job = c.str(64 * 1024);
    return info;
  });
}

}  // namespace ddprun::rendezvous
