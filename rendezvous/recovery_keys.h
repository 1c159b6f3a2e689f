#pragma once
// The keys of in-process recovery (docs/recovery.md), declared once for both ends: the agent
// that publishes a generation of the worker group and the workers' runtime that reads it.
//
// All of them live under the attempt's prefix, "/worker/attempt_<N>" (what ddprun::init() scopes
// the workers' store by), in the store the agent hosts for its workers:
//   ddprun/recovery/<rank>     the generation in which rank's current process holds the
//                              training state (it committed, or healed from a survivor): set
//                              by the runtime's elastic run; the agent recovers in process only
//                              when every worker it would rely on has written it
//   ddprun/generation/<g>      generation g of the group (g >= 1): written once by the agent,
//                              the record below; survivors wait for the next one
// A generation's communicator keys live under "gen/<g>/" of the attempt (generation 0: none),
// so nothing of an old generation is read by a new one.
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace ddprun::rendezvous::recovery {

inline std::string attemptPrefix(int attempt) { return "/worker/attempt_" + std::to_string(attempt); }
inline std::string announceKey(int rank) { return "ddprun/recovery/" + std::to_string(rank); }
inline std::string generationKey(int generation) {
  return "ddprun/generation/" + std::to_string(generation);
}
inline std::string generationScope(int generation) { return "gen/" + std::to_string(generation); }

// What the agent publishes for a generation: its number, the ranks that left and are taken by
// new processes (world size and ranks stay: the replace policy), and one line of why.
// Text: "generation=<g> replaced=<r>[,<r>...]\n<cause>".
struct GenerationRecord {
  int generation = 0;
  std::vector<int> replaced;
  std::string cause;
};

inline std::string formatGenerationRecord(const GenerationRecord& r) {
  std::string ranks;
  for (int x : r.replaced) ranks += (ranks.empty() ? "" : ",") + std::to_string(x);
  return "generation=" + std::to_string(r.generation) + " replaced=" + ranks + "\n" + r.cause;
}

// nullopt when `text` is not such a record (a pure function: tests feed it anything).
inline std::optional<GenerationRecord> parseGenerationRecord(const std::string& text) {
  GenerationRecord r;
  const size_t eol = text.find('\n');
  std::istringstream head(text.substr(0, eol));
  std::string gen, replaced;
  if (!(head >> gen >> replaced)) return std::nullopt;
  if (gen.rfind("generation=", 0) != 0 || replaced.rfind("replaced=", 0) != 0) return std::nullopt;
  char* end = nullptr;
  r.generation = static_cast<int>(std::strtol(gen.c_str() + 11, &end, 10));
  if (*end != '\0' || r.generation < 1) return std::nullopt;
  std::istringstream ranks(replaced.substr(9));
  for (std::string x; std::getline(ranks, x, ',');) {
    const long v = std::strtol(x.c_str(), &end, 10);
    if (x.empty() || *end != '\0' || v < 0 || v > (1 << 24)) return std::nullopt;
    r.replaced.push_back(static_cast<int>(v));
  }
  if (r.replaced.empty()) return std::nullopt;
  if (eol != std::string::npos) r.cause = text.substr(eol + 1);
  return r;
}

}  // namespace ddprun::rendezvous::recovery
