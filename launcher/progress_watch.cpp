#include "launcher/progress_watch.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdio>
#include <functional>

#include "base/log.h"

namespace ddprun::launcher {

namespace asio = boost::asio;

double StallTracker::threshold() const {
  if (policy_.thresholdSeconds > 0) return policy_.thresholdSeconds;
  return std::max(StallPolicy::kAutoFloor, StallPolicy::kAutoMultiple * stepSeconds_);
}

std::optional<StallTracker::Event> StallTracker::observe(SteadyTime now,
                                                         const progress::ProgressSample& s) {
  auto secondsSince = [&](SteadyTime t) { return std::chrono::duration<double>(now - t).count(); };
  if (!seen_ || s.steps != steps_) {
    std::optional<Event> out;
    if (seen_ && warned_) {
      out = Event{.kind = Event::Kind::Resumed, .seconds = secondsSince(lastChange_),
                  .steps = s.steps, .waiting = false, .stepSeconds = stepSeconds_,
                  .thresholdSeconds = threshold()};
    } else if (seen_ && steps_ > 0 && s.steps > steps_) {
      // The time per step, averaged over what happened since the last change (a stall that was
      // warned about does not count: it is not the rank's step time).
      const double per = secondsSince(lastChange_) / static_cast<double>(s.steps - steps_);
      stepSeconds_ = stepSeconds_ == 0 ? per : 0.7 * stepSeconds_ + 0.3 * per;
    }
    seen_ = true;
    steps_ = s.steps;
    lastChange_ = now;
    warned_ = false;
    nextWarning_ = 0;
    return out;
  }
  if (steps_ == 0) return {};  // not started stepping: not watched
  const double stalled = secondsSince(lastChange_);
  const double due = nextWarning_ > 0 ? nextWarning_ : threshold();
  if (stalled < due) return {};
  const double thr = threshold();
  nextWarning_ = std::max(due, thr) * 2;  // backoff: thr, 2 thr, 4 thr, ...
  warned_ = true;
  return Event{.kind = Event::Kind::Stalled, .seconds = stalled, .steps = s.steps,
               .waiting = s.waiting > 0, .stepSeconds = stepSeconds_, .thresholdSeconds = thr};
}

uint32_t FreezePolicy::heartbeatPeriodMs(double timeoutSeconds) {
  if (timeoutSeconds <= 0) return 0;
  return static_cast<uint32_t>(std::clamp(timeoutSeconds * 100.0, 10.0, 500.0));
}

std::optional<double> HeartbeatTracker::observe(SteadyTime now, uint64_t heartbeats) {
  if (policy_.timeoutSeconds <= 0 || heartbeats == 0) return {};
  if (heartbeats != beats_) {
    beats_ = heartbeats;
    lastChange_ = now;
    fired_ = false;
    return {};
  }
  const double silent = std::chrono::duration<double>(now - lastChange_).count();
  if (fired_ || silent < policy_.timeoutSeconds) return {};
  fired_ = true;
  return silent;
}

std::string describeStall(const StallTracker::Event& e, int rank, int localRank, int nodeRank,
                          const std::string& host, long pid) {
  char buf[512];
  const std::string who = "rank " + std::to_string(rank) + " on node " +
                          std::to_string(nodeRank) + " (" + host + ", local rank " +
                          std::to_string(localRank) +
                          (pid > 0 ? ", pid " + std::to_string(pid) : std::string()) + ")";
  if (e.kind == StallTracker::Event::Kind::Resumed) {
    std::snprintf(buf, sizeof buf, "%s progresses again after %.1f s without progress",
                  who.c_str(), e.seconds);
    return buf;
  }
  std::string steps = e.stepSeconds > 0
                          ? "; its recent steps took " + [&] {
                              char s[32];
                              std::snprintf(s, sizeof s, "%.3g s", e.stepSeconds);
                              return std::string(s);
                            }()
                          : std::string();
  std::snprintf(buf, sizeof buf, "%s has made no progress for %.1f s (step %llu%s; warning after "
                "%.1f s)%s", who.c_str(), e.seconds, static_cast<unsigned long long>(e.steps),
                steps.c_str(), e.thresholdSeconds,
                e.waiting ? ": it is waiting in a collective, for a peer that is slower or stalled"
                          : "");
  return buf;
}

std::chrono::milliseconds ProgressWatch::period(const StallPolicy& p) {
  if (p.thresholdSeconds <= 0) return std::chrono::milliseconds(500);
  const auto quarter = static_cast<int64_t>(p.thresholdSeconds * 1000 / 4);
  return std::chrono::milliseconds(std::clamp<int64_t>(quarter, 50, 500));
}

std::chrono::milliseconds ProgressWatch::period(const Options& o) {
  auto p = o.warnStalls ? period(o.policy) : std::chrono::milliseconds(500);
  if (o.freeze.timeoutSeconds > 0) {
    const auto tenth = static_cast<int64_t>(o.freeze.timeoutSeconds * 100);
    p = std::min(p, std::chrono::milliseconds(std::clamp<int64_t>(tenth, 50, 500)));
  }
  return p;
}

struct ProgressWatch::Impl : std::enable_shared_from_this<ProgressWatch::Impl> {
  struct Watched {
    ProgressWatch::Worker worker;
    int fd = -1;
    StallTracker tracker;
    HeartbeatTracker heartbeat;
  };
  Impl(asio::io_context& io, Options o) : options(std::move(o)), timer(io) {
    for (const auto& w : options.workers) {
      watched.push_back(Watched{.worker = w, .fd = ::open(w.path.c_str(), O_RDONLY | O_CLOEXEC),
                                .tracker = StallTracker(options.policy),
                                .heartbeat = HeartbeatTracker(options.freeze)});
    }
  }
  ~Impl() {
    for (auto& w : watched) {
      if (w.fd >= 0) ::close(w.fd);
    }
  }
  void arm() {
    timer.expires_after(period(options));
    timer.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->stopped) return;
      self->tick();
      self->arm();
    });
  }
  void tick() {
    const auto now = std::chrono::steady_clock::now();
    for (auto& w : watched) {
      if (w.fd < 0) continue;
      const long pid = options.pidOf ? options.pidOf(w.worker.localRank) : -1;
      if (pid == 0) {  // it has ended: nothing more to watch
        ::close(w.fd);
        w.fd = -1;
        continue;
      }
      const auto sample = progress::readProgressRecord(w.fd, w.worker.localRank);
      if (!sample) continue;
      if (!signed_ && (sample->heartbeats > 0 || sample->steps > 0)) {
        signed_ = true;
        if (options.onFirstSign) options.onFirstSign();
        if (stopped) return;  // as for onSilent
      }
      if (const auto silent = w.heartbeat.observe(now, sample->heartbeats)) {
        if (options.onSilent) options.onSilent(w.worker, pid, *silent);
        if (stopped) return;  // the callback may end the watch (it is then being destroyed)
      }
      if (!options.warnStalls) continue;
      const auto event = w.tracker.observe(now, *sample);
      if (!event) continue;
      const std::string line =
          describeStall(*event, w.worker.rank, w.worker.localRank, options.nodeRank,
                        options.host, pid);
      if (event->kind == StallTracker::Event::Kind::Stalled) {
        DDPRUN_LOG(WARN, "launcher") << line;
      } else {
        DDPRUN_LOG(INFO, "launcher") << line;
      }
    }
  }

  Options options;
  asio::steady_timer timer;
  std::vector<Watched> watched;
  bool stopped = false;
  bool signed_ = false;  // onFirstSign was called
};

ProgressWatch::ProgressWatch(asio::io_context& io, Options options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  impl_->arm();
}

ProgressWatch::~ProgressWatch() {
  impl_->stopped = true;
  boost::system::error_code ec;
  impl_->timer.cancel(ec);
}

}  // namespace ddprun::launcher
