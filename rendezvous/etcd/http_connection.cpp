#include "rendezvous/etcd/http_connection.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <poll.h>
#include <cerrno>

#include <sys/resource.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <fstream>

#include "base/errors.h"
#include "rendezvous/blocking.h"

namespace ddprun::rendezvous::etcd {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

std::string MemberAddress::text() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::shared_ptr<ssl::context> makeTlsContext(const TlsFiles& files) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  auto readable = [](const std::string& path, const char* what) {
    if (!std::ifstream(path).good()) {
      throw ConfigError(std::string("--rdzv-conf ") + what + "='" + path +
                        "': cannot read the file");
    }
  };
  error_code ec;
  ctx->set_verify_mode(ssl::verify_peer);
  if (files.cacert.empty()) {
    ctx->set_default_verify_paths(ec);
  } else {
    readable(files.cacert, "cacert");
    ctx->load_verify_file(files.cacert, ec);
    if (ec) throw ConfigError("--rdzv-conf cacert='" + files.cacert + "': " + ec.message());
  }
  if (files.cert.empty() != files.key.empty())
    throw ConfigError("--rdzv-conf: cert and key go together (a client certificate and its key)");
  if (!files.cert.empty()) {
    readable(files.cert, "cert");
    readable(files.key, "key");
    ctx->use_certificate_chain_file(files.cert, ec);
    if (ec) throw ConfigError("--rdzv-conf cert='" + files.cert + "': " + ec.message());
    ctx->use_private_key_file(files.key, ssl::context::pem, ec);
    if (ec) throw ConfigError("--rdzv-conf key='" + files.key + "': " + ec.message());
  }
  return ctx;
}

namespace {

std::string descriptorLimit() {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  return "this process may open " + std::to_string(rl.rlim_cur) +
         " file descriptors: RLIMIT_NOFILE";
}

// The io_context a new connection runs on. With no Blocking installed: one of its own (an
// epoll, an eventfd and a timerfd), as a real agent's connections always had. Under a
// Blocking: the one its thread's connections share (they all run on that thread's fibers, and
// each run() below only polls it), so that ten thousand simulated agents' connections cost a
// socket each, not a socket and three descriptors more. Creating one fails when the process is
// out of descriptors: that is said here, as an Error naming the limit, rather than Asio's
// boost::system::system_error escaping a background thread or fiber (which would end the
// process).
std::shared_ptr<asio::io_context> contextFor(const MemberAddress& member) {
  auto make = [&] {
    try {
      return std::make_shared<asio::io_context>(1);
    } catch (const boost::system::system_error& e) {
      throw ConnectionLimitError(
          "cannot open a connection to etcd member " + member.text() +
          ": its I/O context (an epoll, an eventfd, a timerfd) cannot be created: " + e.what() +
          " (" + descriptorLimit() + ")");
    }
  };
  rendezvous::Blocking* const b = rendezvous::Blocking::current();
  if (!b) return make();
  // The shared one never runs out of work (a work guard): an io_context whose work reaches
  // zero stops itself, and a poll() of a stopped one runs nothing until restart(). With one
  // io_context per connection the connection's own next run() restarted it; a shared one
  // would stop inside another connection's poll(), which then leaves this connection's
  // completions unrun while its fiber parks for an edge already taken -- until its deadline.
  struct Shared {
    explicit Shared(std::shared_ptr<asio::io_context> c)
        : io(std::move(c)), guard(asio::make_work_guard(*io)) {}
    std::shared_ptr<asio::io_context> io;
    asio::executor_work_guard<asio::io_context::executor_type> guard;  // released first
  };
  thread_local std::weak_ptr<asio::io_context> shared;
  thread_local rendezvous::Blocking* owner = nullptr;
  auto io = shared.lock();
  if (!io || owner != b) {
    auto holder = std::make_shared<Shared>(make());
    io = std::shared_ptr<asio::io_context>(holder, holder->io.get());
    shared = io;
    owner = b;
  }
  return io;
}

}  // namespace

struct HttpConnection::Impl {
  explicit Impl(const MemberAddress& m)
      : member(m), ioHolder(contextFor(m)), io(*ioHolder),
        sharedIo(rendezvous::Blocking::current() != nullptr) {}
  MemberAddress member;
  std::shared_ptr<ssl::context> tls;
  // Declared before every object that uses it, so destroyed after them.
  std::shared_ptr<asio::io_context> ioHolder;
  asio::io_context& io;
  // Shared with the other connections of this thread (made under a Blocking): only polled,
  // never run or stopped, and used from this thread's fibers only.
  const bool sharedIo;
  tcp::resolver resolver{io};
  std::unique_ptr<tcp::socket> plain;
  std::unique_ptr<ssl::stream<tcp::socket>> secure;
  beast::flat_buffer buffer;
  std::unique_ptr<http::response_parser<http::string_body>> stream;  // an open stream
  bool readPending = false;  // a stream read outlives the nextLine() that started it
  bool readDone = false;
  error_code readError;
  std::atomic<bool> cancelled{false};
  std::atomic<bool> woken{false};
  // Under a Blocking: what the pending operation waits for on the socket (POLLIN, POLLOUT).
  // TLS may need either direction at any step (a handshake, a renegotiation): both, and a
  // spurious wake-up only costs another io.poll().
  short want = POLLIN;

  bool open() const { return plain || secure; }
  tcp::socket& socket() { return secure ? secure->next_layer() : *plain; }

  template <typename Fn>
  void withStream(Fn&& fn) {
    if (secure) fn(*secure);
    else fn(*plain);
  }

  // Sets what a wait under a Blocking watches the socket for: `plainEvents` on plain HTTP.
  void expect(short plainEvents) { want = tls ? short(POLLIN | POLLOUT) : plainEvents; }

  // Runs handlers until `done`; false when the deadline passes or cancel()/wake() comes first.
  bool run(const bool& done, Clock::time_point deadline) {
    rendezvous::Blocking* const coop = rendezvous::Blocking::current();
    io.restart();
    while (!done) {
      if (cancelled || woken || Clock::now() >= deadline) return false;
      if (!coop) {
        io.run_one_until(deadline);
        if (io.stopped()) io.restart();
        continue;
      }
      // Under a Blocking (see the header): the ready handlers, then the fiber parks on the
      // socket. Asio's reactor registers the socket edge-triggered with an epoll of its own,
      // so an edge the scheduler woke us for is still there for io.poll()'s epoll_wait. The
      // io_context is shared with the thread's other connections, so another fiber's poll()
      // may run our handlers first; having drained the socket, it can leave the scheduler's
      // epoll nothing to report (epoll re-checks readiness when it reports), so each of our
      // handlers also wakes this wait (notify()).
      io.poll();
      if (io.stopped()) io.restart();
      if (done || cancelled || woken) continue;
      if (open() && socket().is_open()) {
        coop->pollOrWake(socket().native_handle(), want, deadline, this);
      } else {
        coop->park(nullptr, this, std::min(deadline, Clock::now() + std::chrono::milliseconds(10)));
      }
    }
    return true;
  }

  // Every completion handler of ours calls it: ends the owner's wait in run() when the
  // handler ran in another fiber's poll() of the shared io_context (see run()).
  void notify() {
    if (rendezvous::Blocking* b = rendezvous::Blocking::current()) b->wake(this);
  }

  // cancel() and wake(): end a wait in run(), on whichever thread (or fiber) it is.
  void interruptRun() {
    if (!sharedIo) io.stop();  // a shared one is only polled: the wake below ends the wait
    if (rendezvous::Blocking* b = rendezvous::Blocking::current()) b->wake(this);
  }

  // Closes the socket and completes every pending handler (with operation_aborted).
  void close() {
    if (open()) {
      // A scheduler that watches the socket must drop it before its number is reused.
      if (socket().is_open()) rendezvous::forgetFd(socket().native_handle());
      error_code ignored;
      socket().shutdown(tcp::socket::shutdown_both, ignored);
      socket().close(ignored);
    }
    resolver.cancel();
    io.restart();
    // Runs the aborted handlers. A shared io_context also has other connections' work, which
    // run() would wait for: poll() runs what is ready, this connection's aborted operations
    // among it (closing the socket queued them).
    if (sharedIo) io.poll();
    else io.run();
    plain.reset();
    secure.reset();
    stream.reset();
    buffer.consume(buffer.size());
    readPending = readDone = false;
  }

  [[noreturn]] void fail(const std::string& what, bool maybeSent, Clock::time_point deadline) {
    const bool wasCancelled = cancelled.exchange(false);
    close();
    if (wasCancelled) throw HttpConnection::Failure(what + ": cancelled", maybeSent);
    if (Clock::now() >= deadline) {
      throw TimeoutError("etcd member " + member.text() + ": " + what + ": no reply in time");
    }
    throw HttpConnection::Failure(what, maybeSent);
  }

  // A kept-alive connection the member has closed (or sent something unasked on) is useless.
  bool stale() {
    if (!open()) return true;
    if (buffer.size() > 0) return true;
    pollfd p{socket().native_handle(), POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  void connect(Clock::time_point deadline) {
    close();
    if (tls) secure = std::make_unique<ssl::stream<tcp::socket>>(io, *tls);
    else plain = std::make_unique<tcp::socket>(io);
    bool done = false;
    error_code result;
    const std::string host = member.host;
    // Before each endpoint it tries, async_connect closes the socket of the previous attempt:
    // a scheduler watching that descriptor drops it first (see close()).
    auto forgetPrevious = [this](const error_code&, const tcp::endpoint&) {
      if (socket().is_open()) rendezvous::forgetFd(socket().native_handle());
      return true;
    };
    auto onResolved = [&, forgetPrevious](error_code ec, tcp::resolver::results_type rs) {
      if (ec) {
        result = ec;
        done = true;
        return;
      }
      expect(POLLOUT);
      asio::async_connect(socket(), rs, forgetPrevious, [&](error_code ec2, const tcp::endpoint&) {
        notify();
        if (ec2 || !secure) {
          result = ec2;
          done = true;
          return;
        }
        error_code ignored;
        asio::ip::make_address(host, ignored);
        if (ignored) SSL_set_tlsext_host_name(secure->native_handle(), host.c_str());  // a name
        secure->set_verify_callback(ssl::host_name_verification(host));
        expect(POLLIN | POLLOUT);
        secure->async_handshake(ssl::stream_base::client, [&](error_code ec3) {
          notify();
          result = ec3;
          done = true;
        });
      });
    };
    if (rendezvous::Blocking::current()) {
      error_code ec;  // synchronous under a Blocking (see the header)
      auto rs = resolver.resolve(host, std::to_string(member.port), ec);
      onResolved(ec, std::move(rs));
    } else {
      resolver.async_resolve(host, std::to_string(member.port), onResolved);
    }
    if (!run(done, deadline)) fail("connect", false, deadline);
    if (result) {
      close();
      if (result.value() == EMFILE || result.value() == ENFILE) {
        throw ConnectionLimitError("cannot connect to etcd member " + member.text() + ": " +
                                   result.message() + " (" + descriptorLimit() + ")");
      }
      throw HttpConnection::Failure(
          std::string(tls ? "TLS connect" : "connect") + " failed: " + result.message(), false);
    }
    error_code ignored;
    socket().set_option(tcp::no_delay(true), ignored);
  }

  http::request<http::string_body> request(const std::string& target, const std::string& body) {
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, member.text());
    req.set(http::field::content_type, "application/json");
    // etcd refuses at once (instead of after its own 5-7 s) a request that a member without a
    // leader cannot serve, and cancels a watch whose member loses its leader: we then fail
    // over to a member that has one.
    req.set("Grpc-Metadata-hasleader", "true");
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    return req;
  }

  // Writes `req`, then, once it is written, the read `read(stream, handler)` starts (the whole
  // reply, or a stream's header), both within `deadline`; a failure names `what`.
  template <typename Read>
  void writeThenRead(http::request<http::string_body>& req, const std::string& what,
                     Clock::time_point deadline, Read read) {
    bool done = false;
    error_code result;
    expect(POLLOUT);
    withStream([&](auto& s) {
      http::async_write(s, req, [&](error_code ec, size_t) {
        notify();
        if (ec) {
          result = ec;
          done = true;
          return;
        }
        expect(POLLIN);
        read(s, [&](error_code ec2, size_t) {
          notify();
          result = ec2;
          done = true;
        });
      });
    });
    if (!run(done, deadline)) fail(what, true, deadline);
    if (result) fail(what + ": " + result.message(), true, deadline);
  }
};

HttpConnection::HttpConnection(MemberAddress member, std::shared_ptr<ssl::context> tls)
    : impl_(std::make_unique<Impl>(member)) {
  impl_->tls = std::move(tls);
}

HttpConnection::~HttpConnection() { impl_->close(); }

const MemberAddress& HttpConnection::member() const { return impl_->member; }

void HttpConnection::cancel() {
  impl_->cancelled = true;
  impl_->interruptRun();
}

void HttpConnection::wake() {
  impl_->woken = true;
  impl_->interruptRun();
}

void HttpConnection::close() { impl_->close(); }

HttpConnection::Reply HttpConnection::post(const std::string& target, const std::string& body,
                                           Clock::time_point deadline) {
  Impl& c = *impl_;
  c.cancelled = false;
  c.stream.reset();
  if (c.stale()) c.connect(deadline);
  auto req = c.request(target, body);
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxReply);
  c.writeThenRead(req, "POST " + target, deadline, [&](auto& s, auto handler) {
    http::async_read(s, c.buffer, parser, std::move(handler));
  });
  Reply r{static_cast<int>(parser.get().result_int()), std::move(parser.get().body())};
  if (!parser.get().keep_alive()) c.close();
  return r;
}

int HttpConnection::openStream(const std::string& target, const std::string& body,
                               Clock::time_point deadline) {
  Impl& c = *impl_;
  c.cancelled = false;
  c.connect(deadline);  // a stream has its connection to itself
  auto req = c.request(target, body);
  c.stream = std::make_unique<http::response_parser<http::string_body>>();
  c.stream->body_limit(boost::none);  // a watch runs for the job's lifetime; lines are bounded
  c.writeThenRead(req, "stream " + target, deadline, [&](auto& s, auto handler) {
    http::async_read_header(s, c.buffer, *c.stream, std::move(handler));
  });
  return static_cast<int>(c.stream->get().result_int());
}

std::optional<std::string> HttpConnection::nextLine(Clock::time_point deadline) {
  Impl& c = *impl_;
  c.cancelled = false;
  if (!c.stream) throw HttpConnection::Failure("no stream is open", false);
  for (;;) {
    std::string& body = c.stream->get().body();
    const auto nl = body.find('\n');
    if (nl != std::string::npos) {
      std::string line = body.substr(0, nl);
      body.erase(0, nl + 1);
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (line.empty()) continue;
      return line;
    }
    if (body.size() > kMaxLine) {
      c.close();
      throw ProtocolError("etcd member " + c.member.text() + ": a streamed message exceeds " +
                          std::to_string(kMaxLine) + " bytes");
    }
    if (c.stream->is_done()) c.fail("the member ended the stream", true, deadline);
    c.expect(POLLIN);
    if (!c.readPending) {
      c.readPending = true;
      c.readDone = false;
      c.withStream([&](auto& s) {
        http::async_read_some(s, c.buffer, *c.stream, [&c](error_code ec, size_t) {
          c.notify();
          c.readError = ec;
          c.readDone = true;
          c.readPending = false;
        });
      });
    }
    if (!c.run(c.readDone, deadline)) {
      if (c.cancelled) c.fail("stream read", true, deadline);
      c.woken = false;
      return std::nullopt;
    }
    c.readDone = false;
    if (c.readError) c.fail("stream read: " + c.readError.message(), true, deadline);
  }
}

}  // namespace ddprun::rendezvous::etcd
