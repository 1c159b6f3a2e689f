#include "rendezvous/key_table.h"

#include <algorithm>
#include <charconv>

#include "base/errors.h"

namespace ddprun::rendezvous {

void KeyTable::keyArrived(const std::string& key, Woken& woken, bool onlyOne) {
  auto it = waitersByKey_.find(key);
  if (it == waitersByKey_.end()) return;
  auto& ids = it->second;
  if (onlyOne) {
    // A queue item serves one waiter: the first for which it is the last missing key.
    // The others stay registered, untouched, until the next push.
    for (auto id = ids.begin(); id != ids.end(); ++id) {
      auto w = waiters_.find(*id);
      DDPRUN_CHECK(w != waiters_.end(), "waiter " << *id << " on '" << key << "' is unknown");
      if (w->second.missing != 1) continue;
      woken.push_back(*id);
      waiters_.erase(w);
      ids.erase(id);
      if (ids.empty()) waitersByKey_.erase(it);
      return;
    }
    return;
  }
  for (WaiterId id : ids) {
    auto w = waiters_.find(id);
    DDPRUN_CHECK(w != waiters_.end(), "waiter " << id << " on '" << key << "' is unknown");
    DDPRUN_CHECK(w->second.missing > 0);
    if (--w->second.missing == 0) {
      woken.push_back(id);
      // Complete: all its other keys arrived earlier, so it is registered nowhere else.
      waiters_.erase(w);
    }
  }
  waitersByKey_.erase(it);
}

void KeyTable::set(const std::string& key, std::string value, Woken& woken) {
  map_[key] = std::move(value);
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
  if (it != map_.end()) {
    it->second.assign(buf, end);
  } else {
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
      map_.emplace(key, desired);
      keyArrived(key, woken);
      return desired;
    }
    // c10d's quirk, kept for compatibility: a missing key with a non-empty expectation
    // returns the expectation and stores nothing.
    return expected;
  }
  if (it->second == expected && !writeOnce(key)) it->second = std::move(desired);
  return it->second;
}

bool KeyTable::writeOnce(std::string_view key) {
  constexpr std::string_view kPrefix = "ddprun/rdzv/", kState = "/state/";
  if (key.substr(0, kPrefix.size()) != kPrefix) return false;
  key.remove_prefix(kPrefix.size());
  const size_t slash = key.find('/');  // a run id has no '/' (DynamicRendezvous checks it)
  if (slash == 0 || slash == std::string_view::npos) return false;
  key.remove_prefix(slash);
  if (key.substr(0, kState.size()) != kState) return false;
  key.remove_prefix(kState.size());
  return !key.empty() && std::all_of(key.begin(), key.end(),
                                     [](char c) { return c >= '0' && c <= '9'; });
}

void KeyTable::append(const std::string& key, const std::string& value, Woken& woken) {
  auto [it, inserted] = map_.try_emplace(key);
  it->second.append(value);
  if (inserted) keyArrived(key, woken);
}

bool KeyTable::erase(const std::string& key) { return map_.erase(key) > 0; }

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
  for (const auto& k : keys) {
    if (exists(k)) continue;
    // A key listed twice is awaited once.
    if (std::find(w.keys.begin(), w.keys.end(), k) != w.keys.end()) continue;
    w.keys.push_back(k);
  }
  if (w.keys.empty()) return true;
  w.missing = w.keys.size();
  for (const auto& k : w.keys) waitersByKey_[k].push_back(id);
  waiters_.emplace(id, std::move(w));
  return false;
}

bool KeyTable::cancel(WaiterId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  for (const auto& k : it->second.keys) {
    auto byKey = waitersByKey_.find(k);
    if (byKey == waitersByKey_.end()) continue;
    auto& ids = byKey->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) waitersByKey_.erase(byKey);
  }
  waiters_.erase(it);
  return true;
}

void KeyTable::queuePush(const std::string& key, std::string value, Woken& woken) {
  auto& q = queues_[key];
  q.push_back(std::move(value));
  keyArrived(key, woken, /*onlyOne=*/true);
}

std::pair<int64_t, std::optional<std::string>> KeyTable::queuePop(const std::string& key) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return {0, std::nullopt};
  const auto len = static_cast<int64_t>(it->second.size());
  std::string v = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return {len, std::move(v)};
}

int64_t KeyTable::queueLen(const std::string& key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

}  // namespace ddprun::rendezvous
