#include "rendezvous/store_connection.h"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cstring>

#include "rendezvous/auth.h"
#include "base/log.h"

namespace ddprun::rendezvous {

namespace asio = boost::asio;
using protocol::Op;

namespace {
constexpr size_t kInitialBuffer = 16 * 1024;
constexpr size_t kMinReadSpace = 4 * 1024;
}  // namespace

StoreConnection::StoreConnection(uint64_t id, asio::ip::tcp::socket socket, ServerCore& core)
    : id_(id), socket_(std::move(socket)), core_(core) {
  boost::system::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  peer_ = ec ? std::string("unknown peer") : ep.address().to_string() + ":" + std::to_string(ep.port());
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
  auto local = socket_.local_endpoint(ec);
  if (!ec) channel_ = auth::channelName(local.address().to_string(), local.port());
  authenticated_ = !core_.authToken.has_value();
}

void StoreConnection::start() {
  buf_.reset(new char[kInitialBuffer]);
  cap_ = kInitialBuffer;
  readMore();
}

void StoreConnection::readMore() {
  if (closed_) return;
  // Make room: compact, then grow when a frame needs more than the buffer holds.
  if (start_ == end_) start_ = end_ = 0;
  if (cap_ - end_ < kMinReadSpace || needAtLeast_ > cap_ - start_) {
    if (start_ > 0) {
      std::memmove(buf_.get(), buf_.get() + start_, end_ - start_);
      end_ -= start_;
      start_ = 0;
    }
    size_t want = std::max(needAtLeast_, end_ + kMinReadSpace);
    if (want > cap_) {
      size_t ncap = cap_;
      while (ncap < want) ncap *= 2;
      std::unique_ptr<char[]> nb(new char[ncap]);
      std::memcpy(nb.get(), buf_.get(), end_);
      buf_ = std::move(nb);
      cap_ = ncap;
    }
  }
  socket_.async_read_some(asio::buffer(buf_.get() + end_, cap_ - end_),
                          [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                            if (ec) {
                              // EOF or reset: an ordinary goodbye, logged only in debug.
                              if (!self->closed_) {
                                DDPRUN_LOG(DEBUG, "store") << "connection from " << self->peer_
                                                           << " ended: " << ec.message();
                                self->close("");
                              }
                              return;
                            }
                            self->onRead(n);
                          });
}

void StoreConnection::onRead(size_t n) {
  if (closed_) return;
  end_ += n;
  process();
  if (closed_) return;
  readMore();
}

void StoreConnection::process() {
  processPosted_ = false;
  while (!closed_ && !closeAfterFlush_) {
    const std::string_view in(buf_.get() + start_, end_ - start_);
    if (in.empty() || in.size() < needAtLeast_) break;
    if (!dialect_) {
      dialect_ = protocol::detectDialect(in);
      if (!dialect_) break;
      DDPRUN_LOG(DEBUG, "store") << peer_ << " speaks the " << protocol::dialectName(*dialect_)
                                 << " dialect";
    }
    const auto r = protocol::parseRequest(in, *dialect_, core_.limits, req_);
    if (r.status == protocol::ParseStatus::NeedMore) {
      needAtLeast_ = r.needAtLeast;
      break;
    }
    if (r.status == protocol::ParseStatus::Invalid) {
      close(r.error);
      return;
    }
    needAtLeast_ = 0;
    start_ += r.consumed;
    if (!handle(req_)) return;
  }
  flush();
}

bool StoreConnection::allowedBeforeAuth(Op op) const {
  return op == Op::Validate || op == Op::Ping || op == Op::Hello || op == Op::Auth;
}

const char* StoreConnection::writeOnceViolation(const protocol::Request& req) const {
  const KeyTable& table = core_.table;
  switch (req.op) {
    case Op::Set: case Op::Append: case Op::Add: case Op::DeleteKey: case Op::MultiSet:
      for (const auto& k : req.keys)
        if (table.frozen(k)) return k.c_str();
      return nullptr;
    case Op::QueuePush: case Op::QueuePop:  // a queue of that name would make it "exist"
      return KeyTable::writeOnce(req.keys[0]) ? req.keys[0].c_str() : nullptr;
    default:
      return nullptr;  // COMPARE_SET: the table keeps an existing version (key_table.h)
  }
}

bool StoreConnection::handle(protocol::Request& req) {
  if (!authenticated_ && !allowedBeforeAuth(req.op)) {
    close(std::string("sent ") + protocol::opName(req.op) + " before authenticating");
    return false;
  }
  if (const char* refused = writeOnceViolation(req)) {
    close(std::string(protocol::opName(req.op)) + " of rendezvous state version '" + refused +
          "' refused: a written version is never changed or deleted");
    return false;
  }
  protocol::FrameWriter out(pending_);
  KeyTable& table = core_.table;
  KeyTable::Woken woken;
  auto& key = req.keys.empty() ? waitGetKey_ : req.keys[0];  // ops with one key use keys[0]

  switch (req.op) {
    case Op::Validate:
      break;  // the magic was checked by the parser; no reply
    case Op::Ping:
      out.u32(static_cast<uint32_t>(req.integer));
      break;
    case Op::Hello:
      if (core_.authToken && nonce_.empty()) nonce_ = auth::randomNonce();
      out.str(protocol::kServerIdentity).u8(core_.authToken ? 1 : 0).str(nonce_);
      break;
    case Op::Auth: {
      // Mutual and channel-bound (rendezvous/auth.h): the client's proof covers our nonce, its
      // own and our socket address; we answer with our proof over the same.
      const std::string& clientNonce = req.values[0];
      if (!core_.authToken) {
        out.u8(static_cast<uint8_t>(protocol::AuthReply::Ok)).str("");
      } else if (!nonce_.empty() && clientNonce.size() == auth::kNonceBytes &&
                 auth::constantTimeEquals(
                     req.values[1], auth::proof(*core_.authToken, auth::Direction::ClientToServer,
                                                nonce_, clientNonce, channel_))) {
        authenticated_ = true;
        out.u8(static_cast<uint8_t>(protocol::AuthReply::Ok))
            .str(auth::proof(*core_.authToken, auth::Direction::ServerToClient, nonce_,
                             clientNonce, channel_));
      } else {
        out.u8(static_cast<uint8_t>(protocol::AuthReply::Refused));
        DDPRUN_LOG(WARN, "store") << "refused connection from " << peer_
                                  << ": wrong authentication proof (another token, a replayed "
                                     "proof, or a relay between the client and "
                                  << channel_ << ")";
        closeAfterFlush_ = true;
      }
      nonce_.clear();  // a nonce answers one attempt
      break;
    }
    case Op::Info:
      out.str(core_.instanceId).str(core_.jobId);
      break;
    case Op::Set:
      table.set(key, std::move(req.values[0]), woken);
      break;
    case Op::CompareSet:
      out.str(table.compareSet(key, req.values[0], std::move(req.values[1]), woken));
      break;
    case Op::Get: {
      const std::string* v = table.get(key);
      out.str(v ? std::string_view(*v) : std::string_view());
      break;
    }
    case Op::Add: {
      auto v = table.add(key, req.integer, woken);
      if (!v) {
        close("ADD on key '" + key + "' whose value is not an integer, or the sum overflows");
        return false;
      }
      out.i64(*v);
      break;
    }
    case Op::Check:
      out.u8(static_cast<uint8_t>(table.check(req.keys) ? protocol::CheckReply::Ready
                                                        : protocol::CheckReply::NotReady));
      break;
    case Op::Wait:
      abandonWait();
      if (table.wait(id_, req.keys)) {
        out.u8(static_cast<uint8_t>(protocol::WaitReply::StopWaiting));
      } else {
        waitKind_ = WaitKind::Wait;
      }
      break;
    case Op::WaitGet:
      abandonWait();
      waitGetKey_ = std::move(req.keys[0]);
      waitKind_ = WaitKind::WaitGet;
      if (table.wait(id_, {waitGetKey_})) replyWaitDone();
      break;
    case Op::GetNumKeys:
      out.i64(table.size());
      break;
    case Op::WatchKey:
      break;  // torch 1.13's idle callback connection: accepted, never answered
    case Op::DeleteKey:
      out.i64(table.erase(key) ? 1 : 0);
      break;
    case Op::Append:
      table.append(key, req.values[0], woken);
      break;
    case Op::MultiGet:
      for (const auto& k : req.keys) {
        const std::string* v = table.get(k);
        out.str(v ? std::string_view(*v) : std::string_view());
      }
      break;
    case Op::MultiSet:
      for (size_t i = 0; i < req.keys.size(); ++i)
        table.set(req.keys[i], std::move(req.values[i]), woken);
      break;
    case Op::CancelWait:
      if (waiting()) {
        // Either it is still registered (cancel it) or it completed and its reply is queued.
        table.cancel(id_);
        waitKind_ = WaitKind::None;
      }
      out.u8(static_cast<uint8_t>(protocol::WaitReply::WaitCanceled));
      break;
    case Op::QueuePush:
      table.queuePush(key, std::move(req.values[0]), woken);
      break;
    case Op::QueuePop: {
      auto [len, value] = table.queuePop(key);
      out.i64(len);
      if (value) out.str(*value);
      break;
    }
    case Op::QueueLen:
      out.i64(table.queueLen(key));
      break;
  }
  if (!woken.empty()) core_.wake(woken);
  return true;
}

void StoreConnection::abandonWait() {
  // A new WAIT while one is held: the client gave up on the old one (torch 1.13 has no
  // CANCEL_WAIT, it just moves on after its timeout). The old one is dropped, unanswered.
  if (!waiting()) return;
  core_.table.cancel(id_);
  waitKind_ = WaitKind::None;
}

void StoreConnection::replyWaitDone() {
  protocol::FrameWriter out(pending_);
  out.u8(static_cast<uint8_t>(protocol::WaitReply::StopWaiting));
  if (waitKind_ == WaitKind::WaitGet) {
    const std::string* v = core_.table.get(waitGetKey_);
    out.str(v ? std::string_view(*v) : std::string_view());
  }
  waitKind_ = WaitKind::None;
}

void StoreConnection::completeWait() {
  if (closed_ || !waiting()) return;
  replyWaitDone();
  // Frames that queued behind the WAIT are handled in a later turn of the loop, so that the
  // connection that woke us is not re-entered from inside its own handler.
  if (!processPosted_) {
    processPosted_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      if (!self->closed_) self->process();
    });
  }
}

void StoreConnection::flush() {
  if (writing_ || pending_.empty() || closed_) {
    if (!writing_ && closeAfterFlush_ && pending_.empty()) close("");
    return;
  }
  writing_ = true;
  inflight_.swap(pending_);
  pending_.clear();
  asio::async_write(socket_, asio::buffer(inflight_),
                    [self = shared_from_this()](boost::system::error_code ec, size_t) {
                      self->writing_ = false;
                      if (ec) {
                        if (!self->closed_) self->close("");
                        return;
                      }
                      self->onWritten();
                    });
}

void StoreConnection::onWritten() {
  inflight_.clear();
  if (closed_) return;
  if (!pending_.empty()) {
    flush();
  } else if (closeAfterFlush_) {
    close("");
  }
}

void StoreConnection::close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  if (!reason.empty()) {
    DDPRUN_LOG(WARN, "store") << "closing connection from " << peer_ << ": " << reason;
  }
  core_.table.cancel(id_);
  waitKind_ = WaitKind::None;
  boost::system::error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  core_.forget(id_);
}

}  // namespace ddprun::rendezvous
