#include "rendezvous/silent_members.h"

#include <cstdlib>

#include "base/errors.h"

namespace ddprun::rendezvous {

namespace {
int64_t beatCount(const std::optional<std::string>& v) {
  if (!v) return 0;
  return std::strtoll(v->c_str(), nullptr, 10);  // ADD's decimal text; anything else reads as 0
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
  const int64_t own = beatCount(values.at(0));
  const int64_t ownNeeded = std::max(1, beats_.missedBeats - 1);
  std::vector<std::string> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto& v = values.at(i + 1);
    auto [it, fresh] = seen_.try_emplace(ids[i], Seen{.counter = v, .since = now, .ownSince = own});
    Seen& s = it->second;
    if (!fresh && s.counter != v) s = Seen{.counter = v, .since = now, .ownSince = own};
    if (now - s.since >= beats_.timeout() && own - s.ownSince >= ownNeeded) out.push_back(ids[i]);
  }
  return out;
}

}  // namespace ddprun::rendezvous
