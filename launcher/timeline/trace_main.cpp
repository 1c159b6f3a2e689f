// ddprun-trace FILE: what a job's timeline says (summary.h), as text or --json.
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "launcher/timeline/summary.h"

int main(int argc, char** argv) {
  CLI::App app{"ddprun-trace: summarise a timeline written by ddprun --timeline=FILE"};
  std::string file;
  bool asJson = false;
  app.add_option("FILE", file, "the timeline (Chrome trace JSON)")->required();
  app.add_flag("--json", asJson, "print the summary as JSON");
  CLI11_PARSE(app, argc, argv);
  std::ifstream in(file);
  if (!in) {
    std::cerr << "ddprun-trace: cannot open " << file << "\n";
    return 1;
  }
  // A trace is shallow (the document, its event list, an event, its args). Anything nested
  // deeper is dropped while parsing and refused: the recursive JSON code that destroys and
  // walks values would overflow the stack on a file nested 100,000 levels deep.
  constexpr int kMaxDepth = 32;
  bool tooDeep = false;
  const auto trace = nlohmann::json::parse(
      in,
      [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        if (depth > kMaxDepth) tooDeep = true;
        return depth <= kMaxDepth;
      },
      /*allow_exceptions=*/false);
  if (tooDeep) {
    std::cerr << "ddprun-trace: " << file << " is nested deeper than " << kMaxDepth
              << " levels: not a ddprun trace\n";
    return 1;
  }
  if (trace.is_discarded()) {
    std::cerr << "ddprun-trace: " << file << " is not JSON\n";
    return 1;
  }
  try {
    const auto summary = ddprun::launcher::timeline::summarize(trace);
    if (asJson) {
      std::cout << ddprun::launcher::timeline::summaryJson(summary).dump(2) << "\n";
    } else {
      std::cout << ddprun::launcher::timeline::formatSummary(summary);
    }
  } catch (const std::exception& e) {
    std::cerr << "ddprun-trace: " << file << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
