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
  const auto trace = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
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
