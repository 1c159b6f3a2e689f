#pragma once
// HttpConnection: one HTTP/1.1 keep-alive connection to one etcd member, plain or TLS, over
// Boost.Beast (requests and replies are Beast's; nothing here writes HTTP by hand).
//
// It is blocking code with deadlines: each operation starts Asio operations on the
// connection's own io_context and runs it until they complete or the deadline passes, so one
// thread uses one connection and nothing else waits on it. Another thread may cancel() the
// operation in progress (it then fails at once with NetworkError) or wake() a stream read
// (nextLine() returns early, the stream intact).
//
// On a thread with a rendezvous::Blocking installed (the simulated agents' fibers of
// `ddprun-bench rendezvous --simulate --backend etcd`, rendezvous/blocking.h) the same Asio
// operations run, but the connection never blocks the thread: it runs the handlers that are
// ready (io_context::poll) and parks the fiber on its socket through the Blocking
// (pollOrWake) until the socket is ready, the deadline passes, or cancel()/wake() -- which
// must then come from a fiber of the same thread -- wake it. A host name is then resolved
// synchronously (getaddrinfo on that thread; a numeric address, as the simulation uses,
// costs nothing), since Asio's asynchronous resolver completes from a thread of its own that
// no socket wait would notice. With no Blocking installed nothing of this runs: the
// io_context blocks in run_one_until as before.
//
// A reply is bounded in size (kMaxReply for a whole body, kMaxLine for one streamed message):
// a member cannot make us hold more than that.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/errors.h"

namespace boost::asio::ssl {
class context;
}

namespace ddprun::rendezvous::etcd {

using Clock = std::chrono::steady_clock;

struct MemberAddress {
  std::string host;
  uint16_t port = 2379;
  std::string text() const;  // "host:port", IPv6 in brackets
};

// --rdzv-conf protocol=https: the files named by cacert (the CA that signed the members'
// certificates) and, for client-certificate authentication, cert and key.
struct TlsFiles {
  std::string cacert;
  std::string cert;
  std::string key;
};
// Builds the client TLS context (peer verification on); throws ConfigError naming the file.
std::shared_ptr<boost::asio::ssl::context> makeTlsContext(const TlsFiles& files);

// This process cannot open one more connection: it is out of file descriptors (RLIMIT_NOFILE).
// Not a member's failure, so not tried again on another member; the message names the limit.
class ConnectionLimitError : public Error {
 public:
  using Error::Error;
};

inline constexpr size_t kMaxReply = 64u << 20;  // one unary reply
inline constexpr size_t kMaxLine = 16u << 20;   // one message of a stream

class HttpConnection {
 public:
  struct Reply {
    int status = 0;
    std::string body;
  };
  // A transport failure. `maybeSent`: the request may have reached the member (a write that
  // is not idempotent may have been applied).
  class Failure : public NetworkError {
   public:
    Failure(const std::string& what, bool maybeSent) : NetworkError(what), maybeSent_(maybeSent) {}
    bool maybeSent() const { return maybeSent_; }

   private:
    bool maybeSent_;
  };

  // `tls` null: plain HTTP. Connects lazily, at the first request. Throws
  // ConnectionLimitError when its I/O context cannot be created (see contextFor in the .cpp).
  HttpConnection(MemberAddress member, std::shared_ptr<boost::asio::ssl::context> tls);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // POSTs `body` to `target` and reads the whole reply. A reused connection that the member
  // closed meanwhile is replaced before sending. Throws NetworkError (or Failure) and
  // TimeoutError; the connection is closed after any of them.
  Reply post(const std::string& target, const std::string& body, Clock::time_point deadline);

  // Streams: sends the request and reads the reply's header (returns its status); then the
  // body is read one line at a time.
  int openStream(const std::string& target, const std::string& body, Clock::time_point deadline);
  // The next line of the streamed body, or nullopt when the deadline passes or wake() is
  // called first (the stream stays open: the read goes on at the next call). Throws
  // NetworkError when the stream ends, breaks or is cancelled.
  std::optional<std::string> nextLine(Clock::time_point deadline);

  // Any thread: the operation in progress fails at once with NetworkError ("cancelled").
  // Nothing happens when none is in progress.
  void cancel();
  // Any thread: a nextLine() in progress returns nullopt at once.
  void wake();
  void close();
  const MemberAddress& member() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous::etcd
