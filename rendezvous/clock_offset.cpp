#include "rendezvous/clock_offset.h"

#include "base/timeline.h"
#include "rendezvous/tcp_store.h"

namespace ddprun::rendezvous {

std::optional<ClockOffset> estimateClockOffset(const std::vector<ClockSample>& samples) {
  std::optional<ClockOffset> best;
  for (const ClockSample& s : samples) {
    const int64_t rtt = s.receivedUs - s.sentUs;
    if (rtt < 0) continue;
    if (best && rtt >= best->rttUs) continue;
    // s - (t0 + t1) / 2, without overflow for epoch microseconds.
    const int64_t mid = s.sentUs + rtt / 2;
    best = ClockOffset{.offsetUs = s.serverUs - mid, .boundUs = (rtt + 1) / 2 + 1, .rttUs = rtt};
  }
  if (best) best->samples = static_cast<int>(samples.size());
  return best;
}

std::optional<ClockOffset> measureClockOffset(TcpStore& store, int pings) {
  std::vector<ClockSample> samples;
  samples.reserve(pings);
  for (int i = 0; i < pings; ++i) {
    ClockSample s;
    s.sentUs = ddprun::timeline::nowUs();
    s.serverUs = store.serverClockUs();
    s.receivedUs = ddprun::timeline::nowUs();
    samples.push_back(s);
  }
  return estimateClockOffset(samples);
}

}  // namespace ddprun::rendezvous
