#pragma once
// The grow record: the generation of a shrunk worker group that takes a replacement back in
// (grow back, docs/recovery.md#grow-back), written by the agent under ddprun/generation/<g>, read
// by every worker's runtime; declared here once for both ends. Its siblings (the keys, the
// replace and shrink records, the spare's assignment) are in rendezvous/recovery_keys.h.
//
//   "generation=<g> added=<r> world_size=<n> spare=<id>\n<cause>"
//
// Generation g has one rank more than g-1: the replacement (hot spare <id>, started in the
// background after the shrink) takes rank r, and every rank q >= r of generation g-1 becomes
// q + 1 (growRank()). The agent picks r so that the ranks stay in the order of the local-rank
// slots: once every rank that left is back, every process has its first rank again.
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>

namespace ddprun::rendezvous::recovery {

struct GrowRecord {
  int generation = 0;
  int added = -1;     // the rank the replacement takes in generation g
  int worldSize = 0;  // generation g's world size (g-1's + 1)
  int spare = -1;     // the hot spare that is the replacement
  std::string cause;  // one line of why (for logs)
};

// A rank of generation g-1 in generation g.
inline int growRank(int rank, int added) { return rank >= added ? rank + 1 : rank; }

inline std::string formatGrowRecord(const GrowRecord& r) {
  return "generation=" + std::to_string(r.generation) + " added=" + std::to_string(r.added) +
         " world_size=" + std::to_string(r.worldSize) + " spare=" + std::to_string(r.spare) +
         "\n" + r.cause;
}

// Whether `text` is a grow record at all (its second field is added=...): a record of another
// kind is not an error here.
inline bool isGrowRecord(const std::string& text) {
  std::istringstream head(text.substr(0, text.find('\n')));
  std::string gen, second;
  return static_cast<bool>(head >> gen >> second) && second.rfind("added=", 0) == 0;
}

// Pure: the record in `text`, or nullopt with `why` naming the field that is wrong and its
// value (tests feed it anything).
inline std::optional<GrowRecord> parseGrowRecord(const std::string& text, std::string& why) {
  const size_t eol = text.find('\n');
  std::istringstream head(text.substr(0, eol));
  const char* names[4] = {"generation=", "added=", "world_size=", "spare="};
  long values[4] = {};
  for (int i = 0; i < 4; ++i) {
    std::string field;
    if (!(head >> field)) {
      why = std::string("no ") + names[i] + "<n> field";
      return std::nullopt;
    }
    const std::string name = names[i];
    if (field.rfind(name, 0) != 0) {
      why = "field " + std::to_string(i + 1) + " is '" + field + "', expected " + name + "<n>";
      return std::nullopt;
    }
    const std::string digits = field.substr(name.size());
    char* end = nullptr;
    values[i] = std::strtol(digits.c_str(), &end, 10);
    const long least = i == 0 || i == 2 ? 1 : 0;  // generation and world size start at 1
    if (digits.empty() || *end != '\0' || values[i] < least || values[i] > (1 << 24)) {
      why = name + "'" + digits + "' is not a number >= " + std::to_string(least);
      return std::nullopt;
    }
  }
  if (std::string extra; head >> extra) {
    why = "unexpected field '" + extra + "'";
    return std::nullopt;
  }
  if (values[1] >= values[2]) {
    why = "added=" + std::to_string(values[1]) + " is not a rank of world_size=" +
          std::to_string(values[2]);
    return std::nullopt;
  }
  if (values[2] < 2) {
    why = "world_size=" + std::to_string(values[2]) + " after a grow (at least 2)";
    return std::nullopt;
  }
  return GrowRecord{.generation = static_cast<int>(values[0]),
                    .added = static_cast<int>(values[1]),
                    .worldSize = static_cast<int>(values[2]),
                    .spare = static_cast<int>(values[3]),
                    .cause = eol == std::string::npos ? std::string() : text.substr(eol + 1)};
}

}  // namespace ddprun::rendezvous::recovery
