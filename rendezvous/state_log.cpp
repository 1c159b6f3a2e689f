#include "rendezvous/state_log.h"

#include <algorithm>
#include <set>

#include "base/errors.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/scalable/waiting_list.h"
#include "rendezvous/text_fields.h"

namespace ddprun::rendezvous {

std::string stateKey(int64_t version) { return "state/" + std::to_string(version); }

std::string listKey(int64_t ref, int64_t i) {
  return "l/" + std::to_string(ref) + "/" + std::to_string(i);
}
std::string listIdKey(int64_t ref, const std::string& id) {
  return "l/" + std::to_string(ref) + "/id/" + id;
}

namespace {
int64_t parseVersion(const std::string& value, const std::string& key) {
  try {
    size_t used = 0;
    int64_t v = std::stoll(value, &used);
    if (used == value.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw StoreError("rendezvous key '" + key + "' holds '" + value +
                   "', not a state version: is another program using this rendezvous id?");
}

constexpr const char* kListsCounter = "lists";
// The value no list key holds: a compare-set expecting it reads a key without waiting for it
// and never writes (a missing key returns the expectation; an existing one its value).
constexpr const char* kAbsent = "?";

std::optional<std::string> tryGet(Store& store, const std::string& key) {
  std::string v = store.compareSet(key, kAbsent, kAbsent);
  if (v == kAbsent) return std::nullopt;
  return v;
}

[[noreturn]] void forgedList(const std::string& key, const std::string& why) {
  throw StoreError("rendezvous list key '" + key + "' is corrupt or forged (" + why +
                   "): is another program writing to this rendezvous id?");
}

}  // namespace

std::optional<std::string> tryGetKey(Store& store, const std::string& key) {
  return tryGet(store, key);
}

ListCache::List& ListCache::of(int64_t ref) {
  for (auto& l : lists_)
    if (l.ref == ref) return l;
  if (lists_.size() >= kLists) lists_.pop_front();
  lists_.push_back(List{.ref = ref});
  return lists_.back();
}

void ListCache::notePosition(int64_t ref, const std::string& id, ListPosition p) {
  std::lock_guard<std::mutex> g(mu_);
  List& l = of(ref);
  if (l.positions.size() >= kEntries) l.positions.clear();
  l.positions[id] = p;
}

std::optional<ListPosition> ListCache::position(int64_t ref, const std::string& id) {
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& l : lists_) {
    if (l.ref != ref) continue;
    const auto it = l.positions.find(id);
    if (it != l.positions.end()) return it->second;
  }
  return std::nullopt;
}

void ListCache::noteEntry(int64_t ref, int64_t i, const std::string& id) {
  std::lock_guard<std::mutex> g(mu_);
  List& l = of(ref);
  if (l.entries.size() >= kEntries) l.entries.clear();
  l.entries[i] = id;
}

std::optional<std::string> ListCache::entry(int64_t ref, int64_t i) {
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& l : lists_) {
    if (l.ref != ref) continue;
    const auto it = l.entries.find(i);
    if (it != l.entries.end()) return it->second;
  }
  return std::nullopt;
}

// Entry `id`'s "<index> <first global rank>" in list `ref` (its id key): one round trip, none
// when `cache` knows it (it notes the one read). nullopt when the list has no such key.
static std::optional<ListPosition> idPosition(Store& store, int64_t ref, const std::string& id,
                                              ListCache* cache) {
  if (cache) {
    if (auto known = cache->position(ref, id)) return known;
  }
  const std::string key = listIdKey(ref, id);
  const auto v = tryGet(store, key);
  if (!v) return std::nullopt;
  ListPosition p;
  const auto w = text::words(*v);
  if (w.size() != 2 || !text::number(w[0], p.index) || !text::number(w[1], p.rankOffset) ||
      p.index < 0 || p.rankOffset < 0) {
    forgedList(key, "'" + v->substr(0, 80) + "'");
  }
  if (cache) cache->notePosition(ref, id, p);
  return p;
}

std::optional<ListPosition> position(Store& store, const RoundState& s, RoundState::List which,
                                     const std::string& id, ListCache* cache) {
  const bool members = which == RoundState::List::Members;
  const ListRef& ref = s.listRef(which);
  if (ref.ref == 0) {
    const auto& list = s.list(which);
    ListPosition p;
    for (const auto& n : list) {
      if (n.id == id) return p;
      ++p.index;
      p.rankOffset += n.nproc;
    }
    return std::nullopt;
  }
  if (id == ref.without) return std::nullopt;  // the member an expected list leaves out
  if (!ref.with.empty() && id == ref.with) return ListPosition{.index = ref.stored()};
  const std::string key = listIdKey(ref.ref, id);
  if (ref.waiting > 0 && cache) {
    // A waiting node knows its own entry (it wrote it): no read, and none of the member list.
    if (const auto w = cache->position(waitingListRef(s.round - 1), id)) {
      if (w->index >= ref.waiting) return std::nullopt;  // registered too late for the count
      return ListPosition{.index = ref.stored() + (ref.with.empty() ? 0 : 1) + w->index};
    }
  }
  std::optional<ListPosition> known = idPosition(store, ref.ref, id, cache);
  // A joiners' list (kJoinerListBase) holds the id keys of joiners too late for its count.
  if (known && ref.ref >= kJoinerListBase &&
      (known->index >= ref.stored() || (members && known->rankOffset >= s.worldSize))) {
    known.reset();
  }
  if (!known && ref.waiting > 0) {
    // Not a member of the round before: one of its waiting nodes that round r+1 expects after
    // them (ListRef::waiting)? Their list is written by its own nodes: an index beyond the
    // count names a node that registered too late for it.
    const auto w = idPosition(store, waitingListRef(s.round - 1), id, cache);
    if (!w || w->index >= ref.waiting) return std::nullopt;
    return ListPosition{.index = ref.stored() + (ref.with.empty() ? 0 : 1) + w->index};
  }
  if (!known) return std::nullopt;
  const ListPosition p = *known;
  const bool beyond = p.index >= ref.stored() || (members && p.rankOffset >= s.worldSize);
  if (beyond) {
    forgedList(key, "'" + std::to_string(p.index) + " " + std::to_string(p.rankOffset) + "'");
  }
  return p;
}

std::string ringTarget(Store& store, const RoundState& s, const std::string& self,
                       ListCache* cache) {
  const RoundState::List which =
      s.phase != Phase::Joining ? RoundState::List::Members : RoundState::List::Expected;
  // A closed round's members lost in process (JobLimits::keepRoundOnNodeLoss) stay in its list
  // but are watched no more: the ring goes on to the next member that is not lost.
  auto lost = [&](const std::string& id) {
    return which == RoundState::List::Members &&
           std::find(s.lost.begin(), s.lost.end(), id) != s.lost.end();
  };
  const ListRef& ref = s.listRef(which);
  if (ref.ref == 0) {
    if (s.phase == Phase::Joining && !s.members.empty()) {
      // The state-log join (members append themselves): the ids the state mentions, sorted.
      const std::vector<std::string> ids = s.allIds();
      if (!std::binary_search(ids.begin(), ids.end(), self)) return {};
      return ringSuccessor(ids, self);
    }
    // A loaded state of the slot join: the same ring as on its compact form (list order), so
    // that the agent that wrote it and those that read it agree on who watches whom.
    const auto& list = s.list(which);
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].id != self) continue;
      if (lost(self)) return {};
      for (size_t k = 1; k < list.size(); ++k) {
        const std::string& next = list[(i + k) % list.size()].id;
        if (!lost(next)) return next;
      }
      return {};
    }
    return {};
  }
  if (ref.count < 2 || lost(self)) return {};
  const auto p = position(store, s, which, self, cache);
  if (!p) return {};
  // At most lost.size() + 2 reads: the lost members are few (and `without` is one). A
  // newcomer (`with`) is last in the ring, after the stored entries.
  // The round before's waiting nodes (ListRef::waiting) follow, entries of their own list.
  const int64_t ring = ref.stored() + (ref.with.empty() ? 0 : 1) + ref.waiting;
  const int64_t firstWaiting = ring - ref.waiting;
  for (int64_t k = 1; k < ring; ++k) {
    const int64_t i = (p->index + k) % ring;
    if (i == ref.stored() && !ref.with.empty()) return ref.with;
    const bool waiting = i >= firstWaiting;
    const int64_t list = waiting ? waitingListRef(s.round - 1) : ref.ref;
    const int64_t at = waiting ? i - firstWaiting : i;
    std::optional<std::string> id = cache ? cache->entry(list, at) : std::nullopt;
    if (!id) {
      const std::string key = listKey(list, at);
      const auto nodes = decodeNodeLines({store.get(key)},
                                         waiting          ? RoundState::List::Waiting
                                         : ref.ofMembers ? RoundState::List::Members
                                                         : which,
                                         "'" + key + "'");
      id = nodes.at(0).id;
      if (cache) cache->noteEntry(list, at, *id);
    }
    if (!lost(*id) && *id != ref.without) return *id;
  }
  return {};
}

void StateLog::hydrate(RoundState& s) {
  using L = RoundState::List;
  for (const L which : {L::Members, L::Waiting, L::Expected}) {
    const bool members = which == L::Members;
    ListRef& ref = s.listRef(which);
    if (ref.ref == 0) continue;
    std::vector<std::string> keys;
    keys.reserve(ref.stored());
    for (int64_t i = 0; i < ref.stored(); ++i) keys.push_back(listKey(ref.ref, i));
    // A version names only lists written before it: a missing entry is a forgery, and waiting
    // for it would hold the agent for the store's timeout.
    if (!store_.check(keys)) forgedList(keys.back(), "a version names entries never written");
    const std::string what = "'l/" + std::to_string(ref.ref) + "'";
    auto nodes = decodeNodeLines(store_.multiGet(keys),
                                 ref.ofMembers ? L::Members : which, what);
    if (ref.ofMembers) {  // the member list of the round before: each expected with its rank
      std::vector<NodeInfo> expected;
      for (size_t i = 0; i < nodes.size(); ++i)
        if (nodes[i].id != ref.without)
          expected.push_back(NodeInfo{.id = nodes[i].id, .prevRank = static_cast<int>(i)});
      if (!ref.with.empty()) {
        for (const auto& e : expected)
          if (e.id == ref.with) forgedList(keys.front(), "the newcomer it adds is a member");
        expected.push_back(NodeInfo{.id = ref.with, .prevRank = -1});
      }
      if (ref.waiting > 0) {  // and the round before's waiting nodes (scalable/waiting_list.h)
        const int64_t w = waitingListRef(s.round - 1);
        std::vector<std::string> waitingKeys;
        for (int64_t i = 0; i < ref.waiting; ++i) waitingKeys.push_back(listKey(w, i));
        if (!store_.check(waitingKeys))
          forgedList(waitingKeys.back(), "a version names waiting entries never written");
        std::set<std::string> ids;
        for (const auto& e : expected) ids.insert(e.id);
        for (const auto& n : decodeNodeLines(store_.multiGet(waitingKeys), L::Waiting,
                                             "'l/" + std::to_string(w) + "'")) {
          if (!ids.insert(n.id).second)
            forgedList(listIdKey(w, n.id), "a node both expected and waiting, or waiting twice");
          expected.push_back(NodeInfo{.id = n.id, .prevRank = -1});
        }
      }
      if (static_cast<int64_t>(expected.size()) != ref.count)
        forgedList(keys.front(), "the member it leaves out is not in it once");
      nodes = std::move(expected);
    }
    if (members) {
      int64_t world = 0;
      for (const auto& n : nodes) world += n.nproc;
      if (world != s.worldSize || nodes.empty() || nodes[0].addr != s.masterAddr ||
          nodes[0].masterPort != s.masterPort) {
        forgedList(keys.front(), "its world size or master does not match the version's");
      }
      s.members = std::move(nodes);
      s.worldSize = 0;
      s.masterAddr.clear();
      s.masterPort = 0;
    } else {
      s.list(which) = std::move(nodes);
    }
    ref = {};
  }
  if (s.allDone) {  // done-all: every member not lost (RoundState::allDone)
    for (const auto& m : s.members)
      if (std::find(s.lost.begin(), s.lost.end(), m.id) == s.lost.end()) s.done.push_back(m.id);
    s.allDone = false;
  }
  validateState(s, limits_, "with its lists");
}

void StateLog::spill(RoundState& next, const RoundState& beforeFull,
                     const RoundState& beforeCompact) {
  using L = RoundState::List;
  // A finished job names no done id (RoundState::allDone) when every member is done or lost:
  // every agent reads the final version, which would otherwise carry every member's id, O(N)
  // bytes for each of N agents.
  bool allDone = next.phase == Phase::Finished && !next.done.empty() && !next.members.empty();
  if (allDone) {
    std::set<std::string> ended(next.done.begin(), next.done.end());
    ended.insert(next.lost.begin(), next.lost.end());
    for (const auto& m : next.members) allDone = allDone && ended.count(m.id) > 0;
  }
  for (const L which : {L::Members, L::Waiting, L::Expected}) {
    const bool members = which == L::Members;
    auto& list = next.list(which);
    if (list.empty()) continue;
    ListRef& ref = next.listRef(which);
    const ListRef& old = beforeCompact.listRef(which);
    if (old.ref != 0 && list == beforeFull.list(which)) {
      ref = old;  // unchanged: the entries are in the store already
    } else if (which == L::Expected && beforeCompact.membersList.ref != 0 &&
               list.size() == beforeFull.members.size() &&
               [&] {
                 for (size_t i = 0; i < list.size(); ++i)
                   if (list[i] != NodeInfo{.id = beforeFull.members[i].id,
                                           .prevRank = static_cast<int>(i)})
                     return false;
                 return true;
               }()) {
      // Every member expected back with its rank (a restart): the member list says it all.
      ref = beforeCompact.membersList;
      ref.ofMembers = true;
    } else {
      ref.ref = store_.add(kListsCounter, 1);
      ref.count = static_cast<int64_t>(list.size());
      std::vector<std::string> keys, values;
      keys.reserve(2 * list.size());
      values.reserve(2 * list.size());
      std::set<std::string> seen;
      int64_t offset = 0;
      for (size_t i = 0; i < list.size(); ++i) {
        keys.push_back(listKey(ref.ref, static_cast<int64_t>(i)));
        values.push_back(encodeNodeLine(list[i], which));
        if (seen.insert(list[i].id).second) {
          keys.push_back(listIdKey(ref.ref, list[i].id));
          values.push_back(std::to_string(i) + " " + std::to_string(offset));
        }
        offset += list[i].nproc;
      }
      store_.multiSet(keys, values);
    }
    if (members) {
      next.worldSize = 0;
      for (const auto& n : list) next.worldSize += n.nproc;
      next.masterAddr = list[0].addr;
      next.masterPort = list[0].masterPort;
    }
    list.clear();
  }
  if (allDone && next.membersList.ref != 0) {
    next.done.clear();
    next.allDone = true;
  }
}

Versioned StateLog::read(int64_t version) {
  if (version == 0) return {};
  const std::string key = stateKey(version);
  return {version, decode(store_.get(key), key)};
}

RoundState StateLog::decode(const std::string& text, const std::string& key) const {
  RoundState s = decodeState(text, "'" + key + "'");
  validateState(s, limits_, "'" + key + "'");
  return s;
}

// A version named by a hint or a marker exists: agents write a version before any key that
// names it. A name of a missing version is forged; reading it would wait for read_timeout.
static StoreError neverWritten(int64_t version, const std::string& namedBy) {
  return StoreError("rendezvous key '" + namedBy + "' names version " + std::to_string(version) +
                    ", which was never written: it is forged (is another program writing to "
                    "this rendezvous id?)");
}

int64_t StateLog::existing(int64_t version, const std::string& namedBy) {
  if (version > 0 && !store_.check({stateKey(version)})) throw neverWritten(version, namedBy);
  return version;
}

std::optional<Versioned> StateLog::tryRead(int64_t version) {
  const std::string key = stateKey(version);
  auto text = tryGet(store_, key);  // a version's text is never kAbsent (decode refuses it)
  if (!text) return std::nullopt;
  return Versioned{version, decode(*text, key)};
}

// As existing() + read(): one round trip instead of two.
Versioned StateLog::readNamed(int64_t version, const std::string& namedBy) {
  if (version <= 0) return {};
  auto v = tryRead(version);
  if (!v) throw neverWritten(version, namedBy);
  return std::move(*v);
}

Versioned StateLog::latest() {
  // One round trip: creates the hint as "0" when no state was written yet.
  const int64_t hint = parseVersion(store_.compareSet(kLatestKey, "", "0"), kLatestKey);
  return readNamed(hint, kLatestKey);
}

// From a version the agent holds (version > 0), first the version after it: one round trip when
// none is newer -- an agent re-joining after its round watcher read the version that ended the
// round, the usual case -- and the hint only when one is (then as many as before). From none,
// the hint first: one round trip for it, one per newer version, and one that finds none newer.
Versioned StateLog::refresh(Versioned known) {
  if (known.version > 0) {
    auto next = tryRead(known.version + 1);
    if (!next) return known;
    known = std::move(*next);
  }
  const int64_t hint = parseVersion(store_.compareSet(kLatestKey, "", "0"), kLatestKey);
  if (hint > known.version) known = readNamed(hint, kLatestKey);
  while (auto next = tryRead(known.version + 1)) known = std::move(*next);
  return known;
}

StateLog::Result StateLog::update(Versioned known, const Transition& fn) {
  Versioned cur = std::move(known);
  for (;;) {
    // The transitions are pure functions of the whole state: load the lists of a compact one.
    const RoundState compactCur = cur.state;
    if (cur.state.compact()) hydrate(cur.state);
    std::optional<RoundState> next = fn(cur.state);
    if (!next) {
      // A no-op is only an answer on the newest state.
      const std::string key = stateKey(cur.version + 1);
      if (!store_.check({key})) return {cur, false};
      cur = refresh(cur);
      continue;
    }
    const std::string key = stateKey(cur.version + 1);
    std::string blob;
    if (spill_) {
      // Lists are written before the version that names them; not for a version already taken.
      if (store_.check({key})) {
        cur = refresh(cur);
        continue;
      }
      RoundState compactNext = *next;
      spill(compactNext, cur.state, compactCur);
      blob = encodeState(compactNext);
    } else {
      blob = encodeState(*next);
    }
    std::string got = append(cur.version + 1, blob, *next);
    if (got == blob) return {{cur.version + 1, std::move(*next)}, true};
    cur = {cur.version + 1, decode(got, key)};
  }
}

StateLog::Result StateLog::updateCompact(Versioned known, const Transition& fn) {
  Versioned cur = std::move(known);
  for (;;) {
    std::optional<RoundState> next = fn(cur.state);
    const std::string key = stateKey(cur.version + 1);
    if (!next) {
      if (!store_.check({key})) return {cur, false};
      cur = refresh(cur);
      continue;
    }
    DDPRUN_CHECK(next->members.empty() && next->expected.empty() && next->waiting.empty(),
                 "updateCompact: a transition returned a state with its lists loaded");
    const std::string blob = encodeState(*next);
    std::string got = append(cur.version + 1, blob, *next);
    if (got == blob) return {{cur.version + 1, std::move(*next)}, true};
    cur = {cur.version + 1, decode(got, key)};
  }
}

namespace {

// removeNode, arriveNode, failNode, recoverNode on a spilled log: the O(1) change on the compact
// version when `fast` finds one (it returns the next state), else `general`, the full
// transition, on the newest version (fast's nullopt: the general path decides, and may find
// nothing to do). `settled(st)` true: the general transition does nothing on `st` nor on any
// later version (the event's round is over), so the answer is "nothing written" without loading
// the lists -- k nodes reporting at once: the k-1 losers read versions, never the lists.
template <typename Fast, typename General, typename Settled>
StateLog::Result compactElseGeneral(StateLog& log, const Versioned& known, Fast&& fast,
                                    General&& general, Settled&& settled) {
  Versioned cur = known;
  // A version this agent wrote is held loaded (update returns it so): its compact form is one read.
  if (log.spills() && cur.version > 0 && !cur.state.compact()) cur = log.read(cur.version);
  if (log.spills()) {
    bool decided = false;
    auto r = log.updateCompact(cur, [&](const RoundState& st) -> std::optional<RoundState> {
      if (settled(st)) {
        decided = true;  // updateCompact goes on to the newest version, settled there too
        return std::nullopt;
      }
      auto next = fast(st);
      decided = next.has_value();
      return next;
    });
    if (decided) return r;
    cur = r.now;
  }
  return log.update(cur, general);
}

template <typename Fast, typename General>
StateLog::Result compactElseGeneral(StateLog& log, const Versioned& known, Fast&& fast,
                                    General&& general) {
  return compactElseGeneral(log, known, fast, general, [](const RoundState&) { return false; });
}

// A report about round `round` (a failure, a recovery) is moot once that round is over: rounds
// only grow, and a round's phase never goes back to closed.
bool roundOver(const RoundState& st, int64_t round) {
  return st.round > round || (st.round == round && st.phase != Phase::Closed &&
                              st.phase != Phase::Joining);
}

// `st` is a compact closed round `round` (its lists spilled, none in the version) of which `id`
// is a member: one read of its entry.
bool compactMember(StateLog& log, const RoundState& st, int64_t round, const std::string& id) {
  return st.phase == Phase::Closed && st.round == round && st.membersList.ref != 0 &&
         st.members.empty() && st.expected.empty() && st.waiting.empty() &&
         position(log.store(), st, RoundState::List::Members, id).has_value();
}

// Whether a failure of member `id` may restart the compact closed round `st` as one delta
// (compactNextRound): round r+1 awaits the member list, which leaves members lost in process and
// a waiting list in the version out, so only without them.
bool compactRestartable(StateLog& log, const RoundState& st, int64_t round, const std::string& id) {
  return st.waitingList.ref == 0 && st.lost.empty() && compactMember(log, st, round, id);
}

// Round r+1 of the compact closed round `st`, awaiting its member list and its waiting nodes
// (scalable/waiting_list.h: two reads, no list loaded), `restarts` spent: a failure's restart.
RoundState compactNextRound(StateLog& log, const RoundState& st, int restarts,
                            std::string reason) {
  RoundState next;
  next.round = st.round + 1;
  next.phase = Phase::Joining;
  next.restarts = restarts;
  next.reason = std::move(reason);
  next.expectedList = st.membersList;
  next.expectedList.ofMembers = true;
  next.expectedList.waiting = scalable::readWaitingCount(log.store(), st.round);
  next.expectedList.count += next.expectedList.waiting;
  return next;
}

// The O(1) delta of a failure that ends the job (final, or no restart left), as
// transition::failWorkers writes it, on a compact closed round `st` of which `id` is a member:
// the lists stay where they are.
std::optional<RoundState> failedJob(const RoundState& st, int exitCode, const std::string& reason,
                                    const JobLimits& lim, bool final) {
  if (!final && st.restarts < lim.maxRestarts) return std::nullopt;
  RoundState next = st;
  next.phase = Phase::Failed;
  next.exitCode = exitCode;
  next.reason = final ? reason + " (not retryable: no restart spent)"
                      : reason + " and no restart is left (max_restarts=" +
                            std::to_string(lim.maxRestarts) + ")";
  return next;
}

}  // namespace

StateLog::Result removeNode(StateLog& log, const Versioned& known, const std::string& id,
                            const std::string& reason) {
  const JobLimits& lim = log.limits();
  return compactElseGeneral(
      log, known,
      [&](const RoundState& st) -> std::optional<RoundState> {
        if (st.phase != Phase::Closed || st.membersList.ref == 0 || st.finishing() ||
            st.waitingList.ref != 0 || !st.waiting.empty() || !st.members.empty() ||
            std::find(st.lost.begin(), st.lost.end(), id) != st.lost.end()) {
          return std::nullopt;  // the general path decides (and may find nothing to do)
        }
        const auto p = position(log.store(), st, RoundState::List::Members, id);
        if (!p) return std::nullopt;
        if (lim.keepRoundOnNodeLoss && p->index > 0) {  // lost in process: as transition::remove
          RoundState next = st;
          next.lost.push_back(id);
          next.reason = reason + " (lost in process)";
          return next;
        }
        // Round r+1 awaits every other member with its rank (openNext), which leaves members
        // lost in process out: only without any, and with someone left to await.
        if (!st.lost.empty() || st.membersList.count < 2) return std::nullopt;
        RoundState next;
        next.round = st.round + 1;
        next.phase = Phase::Joining;
        next.restarts = st.restarts;
        next.reason = reason;
        // And the round's waiting nodes (scalable/waiting_list.h): two reads, no list loaded.
        const int64_t waiting = scalable::readWaitingCount(log.store(), st.round);
        next.expectedList = ListRef{.ref = st.membersList.ref,
                                    .count = st.membersList.count - 1 + waiting,
                                    .ofMembers = true, .without = id, .waiting = waiting};
        return next;
      },
      [&](const RoundState& s) { return transition::remove(s, id, reason, lim); });
}

StateLog::Result arriveNode(StateLog& log, const Versioned& known, const NodeInfo& node) {
  const JobLimits& lim = log.limits();
  return compactElseGeneral(
      log, known,
      [&](const RoundState& st) -> std::optional<RoundState> {
        if (st.phase != Phase::Closed || st.membersList.ref == 0 || st.finishing() ||
            st.membersList.count >= lim.maxNodes || st.waitingList.ref != 0 ||
            !st.waiting.empty() || !st.members.empty() || !st.lost.empty() ||
            position(log.store(), st, RoundState::List::Members, node.id)) {
          return std::nullopt;  // the general path decides (waits, ends, or nothing to do)
        }
        // As transition::arrive: round r+1 awaits the members with their ranks, and the newcomer.
        RoundState next;
        next.round = st.round + 1;
        next.phase = Phase::Joining;
        next.restarts = st.restarts;
        next.reason = "node " + node.id + " (" + node.addr + ") arrived";
        next.expectedList = ListRef{.ref = st.membersList.ref, .count = st.membersList.count + 1,
                                    .ofMembers = true, .with = node.id};
        return next;
      },
      [&](const RoundState& st) -> std::optional<RoundState> {
        return st.phase == Phase::Joining ? std::nullopt : transition::arrive(st, node, lim);
      });
}

StateLog::Result failNode(StateLog& log, const Versioned& known, int64_t round,
                          const std::string& id, int exitCode, const std::string& reason,
                          bool final) {
  const JobLimits& lim = log.limits();
  return compactElseGeneral(
      log, known,
      [&](const RoundState& st) -> std::optional<RoundState> {
        if (!compactRestartable(log, st, round, id)) {
          return std::nullopt;  // the general path decides (and may find nothing to do)
        }
        // As transition::failWorkers, on the compact state: the lists stay where they are.
        if (auto failed = failedJob(st, exitCode, reason, lim, final)) return failed;
        return compactNextRound(log, st, st.restarts + 1,
                                reason + " (restart " + std::to_string(st.restarts + 1) + " of " +
                                    std::to_string(lim.maxRestarts) + ")");
      },
      [&](const RoundState& s) {
        return transition::failWorkers(s, round, id, exitCode, reason, lim, final);
      },
      [&](const RoundState& st) { return roundOver(st, round); });
}

StateLog::Result failRecoveredNode(StateLog& log, const Versioned& known, int64_t round,
                                   const std::string& id, const std::string& reason) {
  const JobLimits& lim = log.limits();
  return compactElseGeneral(
      log, known,
      [&](const RoundState& st) -> std::optional<RoundState> {
        if (!compactRestartable(log, st, round, id)) return std::nullopt;  // as failNode's
        return compactNextRound(log, st, st.restarts,
                                transition::failedRecoveryReason(reason, st.restarts, lim));
      },
      [&](const RoundState& s) {
        return transition::failRecoveredWorkers(s, round, id, reason, lim);
      },
      [&](const RoundState& st) { return roundOver(st, round); });
}

StateLog::Result markFinishing(StateLog& log, const Versioned& known, int64_t round,
                               const std::string& id) {
  return compactElseGeneral(
      log, known,
      [&](const RoundState& st) -> std::optional<RoundState> {
        if (st.finishing() || !compactMember(log, st, round, id)) return std::nullopt;
        // As transition::nodeDone: the lists stay where they are.
        RoundState next = st;
        next.lost.erase(std::remove(next.lost.begin(), next.lost.end(), id), next.lost.end());
        next.done.push_back(id);
        // Done at once (every other member lost): the general path writes Finished.
        if (1 + static_cast<int64_t>(next.lost.size()) >= st.membersList.count) return std::nullopt;
        return next;
      },
      [&](const RoundState& s) { return transition::nodeDone(s, round, id); },
      [&](const RoundState& st) { return roundOver(st, round); });
}

StateLog::Result finishFromCount(StateLog& log, const Versioned& known, int64_t round,
                                 int64_t doneCount,
                                 const std::function<std::vector<std::string>()>& doneIds) {
  std::optional<std::vector<std::string>> ids;
  return compactElseGeneral(
      log, known,
      [&](const RoundState& st) -> std::optional<RoundState> {
        // Every member counted itself done once (only members do, and each once per round):
        // with none lost, doneCount members are done and none is counted twice.
        if (st.phase != Phase::Closed || st.round != round || st.membersList.ref == 0 ||
            !st.members.empty() || !st.lost.empty() || doneCount < st.membersList.count) {
          return std::nullopt;  // a member lost: the general path tells the done from the lost
        }
        RoundState next = st;
        next.phase = Phase::Finished;
        next.done.clear();
        next.allDone = true;
        next.reason = "every node's workers succeeded in round " + std::to_string(round);
        return next;
      },
      [&](const RoundState& s) {
        if (!ids) ids = doneIds();
        return transition::finishWithDone(s, round, *ids);
      },
      [&](const RoundState& st) { return roundOver(st, round); });
}

StateLog::Result recoverNode(StateLog& log, const Versioned& known, int64_t round,
                             const std::string& id, int exitCode, const std::string& reason,
                             bool final) {
  const JobLimits& lim = log.limits();
  return compactElseGeneral(
      log, known,
      [&](const RoundState& st) -> std::optional<RoundState> {
        if (!compactMember(log, st, round, id)) {
          return std::nullopt;  // the general path decides (and may find nothing to do)
        }
        // As transition::recoverWorkers, on the compact state: the round, its lists and its lost
        // members stay; one more restart, and a reason naming the node.
        if (auto failed = failedJob(st, exitCode, reason, lim, final)) return failed;
        RoundState next = st;
        next.restarts = st.restarts + 1;
        next.reason = transition::recoveredReason(reason, next.restarts, lim);
        return next;
      },
      [&](const RoundState& s) {
        return transition::recoverWorkers(s, round, id, exitCode, reason, lim, final);
      },
      [&](const RoundState& st) { return roundOver(st, round); });
}

// Writes version `version` (compare-set on the missing key) and, when it wins, the markers `s`
// implies and the hint `latest`: one request on etcd (the markers in the txn that writes the
// version, so a writer that dies after it leaves none missing), a compare-set and a MULTI_SET
// on ddprun-store. Returns what the compare-set found or wrote.
std::string StateLog::append(int64_t version, const std::string& blob, const RoundState& s) {
  std::vector<std::string> keys = markersFor(s, limits_);
  keys.push_back(kLatestKey);
  const std::vector<std::string> values(keys.size(), std::to_string(version));
  return store_.compareSetAndSet(stateKey(version), "", blob, keys, values);
}

// A marker's value, waiting up to `timeout` for it: one round trip (WAIT_GET on ddprun-store;
// with no time to wait, a compare-set that reads and never writes).
static std::optional<std::string> waitValue(Store& store, const std::string& key, Millis timeout) {
  return timeout.count() <= 0 ? tryGet(store, key) : store.waitGet(key, timeout);
}

std::optional<int64_t> StateLog::waitMarker(const std::string& key, Millis timeout) {
  const auto text = waitValue(store_, key, timeout);
  if (!text) return std::nullopt;
  return existing(parseVersion(*text, key), key);
}

std::optional<Versioned> StateLog::waitMarkerRead(const std::string& key, Millis timeout) {
  const auto text = waitValue(store_, key, timeout);
  if (!text) return std::nullopt;
  return readNamed(parseVersion(*text, key), key);
}

std::optional<Versioned> StateLog::waitNewer(const Versioned& known, Millis timeout) {
  const int64_t next = known.version + 1;
  if (timeout.count() <= 0) return tryRead(next);
  const std::string key = stateKey(next);
  const auto text = store_.waitGet(key, timeout);
  if (!text) return std::nullopt;
  return Versioned{next, decode(*text, key)};
}

void StateView::onChange(std::function<void()> fn) {
  std::lock_guard<std::mutex> g(callbackMu_);
  onChange_ = std::move(fn);
}

void StateView::offer(const Versioned& v) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (v.version <= newest_.version && newest_.version != 0) return;
    newest_ = v;
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> g(callbackMu_);
  if (onChange_) onChange_();
}

Versioned StateView::get() {
  std::lock_guard<std::mutex> g(mu_);
  return newest_;
}

bool StateView::waitNewer(int64_t seen) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return stopped_ || newest_.version > seen; });
  return !stopped_;
}

void StateView::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

}  // namespace ddprun::rendezvous
