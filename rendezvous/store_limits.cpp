#include "rendezvous/store_limits.h"

#include <cmath>
#include <optional>

#include "base/errors.h"

namespace ddprun::rendezvous {

namespace {

// "1048576", "64K", "8M", "2G" (powers of 1024); nullopt when not a size.
std::optional<uint64_t> parseSize(const std::string& v) {
  if (v.empty()) return std::nullopt;
  uint64_t scale = 1;
  std::string digits = v;
  switch (v.back()) {
    case 'K': case 'k': scale = 1ull << 10; digits.pop_back(); break;
    case 'M': case 'm': scale = 1ull << 20; digits.pop_back(); break;
    case 'G': case 'g': scale = 1ull << 30; digits.pop_back(); break;
    default: break;
  }
  if (digits.empty() || digits.size() > 15) return std::nullopt;
  for (char c : digits)
    if (c < '0' || c > '9') return std::nullopt;
  return std::stoull(digits) * scale;
}

}  // namespace

std::optional<std::chrono::milliseconds> parseSecondsValue(const std::string& v) {
  try {
    size_t used = 0;
    const double s = std::stod(v, &used);
    if (used == v.size() && std::isfinite(s) && s >= 0 && s < 1e9) {
      // llround for 0 <= ms < 1e12 < 2^53: the integer part and the fraction are exact.
      const double ms = s * 1000;
      const auto whole = static_cast<int64_t>(ms);
      return std::chrono::milliseconds(whole + (ms - static_cast<double>(whole) >= 0.5 ? 1 : 0));
    }
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

const std::vector<std::string>& storeLimitNames() {
  static const std::vector<std::string> names{
      "max_connections", "max_waiters", "max_keys", "max_stored_bytes",
      "max_unsent_reply_bytes", "max_value_bytes", "max_frame_bytes",
      "handshake_timeout", "frame_timeout", "idle_timeout"};
  return names;
}

void setStoreLimit(ServerLimits& l, const std::string& name, const std::string& value,
                   const std::string& what) {
  auto size = [&](uint64_t min, const char* unit = " bytes") {
    auto n = parseSize(value);
    if (!n || *n < min) {
      throw ConfigError(what + "='" + value + "' is not valid (allowed: " +
                        std::to_string(min) + unit + " or more, with an optional K, M or G "
                        "suffix)");
    }
    return *n;
  };
  auto count = [&] { return size(1, ""); };
  auto seconds = [&] {
    auto ms = parseSecondsValue(value);
    if (!ms) {
      throw ConfigError(what + "='" + value +
                        "' is not valid (allowed: a number of seconds >= 0, e.g. 30 or 0.5; "
                        "0 turns it off)");
    }
    return *ms;
  };
  if (name == "max_connections") l.maxConnections = count();
  else if (name == "max_waiters") l.maxWaiters = count();
  else if (name == "max_keys") l.maxKeys = count();
  else if (name == "max_stored_bytes") l.maxStoredBytes = size(1);
  else if (name == "max_unsent_reply_bytes") l.maxUnsentReplyBytes = size(1);
  else if (name == "max_value_bytes") l.frame.maxValueBytes = size(1);
  else if (name == "max_frame_bytes") l.frame.maxFrameBytes = size(1024);
  else if (name == "handshake_timeout") l.handshakeTimeout = seconds();
  else if (name == "frame_timeout") l.frameTimeout = seconds();
  else if (name == "idle_timeout") l.idleTimeout = seconds();
  else {
    std::string all;
    for (const auto& n : storeLimitNames()) all += (all.empty() ? "" : ", ") + n;
    throw ConfigError(what + " is not a store limit (allowed: " + all + ")");
  }
}

}  // namespace ddprun::rendezvous
