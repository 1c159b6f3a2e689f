#include "rendezvous/silent_members.h"

#include "base/errors.h"
#include "base/log.h"

namespace ddprun::rendezvous {

namespace {
// How far this node's own counter moved from `since` to `now`, 0 when it went back (forged) or
// the difference overflows int64 (forged values of opposite signs): never judging on it.
int64_t movedBy(int64_t now, int64_t since) {
  int64_t d = 0;
  if (__builtin_sub_overflow(now, since, &d) || d < 0) return 0;
  return d;
}

// The counters in two round trips when all exist (a killed node's stay);
// else one CHECK and GET each (Store::readAll): a node that left has deleted its keys.
std::vector<std::optional<std::string>> readCounters(Store& store,
                                                     const std::vector<std::string>& keys) {
  if (store.check(keys)) {
    try {
      std::vector<std::optional<std::string>> out;
      for (auto& v : store.multiGet(keys)) out.emplace_back(std::move(v));
      return out;
    } catch (const TimeoutError&) {
      // A node left between the CHECK and the MULTI_GET (its keys deleted): read them one by one.
    }
  }
  return store.readAll(keys);
}
}  // namespace

std::vector<std::string> SilentMembers::silent(Store& store, const std::vector<std::string>& ids) {
  std::vector<std::string> keys{heartbeatCounterKey(self_)};
  for (const auto& id : ids) keys.push_back(heartbeatCounterKey(id));
  const auto values = readCounters(store, keys);
  const auto now = Clock::now();
  // Any client of a store without a token can write a counter (docs/security.md): a value that
  // is not a count is named once per value. A member's is compared as it is (it moves when it
  // changes); this node's own must count: forged, this step judges nobody.
  auto warnForged = [&](size_t i, const std::string& then) {
    const auto& v = values.at(i);
    if (!v || beatCount(*v) || warned_[keys[i]] == *v) return;
    warned_[keys[i]] = *v;
    DDPRUN_LOG(WARN, "rendezvous") << forgedCounter(keys[i], *v, "not a decimal beat count")
                                   << ": " << then;
  };
  const auto own = values.at(0) ? beatCount(*values.at(0)) : std::optional<int64_t>(0);
  warnForged(0, "this node judges nobody silent until its own counter counts again");
  const int64_t ownNeeded = std::max(1, beats_.missedBeats - 1);
  std::vector<std::string> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto& v = values.at(i + 1);
    warnForged(i + 1, "node " + ids[i] + " counts as beating only while it changes");
    auto [it, fresh] = seen_.try_emplace(ids[i], Seen{.counter = v, .since = now, .ownSince = own});
    Seen& s = it->second;
    if (!fresh && s.counter != v) s = Seen{.counter = v, .since = now, .ownSince = own};
    if (!s.ownSince) s.ownSince = own;  // counted from this node's first count since
    if (own && now - s.since >= beats_.timeout() && movedBy(*own, *s.ownSince) >= ownNeeded) {
      out.push_back(ids[i]);
    }
  }
  return out;
}

}  // namespace ddprun::rendezvous
