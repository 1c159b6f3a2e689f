#include "rendezvous/etcd/grpc/connection.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <unordered_map>

#include "rendezvous/etcd/grpc/proto.h"

namespace ddprun::rendezvous::etcd::grpc {

namespace {

constexpr size_t kMaxHeaderBytes = 64u << 10;      // one call's headers and trailers
constexpr int32_t kStreamWindow = 1 << 20;          // what a member may send a call unread
constexpr int32_t kConnectionWindow = 16 << 20;
constexpr size_t kMaxReadPerPump = 1u << 20;        // then the next waiter gets its turn

std::string descriptorLimit() {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  return "this process may open " + std::to_string(rl.rlim_cur) +
         " file descriptors: RLIMIT_NOFILE";
}

// grpc-message is percent-encoded (gRPC's HTTP/2 protocol spec).
std::string percentDecode(std::string_view v) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '%' && i + 2 < v.size() && hex(v[i + 1]) >= 0 && hex(v[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(v[i + 1]) * 16 + hex(v[i + 2])));
      i += 2;
      continue;
    }
    out.push_back(v[i]);
  }
  return out;
}

}  // namespace

// What the connection knows of one call; shared by the Call and the connection's table of open
// streams (until the stream closes).
struct CallState {
  CallState(std::string m, size_t max) : method(m), maxMessage(max), reader(std::move(m), max) {}
  std::string method;
  size_t maxMessage;
  int32_t id = -1;
  std::string out;  // the framed request, sent by readRequest()
  size_t outOff = 0;
  bool halfClose = true;
  MessageReader reader;
  std::deque<std::string> messages;  // whole reply messages not yet taken
  size_t held = 0;                   // their bytes
  size_t headerBytes = 0;
  int httpStatus = 0;
  std::optional<int> grpcStatus;
  std::string grpcMessage;
  bool closed = false;
  uint32_t closeCode = 0;  // the HTTP/2 error code the stream closed with
  std::string error;       // what the member sent that gRPC does not allow (the call failed)
  bool cancelled = false;
  bool woken = false;
};

struct Connection::Impl {
  std::string member;
  int fd = -1;
  int wakeFd = -1;     // threads only: ends the driver's poll
  bool coop = false;   // made under a Blocking: its waits park fibers of that thread
  nghttp2_session* session = nullptr;
  std::mutex mu;
  CondVar cv;
  bool driving = false;
  bool broken = false;
  std::string brokenWhy;
  bool goaway = false;
  std::string http2Error;  // nghttp2's last word on what the member did wrong
  bool receivedAny = false;
  std::string out;  // bytes nghttp2 produced that the socket has not taken yet
  std::unordered_map<int32_t, std::shared_ptr<CallState>> calls;
  int64_t started = 0;

  ~Impl() {
    if (session) nghttp2_session_del(session);
    if (fd >= 0) closeFd(fd);
    if (wakeFd >= 0) ::close(wakeFd);
  }

  CallState* find(int32_t id) {
    auto it = calls.find(id);
    return it == calls.end() ? nullptr : it->second.get();
  }

  void breakLocked(const std::string& why) {
    if (!broken) {
      broken = true;
      brokenWhy = why;
    }
    cv.notifyAll();
  }

  // Ends the driver's wait for the socket (it then re-checks why).
  void interruptDriver() {
    if (coop) {
      if (Blocking* b = Blocking::current()) b->wake(this);
    } else if (wakeFd >= 0) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(wakeFd, &one, sizeof one);
    }
  }

  // Hands nghttp2's pending frames to the socket, as far as it takes them without blocking.
  void flushLocked() {
    if (broken) return;
    for (;;) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(session, &data);
      if (n < 0) {
        breakLocked("HTTP/2: " + std::string(nghttp2_strerror(static_cast<int>(n))));
        return;
      }
      if (n == 0) break;
      out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
      if (out.size() >= (1u << 20)) break;  // the rest once the socket takes this
    }
    while (!out.empty()) {
      const ssize_t w = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        out.erase(0, static_cast<size_t>(w));
      } else if (w < 0 && errno == EINTR) {
        continue;
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else {
        breakLocked(std::string("send failed: ") + std::strerror(errno));
        return;
      }
    }
  }

  // Reads what the socket has (without blocking), lets nghttp2 process it, then flushes.
  void pumpLocked() {
    // One buffer per thread that reads, allocated at its first read. Not a thread_local array:
    // its 16 KB of static TLS would be zeroed at the creation of every thread of every ddprun
    // process (4 pages each, etcd or not); not on the stack: simulated agents run on fibers.
    constexpr size_t kBuf = 16384;
    thread_local std::unique_ptr<char[]> tBuf;
    if (!tBuf) tBuf.reset(new char[kBuf]);  // not zeroed: recv() writes what is read
    char* const buf = tBuf.get();
    size_t total = 0;
    while (!broken && total < kMaxReadPerPump) {
      const ssize_t n = ::recv(fd, buf, kBuf, MSG_DONTWAIT);
      if (n > 0) {
        if (total == 0 && !receivedAny && std::string_view(buf, static_cast<size_t>(n)).rfind("HTTP/1.", 0) == 0) {
          // An HTTP/1 server (a proxy, or a port that is not etcd's client port): nghttp2
          // would take it for an unknown frame and wait for the rest of it.
          const std::string_view reply(buf, static_cast<size_t>(n));
          breakLocked("the member answered in HTTP/1.x, not HTTP/2 ('" +
                      std::string(reply.substr(0, std::min(reply.find('\r'), size_t{80}))) + "')");
          break;
        }
        receivedAny = true;
        total += static_cast<size_t>(n);
        const ssize_t r = nghttp2_session_mem_recv(session, reinterpret_cast<uint8_t*>(buf),
                                                   static_cast<size_t>(n));
        if (r < 0) {
          breakLocked("HTTP/2: " + std::string(nghttp2_strerror(static_cast<int>(r))));
        } else if (flushLocked(), !nghttp2_session_want_read(session)) {
          // nghttp2 ended the session (its GOAWAY now sent): the member broke the protocol,
          // or both sides said GOAWAY and no call is left.
          breakLocked("HTTP/2: " + (http2Error.empty() ? std::string("the member broke the protocol; the session was ended") : http2Error));
        }
        continue;
      }
      if (n == 0) {
        breakLocked("the member closed the connection");
      } else if (errno == EINTR) {
        continue;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        breakLocked(std::string("recv failed: ") + std::strerror(errno));
      }
      break;
    }
    flushLocked();
    cv.notifyAll();
  }

  // Waits for the socket (or an interruption): > 0 ready, 0 at the deadline or interrupted.
  int waitSocket(short events, Clock::time_point deadline) {
    if (coop) {
      Blocking* b = Blocking::current();
      if (b) return b->pollOrWake(fd, events, deadline, this);
    }
    pollfd p[2] = {{fd, events, 0}, {wakeFd, POLLIN, 0}};
    int timeout = -1;
    if (deadline != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      timeout = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1'000'000'000));
    }
    const int r = ::poll(p, wakeFd >= 0 ? 2 : 1, timeout);
    if (r <= 0) return 0;
    if (wakeFd >= 0 && p[1].revents) {
      uint64_t v;
      [[maybe_unused]] ssize_t n = ::read(wakeFd, &v, sizeof v);
    }
    return p[0].revents ? 1 : 0;
  }

  // Waits with `lock` held until done(): false at `deadline`, or when woken (`wakeable`).
  // Throws Failure when the call is cancelled or the connection breaks first.
  template <typename Done>
  bool wait(std::unique_lock<std::mutex>& lock, CallState& s, Done done,
            Clock::time_point deadline, bool wakeable) {
    for (;;) {
      if (done()) return true;
      if (s.cancelled) throw Failure("etcd member " + member + ": " + s.method + ": cancelled", true);
      if (broken) throw Failure("etcd member " + member + ": " + s.method + ": " + brokenWhy, true);
      if (wakeable && s.woken) {
        s.woken = false;
        return false;
      }
      if (Clock::now() >= deadline) return false;
      if (!driving) {
        driving = true;
        const short events = static_cast<short>(POLLIN | (out.empty() ? 0 : POLLOUT));
        lock.unlock();
        const int ready = waitSocket(events, deadline);
        lock.lock();
        driving = false;
        if (ready > 0) pumpLocked();
        else flushLocked();  // woken, perhaps to write what a caller could not
        cv.notifyAll();      // the next waiter drives, or finds its reply
      } else {
        cv.waitUntil(lock, deadline, [&] {
          return done() || !driving || broken || s.cancelled || (wakeable && s.woken);
        });
      }
    }
  }

  // ---- nghttp2 callbacks (the driver's, with mu held; they never throw) ----

  static int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t,
                      void* user) {
    auto* self = static_cast<Impl*>(user);
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    CallState* s = self->find(frame->hd.stream_id);
    if (!s) return 0;
    s->headerBytes += namelen + valuelen + 32;
    if (s->headerBytes > kMaxHeaderBytes) {
      s->error = "the reply's headers exceed " + std::to_string(kMaxHeaderBytes) + " bytes";
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;  // resets the stream
    }
    const std::string_view n(reinterpret_cast<const char*>(name), namelen);
    const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    try {
      if (n == ":status") {
        s->httpStatus = std::atoi(std::string(v).c_str());
      } else if (n == "grpc-status") {
        const std::string t(v);
        char* end = nullptr;
        const long code = std::strtol(t.c_str(), &end, 10);
        if (t.empty() || *end || code < 0 || code > 16) {
          s->error = "grpc-status '" + t.substr(0, 40) + "' is not a gRPC status code";
          return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        }
        s->grpcStatus = static_cast<int>(code);
      } else if (n == "grpc-message") {
        s->grpcMessage = percentDecode(v);
      }
    } catch (...) {
      return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    return 0;
  }

  static int onData(nghttp2_session* session, uint8_t, int32_t id, const uint8_t* data,
                    size_t len, void* user) {
    CallState* s = static_cast<Impl*>(user)->find(id);
    if (!s || !s->error.empty()) return 0;
    try {
      s->reader.append(std::string_view(reinterpret_cast<const char*>(data), len));
      while (auto m = s->reader.next()) {
        s->held += m->size();
        s->messages.push_back(std::move(*m));
      }
      if (s->held + s->reader.pending() > 2 * s->maxMessage) {
        s->error = std::to_string(s->held + s->reader.pending()) +
                   " bytes of replies unread (at most " + std::to_string(2 * s->maxMessage) +
                   " held)";
      }
    } catch (const std::exception& e) {
      s->error = e.what();
    }
    if (!s->error.empty()) nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    return 0;
  }

  static int onStreamClose(nghttp2_session*, int32_t id, uint32_t code, void* user) {
    auto* self = static_cast<Impl*>(user);
    auto it = self->calls.find(id);
    if (it == self->calls.end()) return 0;
    it->second->closed = true;
    it->second->closeCode = code;
    self->calls.erase(it);
    return 0;
  }

  static int onError(nghttp2_session*, int, const char* msg, size_t len, void* user) {
    auto* self = static_cast<Impl*>(user);
    try {
      self->http2Error.assign(msg, std::min<size_t>(len, 300));
    } catch (...) {
    }
    return 0;
  }

  static int onFrame(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    if (frame->hd.type == NGHTTP2_GOAWAY) static_cast<Impl*>(user)->goaway = true;
    return 0;
  }

  static ssize_t readRequest(nghttp2_session*, int32_t, uint8_t* buf, size_t length,
                             uint32_t* flags, nghttp2_data_source* source, void*) {
    auto* s = static_cast<CallState*>(source->ptr);
    const size_t n = std::min(length, s->out.size() - s->outOff);
    std::memcpy(buf, s->out.data() + s->outOff, n);
    s->outOff += n;
    if (s->outOff == s->out.size()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      if (!s->halfClose) *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
      std::string().swap(s->out);
      s->outOff = 0;
    }
    return static_cast<ssize_t>(n);
  }
};

// ---- Connection ----

Connection::Connection(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)), member_(impl_->member) {}

Connection::~Connection() = default;

std::shared_ptr<Connection> Connection::open(const ConnectionOptions& o,
                                             Clock::time_point deadline) {
  auto impl = std::make_unique<Impl>();
  const bool v6 = o.host.find(':') != std::string::npos;
  impl->member = (v6 ? "[" + o.host + "]" : o.host) + ":" + std::to_string(o.port);
  impl->coop = Blocking::current() != nullptr;
  const std::string who = "etcd member " + impl->member;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(o.host.c_str(), std::to_string(o.port).c_str(), &hints, &res);
  if (gai != 0) throw Failure(who + ": cannot resolve: " + ::gai_strerror(gai), false);
  std::string lastError = "no address";
  for (addrinfo* a = res; a && impl->fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      const int err = errno;
      ::freeaddrinfo(res);
      if (err == EMFILE || err == ENFILE) {
        throw Failure("cannot connect to " + who + ": " + std::strerror(err) + " (" +
                          descriptorLimit() + ")",
                      false, true);
      }
      throw Failure(who + ": socket: " + std::strerror(err), false);
    }
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      const auto left = std::chrono::ceil<Millis>(deadline - Clock::now());
      rc = pollFd(fd, POLLOUT, std::max(Millis(1), left));
      if (rc == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        if (rc == 0) errno = ETIMEDOUT;
        rc = -1;
      }
    }
    if (rc != 0) {
      lastError = std::strerror(errno);
      closeFd(fd);
      continue;
    }
    impl->fd = fd;
  }
  ::freeaddrinfo(res);
  if (impl->fd < 0) throw Failure(who + ": connect failed: " + lastError, false);
  int one = 1;
  ::setsockopt(impl->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!impl->coop) {
    impl->wakeFd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (impl->wakeFd < 0) {
      throw Failure("cannot connect to " + who + ": eventfd: " + std::strerror(errno) + " (" +
                        descriptorLimit() + ")",
                    false, errno == EMFILE || errno == ENFILE);
    }
  }

  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_header_callback(cb, &Impl::onHeader);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, &Impl::onData);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, &Impl::onStreamClose);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, &Impl::onFrame);
  nghttp2_session_callbacks_set_error_callback2(cb, &Impl::onError);
  const int rc = nghttp2_session_client_new(&impl->session, cb, impl.get());
  nghttp2_session_callbacks_del(cb);
  if (rc != 0) throw Failure(who + ": HTTP/2: " + nghttp2_strerror(rc), false);
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<uint32_t>(kMaxHeaderBytes)},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(kStreamWindow)},
  };
  nghttp2_submit_settings(impl->session, NGHTTP2_FLAG_NONE, settings, 3);
  nghttp2_session_set_local_window_size(impl->session, NGHTTP2_FLAG_NONE, 0, kConnectionWindow);
  {
    std::lock_guard<std::mutex> g(impl->mu);
    impl->flushLocked();  // the preface and our settings; the rest goes with the first call
    if (impl->broken) throw Failure(who + ": " + impl->brokenWhy, false);
  }
  return std::shared_ptr<Connection>(new Connection(std::move(impl)));
}

bool Connection::usable() {
  Impl& c = *impl_;
  std::lock_guard<std::mutex> g(c.mu);
  if (!c.broken && !c.goaway && !c.driving) {
    // An idle connection the member closed (or sent to meanwhile) is found out now, before a
    // request that cannot be retried is sent on it.
    pollfd p{c.fd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) c.pumpLocked();
  }
  return !c.broken && !c.goaway;
}

int64_t Connection::streamsStarted() {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->started;
}

std::unique_ptr<Call> Connection::start(const std::string& method, const std::string& request,
                                        bool halfClose, size_t maxMessage) {
  Impl& c = *impl_;
  auto s = std::make_shared<CallState>(method, maxMessage);
  s->out = frame(request);
  s->halfClose = halfClose;
  std::lock_guard<std::mutex> g(c.mu);
  if (c.broken) throw Failure("etcd member " + member_ + ": " + method + ": " + c.brokenWhy, false);
  if (c.goaway) {
    throw Failure("etcd member " + member_ + ": " + method + ": the member is closing the connection (GOAWAY)", false);
  }
  auto nv = [](const char* n, const std::string& v) {
    return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(n)),
                      reinterpret_cast<uint8_t*>(const_cast<char*>(v.data())), std::strlen(n),
                      v.size(), NGHTTP2_NV_FLAG_NONE};
  };
  static const std::string post = "POST", http = "http", grpcType = "application/grpc",
                           trailers = "trailers", yes = "true", agent = "ddprun-etcd-grpc";
  // hasleader: etcd refuses at once a call that a member without a leader cannot serve, and
  // cancels a watch whose member loses its leader (we then fail over to a member that has one).
  const nghttp2_nv headers[] = {
      nv(":method", post),         nv(":scheme", http),        nv(":path", method),
      nv(":authority", member_),   nv("content-type", grpcType), nv("te", trailers),
      nv("user-agent", agent),     nv("hasleader", yes),
  };
  nghttp2_data_provider body{};
  body.source.ptr = s.get();
  body.read_callback = &Impl::readRequest;
  const int32_t id = nghttp2_submit_request(c.session, nullptr, headers,
                                            sizeof headers / sizeof headers[0], &body, nullptr);
  if (id < 0) {
    throw Failure("etcd member " + member_ + ": cannot start " + method + ": " + nghttp2_strerror(id), false);
  }
  s->id = id;
  c.calls[id] = s;
  ++c.started;
  c.flushLocked();
  if (!c.out.empty() && c.driving) c.interruptDriver();  // it polls for POLLOUT then
  return std::unique_ptr<Call>(new Call(shared_from_this(), std::move(s), method));
}

// ---- Call ----

Call::Call(std::shared_ptr<Connection> c, std::shared_ptr<CallState> s, std::string method)
    : conn_(std::move(c)), state_(std::move(s)), method_(std::move(method)) {}

Call::~Call() {
  Connection::Impl& c = *conn_->impl_;
  std::lock_guard<std::mutex> g(c.mu);
  if (!state_->closed && !c.broken && state_->id > 0) {
    nghttp2_submit_rst_stream(c.session, NGHTTP2_FLAG_NONE, state_->id, NGHTTP2_CANCEL);
    c.flushLocked();
    if (!c.out.empty() && c.driving) c.interruptDriver();
  }
}

void Call::cancel() {
  Connection::Impl& c = *conn_->impl_;
  std::lock_guard<std::mutex> g(c.mu);
  state_->cancelled = true;
  c.cv.notifyAll();
  c.interruptDriver();
}

void Call::wake() {
  Connection::Impl& c = *conn_->impl_;
  std::lock_guard<std::mutex> g(c.mu);
  state_->woken = true;
  c.cv.notifyAll();
  c.interruptDriver();
}

namespace {
std::string endText(const CallState& s) {
  if (s.grpcStatus) {
    return "grpc-status " + std::to_string(*s.grpcStatus) +
           (s.grpcMessage.empty() ? "" : " (" + s.grpcMessage + ")");
  }
  std::string t = "no grpc-status";
  if (s.httpStatus != 0 && s.httpStatus != 200) t += ", HTTP status " + std::to_string(s.httpStatus);
  if (s.closeCode != 0) {
    t += ", stream reset by the member (" + std::string(nghttp2_http2_strerror(s.closeCode)) + ")";
  }
  return t;
}
}  // namespace

Reply Call::finish(Clock::time_point deadline) {
  Connection::Impl& c = *conn_->impl_;
  CallState& s = *state_;
  std::unique_lock<std::mutex> lock(c.mu);
  const std::string who = "etcd member " + c.member + ": " + method_;
  if (!c.wait(lock, s, [&] { return s.closed || !s.error.empty(); }, deadline, false)) {
    throw TimeoutError(who + ": no reply in time");  // ~Call resets the stream
  }
  if (!s.error.empty()) throw ProtocolError(who + ": " + s.error);
  if (!s.grpcStatus) throw Failure(who + ": the call ended without a status: " + endText(s), true);
  Reply r{*s.grpcStatus, s.grpcMessage, {}};
  if (r.code == 0) {
    if (s.messages.size() != 1) {
      throw ProtocolError(who + ": " + std::to_string(s.messages.size()) +
                          " reply messages to a unary call (one expected)");
    }
    if (s.reader.pending() != 0) throw ProtocolError(who + ": the reply ends inside a message");
    r.body = std::move(s.messages.front());
    s.messages.clear();
  }
  return r;
}

std::optional<std::string> Call::next(Clock::time_point deadline) {
  Connection::Impl& c = *conn_->impl_;
  CallState& s = *state_;
  std::unique_lock<std::mutex> lock(c.mu);
  const std::string who = "etcd member " + c.member + ": " + method_;
  auto ready = [&] { return !s.messages.empty() || s.closed || !s.error.empty(); };
  if (!c.wait(lock, s, ready, deadline, true)) return std::nullopt;
  if (!s.messages.empty()) {
    std::string m = std::move(s.messages.front());
    s.messages.pop_front();
    s.held -= m.size();
    return m;
  }
  if (!s.error.empty()) throw ProtocolError(who + ": " + s.error);
  throw Failure(who + ": the stream ended: " + endText(s), true);
}

// ---- ChannelPool ----

std::shared_ptr<Connection> ChannelPool::get(size_t index, const ConnectionOptions& o,
                                             Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (index < conns_.size() && conns_[index] && conns_[index]->usable()) return conns_[index];
  }
  // Connected without the lock: connecting parks a fiber, and another may want the pool.
  auto c = Connection::open(o, deadline);
  std::lock_guard<std::mutex> g(mu_);
  if (conns_.size() <= index) conns_.resize(index + 1);
  if (conns_[index] && conns_[index]->usable()) return conns_[index];  // another was quicker
  conns_[index] = c;
  ++made_;
  return c;
}

size_t ChannelPool::home(size_t members) {
  std::lock_guard<std::mutex> g(mu_);
  if (!home_ || *home_ >= members) {
    std::random_device rd;
    home_ = std::uniform_int_distribution<size_t>(0, members - 1)(rd);
  }
  return *home_;
}

int64_t ChannelPool::connectionsMade() {
  std::lock_guard<std::mutex> g(mu_);
  return made_;
}

}  // namespace ddprun::rendezvous::etcd::grpc
