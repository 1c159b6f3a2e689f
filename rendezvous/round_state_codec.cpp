// The text encoding of RoundState (round_state.h): encodeState / decodeState.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <string_view>

#include "rendezvous/round_state.h"
#include "rendezvous/text_fields.h"

namespace ddprun::rendezvous {

// ---- Encoding ----
//   ddprun-rendezvous-state 1
//   round <r>
//   phase joining|closed|finished|failed
//   restarts <n>
//   exit <code>
//   reason <text to the end of the line>
//   member|waiting <id> <addr> <nproc> <masterPort> <fixedRank> <prevRank>
//   expected <id> <prevRank>
//   done|lost <id>             (a finishing round: members in the exit barrier / lost since;
//                               lost in a closed round that is not finishing: lost in process)
//   done-all                    (finished, members in the store: every member not lost is done)
//   members-list <ref> <count> <world> <masterAddr> <masterPort>   (a compact state: the
//   waiting-list|expected-list <ref> <count>  lists are in the store, see StateLog; ListRef)
// Hand-written both ways: a state is re-read on every lost compare-set, so it must be cheap.
namespace {
constexpr std::string_view kMagic = "ddprun-rendezvous-state 1";

void put(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void encodeNode(std::string& out, std::string_view tag, const NodeInfo& n) {
  out.append(tag).append(" ").append(n.id).append(" ").append(n.addr).append(" ");
  put(out, n.nproc);
  out += ' ';
  put(out, n.masterPort);
  out += ' ';
  put(out, n.fixedRank);
  out += ' ';
  put(out, n.prevRank);
  out += '\n';
}

using text::number;
using text::validAddress;
using text::validId;
using text::words;
}  // namespace

std::string encodeState(const RoundState& s) {
  std::string out;
  out.reserve(160 + 64 * (s.members.size() + s.waiting.size()) + 40 * s.expected.size());
  out.append(kMagic).append("\nround ");
  put(out, s.round);
  out.append("\nphase ").append(phaseName(s.phase)).append("\nrestarts ");
  put(out, s.restarts);
  out.append("\nexit ");
  put(out, s.exitCode);
  out += '\n';
  std::string reason = s.reason;
  for (char& c : reason)  // one line of printable text: control characters become spaces
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  out.append("reason ").append(reason).append("\n");
  for (const auto& n : s.members) encodeNode(out, "member", n);
  for (const auto& n : s.waiting) encodeNode(out, "waiting", n);
  for (const auto& n : s.expected) {
    out.append("expected ").append(n.id).append(" ");
    put(out, n.prevRank);
    out += '\n';
  }
  for (const auto& id : s.done) out.append("done ").append(id).append("\n");
  for (const auto& id : s.lost) out.append("lost ").append(id).append("\n");
  if (s.allDone) out.append("done-all\n");
  if (s.membersList.ref) {
    out.append("members-list ");
    put(out, s.membersList.ref);
    out += ' ';
    put(out, s.membersList.count);
    out += ' ';
    put(out, s.worldSize);
    out.append(" ").append(s.masterAddr).append(" ");
    put(out, s.masterPort);
    out += '\n';
  }
  if (s.waitingList.ref) {
    out.append("waiting-list ");
    put(out, s.waitingList.ref);
    out += ' ';
    put(out, s.waitingList.count);
    out += '\n';
  }
  if (s.expectedList.ref) {
    out.append("expected-list ");
    put(out, s.expectedList.ref);
    out += ' ';
    put(out, s.expectedList.count);
    if (s.expectedList.ofMembers) out.append(" members");
    if (s.expectedList.ofMembers && !s.expectedList.without.empty()) {
      out.append(" ");
      out.append(s.expectedList.without);
    } else if (s.expectedList.ofMembers && !s.expectedList.with.empty()) {
      out.append(" and ");
      out.append(s.expectedList.with);
    }
    if (s.expectedList.ofMembers && s.expectedList.waiting > 0) {
      out.append(" waiting ");
      put(out, s.expectedList.waiting);
    }
    out += '\n';
  }
  return out;
}

std::string encodeNodeLine(const NodeInfo& n, RoundState::List list) {
  std::string out;
  if (list == RoundState::List::Expected) {
    out.append("expected ").append(n.id).append(" ");
    put(out, n.prevRank);
  } else {
    encodeNode(out, list == RoundState::List::Members ? "member" : "waiting", n);
    out.pop_back();  // the newline
  }
  return out;
}

std::vector<NodeInfo> decodeNodeLines(const std::vector<std::string>& lines, RoundState::List list,
                                      const std::string& what) {
  const std::string_view tag = list == RoundState::List::Expected  ? "expected "
                               : list == RoundState::List::Members ? "member "
                                                                   : "waiting ";
  std::string text(kMagic);
  text.append("\nround 0\nphase joining\n");
  for (const auto& l : lines) {
    if (l.substr(0, tag.size()) != tag || l.find('\n') != std::string::npos) {
      throw StoreError("rendezvous list " + what + " is corrupt or forged (entry '" +
                       l.substr(0, 80) + "'): is another program writing to this rendezvous id?");
    }
    text.append(l).append("\n");
  }
  RoundState s = decodeState(text, what);
  return std::move(s.list(list));
}

RoundState decodeState(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) -> StoreError {
    return StoreError("rendezvous state " + what + " is corrupt or forged (" + why +
                      "): is another program writing to this rendezvous id?");
  };
  std::string_view rest(text);
  auto nextLine = [&](std::string_view& line) {
    if (rest.empty()) return false;
    const size_t nl = rest.find('\n');
    line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    return true;
  };
  for (char c : text) {  // lines of printable text only: a state is never binary
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f) {
      throw bad("control character " + std::to_string(static_cast<unsigned char>(c)));
    }
  }
  std::string_view line;
  if (!nextLine(line) || line != kMagic) throw bad("no '" + std::string(kMagic) + "' header");
  RoundState s;
  bool seenRound = false, seenPhase = false;
  while (nextLine(line)) {
    if (line.substr(0, 7) == "reason ") {
      s.reason = std::string(line.substr(7));
      continue;
    }
    const auto w = words(line);
    if (w.empty()) continue;
    const std::string_view tag = w[0];
    auto field = [&](auto& v) { return w.size() == 2 && number(w[1], v); };
    if (tag == "round") {
      if (!field(s.round) || s.round < 0) throw bad("round: '" + std::string(line) + "'");
      seenRound = true;
    } else if (tag == "phase") {
      const std::string_view p = w.size() == 2 ? w[1] : std::string_view();
      if (p == "joining") s.phase = Phase::Joining;
      else if (p == "closed") s.phase = Phase::Closed;
      else if (p == "finished") s.phase = Phase::Finished;
      else if (p == "failed") s.phase = Phase::Failed;
      else throw bad("phase '" + std::string(p) + "'");
      seenPhase = true;
    } else if (tag == "restarts") {
      if (!field(s.restarts) || s.restarts < 0) throw bad("restarts: '" + std::string(line) + "'");
    } else if (tag == "exit") {
      if (!field(s.exitCode)) throw bad("exit: '" + std::string(line) + "'");
    } else if (tag == "done" || tag == "lost") {
      if (w.size() != 2 || !validId(w[1]))
        throw bad(std::string(tag) + " record '" + std::string(line) + "'");
      (tag == "done" ? s.done : s.lost).emplace_back(w[1]);
    } else if (tag == "done-all") {  // every member not lost is done (RoundState::allDone)
      if (w.size() != 1) throw bad("done-all record '" + std::string(line) + "'");
      s.allDone = true;
    } else if (tag == "member" || tag == "waiting") {
      NodeInfo n;
      int port = 0;
      if (w.size() != 7 || !number(w[3], n.nproc) || !number(w[4], port) ||
          !number(w[5], n.fixedRank) || !number(w[6], n.prevRank) || n.nproc < 1 || port < 0 ||
          port > 65535) {
        throw bad("node record '" + std::string(line) + "'");
      }
      if (n.nproc > kMaxNproc || n.fixedRank < -1 || n.prevRank < -1 || !validId(w[1]) ||
          !validAddress(w[2])) {
        throw bad("node record '" + std::string(line) + "'");
      }
      n.id = std::string(w[1]);
      n.addr = std::string(w[2]);
      n.masterPort = static_cast<uint16_t>(port);
      (tag == "member" ? s.members : s.waiting).push_back(std::move(n));
    } else if (tag == "expected") {
      NodeInfo n;
      if (w.size() != 3 || !number(w[2], n.prevRank) || n.prevRank < -1 || !validId(w[1])) {
        throw bad("expected record '" + std::string(line) + "'");
      }
      n.id = std::string(w[1]);
      s.expected.push_back(std::move(n));
    } else if (tag == "members-list") {
      int port = 0;
      if (w.size() != 6 || !number(w[1], s.membersList.ref) || !number(w[2], s.membersList.count) ||
          !number(w[3], s.worldSize) || !validAddress(w[4]) || !number(w[5], port) ||
          s.membersList.ref < 1 || s.membersList.count < 1 || s.worldSize < 1 || port < 0 ||
          port > 65535 || !s.members.empty()) {
        throw bad("members-list record '" + std::string(line) + "'");
      }
      s.masterAddr = std::string(w[4]);
      s.masterPort = static_cast<uint16_t>(port);
    } else if (tag == "expected-list" || tag == "waiting-list") {
      ListRef& ref = tag == "expected-list" ? s.expectedList : s.waitingList;
      // A record given again replaces the one before whole, as every other record does: a
      // field of the earlier line (its `without`, `with` or `waiting`) must not survive into a
      // state that no longer encodes it (found by fuzz_state_codec).
      ref = ListRef{};
      // "... members ... waiting <K>": and the round before's K waiting nodes (ListRef::waiting).
      auto w = words(line);
      if (tag == "expected-list" && w.size() >= 6 && w[w.size() - 2] == "waiting") {
        if (!number(w.back(), ref.waiting) || ref.waiting < 1)
          throw bad(std::string(tag) + " record '" + std::string(line) + "'");
        w.resize(w.size() - 2);
      }
      ref.ofMembers = (w.size() >= 4 && w.size() <= 6) && tag == "expected-list" &&
                      w[3] == "members";
      size_t words = ref.ofMembers ? 4u : 3u;
      if (ref.ofMembers && w.size() == 5) {  // "members <id>": every member but <id>
        if (!validId(w[4])) throw bad(std::string(tag) + " record '" + std::string(line) + "'");
        ref.without = std::string(w[4]);
        words = 5;
      } else if (ref.ofMembers && w.size() == 6 && w[4] == "and") {  // and a newcomer
        if (!validId(w[5])) throw bad(std::string(tag) + " record '" + std::string(line) + "'");
        ref.with = std::string(w[5]);
        words = 6;
      }
      if (w.size() != words || !number(w[1], ref.ref) || !number(w[2], ref.count) ||
          ref.ref < 1 || ref.count < 1 || (!ref.with.empty() && ref.count < 2) ||
          (ref.waiting > 0 && (!ref.ofMembers || ref.stored() < 1))) {
        throw bad(std::string(tag) + " record '" + std::string(line) + "'");
      }
    } else {
      throw bad("unknown record '" + std::string(tag) + "'");
    }
  }
  if (!seenRound || !seenPhase) throw bad("round or phase missing");
  if ((s.membersList.ref && !s.members.empty()) || (s.expectedList.ref && !s.expected.empty()) ||
      (s.waitingList.ref && !s.waiting.empty()))
    throw bad("a list both inline and in the store");
  if (s.allDone && (s.phase != Phase::Finished || !s.membersList.ref || !s.done.empty()))
    throw bad("done-all outside a finished state with a member list in the store");
  return s;
}

void validateState(const RoundState& s, const JobLimits& lim, const std::string& what) {
  auto bad = [&](const std::string& why) {
    throw StoreError("rendezvous state " + what + " is corrupt or forged (" + why +
                     "): is another program writing to this rendezvous id?");
  };
  const int64_t members = s.memberCount();
  if (members > lim.maxNodes) {
    bad(std::to_string(members) + " members, more than MAX=" + std::to_string(lim.maxNodes));
  }
  if (s.phase != Phase::Joining && members == 0) bad(std::string(phaseName(s.phase)) + " with no member");
  if (s.restarts > lim.maxRestarts) {
    bad("restarts " + std::to_string(s.restarts) + " > max_restarts=" +
        std::to_string(lim.maxRestarts));
  }
  // The world size, summed without overflow: at most MAX x the largest nproc a node may have.
  int64_t world = 0;
  std::vector<std::string_view> ids;
  for (const auto& m : s.members) {
    world += m.nproc;  // each in [1, kMaxNproc] (decodeState), at most MAX of them
    if (m.fixedRank >= lim.maxNodes) {
      bad("member " + m.id + " has node rank " + std::to_string(m.fixedRank) + " >= MAX=" +
          std::to_string(lim.maxNodes));
    }
    ids.push_back(m.id);
  }
  if (s.membersList.ref) world = s.worldSize;
  if (s.membersList.ref && s.worldSize < members) bad("world size below the node count");
  if (world > static_cast<int64_t>(lim.maxNodes) * kMaxNproc || world > INT32_MAX) {
    bad("world size " + std::to_string(world) + " out of range");
  }
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) bad("a member appears twice");
  // A closed round's lost nodes are members: at most MAX. Each is listed once (a joining round's
  // too: the nodes removed while it was open).
  if (s.phase != Phase::Joining && static_cast<int64_t>(s.lost.size()) > lim.maxNodes) {
    bad(std::to_string(s.lost.size()) + " lost nodes, more than MAX=" + std::to_string(lim.maxNodes));
  }
  std::vector<std::string_view> lostIds(s.lost.begin(), s.lost.end());
  std::sort(lostIds.begin(), lostIds.end());
  if (std::adjacent_find(lostIds.begin(), lostIds.end()) != lostIds.end()) bad("a lost node appears twice");
  if (s.phase == Phase::Failed && (s.exitCode < -255 || s.exitCode > 255)) {
    bad("exit code " + std::to_string(s.exitCode) + " out of range");
  }
}

}  // namespace ddprun::rendezvous
