#include "rendezvous/etcd/http_connection.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <poll.h>

#include <atomic>
#include <boost/asio/connect.hpp>
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

struct HttpConnection::Impl {
  MemberAddress member;
  std::shared_ptr<ssl::context> tls;
  asio::io_context io{1};
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
      // so an edge the scheduler woke us for is still there for io.poll()'s epoll_wait.
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

  // cancel() and wake(): end a wait in run(), on whichever thread (or fiber) it is.
  void interruptRun() {
    io.stop();
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
    io.run();
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
};

HttpConnection::HttpConnection(MemberAddress member, std::shared_ptr<ssl::context> tls)
    : impl_(std::make_unique<Impl>()) {
  impl_->member = std::move(member);
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
  bool done = false;
  error_code result;
  c.expect(POLLOUT);
  c.withStream([&](auto& s) {
    http::async_write(s, req, [&](error_code ec, size_t) {
      if (ec) {
        result = ec;
        done = true;
        return;
      }
      c.expect(POLLIN);
      http::async_read(s, c.buffer, parser, [&](error_code ec2, size_t) {
        result = ec2;
        done = true;
      });
    });
  });
  if (!c.run(done, deadline)) c.fail("POST " + target, true, deadline);
  if (result) c.fail("POST " + target + ": " + result.message(), true, deadline);
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
  bool done = false;
  error_code result;
  c.expect(POLLOUT);
  c.withStream([&](auto& s) {
    http::async_write(s, req, [&](error_code ec, size_t) {
      if (ec) {
        result = ec;
        done = true;
        return;
      }
      c.expect(POLLIN);
      http::async_read_header(s, c.buffer, *c.stream, [&](error_code ec2, size_t) {
        result = ec2;
        done = true;
      });
    });
  });
  if (!c.run(done, deadline)) c.fail("stream " + target, true, deadline);
  if (result) c.fail("stream " + target + ": " + result.message(), true, deadline);
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
