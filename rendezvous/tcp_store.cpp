#include "rendezvous/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "rendezvous/auth.h"
#include "rendezvous/errors.h"
#include "rendezvous/log.h"

namespace ddprun::rendezvous {

using protocol::FrameReader;
using protocol::FrameWriter;
using protocol::Op;

namespace {

std::string quoteKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 4; ++i) {
    if (i) s += ", ";
    s += "'" + keys[i] + "'";
  }
  if (keys.size() > 4) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return s;
}

// An I/O failure inside a call; `call` turns it into a typed error with the context.
struct IoFailure {
  bool timeout;
  std::string what;
};

}  // namespace

// One socket with a receive buffer. Every read and write honours an absolute deadline
// (SO_RCVTIMEO/SO_SNDTIMEO, updated only when the remaining time shrinks below them, so the
// common round trip costs one send and one recv).
class TcpStore::Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  ~Connection() { ::close(fd_); }

  void setDeadline(Clock::time_point d) { deadline_ = d; }
  int fd() const { return fd_; }

  void write(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      applyTimeout(SO_SNDTIMEO, sndTimeout_);
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        retryOrThrow(sndTimeout_, "send timed out");
        continue;
      }
      throw IoFailure{false, std::string("send failed: ") + std::strerror(errno)};
    }
  }

  // Makes at least n bytes available in the buffer.
  void fill(size_t n) {
    while (end_ - start_ < n) {
      if (start_ > 0 && (buf_.size() - end_ < 4096 || start_ == end_)) {
        std::memmove(buf_.data(), buf_.data() + start_, end_ - start_);
        end_ -= start_;
        start_ = 0;
      }
      if (buf_.size() - end_ < n - (end_ - start_) || buf_.size() - end_ < 4096)
        buf_.resize(std::max(buf_.size() * 2, end_ + n + 4096));
      applyTimeout(SO_RCVTIMEO, rcvTimeout_);
      ssize_t r = ::recv(fd_, buf_.data() + end_, buf_.size() - end_, 0);
      if (r > 0) {
        end_ += static_cast<size_t>(r);
        continue;
      }
      if (r == 0) throw IoFailure{false, "the server closed the connection"};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        retryOrThrow(rcvTimeout_, "no reply in time");
        continue;
      }
      throw IoFailure{false, std::string("recv failed: ") + std::strerror(errno)};
    }
  }

  // Blocks until a byte can be read or the deadline passes (then throws a timeout), with
  // poll()'s precise timer: a socket timeout (SO_RCVTIMEO) runs on the kernel's coarse timer
  // wheel and fires up to ~12% late on waits of seconds. Used before long waits (WAIT).
  void awaitReadable() {
    while (end_ == start_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline_ - Clock::now() + std::chrono::microseconds(999));
      if (left.count() <= 0) throw IoFailure{true, "no reply in time"};
      pollfd p{fd_, POLLIN, 0};
      const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX)));
      if (rc > 0) return;  // readable, or an error/hang-up that the next recv reports
      if (rc < 0 && errno != EINTR) {
        throw IoFailure{false, std::string("poll failed: ") + std::strerror(errno)};
      }
    }
  }
  uint8_t u8() { fill(1); return static_cast<uint8_t>(buf_[start_++]); }
  uint32_t u32() { uint32_t v; take(&v, 4); return v; }
  int64_t i64() { int64_t v; take(&v, 8); return v; }
  std::string str(uint64_t maxLen) {
    uint64_t len;
    take(&len, 8);
    if (len > maxLen) throw IoFailure{false, "reply string of " + std::to_string(len) + " bytes exceeds " + std::to_string(maxLen)};
    fill(static_cast<size_t>(len));
    std::string s(buf_.data() + start_, static_cast<size_t>(len));
    start_ += static_cast<size_t>(len);
    return s;
  }

 private:
  void take(void* p, size_t n) {
    fill(n);
    std::memcpy(p, buf_.data() + start_, n);
    start_ += n;
  }
  // Sets the socket timeout to the time left until the deadline, unless the current setting
  // is already within a small slack of it: then the common round trip costs no setsockopt.
  // A recv that times out before the deadline re-arms and retries (see retryOrThrow).
  void applyTimeout(int which, std::chrono::microseconds& current) {
    using std::chrono::microseconds;
    auto left = std::chrono::duration_cast<microseconds>(deadline_ - Clock::now());
    if (left.count() <= 0) throw IoFailure{true, "deadline passed"};
    const microseconds slack = current / 64 + microseconds(1000);
    if (current.count() != 0 && left > current - slack && left < current + slack) return;
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(left.count() / 1'000'000);
    tv.tv_usec = static_cast<suseconds_t>(left.count() % 1'000'000);
    ::setsockopt(fd_, SOL_SOCKET, which, &tv, sizeof tv);
    current = left;
  }
  // After EAGAIN: retry when the deadline is still ahead (the setting was stale), else throw.
  void retryOrThrow(std::chrono::microseconds& current, const char* what) {
    if (Clock::now() + std::chrono::milliseconds(1) < deadline_) {
      current = std::chrono::microseconds(0);
      return;
    }
    throw IoFailure{true, what};
  }

  int fd_;
  std::vector<char> buf_ = std::vector<char>(64 * 1024);
  size_t start_ = 0, end_ = 0;
  Clock::time_point deadline_{};
  std::chrono::microseconds rcvTimeout_{0}, sndTimeout_{0};
};

namespace {

// Resolves host:port; returns the addresses to try, or throws NetworkError.
std::vector<addrinfo> resolve(const std::string& host, uint16_t port, addrinfo** list) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, list);
  if (rc != 0) {
    throw NetworkError("store at " + host + ":" + service + ": cannot resolve '" + host +
                       "': " + gai_strerror(rc));
  }
  std::vector<addrinfo> out;
  for (addrinfo* a = *list; a; a = a->ai_next) out.push_back(*a);
  return out;
}

// One non-blocking connect attempt bounded by `timeout`; returns the fd or -1 with errno set.
int tryConnect(const addrinfo& a, std::chrono::milliseconds timeout) {
  int fd = ::socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.ai_protocol);
  if (fd < 0) return -1;
  int rc = ::connect(fd, a.ai_addr, a.ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, timeout.count())));
    if (rc == 1) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    } else {
      rc = -1;
      if (errno == 0 || rc == 0) errno = ETIMEDOUT;
    }
  }
  if (rc != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  int flags = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &flags, sizeof flags);
  // Back to blocking: reads and writes are bounded by SO_RCVTIMEO/SO_SNDTIMEO.
  int fl = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

}  // namespace

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
  std::mt19937_64 rng(std::random_device{}());
  auto backoff = std::chrono::milliseconds(10);
  std::string lastError;
  int attempts = 0;
  for (;;) {
    ++attempts;
    addrinfo* list = nullptr;
    try {
      auto addrs = resolve(options_.host, options_.port, &list);
      for (const auto& a : addrs) {
        auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
        int fd = tryConnect(a, std::max(Millis(1), std::min(left, Millis(5000))));
        if (fd >= 0) {
          ::freeaddrinfo(list);
          conn_ = std::make_unique<Connection>(fd);
          handshake();
          connectedOnce_ = true;
          return;
        }
        lastError = std::strerror(errno);
      }
      ::freeaddrinfo(list);
    } catch (const NetworkError& e) {  // resolution failure: may be transient, retry
      if (list) ::freeaddrinfo(list);
      lastError = e.what();
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    // Exponential backoff with jitter in [0.5, 1.5), so that many clients do not retry in step.
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    auto sleep = std::chrono::duration_cast<Clock::duration>(backoff * jitter(rng));
    sleep = std::min(sleep, deadline - now);
    {
      // Sleeps, unless interrupt() cuts the backoff short.
      std::unique_lock<std::mutex> lock(interruptMu_);
      if (interruptCv_.wait_for(lock, sleep, [&] { return interrupted_; }))
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
    if (c.u32() != nonce) throw StoreError("store at " + address_ + " answered PING wrongly");
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
    if (authRequired) {
      std::string a = frame(Op::Auth, wire_);
      FrameWriter(a).str(auth::proof(*options_.authToken, challenge));
      c.write(a);
      if (c.u8() != static_cast<uint8_t>(protocol::AuthReply::Ok)) {
        throw AuthError("the store at " + address_ + " refused our authentication token");
      }
    }
  } catch (const IoFailure& f) {
    conn_.reset();
    throw StoreError("the server at " + address_ + " did not complete the " +
                     (ddprun ? "ddprun" : "TCPStore") + " handshake (" + f.what +
                     (ddprun ? "): is it a ddprun-store?" : ")"));
  } catch (...) {
    conn_.reset();
    throw;
  }
}

void TcpStore::interrupt() {
  {
    std::lock_guard<std::mutex> g(interruptMu_);
    interrupted_ = true;
    if (activeFd_ >= 0) ::shutdown(activeFd_, SHUT_RDWR);
  }
  interruptCv_.notify_all();
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
    const std::string msg = "store at " + address_ + ": " + op + " " + what + ": " + f.what;
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

// Reads a WAIT or WAIT_GET reply until `timeout`; on timeout cancels the wait on the server
// (current dialects) so the connection stays usable, then throws TimeoutError.
// Returns the value for WAIT_GET.
static std::string awaitWaitReply(TcpStore::Connection& c, bool withValue, Millis timeout,
                                  protocol::Dialect wire, const std::string& address,
                                  const std::string& what) {
  c.setDeadline(Clock::now() + timeout);
  try {
    c.awaitReadable();
    const uint8_t r = c.u8();
    if (r != static_cast<uint8_t>(protocol::WaitReply::StopWaiting))
      throw IoFailure{false, "unexpected WAIT reply " + std::to_string(r)};
    return withValue ? c.str(kMaxReply) : std::string();
  } catch (const IoFailure& f) {
    if (!f.timeout || wire == protocol::Dialect::Legacy) throw;  // legacy: drop the socket
  }
  c.setDeadline(Clock::now() + kHandshakeTimeout);
  c.write(frame(Op::CancelWait, wire));
  uint8_t r = c.u8();
  if (r == static_cast<uint8_t>(protocol::WaitReply::StopWaiting)) {  // raced: done after all
    if (withValue) c.str(kMaxReply);
    r = c.u8();
  }
  if (r != static_cast<uint8_t>(protocol::WaitReply::WaitCanceled))
    throw IoFailure{false, "unexpected CANCEL_WAIT reply " + std::to_string(r)};
  throw TimeoutError("store at " + address + ": timed out after " +
                     std::to_string(timeout.count()) + " ms waiting for " + what);
}

std::string TcpStore::get(const std::string& key) {
  if (options_.dialect == StoreDialect::Ddprun) {
    return call("GET", "'" + key + "'", [&](Connection& c) {
      std::string f = frame(Op::WaitGet, wire_);
      FrameWriter(f).str(key);
      c.write(f);
      return awaitWaitReply(c, true, timeout(), wire_, address_, "'" + key + "'");
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
    awaitWaitReply(c, false, timeout, wire_, address_, quoteKeys(keys));
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

}  // namespace ddprun::rendezvous
