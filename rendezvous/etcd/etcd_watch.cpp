#include "rendezvous/etcd/etcd_watch.h"

#include <algorithm>
#include <random>

#include "base/log.h"
#include "rendezvous/blocking.h"
#include "rendezvous/etcd/grpc/proto.h"

namespace ddprun::rendezvous::etcd {

namespace {
constexpr Millis kMinAttempt{2'000};
}

EtcdWatch::EtcdWatch(EtcdClientOptions options, WatchCreate create)
    : options_(std::move(options)), create_(std::move(create)), next_(create_.startRevision) {
  DDPRUN_CHECK(next_ > 0, "a watch starts from a revision the caller has read");
  DDPRUN_CHECK(!options_.endpoints.empty(), "a watch needs at least one endpoint");
  if (usesGrpc(options_) && !options_.channels)
    options_.channels = std::make_shared<grpc::ChannelPool>();
  if (usesGrpc(options_)) {
    member_ = options_.channels->home(options_.endpoints.size());
  } else {
    std::random_device rd;
    member_ = std::uniform_int_distribution<size_t>(0, options_.endpoints.size() - 1)(rd);
  }
}

EtcdWatch::~EtcdWatch() = default;

void EtcdWatch::cancel() {
  cancelled_ = true;
  std::lock_guard<std::mutex> g(mu_);
  if (conn_) conn_->cancel();
  if (call_) call_->cancel();
}

void EtcdWatch::wake() {
  woken_ = true;
  std::lock_guard<std::mutex> g(mu_);
  if (conn_) conn_->wake();
  if (call_) call_->wake();
}

// One attempt to open the stream on member_ (the "created" reply is read by next()).
void EtcdWatch::open(Clock::time_point deadline) {
  WatchCreate w = create_;
  w.startRevision = next_;
  if (usesGrpc(options_)) {
    const MemberAddress& m = options_.endpoints[member_];
    std::unique_ptr<grpc::Call> call;
    try {
      auto conn = options_.channels->get(member_, {.host = m.host, .port = m.port}, deadline);
      call = conn->start("/etcdserverpb.Watch/Watch", grpc::encodeWatchCreate(w), false, kMaxLine);
    } catch (const grpc::Failure& f) {
      if (f.descriptorLimit()) throw ConnectionLimitError(f.what());
      throw;
    }
    std::unique_ptr<grpc::Call> old;
    {
      std::lock_guard<std::mutex> g(mu_);
      old = std::move(call_);  // reset (its stream) below, without mu_
      call_ = std::move(call);
      if (cancelled_) call_->cancel();
    }
    open_ = true;
    return;
  }
  auto c = std::make_unique<HttpConnection>(options_.endpoints[member_], options_.tls);
  {
    std::lock_guard<std::mutex> g(mu_);
    conn_ = std::move(c);
    if (cancelled_) conn_->cancel();
  }
  const int status = conn_->openStream("/v3/watch", encodeWatchCreate(w), deadline);
  if (status != 200) {
    std::string why = "HTTP " + std::to_string(status);
    try {
      if (auto line = conn_->nextLine(deadline))
        if (auto e = parseError(*line)) why = e->message;
    } catch (const Error&) {
    }
    throw NetworkError(why);
  }
  open_ = true;
}

std::optional<WatchMessage> EtcdWatch::read(Clock::time_point deadline) {
  if (call_) {
    auto m = call_->next(deadline);
    if (!m) return std::nullopt;
    return grpc::decodeWatch(*m);
  }
  auto line = conn_->nextLine(deadline);
  if (!line) return std::nullopt;
  if (auto err = parseError(*line)) throw NetworkError(err->message);
  return parseWatchMessage(*line);
}

std::vector<Event> EtcdWatch::next(Clock::time_point deadline) {
  const std::string what = "watch on '" + create_.key + "'" +
                           (create_.rangeEnd.empty() ? "" : " and the keys after it");
  std::optional<Clock::time_point> failingSince;
  Millis backoff{20};
  auto broken = [&](const std::string& why) {
    open_ = false;
    lastError_ = why;
    DDPRUN_LOG(DEBUG, "etcd") << what << ": " << why << "; re-opening on the next member";
    member_ = (member_ + 1) % options_.endpoints.size();
  };
  for (;;) {
    if (cancelled_) throw NetworkError(describeCluster(options_) + ": " + what + ": cancelled");
    if (woken_.exchange(false)) return {};
    if (!open_) {
      const auto now = Clock::now();
      if (!failingSince) {
        failingSince = now;
      } else if (now - *failingSince >= options_.timeout) {
        throw NetworkError(describeCluster(options_) + ": " + what +
                           " could not be re-established on any member within " +
                           secondsText(options_.timeout) + " (last error: " + lastError_ + ")");
      } else {
        sleepFor(backoff);
        backoff = std::min(backoff * 2, Millis(500));
      }
      const auto failDeadline = *failingSince + options_.timeout;
      try {
        open(std::min(failDeadline, Clock::now() + std::max(kMinAttempt, options_.timeout / 3)));
      } catch (const TimeoutError& e) {
        const std::string earlier = lastError_;  // a real error says more than the deadline
        broken("member " + options_.endpoints[member_].text() + ": " + e.what());
        if (!earlier.empty()) lastError_ = earlier;
      } catch (const ConnectionLimitError&) {
        throw;  // this process's limit: no member would do better
      } catch (const Error& e) {
        broken("member " + options_.endpoints[member_].text() + ": " + e.what());
      }
      continue;
    }
    std::optional<WatchMessage> read;
    try {
      read = this->read(deadline);
    } catch (const NetworkError& e) {
      if (cancelled_) continue;
      broken("member " + options_.endpoints[member_].text() + ": " + e.what());
      continue;
    }
    if (!read) {
      // The deadline, or a wake. A wake() made while no next() was reading is answered at the
      // top of the loop, but also left the stream's own flag set: its read then returns at
      // once, and that leftover is not this call's wake (it would end a wait for an event
      // that is on its way).
      if (woken_.exchange(false) || Clock::now() >= deadline) return {};
      continue;
    }
    WatchMessage& m = *read;
    failingSince.reset();
    backoff = Millis(20);
    if (m.canceled) {
      if (m.compactRevision > 0) {
        throw CompactedError(describeCluster(options_) + ": " + what + " from revision " +
                                 std::to_string(next_) + ": compacted up to " +
                                 std::to_string(m.compactRevision),
                             m.compactRevision);
      }
      broken("the member cancelled the watch: " + m.cancelReason);
      continue;
    }
    std::vector<Event> out;
    for (auto& e : m.events)
      if (e.kv.modRevision >= next_) out.push_back(std::move(e));
    if (!out.empty()) {
      next_ = out.back().kv.modRevision + 1;
      return out;
    }
  }
}

}  // namespace ddprun::rendezvous::etcd
