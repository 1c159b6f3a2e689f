#include "rendezvous/store_server.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/steady_timer.hpp>
#include <unordered_map>

#include "base/errors.h"
#include "base/log.h"
#include "rendezvous/auth.h"
#include "rendezvous/store_connection.h"

namespace ddprun::rendezvous {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class StoreServer::Impl : public ServerCore, public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, StoreServerOptions options)
      : io_(io), options_(std::move(options)), acceptor_(io), retryTimer_(io) {
    limits = options_.limits;
    authToken = options_.authToken;
    instanceId = auth::randomId();
    jobId = options_.jobId;
  }

  void listen() {
    boost::system::error_code ec;
    auto address = asio::ip::make_address(options_.host, ec);
    if (ec) {
      throw ConfigError("store: '" + options_.host + "' is not an IP address: " + ec.message());
    }
    tcp::endpoint ep(address, options_.port);
    const std::string where = options_.host + ":" + std::to_string(options_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec && address.is_v6()) acceptor_.set_option(asio::ip::v6_only(false), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(options_.backlog, ec);
    if (ec) throw NetworkError("store: cannot listen on " + where + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    // Non-blocking, so that acceptFailed() and the batch in accept() take a queued connection
    // without ever blocking the loop (a synchronous accept returns would_block instead).
    acceptor_.native_non_blocking(true, ec);
    acceptor_.non_blocking(true, ec);
    spareFd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }

  // One accept per turn of the loop would let the kernel's accept queue (somaxconn, 4096 here)
  // overflow when thousands of clients connect within a few hundred milliseconds -- an
  // overflowing queue drops their SYNs, and each dropped one costs its client a 1 s
  // retransmission. So each completion also takes, without blocking, up to kAcceptBatch more
  // connections already queued.
  static constexpr int kAcceptBatch = 256;

  void accept() {
    acceptor_.async_accept([self = shared_from_this()](boost::system::error_code ec,
                                                       tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor_.is_open()) return;
      if (ec) {
        self->acceptFailed(ec);
        return;
      }
      self->adopt(std::move(socket));
      for (int i = 0; i < kAcceptBatch && self->acceptor_.is_open(); ++i) {
        tcp::socket next(self->io_);
        self->acceptor_.accept(next, ec);  // the acceptor is non-blocking (listen())
        if (ec == asio::error::would_block || ec == asio::error::try_again) break;
        if (ec) {
          self->acceptFailed(ec);
          return;
        }
        self->adopt(std::move(next));
      }
      self->accept();
    });
  }

  void adopt(tcp::socket socket) {
    if (connections_.size() >= limits.maxConnections) {
      boost::system::error_code e;
      auto ep = socket.remote_endpoint(e);
      logRefusal("refusing connection from " + (e ? "unknown peer" : endpointText(ep)) + ": " +
                 std::to_string(connections_.size()) + " connections are open, the limit is " +
                 std::to_string(limits.maxConnections) + " (max_connections)");
      socket.close(e);
      return;
    }
    const uint64_t id = ++nextId_;
    auto conn = std::make_shared<StoreConnection>(id, std::move(socket), *this);
    connections_.emplace(id, conn);
    conn->start();
  }

  // Out of descriptors (EMFILE/ENFILE), or a transient error. Out of descriptors, the pending
  // connection would sit in the backlog until the client times out; instead it is accepted on
  // the spare descriptor and closed at once, so the client sees the refusal now.
  void acceptFailed(const boost::system::error_code& ec) {
    const bool exhausted = ec == asio::error::no_descriptors || ec.value() == ENFILE;
    int fd = -1;
    if (exhausted && spareFd_ >= 0) {
      ::close(spareFd_);
      fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) ::close(fd);
      spareFd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (fd >= 0) {
      logRefusal("out of file descriptors with " + std::to_string(connections_.size()) +
                 " connections open: a new connection was closed at once (raise `ulimit -n`, "
                 "or lower max_connections to refuse earlier)");
      accept();
      return;
    }
    logRefusal("accept failed: " + ec.message());
    // Nothing accepted: wait a little before trying again, so the loop does not spin.
    retryTimer_.expires_after(std::chrono::milliseconds(100));
    retryTimer_.async_wait([self = shared_from_this()](boost::system::error_code e) {
      if (!e) self->accept();
    });
  }

  void logRefusal(const std::string& line) {
    uint64_t suppressed = 0;
    if (!refusalLog_.allow(suppressed)) return;
    DDPRUN_LOG(WARN, "store") << line
                              << (suppressed ? " (" + std::to_string(suppressed) +
                                                   " such lines suppressed before this one)"
                                             : std::string());
  }

  static std::string endpointText(const tcp::endpoint& ep) {
    return ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void wake(const KeyTable::Woken& woken) override {
    for (uint64_t id : woken) {
      auto it = connections_.find(id);
      if (it != connections_.end()) it->second->completeWait();
    }
  }

  void forget(uint64_t id) override { connections_.erase(id); }

  void stop() {
    boost::system::error_code ec;
    acceptor_.close(ec);
    if (spareFd_ >= 0) ::close(spareFd_);
    spareFd_ = -1;
    retryTimer_.cancel();
    auto all = std::move(connections_);
    connections_.clear();
    for (auto& [id, c] : all) c->close("");
  }

  StoreServerStats stats() const {
    StoreServerStats s;
    s.connections = connections_.size();
    s.accepted = nextId_;
    s.waiters = table.waiterCount();
    s.keys = table.size();
    s.storedBytes = table.bytes();
    for (const auto& [id, c] : connections_) {
      s.unsentReplyBytes += c->unsentReplyBytes();
      if (c->paused()) ++s.pausedConnections;
    }
    return s;
  }

  asio::io_context& io_;
  StoreServerOptions options_;
  tcp::acceptor acceptor_;
  asio::steady_timer retryTimer_;
  uint16_t port_ = 0;
  uint64_t nextId_ = 0;
  int spareFd_ = -1;        // kept free to accept-and-close when out of descriptors
  LogThrottle refusalLog_;  // accept failures and refused connections
  std::unordered_map<uint64_t, std::shared_ptr<StoreConnection>> connections_;
};

StoreServer::StoreServer(asio::io_context& io, StoreServerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  impl_->listen();
  impl_->accept();
}

StoreServer::~StoreServer() { impl_->stop(); }

uint16_t StoreServer::port() const { return impl_->port_; }
const std::string& StoreServer::host() const { return impl_->options_.host; }
const std::string& StoreServer::instanceId() const { return impl_->instanceId; }

void StoreServer::set(const std::string& key, const std::string& value) {
  KeyTable::Woken woken;
  impl_->table.set(key, value, woken);
  impl_->wake(woken);
}

std::optional<std::string> StoreServer::get(const std::string& key) const {
  const std::string* v = impl_->table.get(key);
  if (v == nullptr) return std::nullopt;
  return *v;
}
void StoreServer::setObserver(std::function<void(const std::string& key)> fn) {
  impl_->onSet = std::move(fn);
}
void StoreServer::stop() { impl_->stop(); }
StoreServerStats StoreServer::stats() const { return impl_->stats(); }

uint64_t raiseFileLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  return rl.rlim_cur;
}

}  // namespace ddprun::rendezvous
