#include "rendezvous/memory_store.h"

#include "base/errors.h"

namespace ddprun::rendezvous {

void MemoryStore::waitLocked(std::unique_lock<std::mutex>& lock,
                             const std::vector<std::string>& keys, Millis timeout) {
  if (!changed_.wait_for(lock, timeout, [&] { return table_.check(keys); })) {
    throw TimeoutError("memory store: timed out after " + std::to_string(timeout.count()) +
                       " ms waiting for " + quoteKeys(keys));
  }
}

void MemoryStore::set(const std::string& key, const std::string& value) {
  KeyTable::Woken woken;
  {
    std::lock_guard<std::mutex> g(mu_);
    table_.set(key, value, woken);
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mu_);
  waitLocked(lock, {key}, timeout());
  return *table_.get(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  KeyTable::Woken woken;
  std::optional<int64_t> v;
  {
    std::lock_guard<std::mutex> g(mu_);
    v = table_.add(key, delta, woken);
  }
  changed_.notify_all();
  if (!v) throw StoreError("memory store: ADD on key '" + key + "' whose value is not an integer");
  return *v;
}

std::string MemoryStore::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  KeyTable::Woken woken;
  std::string r;
  {
    std::lock_guard<std::mutex> g(mu_);
    r = table_.compareSet(key, expected, desired, woken);
  }
  changed_.notify_all();
  return r;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> g(mu_);
  return table_.check(keys);
}

void MemoryStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  waitLocked(lock, keys, timeout);
}

bool MemoryStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  return table_.erase(key);
}

int64_t MemoryStore::numKeys() {
  std::lock_guard<std::mutex> g(mu_);
  return table_.size();
}

std::vector<std::string> MemoryStore::multiGet(const std::vector<std::string>& keys) {
  std::unique_lock<std::mutex> lock(mu_);
  waitLocked(lock, keys, timeout());
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(*table_.get(k));
  return out;
}

void MemoryStore::multiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("memory store: multiSet with " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  }
  KeyTable::Woken woken;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < keys.size(); ++i) table_.set(keys[i], values[i], woken);
  }
  changed_.notify_all();
}

void MemoryStore::append(const std::string& key, const std::string& value) {
  KeyTable::Woken woken;
  {
    std::lock_guard<std::mutex> g(mu_);
    table_.append(key, value, woken);
  }
  changed_.notify_all();
}

}  // namespace ddprun::rendezvous
