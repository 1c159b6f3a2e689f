#pragma once
// Clock offset to a store's machine, for the job timeline (docs/timeline.md, "One time axis").
//
// A client sends CLOCK (docs/protocol.md) several times; each sample is (t0: sent, s: the
// server's clock, t1: answered), all system_clock microseconds. The server read its clock
// somewhere in [t0, t1] of ours, so `s - (t0 + t1) / 2` is the offset (server minus local) to
// within (t1 - t0) / 2. The sample with the shortest round trip has the tightest bound: it is
// the estimate, and its half round trip (plus 1 us for the microsecond truncation) the bound.
// Adding the offset to a local time gives the server machine's time of the same moment.
#include <cstdint>
#include <optional>
#include <vector>

namespace ddprun::rendezvous {

class TcpStore;

struct ClockSample {
  int64_t sentUs = 0;      // local clock before the request
  int64_t serverUs = 0;    // the server's CLOCK reply
  int64_t receivedUs = 0;  // local clock after the reply
};

struct ClockOffset {
  int64_t offsetUs = 0;  // server minus local
  int64_t boundUs = 0;   // |true offset - offsetUs| <= boundUs
  int64_t rttUs = 0;     // the chosen sample's round trip
  int samples = 0;       // samples considered
};

// The minimum-RTT sample's offset; nullopt when no sample is usable (none, or every one had
// receivedUs < sentUs: the local clock stepped back meanwhile). Pure.
std::optional<ClockOffset> estimateClockOffset(const std::vector<ClockSample>& samples);

// Sends `pings` CLOCK requests on `store` (ddprun dialect) and estimates, on the clock of
// base/timeline.h (nowUs()). Throws what the store throws; nullopt as above.
std::optional<ClockOffset> measureClockOffset(TcpStore& store, int pings = 8);

}  // namespace ddprun::rendezvous
