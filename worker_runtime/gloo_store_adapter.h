#pragma once
// GlooStoreAdapter: a ddprun Store seen through Gloo's rendezvous::Store interface, so that
// Gloo's full-mesh connection setup exchanges its addresses through the ddprun store.
#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace ddprun::runtime {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  // `rank` of `size` (size 0: every call passes through): see wait(). `waitTimeout`: the bound
  // of every wait, whatever Gloo passes (zero: Gloo's). Gloo passes its context's timeout, which
  // the communicator sets to the pairs' connect bound (a fifth of its set-up bound), not to how
  // long a peer may take to publish its addresses.
  explicit GlooStoreAdapter(rendezvous::Store& store, int rank = 0, int size = 0,
                            std::chrono::milliseconds waitTimeout = {})
      : store_(store), rank_(rank), size_(size), waitTimeout_(waitTimeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::string(data.begin(), data.end()));
  }
  // Blocks until the key exists (bounded by the store's timeout), as Gloo expects.
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_.get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_.timeout()); }
  // Gloo's connectFullMesh writes this rank's pair addresses under "<rank>", then for each peer i
  // in turn waits for "<i>" and connects the pair, and a pair's connect waits for the peer over
  // TCP with Gloo's own timeout (the collective timeout), which no store sees. A peer that gave
  // up a superseded generation's set-up (rendezvous/superseded_store.h) after writing its
  // addresses, and before connecting this rank's pair, left this rank there until that timeout.
  // So the first wait for a peer's addresses waits for every peer's at once: no pair is
  // connected before every rank has written its addresses, and a rank gives up only in a store
  // wait, before all of them are there (a rank of the generation that never came, or died).
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& glooTimeout) override {
    const auto timeout = waitTimeout_.count() > 0 ? waitTimeout_ : glooTimeout;
    if (size_ > 1 && !allAddressesSeen_ && keys.size() == 1 && isPeer(keys[0])) {
      std::vector<std::string> all;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) all.push_back(std::to_string(r));
      }
      store_.wait(all, timeout);
      allAddressesSeen_ = true;
      return;
    }
    store_.wait(keys, timeout);
  }

 private:
  // Whether `key` is a peer's address key ("<i>", i != rank, i < size).
  bool isPeer(const std::string& key) const {
    if (key.empty() || key.size() > 9 || key.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    const int r = std::stoi(key);
    return r != rank_ && r < size_ && std::to_string(r) == key;
  }

  rendezvous::Store& store_;
  int rank_;
  int size_;
  std::chrono::milliseconds waitTimeout_;
  bool allAddressesSeen_ = false;
};

}  // namespace ddprun::runtime
