#include "rendezvous/key_table.h"

#include <algorithm>
#include <charconv>
#include <string_view>
#include <unordered_set>

#include "base/errors.h"

namespace ddprun::rendezvous {

void KeyTable::keyArrived(const std::string& key, Woken& woken, bool onlyOne) {
  auto it = waitersByKey_.find(key);
  if (it == waitersByKey_.end()) return;
  WaitList& list = it->second;
  if (onlyOne) {
    // A queue item serves one waiter: the first for which it is the last missing key.
    // The others stay registered, untouched, until the next push.
    for (auto node = list.begin(); node != list.end(); ++node) {
      auto w = waiters_.find(node->id);
      DDPRUN_CHECK(w != waiters_.end(), "waiter " << node->id << " on '" << key << "' is unknown");
      if (w->second.missing != 1) continue;
      woken.push_back(node->id);
      waiters_.erase(w);
      list.erase(node);
      if (list.empty()) waitersByKey_.erase(it);
      return;
    }
    return;
  }
  for (const Registration& r : list) {
    auto w = waiters_.find(r.id);
    DDPRUN_CHECK(w != waiters_.end(), "waiter " << r.id << " on '" << key << "' is unknown");
    DDPRUN_CHECK(w->second.missing > 0);
    if (--w->second.missing == 0) {
      woken.push_back(r.id);
      // Complete: all its other keys arrived earlier, so it is registered nowhere else.
      waiters_.erase(w);
    } else {
      w->second.entries[r.index].list = nullptr;  // this list goes away below
    }
  }
  waitersByKey_.erase(it);
}

void KeyTable::set(const std::string& key, std::string value, Woken& woken) {
  auto [it, inserted] = map_.try_emplace(key);
  adjustBytes(value.size() + (inserted ? key.size() : 0), it->second.size());
  it->second = std::move(value);
  keyArrived(key, woken);
}

const std::string* KeyTable::get(const std::string& key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

std::optional<int64_t> KeyTable::add(const std::string& key, int64_t delta, Woken& woken) {
  auto it = map_.find(key);
  int64_t current = 0;
  if (it != map_.end()) {
    const std::string& s = it->second;
    const char* b = s.data();
    const char* e = b + s.size();
    // Leading spaces and '+' are not produced by any client; accept what std::stoll would.
    while (b != e && *b == ' ') ++b;
    if (b != e && *b == '+') ++b;
    auto [ptr, ec] = std::from_chars(b, e, current);
    if (ec != std::errc() || ptr != e || b == e) return std::nullopt;
  }
  int64_t next = 0;
  if (__builtin_add_overflow(current, delta, &next)) return std::nullopt;
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, next);
  (void)ec;
  const size_t len = static_cast<size_t>(end - buf);
  if (it != map_.end()) {
    adjustBytes(len, it->second.size());
    it->second.assign(buf, end);
  } else {
    adjustBytes(key.size() + len, 0);
    map_.emplace(key, std::string(buf, end));
  }
  keyArrived(key, woken);
  return next;
}

std::string KeyTable::compareSet(const std::string& key, const std::string& expected,
                                 std::string desired, Woken& woken) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    if (expected.empty()) {
      adjustBytes(key.size() + desired.size(), 0);
      map_.emplace(key, desired);
      keyArrived(key, woken);
      return desired;
    }
    // c10d's quirk, kept for compatibility: a missing key with a non-empty expectation
    // returns the expectation and stores nothing.
    return expected;
  }
  if (it->second == expected && !writeOnce(key)) {
    adjustBytes(desired.size(), it->second.size());
    it->second = std::move(desired);
  }
  return it->second;
}

namespace {

bool allDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Removes `word` from the front of `s`; false (and `s` unchanged) when it is not there.
bool take(std::string_view& s, std::string_view word) {
  if (s.substr(0, word.size()) != word) return false;
  s.remove_prefix(word.size());
  return true;
}

}  // namespace

bool KeyTable::writeOnce(std::string_view key) {
  if (!take(key, "ddprun/rdzv/")) return false;
  const size_t slash = key.find('/');  // a run id has no '/' (DynamicRendezvous checks it)
  if (slash == 0 || slash == std::string_view::npos) return false;
  key.remove_prefix(slash);
  if (take(key, "/state/")) return allDigits(key);
  // Spilled lists (state_log.h): l/<ref>/<i> and l/<ref>/id/<id>; `lists` is a counter (ADD).
  if (take(key, "/l/")) {
    const size_t end = key.find('/');
    if (end == std::string_view::npos || !allDigits(key.substr(0, end))) return false;
    key.remove_prefix(end);
    if (take(key, "/id/")) return !key.empty();
    return take(key, "/") && allDigits(key);
  }
  // The slot join (rendezvous/scalable/slot_join.h): r/<r>/node/<s>, r/<r>/done/<d>,
  // r/<r>/closed, r/<r>/over. r/<r>/count and r/<r>/done are counters (ADD), not write-once.
  if (!take(key, "/r/")) return false;
  const size_t end = key.find('/');
  if (end == std::string_view::npos || !allDigits(key.substr(0, end))) return false;
  key.remove_prefix(end);
  if (take(key, "/node/")) return allDigits(key);
  if (take(key, "/done/")) return allDigits(key);  // the exit barrier's records (r/<r>/done: ADD)
  return key == "/closed" || key == "/over";
}

void KeyTable::append(const std::string& key, const std::string& value, Woken& woken) {
  auto [it, inserted] = map_.try_emplace(key);
  adjustBytes(value.size() + (inserted ? key.size() : 0), 0);
  it->second.append(value);
  if (inserted) keyArrived(key, woken);
}

bool KeyTable::erase(const std::string& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  adjustBytes(0, key.size() + it->second.size());
  map_.erase(it);
  return true;
}

bool KeyTable::exists(const std::string& key) const {
  if (map_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

bool KeyTable::check(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return exists(k); });
}

bool KeyTable::wait(WaiterId id, const std::vector<std::string>& keys) {
  DDPRUN_CHECK(waiters_.count(id) == 0, "waiter " << id << " is already waiting");
  Waiter w;
  std::unordered_set<std::string_view> seen;  // a key listed twice is awaited once
  if (keys.size() > 1) seen.reserve(keys.size());
  for (const auto& k : keys) {
    if (exists(k)) continue;
    if (keys.size() > 1 && !seen.insert(k).second) continue;
    auto [entry, inserted] = waitersByKey_.try_emplace(k);
    entry->second.push_back({id, w.entries.size()});
    w.entries.push_back({&*entry, std::prev(entry->second.end())});
  }
  if (w.entries.empty()) return true;
  w.missing = w.entries.size();
  waiters_.emplace(id, std::move(w));
  return false;
}

bool KeyTable::cancel(WaiterId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  for (const auto& e : it->second.entries) {
    if (!e.list) continue;  // that key arrived: its list is gone
    e.list->second.erase(e.node);
    if (e.list->second.empty()) waitersByKey_.erase(waitersByKey_.find(e.list->first));
  }
  waiters_.erase(it);
  return true;
}

void KeyTable::queuePush(const std::string& key, std::string value, Woken& woken) {
  auto [it, inserted] = queues_.try_emplace(key);
  adjustBytes(value.size() + (inserted ? key.size() : 0), 0);
  it->second.push_back(std::move(value));
  keyArrived(key, woken, /*onlyOne=*/true);
}

std::pair<int64_t, std::optional<std::string>> KeyTable::queuePop(const std::string& key) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return {0, std::nullopt};
  const auto len = static_cast<int64_t>(it->second.size());
  std::string v = std::move(it->second.front());
  it->second.pop_front();
  adjustBytes(0, v.size());
  if (it->second.empty()) {
    adjustBytes(0, key.size());
    queues_.erase(it);
  }
  return {len, std::move(v)};
}

int64_t KeyTable::queueLen(const std::string& key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

}  // namespace ddprun::rendezvous
