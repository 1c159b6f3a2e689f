#include "rendezvous/state_log.h"

#include "base/errors.h"

namespace ddprun::rendezvous {

std::string stateKey(int64_t version) { return "state/" + std::to_string(version); }

namespace {
int64_t parseVersion(const std::string& value, const std::string& key) {
  try {
    size_t used = 0;
    int64_t v = std::stoll(value, &used);
    if (used == value.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw StoreError("rendezvous key '" + key + "' holds '" + value +
                   "', not a state version: is another program using this rendezvous id?");
}
}  // namespace

Versioned StateLog::read(int64_t version) {
  if (version == 0) return {};
  const std::string key = stateKey(version);
  return {version, decode(store_.get(key), key)};
}

RoundState StateLog::decode(const std::string& text, const std::string& key) const {
  RoundState s = decodeState(text, "'" + key + "'");
  validateState(s, limits_, "'" + key + "'");
  return s;
}

// A version named by a hint or a marker exists: agents write a version before any key that
// names it. A name of a missing version is forged; reading it would wait for read_timeout.
int64_t StateLog::existing(int64_t version, const std::string& namedBy) {
  if (version > 0 && !store_.check({stateKey(version)})) {
    throw StoreError("rendezvous key '" + namedBy + "' names version " + std::to_string(version) +
                     ", which was never written: it is forged (is another program writing to "
                     "this rendezvous id?)");
  }
  return version;
}

Versioned StateLog::latest() {
  // One round trip: creates the hint as "0" when no state was written yet.
  const int64_t hint = parseVersion(store_.compareSet(kLatestKey, "", "0"), kLatestKey);
  return read(existing(hint, kLatestKey));
}

Versioned StateLog::refresh(Versioned known) {
  const int64_t hint = parseVersion(store_.compareSet(kLatestKey, "", "0"), kLatestKey);
  if (hint > known.version) known = read(existing(hint, kLatestKey));
  while (store_.check({stateKey(known.version + 1)})) known = read(known.version + 1);
  return known;
}

StateLog::Result StateLog::update(Versioned known, const Transition& fn) {
  Versioned cur = std::move(known);
  for (;;) {
    std::optional<RoundState> next = fn(cur.state);
    if (!next) {
      // A no-op is only an answer on the newest state.
      const std::string key = stateKey(cur.version + 1);
      if (!store_.check({key})) return {cur, false};
      cur = refresh(cur);
      continue;
    }
    const std::string key = stateKey(cur.version + 1);
    const std::string blob = encodeState(*next);
    std::string got = store_.compareSet(key, "", blob);
    if (got == blob) {
      cur = {cur.version + 1, std::move(*next)};
      publish(cur);
      return {cur, true};
    }
    cur = {cur.version + 1, decode(got, key)};
  }
}

void StateLog::publish(const Versioned& v) {
  std::vector<std::string> keys = markersFor(v.state, limits_);
  keys.push_back(kLatestKey);
  std::vector<std::string> values(keys.size(), std::to_string(v.version));
  store_.multiSet(keys, values);
}

std::optional<int64_t> StateLog::waitMarker(const std::string& key, Millis timeout) {
  if (timeout.count() <= 0) {
    if (!store_.check({key})) return std::nullopt;
  } else {
    try {
      store_.wait({key}, timeout);
    } catch (const TimeoutError&) {
      return std::nullopt;
    }
  }
  return existing(parseVersion(store_.get(key), key), key);
}

std::optional<Versioned> StateLog::waitNewer(const Versioned& known, Millis timeout) {
  const std::string key = stateKey(known.version + 1);
  if (timeout.count() <= 0) {
    if (!store_.check({key})) return std::nullopt;
  } else {
    try {
      store_.wait({key}, timeout);
    } catch (const TimeoutError&) {
      return std::nullopt;
    }
  }
  return read(known.version + 1);
}

void StateView::onChange(std::function<void()> fn) {
  std::lock_guard<std::mutex> g(callbackMu_);
  onChange_ = std::move(fn);
}

void StateView::offer(const Versioned& v) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (v.version <= newest_.version && newest_.version != 0) return;
    newest_ = v;
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> g(callbackMu_);
  if (onChange_) onChange_();
}

Versioned StateView::get() {
  std::lock_guard<std::mutex> g(mu_);
  return newest_;
}

bool StateView::waitNewer(int64_t seen) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return stopped_ || newest_.version > seen; });
  return !stopped_;
}

void StateView::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

}  // namespace ddprun::rendezvous
