#include "rendezvous/prefix_store.h"

#include "base/errors.h"

namespace ddprun::rendezvous {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : Store(inner ? inner->timeout() : kDefaultStoreTimeout),
      prefix_(std::move(prefix)),
      inner_(std::move(inner)) {
  DDPRUN_CHECK(inner_ != nullptr, "PrefixStore needs an inner store");
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(join(k));
  return out;
}

// The inner store applies its own timeout; keep it in step with ours.
void PrefixStore::set(const std::string& key, const std::string& value) {
  inner_->set(join(key), value);
}
std::string PrefixStore::get(const std::string& key) {
  inner_->setTimeout(timeout());
  return inner_->get(join(key));
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(join(key), delta);
}
std::string PrefixStore::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  return inner_->compareSet(join(key), expected, desired);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(join(keys)); }
void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  inner_->wait(join(keys), timeout);
}
bool PrefixStore::deleteKey(const std::string& key) { return inner_->deleteKey(join(key)); }
int64_t PrefixStore::numKeys() { return inner_->numKeys(); }
std::vector<std::string> PrefixStore::multiGet(const std::vector<std::string>& keys) {
  inner_->setTimeout(timeout());
  return inner_->multiGet(join(keys));
}
void PrefixStore::multiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  inner_->multiSet(join(keys), values);
}
void PrefixStore::createAll(const std::vector<std::string>& keys,
                            const std::vector<std::string>& values) {
  inner_->createAll(join(keys), values);
}
void PrefixStore::setTimeout(Millis t) {
  Store::setTimeout(t);
  inner_->setTimeout(t);
}
void PrefixStore::append(const std::string& key, const std::string& value) {
  inner_->append(join(key), value);
}

}  // namespace ddprun::rendezvous
