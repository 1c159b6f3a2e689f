#pragma once
// GlooStoreAdapter: a ddprun Store seen through Gloo's rendezvous::Store interface, so that
// Gloo's full-mesh connection setup exchanges its addresses through the ddprun store.
#include <gloo/rendezvous/store.h>

#include "rendezvous/store.h"

namespace ddprun::runtime {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(rendezvous::Store& store) : store_(store) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::string(data.begin(), data.end()));
  }
  // Blocks until the key exists (bounded by the store's timeout), as Gloo expects.
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_.get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  rendezvous::Store& store_;
};

}  // namespace ddprun::runtime
