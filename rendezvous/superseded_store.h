#pragma once
// SupersededStore: the store a generation's communicator is built over (in-process recovery,
// docs/recovery.md). It is the generation's PrefixStore, except that every blocking wait gives up
// once the agent has published a newer generation: a peer of this generation died before it
// wrote its keys (a replacement killed right after it started), so the keys waited for will never
// come. The wait then throws BackendError, which the elastic run answers by moving on to the
// newest generation, instead of waiting the whole collective timeout for a dead peer.
//
// A wait also gives up after `bound` (the runtime passes DDPRUN_RECOVERY_TIMEOUT) when that is
// shorter than the wait's own timeout (the collective timeout, 30 min by default): a peer that
// never comes while no newer generation is published (stuck, not dead) ends the set-up with a
// TimeoutError naming the keys and the bound, and the elastic run moves on to the next
// generation, or fails, within its own bound.
//
// Waits are cut into slices of kSlice; between two, one CHECK of the next generation's key in
// the attempt's store (the ddprun store cancels a timed-out WAIT cleanly). Everything else is
// passed through.
#include <algorithm>
#include <memory>

#include "base/errors.h"
#include "rendezvous/recovery_keys.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

class SupersededStore final : public Store {
 public:
  static constexpr Millis kSlice{200};

  // `inner`: generation `generation`'s keys; `attempt`: where the agent publishes generations;
  // `bound`: the longest any wait lasts.
  SupersededStore(std::shared_ptr<Store> inner, std::shared_ptr<Store> attempt, int generation,
                  Millis bound = Millis::max())
      : Store(inner->timeout()),
        inner_(std::move(inner)),
        attempt_(std::move(attempt)),
        generation_(generation),
        bound_(bound) {}

  void set(const std::string& key, const std::string& value) override { inner_->set(key, value); }
  std::string get(const std::string& key) override {
    wait({key}, timeout());
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override {
    return inner_->compareSet(key, expected, desired);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    const bool bounded = bound_ < timeout;
    const auto deadline = Clock::now() + std::min(timeout, bound_);
    for (;;) {
      const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
      try {
        inner_->wait(keys, std::clamp(left, Millis(1), kSlice));
        return;
      } catch (const TimeoutError&) {
        if (attempt_->check({recovery::generationKey(generation_ + 1)})) {
          throw BackendError("generation " + std::to_string(generation_ + 1) +
                             " was published while this rank set up generation " +
                             std::to_string(generation_) + "'s communicator (a peer of it died "
                             "before it joined): moving on to the newest");
        }
        if (Clock::now() < deadline) continue;
        if (!bounded) throw;
        throw TimeoutError("generation " + std::to_string(generation_) + "'s set-up waited " +
                           std::to_string(bound_.count() / 1000.0).substr(0, 5) +
                           " s (DDPRUN_RECOVERY_TIMEOUT) for " +
                           (keys.size() == 1 ? "key " : "keys ") + quoteKeys(keys) +
                           ", and no newer generation was published: a peer of this generation "
                           "is alive but not joining it");
      }
    }
  }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  int64_t numKeys() override { return inner_->numKeys(); }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    wait(keys, timeout());
    return inner_->multiGet(keys);
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override {
    inner_->multiSet(keys, values);
  }
  void append(const std::string& key, const std::string& value) override {
    inner_->append(key, value);
  }
  void setTimeout(Millis t) override {
    Store::setTimeout(t);
    inner_->setTimeout(t);
  }
  void giveUpWhenRefused() override { inner_->giveUpWhenRefused(); }

 private:
  std::shared_ptr<Store> inner_;
  std::shared_ptr<Store> attempt_;
  int generation_;
  Millis bound_;
};

}  // namespace ddprun::rendezvous
