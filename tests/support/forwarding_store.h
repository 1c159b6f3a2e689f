#pragma once
// ForwardingStore: a Store that passes every call to another, for tests that change one call
// of a real store (a forged read, a write held at a gate) and leave the rest as they are. A test
// derives from it and overrides that call alone; inner() is the store underneath.
//
// Every virtual of rendezvous::Store is forwarded, the optional ones too (waitGet, tickets,
// createAll, readAll, compareSetAndSet, setTimeout, giveUpWhenRefused): a wrapped store offers
// exactly what the store underneath offers, in as many round trips, so the code under test takes
// the path it takes on the real store.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/store.h"

namespace ddprun::testing {

class ForwardingStore : public rendezvous::Store {
 public:
  using Millis = rendezvous::Millis;

  explicit ForwardingStore(std::shared_ptr<rendezvous::Store> inner)
      : Store(inner->timeout()), inner_(std::move(inner)) {}

  void set(const std::string& k, const std::string& v) override { inner_->set(k, v); }
  std::string get(const std::string& k) override { return inner_->get(k); }
  int64_t add(const std::string& k, int64_t d) override { return inner_->add(k, d); }
  std::string compareSet(const std::string& k, const std::string& e,
                         const std::string& d) override {
    return inner_->compareSet(k, e, d);
  }
  bool check(const std::vector<std::string>& k) override { return inner_->check(k); }
  void wait(const std::vector<std::string>& k, Millis t) override { inner_->wait(k, t); }
  std::optional<std::string> waitGet(const std::string& k, Millis t) override {
    return inner_->waitGet(k, t);
  }
  bool deleteKey(const std::string& k) override { return inner_->deleteKey(k); }
  int64_t numKeys() override { return inner_->numKeys(); }
  std::vector<std::string> multiGet(const std::vector<std::string>& k) override {
    return inner_->multiGet(k);
  }
  void multiSet(const std::vector<std::string>& k, const std::vector<std::string>& v) override {
    inner_->multiSet(k, v);
  }
  void append(const std::string& k, const std::string& v) override { inner_->append(k, v); }
  bool hasTickets() const override { return inner_->hasTickets(); }
  int64_t takeTicket(const std::string& c, const std::string& m) override {
    return inner_->takeTicket(c, m);
  }
  int64_t ticketCount(const std::string& c) override { return inner_->ticketCount(c); }
  Ticket takeWeightedTicket(const std::string& c, const std::string& m, int64_t w) override {
    return inner_->takeWeightedTicket(c, m, w);
  }
  void createAll(const std::vector<std::string>& k, const std::vector<std::string>& v) override {
    inner_->createAll(k, v);
  }
  std::vector<std::optional<std::string>> readAll(const std::vector<std::string>& k) override {
    return inner_->readAll(k);
  }
  std::string compareSetAndSet(const std::string& k, const std::string& e, const std::string& d,
                               const std::vector<std::string>& keys,
                               const std::vector<std::string>& values) override {
    return inner_->compareSetAndSet(k, e, d, keys, values);
  }
  void setTimeout(Millis t) override {
    Store::setTimeout(t);
    inner_->setTimeout(t);
  }
  void giveUpWhenRefused() override { inner_->giveUpWhenRefused(); }

 protected:
  rendezvous::Store& inner() { return *inner_; }

 private:
  std::shared_ptr<rendezvous::Store> inner_;
};

}  // namespace ddprun::testing
