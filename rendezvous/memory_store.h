#pragma once
// MemoryStore: an in-process Store over a KeyTable, safe to share between threads.
// Unit tests run N "ranks" as threads on one MemoryStore (no sockets involved).
#include <condition_variable>
#include <mutex>

#include "rendezvous/key_table.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(Millis timeout = kDefaultStoreTimeout) : Store(timeout) {}

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;

 private:
  // Waits with the lock held until all keys exist; throws TimeoutError naming them.
  void waitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                  Millis timeout);

  std::mutex mu_;
  std::condition_variable changed_;
  KeyTable table_;
};

}  // namespace ddprun::rendezvous
