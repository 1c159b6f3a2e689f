#include "rendezvous/store_connection.h"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <sstream>

#include "rendezvous/auth.h"
#include "base/log.h"
#include "base/timeline.h"

namespace ddprun::rendezvous {

namespace asio = boost::asio;
using protocol::Op;

namespace {
constexpr size_t kInitialBuffer = 16 * 1024;
constexpr size_t kMinReadSpace = 4 * 1024;
}  // namespace

StoreConnection::StoreConnection(uint64_t id, asio::ip::tcp::socket socket, ServerCore& core)
    : id_(id), socket_(std::move(socket)), core_(core), timer_(socket_.get_executor()) {
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
  if (!authenticated_ || core_.limits.idleTimeout.count() > 0) acceptedAt_ = lastFrameAt_ = Clock::now();
  pump();
}

void StoreConnection::readMore() {
  if (closed_ || reading_) return;
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
  reading_ = true;
  socket_.async_read_some(asio::buffer(buf_.get() + end_, cap_ - end_),
                          [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                            self->reading_ = false;
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
  pump();
}

void StoreConnection::pump() {
  process();
  if (closed_) return;
  if (!paused_) readMore();
  // A frame partly received: its deadline counts from when its first bytes were seen (a
  // clock read only when a frame straddles reads, which small frames rarely do).
  if (start_ == end_) {
    partialSince_.reset();
  } else if (!partialSince_ || partialFrameNo_ != framesDone_) {
    partialSince_ = Clock::now();
    partialFrameNo_ = framesDone_;
  }
  armTimer();
}

void StoreConnection::process() {
  processPosted_ = false;
  const uint64_t framesBefore = framesDone_;
  while (!closed_ && !closeAfterFlush_) {
    if (unsentBytes() >= core_.limits.maxUnsentReplyBytes) {
      // Backpressure: the peer does not read its replies; stop reading its requests.
      if (!paused_) {
        DDPRUN_LOG(DEBUG, "store") << peer_ << " has " << unsentBytes()
                                   << " bytes of unread replies: not reading it until they drain";
        if (core_.limits.frameTimeout.count() > 0) pausedSince_ = Clock::now();
      }
      paused_ = true;
      break;
    }
    const std::string_view in(buf_.get() + start_, end_ - start_);
    if (in.empty() || in.size() < needAtLeast_) break;
    if (!dialect_) {
      dialect_ = protocol::detectDialect(in);
      if (!dialect_) break;
      DDPRUN_LOG(DEBUG, "store") << peer_ << " speaks the " << protocol::dialectName(*dialect_)
                                 << " dialect";
    }
    if (!authenticated_ && !parser_.inFrame()) {
      // Before authentication only the handshake is read, refused from its first byte.
      const auto op = protocol::decodeCommand(static_cast<uint8_t>(in[0]), *dialect_);
      if (op && !allowedBeforeAuth(*op)) {
        close(std::string("sent ") + protocol::opName(*op) + " before authenticating");
        return;
      }
      if (++handshakeFrames_ > kMaxHandshakeFrames) {
        close("sent more than " + std::to_string(kMaxHandshakeFrames) +
              " handshake frames without authenticating");
        return;
      }
    }
    const protocol::Limits& limits = authenticated_ ? core_.limits.frame : kHandshakeFrameLimits;
    const auto r = parser_.parse(in, *dialect_, limits, req_);
    if (r.status == protocol::ParseStatus::NeedMore) {
      needAtLeast_ = r.needAtLeast;
      break;
    }
    if (r.status == protocol::ParseStatus::Invalid) {
      close(authenticated_ ? r.error : r.error + " (before authenticating)");
      return;
    }
    needAtLeast_ = 0;
    start_ += r.consumed;
    ++framesDone_;
    if (!handle(req_)) return;
  }
  if (framesDone_ != framesBefore && core_.limits.idleTimeout.count() > 0) {
    lastFrameAt_ = Clock::now();
  }
  flush();
}

StoreConnection::Deadline StoreConnection::nextDeadline() const {
  const auto& lim = core_.limits;
  if (!authenticated_ && lim.handshakeTimeout.count() > 0) {
    return {DeadlineKind::Handshake, acceptedAt_ + lim.handshakeTimeout};
  }
  if (paused_) {
    // We are the ones not reading, so no frame or idle deadline counts; but a peer that reads
    // none of its replies for frame_timeout is as stuck as a slow sender.
    if (lim.frameTimeout.count() == 0) return {};
    return {DeadlineKind::Drain, pausedSince_ + lim.frameTimeout};
  }
  if (partialSince_ && lim.frameTimeout.count() > 0) {
    return {DeadlineKind::Frame, *partialSince_ + lim.frameTimeout};
  }
  if (!partialSince_ && !waiting() && lim.idleTimeout.count() > 0) {
    return {DeadlineKind::Idle, lastFrameAt_ + lim.idleTimeout};
  }
  return {};
}

void StoreConnection::armTimer() {
  const Deadline d = nextDeadline();
  if (d.kind == DeadlineKind::None || closed_) return;
  if (timerArmed_ && timer_.expiry() <= d.at) return;  // fires first, then re-arms
  timerArmed_ = true;
  timer_.expires_at(d.at);
  timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec == asio::error::operation_aborted) return;  // re-armed earlier, or closed
    self->timerArmed_ = false;
    self->onTimer();
  });
}

void StoreConnection::onTimer() {
  if (closed_) return;
  const Deadline d = nextDeadline();
  if (d.kind == DeadlineKind::None || Clock::now() < d.at) {
    armTimer();
    return;
  }
  const auto& lim = core_.limits;
  auto seconds = [](std::chrono::milliseconds ms) {
    std::ostringstream s;
    s << static_cast<double>(ms.count()) / 1000 << " s";
    return s.str();
  };
  switch (d.kind) {
    case DeadlineKind::Handshake:
      close("did not authenticate within " + seconds(lim.handshakeTimeout) +
            " (handshake_timeout)");
      break;
    case DeadlineKind::Frame:
      close("did not complete a frame within " + seconds(lim.frameTimeout) + " (frame_timeout; " +
            std::to_string(end_ - start_) + " bytes of it arrived)");
      break;
    case DeadlineKind::Drain:
      close("read none of its " + std::to_string(unsentBytes()) + " bytes of pending replies for " +
            seconds(lim.frameTimeout) + " (frame_timeout)");
      break;
    case DeadlineKind::Idle:
      close("sent no request for " + seconds(lim.idleTimeout) + " (idle_timeout)");
      break;
    case DeadlineKind::None:
      break;
  }
}

bool StoreConnection::allowedBeforeAuth(Op op) const {
  return op == Op::Validate || op == Op::Ping || op == Op::Hello || op == Op::Auth;
}

namespace {
// An upper bound of what a request adds to the table: bytes of keys and values, new keys.
struct Growth {
  uint64_t bytes = 0;
  uint64_t keys = 0;
};

void addSet(Growth& g, const KeyTable& t, const std::string& key, size_t valueBytes) {
  if (const std::string* old = t.get(key)) {
    if (valueBytes > old->size()) g.bytes += valueBytes - old->size();
  } else {
    g.bytes += key.size() + valueBytes;
    g.keys += 1;
  }
}

Growth growthOf(const protocol::Request& req, const KeyTable& t) {
  Growth g;
  switch (req.op) {
    case Op::Set: addSet(g, t, req.keys[0], req.values[0].size()); break;
    case Op::CompareSet: addSet(g, t, req.keys[0], req.values[1].size()); break;
    case Op::Add: addSet(g, t, req.keys[0], 20); break;
    case Op::Append: {
      const std::string* old = t.get(req.keys[0]);
      addSet(g, t, req.keys[0], (old ? old->size() : 0) + req.values[0].size());
      break;
    }
    case Op::MultiSet:
      for (size_t i = 0; i < req.keys.size(); ++i) addSet(g, t, req.keys[i], req.values[i].size());
      break;
    case Op::QueuePush:
      g.bytes = req.values[0].size();
      if (t.queueLen(req.keys[0]) == 0) {
        g.bytes += req.keys[0].size();
        g.keys = 1;
      }
      break;
    default: break;
  }
  return g;
}
}  // namespace

bool StoreConnection::withinCaps(const protocol::Request& req) {
  const auto& lim = core_.limits;
  const KeyTable& t = core_.table;
  auto what = [&] {
    return std::string(protocol::opName(req.op)) +
           (req.keys.empty() ? "" : " of key '" + req.keys[0].substr(0, 200) + "'");
  };
  switch (req.op) {
    case Op::Set: case Op::CompareSet: case Op::Add: case Op::Append: case Op::MultiSet:
    case Op::QueuePush: {
      const Growth g = growthOf(req, t);
      if (g.keys > 0 && t.keyCount() + g.keys > lim.maxKeys) {
        close(what() + " refused: the store holds " + std::to_string(t.keyCount()) +
              " keys, the limit is " + std::to_string(lim.maxKeys) + " (max_keys)");
        return false;
      }
      if (g.bytes > 0 && t.bytes() + g.bytes > lim.maxStoredBytes) {
        close(what() + " refused: the store holds " + std::to_string(t.bytes()) +
              " bytes, this adds up to " + std::to_string(g.bytes) + ", the limit is " +
              std::to_string(lim.maxStoredBytes) + " (max_stored_bytes)");
        return false;
      }
      return true;
    }
    case Op::Wait: case Op::WaitGet:
      // The connection's own held WAIT, if any, is replaced: it does not count.
      if (t.waiterCount() - (waiting() ? 1 : 0) >= lim.maxWaiters && !t.check(req.keys)) {
        close(what() + " refused: " + std::to_string(t.waiterCount()) +
              " connections hold a WAIT, the limit is " + std::to_string(lim.maxWaiters) +
              " (max_waiters)");
        return false;
      }
      return true;
    case Op::MultiGet: {
      // One reply holds every value: bounded like one value.
      uint64_t bytes = 0;
      for (const auto& k : req.keys) {
        const std::string* v = t.get(k);
        bytes += 8 + (v ? v->size() : 0);
      }
      if (bytes > lim.frame.maxValueBytes + 8 * req.keys.size()) {
        close(what() + " refused: its reply of " + std::to_string(bytes) +
              " bytes exceeds the value limit of " + std::to_string(lim.frame.maxValueBytes) +
              " bytes (max_value_bytes)");
        return false;
      }
      return true;
    }
    default:
      return true;
  }
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
  if (!withinCaps(req)) return false;
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
    case Op::Clock:
      // The timeline's clock (base/timeline.h: its test skew hook included), so that a node's
      // offset to this machine is measured on the axis its events are recorded on.
      out.i64(ddprun::timeline::nowUs());
      break;
    case Op::Set:
      table.set(key, std::move(req.values[0]), woken);
      if (core_.onSet) core_.onSet(key);
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
  // The reply goes out now (an inline send on an idle socket), not in the later turn below: a
  // host that SETs and then keeps its thread busy (an agent publishing a recovery's generation,
  // then starting the next spare) would otherwise hold every waiter's wake-up until it returns.
  flush();
  if (core_.limits.idleTimeout.count() > 0) lastFrameAt_ = Clock::now();  // idle from now
  // Frames that queued behind the WAIT are handled in a later turn of the loop, so that the
  // connection that woke us is not re-entered from inside its own handler.
  if (!processPosted_) {
    processPosted_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      if (!self->closed_) self->pump();
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
  if (paused_ && unsentBytes() < core_.limits.maxUnsentReplyBytes) {
    // The peer read its replies: handle what is buffered and read it again; a partial
    // frame's deadline starts afresh (it did not count while we were not reading).
    paused_ = false;
    partialSince_.reset();
    pump();
    return;
  }
  if (paused_ && core_.limits.frameTimeout.count() > 0) pausedSince_ = Clock::now();  // it reads
  if (!pending_.empty()) {
    flush();
  } else if (closeAfterFlush_) {
    close("");
  }
}

void StoreConnection::close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  uint64_t suppressed = 0;
  if (!reason.empty() && core_.closeLog.allow(suppressed)) {
    DDPRUN_LOG(WARN, "store") << "closing connection from " << peer_ << ": " << reason
                              << (suppressed ? " (" + std::to_string(suppressed) +
                                                   " such lines suppressed before this one)"
                                             : std::string());
  }
  core_.table.cancel(id_);
  waitKind_ = WaitKind::None;
  timer_.cancel();
  boost::system::error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  core_.forget(id_);
}

}  // namespace ddprun::rendezvous
