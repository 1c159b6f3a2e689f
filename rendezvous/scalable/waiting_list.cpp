#include "rendezvous/scalable/waiting_list.h"

#include <string>
#include <vector>

#include "base/errors.h"
#include "base/log.h"
#include "rendezvous/state_log.h"

namespace ddprun::rendezvous::scalable {

namespace {

constexpr const char* kTooMany = "more than 1048576 waiting nodes";

[[noreturn]] void forgedCount(const std::string& key, int64_t v, const std::string& why) {
  throw StoreError("rendezvous key '" + key + "' counts " + std::to_string(v) +
                   ", which is corrupt or forged (" + why + ")");
}

}  // namespace

std::string waitingCountKey(int64_t round) { return "r/" + std::to_string(round) + "/waiting"; }
std::string waitingWrittenKey(int64_t round) {
  return "r/" + std::to_string(round) + "/waiting.written";
}

int64_t joinWaitingList(Store& store, int64_t round, const NodeInfo& self) {
  const std::string ck = waitingCountKey(round);
  const int64_t i = store.hasTickets() ? store.takeTicket(ck, self.id) : store.add(ck, 1);
  if (i < 1) forgedCount(ck, i, "an index below 1");
  if (i > kMaxWaiting) forgedCount(ck, i, kTooMany);
  const int64_t ref = waitingListRef(round);
  NodeInfo entry = self;
  entry.fixedRank = -1;
  entry.prevRank = -1;
  std::vector<std::string> keys{listKey(ref, i - 1), listIdKey(ref, self.id)};
  std::vector<std::string> values{encodeNodeLine(entry, RoundState::List::Waiting),
                                  std::to_string(i - 1) + " 0"};
  const std::string wk = waitingWrittenKey(round);
  if (store.hasTickets()) {
    // etcd: the entries and the written ticket in one txn that creates all or none (a ticket of
    // a counter is the key <counter>.t/<member>, valued the member: EtcdStore::takeTicket), so
    // the written count never counts an entry that is not there.
    keys.push_back(wk + ".t/" + std::to_string(i));
    values.push_back(std::to_string(i));
    store.createAll(keys, values);
    return i;
  }
  // ddprun-store's MULTI_SET is write-once for list keys (it refuses one already written).
  store.multiSet(keys, values);
  const int64_t w = store.add(wk, 1);
  if (w < 1) forgedCount(wk, w, "a written count below 1");
  return i;
}

int64_t readWaitingCount(Store& store, int64_t round) {
  const std::string ck = waitingCountKey(round), wk = waitingWrittenKey(round);
  // Nobody waits (the usual re-form): one round trip, and no counter created by an ADD of 0.
  if (!store.hasTickets() && !store.check({ck})) return 0;
  const int64_t written = store.hasTickets() ? store.ticketCount(wk) : store.add(wk, 0);
  const int64_t count = store.hasTickets() ? store.ticketCount(ck) : store.add(ck, 0);
  if (written < 0) forgedCount(wk, written, "a negative written count");
  if (count < written) forgedCount(ck, count, "fewer than written");
  if (count != written || count == 0) return 0;
  // Counters inflated in step vouch for nothing: a count above kMaxWaiting, or K whose entry K-1
  // was never written (its holder wrote its entries before it counted itself written, and K
  // holders counted). Such a K is ignored, said once in a warning naming the key and the value:
  // the waiting nodes, if any, re-join as newcomers (as when the counts disagree) instead of a
  // re-form expecting 2^40 nodes (which a loader would allocate) or nodes whose entries a ring
  // would WAIT for. One more round trip (the CHECK) when nodes wait.
  std::string why = kTooMany;
  if (count <= kMaxWaiting) {
    const std::string last = listKey(waitingListRef(round), count - 1);
    if (store.check({last})) return count;
    why = "its entry '" + last + "' was never written";
  }
  DDPRUN_LOG(WARN, "rendezvous") << "rendezvous key '" << ck << "' counts " << count
                                 << ", which is corrupt or forged (" << why
                                 << "): ignored, no waiting node is expected back";
  return 0;
}

}  // namespace ddprun::rendezvous::scalable
