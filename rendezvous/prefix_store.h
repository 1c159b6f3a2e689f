#pragma once
// PrefixStore: a view of another store in which every key is `prefix + "/" + key`,
// exactly as c10d::PrefixStore joins them, so ddprun and PyTorch processes that use the
// same prefix see the same keys. Used to scope keys per job, per rendezvous round and
// per restart attempt. numKeys() counts the whole underlying store (as PyTorch's does).
#include <memory>

#include "rendezvous/store.h"

namespace ddprun::rendezvous {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::optional<std::string> waitGet(const std::string& key, Millis timeout) override {
    return inner_->waitGet(join(key), timeout);
  }
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;
  // Sets the inner store's per-call timeout too (it applies it).
  void setTimeout(Millis t) override;
  void giveUpWhenRefused() override { inner_->giveUpWhenRefused(); }
  bool hasTickets() const override { return inner_->hasTickets(); }
  int64_t takeTicket(const std::string& counter, const std::string& member) override {
    return inner_->takeTicket(join(counter), member);
  }
  int64_t ticketCount(const std::string& counter) override {
    return inner_->ticketCount(join(counter));
  }
  Ticket takeWeightedTicket(const std::string& counter, const std::string& member,
                            int64_t weight) override {
    return inner_->takeWeightedTicket(join(counter), member, weight);
  }
  void createAll(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  std::vector<std::optional<std::string>> readAll(const std::vector<std::string>& keys) override {
    return inner_->readAll(join(keys));
  }
  std::string compareSetAndSet(const std::string& key, const std::string& expected,
                               const std::string& desired, const std::vector<std::string>& keys,
                               const std::vector<std::string>& values) override {
    return inner_->compareSetAndSet(join(key), expected, desired, join(keys), values);
  }

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& inner() const { return inner_; }

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace ddprun::rendezvous
