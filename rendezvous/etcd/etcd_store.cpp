#include "rendezvous/etcd/etcd_store.h"

#include <algorithm>
#include <limits>

#include "base/errors.h"

namespace ddprun::rendezvous::etcd {

namespace {

std::string quoted(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "'" : ", '") + k + "'";
  return s;
}

RequestOp rangeOp(const std::string& key) { return RequestOp::rangeOf({.key = key}); }
RequestOp putOp(const std::string& key, const std::string& value) {
  return RequestOp::putOf({.key = key, .value = value});
}

// A compare-set's condition on `key`: absent (create_revision 0) when `expected` is empty, as
// c10d's compareSet means it, else holding `expected`.
Compare expecting(const std::string& key, const std::string& expected) {
  if (expected.empty()) return Compare{.key = key, .target = Compare::Target::Create, .number = 0};
  return Compare{.key = key, .target = Compare::Target::Value, .value = expected};
}

const KeyValue* firstKv(const TxnReply& r) {
  if (r.responses.empty() || r.responses[0].range.kvs.empty()) return nullptr;
  return &r.responses[0].range.kvs[0];
}

}  // namespace

EtcdStore::EtcdStore(EtcdClientOptions options, std::string prefix)
    : Store(options.timeout), client_(std::move(options)), prefix_(std::move(prefix)) {}

void EtcdStore::interrupt() {
  interrupted_ = true;
  cancelCall();
  client_.interrupt();
}

void EtcdStore::cancelCall() {
  client_.cancelCall();
  std::lock_guard<std::mutex> g(mu_);
  if (watch_) watch_->cancel();
}

void EtcdStore::set(const std::string& key, const std::string& value) {
  client_.put({.key = prefix_ + key, .value = value});
}

std::pair<std::vector<std::optional<std::string>>, int64_t> EtcdStore::read(
    const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> values(keys.size());
  if (keys.size() == 1) {
    RangeReply r = client_.range({.key = prefix_ + keys[0]});
    if (!r.kvs.empty()) values[0] = std::move(r.kvs[0].value);
    return {std::move(values), r.header.revision};
  }
  // One txn per kMaxTxnOps keys (etcd refuses more). The revision returned is the first txn's,
  // the oldest: a watch from it never misses a PUT of a key some later txn found missing.
  int64_t revision = 0;
  for (size_t from = 0; from < keys.size(); from += kMaxTxnOps) {
    const size_t to = std::min(keys.size(), from + kMaxTxnOps);
    TxnRequest t;  // no compare: the success branch always runs, at one revision
    for (size_t i = from; i < to; ++i) t.success.push_back(rangeOp(prefix_ + keys[i]));
    TxnReply r = client_.txn(t, true);
    if (from == 0) revision = r.header.revision;
    for (size_t i = from; i < to && i - from < r.responses.size(); ++i)
      if (!r.responses[i - from].range.kvs.empty())
        values[i] = std::move(r.responses[i - from].range.kvs[0].value);
  }
  return {std::move(values), revision};
}

void EtcdStore::watchFor(const std::string& key, int64_t revision, Clock::time_point deadline,
                         Millis timeout) {
  EtcdWatch watch(client_.options(), {.key = prefix_ + key, .startRevision = revision + 1});
  {
    std::lock_guard<std::mutex> g(mu_);
    if (interrupted_) throw NetworkError(describe() + ": interrupted");
    watch_ = &watch;
  }
  struct Clear {
    EtcdStore* s;
    ~Clear() {
      std::lock_guard<std::mutex> g(s->mu_);
      s->watch_ = nullptr;
    }
  } clear{this};
  for (;;) {
    std::vector<Event> events;
    try {
      events = watch.next(deadline);
    } catch (const CompactedError&) {
      return;  // history is gone: the caller reads the key again
    }
    for (const Event& e : events)
      if (e.type == Event::Type::Put) return;
    if (Clock::now() >= deadline) {
      throw TimeoutError(describe() + ": timed out after " + std::to_string(timeout.count()) +
                         " ms waiting for key '" + prefix_ + key + "'");
    }
  }
}

void EtcdStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto [values, revision] = read(keys);
    size_t missing = 0;
    while (missing < keys.size() && values[missing]) ++missing;
    if (missing == keys.size()) return;
    if (Clock::now() >= deadline) {
      throw TimeoutError(describe() + ": timed out after " + std::to_string(timeout.count()) +
                         " ms waiting for " + quoted(keys) + " under '" + prefix_ + "'");
    }
    watchFor(keys[missing], revision, deadline, timeout);
  }
}

std::string EtcdStore::get(const std::string& key) {
  const auto deadline = Clock::now() + timeout();
  for (;;) {
    auto [values, revision] = read({key});
    if (values[0]) return std::move(*values[0]);
    watchFor(key, revision, deadline, timeout());
  }
}

std::vector<std::string> EtcdStore::multiGet(const std::vector<std::string>& keys) {
  const auto deadline = Clock::now() + timeout();
  for (;;) {
    auto [values, revision] = read(keys);
    size_t missing = 0;
    while (missing < keys.size() && values[missing]) ++missing;
    if (missing == keys.size()) {
      std::vector<std::string> out;
      for (auto& v : values) out.push_back(std::move(*v));
      return out;
    }
    watchFor(keys[missing], revision, deadline, timeout());
  }
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  auto [values, revision] = read(keys);
  for (const auto& v : values)
    if (!v) return false;
  return true;
}

void EtcdStore::multiSet(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw StoreError(describe() + ": multiSet with " + std::to_string(keys.size()) +
                     " keys but " + std::to_string(values.size()) + " values");
  }
  for (size_t from = 0; from < keys.size(); from += kMaxTxnOps) {
    TxnRequest t;
    for (size_t i = from; i < std::min(keys.size(), from + kMaxTxnOps); ++i)
      t.success.push_back(putOp(prefix_ + keys[i], values[i]));
    client_.txn(t, true);
  }
}

bool EtcdStore::deleteKey(const std::string& key) {
  return client_.deleteRange({.key = prefix_ + key}).deleted > 0;
}

int64_t EtcdStore::numKeys() {
  return client_.range({.key = prefix_, .rangeEnd = prefixEnd(prefix_), .countOnly = true}).count;
}

std::string EtcdStore::compareSet(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  const std::string k = prefix_ + key;
  const Compare first = expecting(k, expected);
  Compare cmp = first;
  for (;;) {
    TxnRequest t{.compare = {cmp}, .success = {putOp(k, desired)}, .failure = {rangeOp(k)}};
    // Idempotent: applied twice, the second finds `desired` and returns it, as the first did.
    TxnReply r = client_.txn(t, true);
    if (r.succeeded) return desired;
    const KeyValue* kv = firstKv(r);
    if (!kv) {
      if (!expected.empty()) return expected;  // c10d's quirk: missing key, non-empty expectation
      cmp = first;                             // deleted meanwhile: try to create it again
      continue;
    }
    if (!expected.empty() || !kv->value.empty()) return kv->value;
    // The key exists with the value "" and we expected "": swap it, on its mod revision.
    cmp = Compare{.key = k, .target = Compare::Target::Mod, .number = kv->modRevision};
  }
}

// A ticket of `counter` is the key `<counter>.t/<member>` (value: the member). Its number is
// the count of ticket keys created before it plus one, read in the txn that creates it: one
// request, O(1) bytes back, whatever the number of members taking one at the same moment (etcd
// serializes the txns; none retries). Tickets are never deleted while the job runs, so the
// numbers are dense and unique.
int64_t EtcdStore::takeTicket(const std::string& counter, const std::string& member) {
  const std::string dir = prefix_ + counter + ".t/", k = dir + member;
  if (member.empty()) throw StoreError(describe() + ": a ticket of '" + dir + "' for no member");
  const RequestOp countBefore =
      RequestOp::rangeOf({.key = dir, .rangeEnd = prefixEnd(dir), .countOnly = true});
  TxnRequest t{.compare = {Compare{.key = k, .target = Compare::Target::Create, .number = 0}},
               .success = {countBefore, putOp(k, member)},
               .failure = {rangeOp(k)}};
  // Idempotent: applied twice, the second application takes the failure branch, below.
  TxnReply r = client_.txn(t, true);
  if (r.succeeded) {
    if (r.responses.empty()) throw StoreError(describe() + ": no count in the reply for '" + k + "'");
    return r.responses[0].range.count + 1;
  }
  const KeyValue* kv = firstKv(r);
  if (!kv || kv->value != member) {
    throw StoreError("rendezvous key '" + k + "' holds '" + (kv ? kv->value.substr(0, 200) : "") +
                     "', which is corrupt or forged (not this member's ticket)");
  }
  // Taken before (a retried request, rare): its number is the count of tickets created up to its
  // own (O(number) bytes, on this path only).
  return countCreatedUpTo(dir, kv->createRevision);
}

// The keys under `dir` created at or before `revision`: the keys themselves, as etcd does not
// apply max_create_revision to a count.
int64_t EtcdStore::countCreatedUpTo(const std::string& dir, int64_t revision) {
  const RangeReply upTo = client_.range({.key = dir, .rangeEnd = prefixEnd(dir), .keysOnly = true,
                                         .maxCreateRevision = revision});
  return static_cast<int64_t>(std::count_if(upTo.kvs.begin(), upTo.kvs.end(), [&](const KeyValue& t) {
    return t.createRevision <= revision;
  }));
}

namespace {
// A weighted ticket's weight is kept in binary: bit b set puts a key under `<counter>.w<b>/`, so
// that the weights of the tickets before it are sum(2^b * count of keys under .w<b>/), 17 counts
// read in the txn that takes it (etcd sums nothing, it counts).
constexpr int kWeightBits = 17;  // weights 1..2^16
std::string weightDir(const std::string& counterKey, int bit) {
  return counterKey + ".w" + std::to_string(bit) + "/";
}
}  // namespace

// One txn, as takeTicket: if `<counter>.t/<member>` is absent, count the tickets and each weight
// bit's keys, and create the ticket and its weight's keys. O(1) bytes back and no retry however
// many take one at once; the weight keys are never deleted while the job runs, as the tickets.
Store::Ticket EtcdStore::takeWeightedTicket(const std::string& counter, const std::string& member,
                                            int64_t weight) {
  const std::string ck = prefix_ + counter, dir = ck + ".t/", k = dir + member;
  if (member.empty()) throw StoreError(describe() + ": a ticket of '" + dir + "' for no member");
  if (weight < 1 || weight > kMaxTicketWeight) {
    throw StoreError(describe() + ": a ticket of '" + dir + "' weighing " + std::to_string(weight) +
                     " (1.." + std::to_string(kMaxTicketWeight) + ")");
  }
  TxnRequest t{.compare = {Compare{.key = k, .target = Compare::Target::Create, .number = 0}},
               .success = {RequestOp::rangeOf({.key = dir, .rangeEnd = prefixEnd(dir),
                                               .countOnly = true})},
               .failure = {rangeOp(k)}};
  for (int b = 0; b < kWeightBits; ++b) {
    const std::string wd = weightDir(ck, b);
    t.success.push_back(RequestOp::rangeOf({.key = wd, .rangeEnd = prefixEnd(wd), .countOnly = true}));
  }
  t.success.push_back(putOp(k, member));
  for (int b = 0; b < kWeightBits; ++b) {
    if (weight & (int64_t{1} << b)) t.success.push_back(putOp(weightDir(ck, b) + member, member));
  }
  TxnReply r = client_.txn(t, true);  // idempotent, as takeTicket's
  if (r.succeeded) {
    if (r.responses.size() < 1 + kWeightBits) {
      throw StoreError(describe() + ": no counts in the reply for '" + k + "'");
    }
    Ticket got{.number = r.responses[0].range.count + 1, .weightThrough = weight};
    for (int b = 0; b < kWeightBits; ++b)
      got.weightThrough += (int64_t{1} << b) * r.responses[1 + b].range.count;
    return got;
  }
  const KeyValue* kv = firstKv(r);
  if (!kv || kv->value != member) {
    throw StoreError("rendezvous key '" + k + "' holds '" + (kv ? kv->value.substr(0, 200) : "") +
                     "', which is corrupt or forged (not this member's ticket)");
  }
  // Taken before (a retried request, rare): the counts up to its own creation (O(number) bytes).
  Ticket got{.number = countCreatedUpTo(dir, kv->createRevision)};
  for (int b = 0; b < kWeightBits; ++b)
    got.weightThrough += (int64_t{1} << b) * countCreatedUpTo(weightDir(ck, b), kv->createRevision);
  return got;
}

// One txn: every key absent (create_revision 0) -> put them all; else read them, and a key
// holding another value is a forgery (or another writer's).
void EtcdStore::createAll(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) {
  if (keys.size() != values.size() || keys.empty() || keys.size() > kMaxTxnOps) {
    throw StoreError(describe() + ": createAll with " + std::to_string(keys.size()) + " keys and " +
                     std::to_string(values.size()) + " values (1.." + std::to_string(kMaxTxnOps) +
                     " keys, as many values)");
  }
  TxnRequest t;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string k = prefix_ + keys[i];
    t.compare.push_back(Compare{.key = k, .target = Compare::Target::Create, .number = 0});
    t.success.push_back(putOp(k, values[i]));
    t.failure.push_back(rangeOp(k));
  }
  const TxnReply r = client_.txn(t, true);  // idempotent: applied twice, the values match
  if (r.succeeded) return;
  for (size_t i = 0; i < keys.size() && i < r.responses.size(); ++i) {
    const auto& kvs = r.responses[i].range.kvs;
    if (!kvs.empty() && kvs.front().value != values[i]) {
      throw StoreError("rendezvous key '" + prefix_ + keys[i] + "' holds '" +
                       kvs.front().value.substr(0, 200) + "', written before: it is corrupt or forged");
    }
  }
  // Some exist with our values (a retried request), others may not: create the missing ones.
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i < r.responses.size() && !r.responses[i].range.kvs.empty()) continue;
    const std::string got = compareSet(keys[i], "", values[i]);
    if (got != values[i]) {
      throw StoreError("rendezvous key '" + prefix_ + keys[i] + "' holds '" + got.substr(0, 200) +
                       "', written before: it is corrupt or forged");
    }
  }
}

std::vector<std::optional<std::string>> EtcdStore::readAll(const std::vector<std::string>& keys) {
  if (keys.empty()) return {};
  return read(keys).first;
}

// compareSet's txn with the other puts in its success branch: the state log's version and its
// markers in one request (etcd applies a txn whole). The rare cases compareSet settles in a second
// txn (the key deleted meanwhile, or holding "" where "" was expected) take the general path.
std::string EtcdStore::compareSetAndSet(const std::string& key, const std::string& expected,
                                        const std::string& desired,
                                        const std::vector<std::string>& keys,
                                        const std::vector<std::string>& values) {
  if (keys.size() != values.size() || keys.size() + 1 > kMaxTxnOps) {
    return Store::compareSetAndSet(key, expected, desired, keys, values);
  }
  const std::string k = prefix_ + key;
  TxnRequest t{.compare = {expecting(k, expected)}, .success = {putOp(k, desired)}, .failure = {rangeOp(k)}};
  for (size_t i = 0; i < keys.size(); ++i) t.success.push_back(putOp(prefix_ + keys[i], values[i]));
  // Idempotent: applied twice, the second finds `desired` (and the keys set by the first).
  const TxnReply r = client_.txn(t, true);
  if (r.succeeded) return desired;
  const KeyValue* kv = firstKv(r);
  if (kv && (!expected.empty() || !kv->value.empty())) return kv->value;
  if (!kv && !expected.empty()) return expected;  // c10d's quirk, as compareSet
  return Store::compareSetAndSet(key, expected, desired, keys, values);
}

int64_t EtcdStore::ticketCount(const std::string& counter) {
  const std::string dir = prefix_ + counter + ".t/";
  return client_.range({.key = dir, .rangeEnd = prefixEnd(dir), .countOnly = true}).count;
}

std::string EtcdStore::readModifyWrite(const std::string& key, const char* op, const Update& fn) {
  const std::string k = prefix_ + key;
  std::optional<KeyValue> known;  // nullopt: we believe the key is absent
  for (;;) {
    const std::string next = fn(known ? std::optional<std::string>(known->value) : std::nullopt);
    Compare cmp{.key = k, .target = known ? Compare::Target::Mod : Compare::Target::Create,
                .number = known ? known->modRevision : 0};
    TxnRequest t{.compare = {cmp}, .success = {putOp(k, next)}, .failure = {rangeOp(k)}};
    TxnReply r;
    try {
      r = client_.txn(t, false);
    } catch (const AmbiguousError& e) {
      // Applied or not? Unchanged since our read means not: then it is safe to try again.
      RangeReply now = client_.range({.key = k});
      const bool unchanged = now.kvs.empty() ? !known
                                             : known && now.kvs[0].modRevision == known->modRevision;
      if (unchanged) continue;
      throw StoreError(describe() + ": " + op + " on key '" + k + "': " + e.what() +
                       "; the key has changed since, so whether it was applied cannot be told");
    }
    if (r.succeeded) return next;
    const KeyValue* kv = firstKv(r);
    known = kv ? std::optional<KeyValue>(*kv) : std::nullopt;
  }
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  readModifyWrite(key, "ADD", [&](const std::optional<std::string>& cur) {
    int64_t v = 0;
    if (cur) {
      size_t used = 0;
      try {
        v = std::stoll(*cur, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (cur->empty() || used != cur->size()) {
        throw StoreError(describe() + ": ADD on key '" + prefix_ + key +
                         "' whose value is not an integer");
      }
    }
    if ((delta > 0 && v > std::numeric_limits<int64_t>::max() - delta) ||
        (delta < 0 && v < std::numeric_limits<int64_t>::min() - delta)) {
      throw StoreError(describe() + ": ADD on key '" + prefix_ + key + "' overflows");
    }
    result = v + delta;
    return std::to_string(result);
  });
  return result;
}

void EtcdStore::append(const std::string& key, const std::string& value) {
  readModifyWrite(key, "APPEND", [&](const std::optional<std::string>& cur) {
    return cur ? *cur + value : value;
  });
}

}  // namespace ddprun::rendezvous::etcd
