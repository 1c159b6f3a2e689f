// Error files of C++ programs (TORCHELASTIC_ERROR_FILE): what is written, and whether the error
// is marked retryable.
#include "tests/support/catch_torch.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/errors.h"
#include "worker_runtime/checkpoint.h"
#include "worker_runtime/error_file.h"

using namespace ddprun::runtime;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

EnvLookup envWith(const std::string& errorFile) {
  return [errorFile](const std::string& name) -> std::optional<std::string> {
    if (name == "TORCHELASTIC_ERROR_FILE") return errorFile;
    return std::nullopt;
  };
}

}  // namespace

TEST_CASE("errors a restart cannot fix are not retryable", "[error_file]") {
  CHECK_FALSE(isRetryable(ddprun::ConfigError("bad lr")));
  CHECK_FALSE(isRetryable(IncompatibleCheckpoint("does not fit")));
  CHECK(isRetryable(CheckpointError("disk full")));
  CHECK(isRetryable(ddprun::BackendError("peer gone")));
  CHECK(isRetryable(ddprun::TimeoutError("too slow")));
  CHECK(isRetryable(std::runtime_error("something")));
  CHECK(exceptionTypeName(IncompatibleCheckpoint("x")) == "ddprun::runtime::IncompatibleCheckpoint");
  CHECK(exceptionTypeName(IncompatibleCheckpoint("x"), false) == "IncompatibleCheckpoint");
}

TEST_CASE("recordError writes @record's JSON with ddprun's fields, atomically", "[error_file]") {
  const fs::path dir = fs::temp_directory_path() / ("ddprun-errfile-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "error.json";
  CHECK(recordError(IncompatibleCheckpoint("checkpoint c.ddpck does not fit: fc1.weight"),
                    std::nullopt, envWith(file.string())));
  auto j = nlohmann::json::parse(slurp(file));
  CHECK(j["message"]["message"] == "IncompatibleCheckpoint: checkpoint c.ddpck does not fit: fc1.weight");
  CHECK(j["message"]["extraInfo"]["exceptionType"] == "ddprun::runtime::IncompatibleCheckpoint");
  CHECK(j["message"]["extraInfo"]["retryable"] == false);
  CHECK(std::stoll(j["message"]["extraInfo"]["timestamp"].get<std::string>()) > 1'600'000'000);
  // Overwritten (rename), and nothing else is left in the directory.
  CHECK(recordError(ddprun::BackendError("rank 2 closed the connection\n\xff"), std::nullopt,
                    envWith(file.string())));
  j = nlohmann::json::parse(slurp(file));
  CHECK(j["message"]["extraInfo"]["retryable"] == true);
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
  // Unset: nothing written; an unwritable path: false, no exception.
  CHECK_FALSE(writeErrorFile("x", "y", false, [](const std::string&) { return std::nullopt; }));
  CHECK_FALSE(writeErrorFile("x", "y", false, envWith((dir / "missing" / "e.json").string())));
  fs::remove_all(dir);
}

TEST_CASE("recordErrors: exit 2 when not retryable, 1 otherwise, the body's code without error",
          "[error_file]") {
  CHECK(recordErrors("t", [] { return 7; }) == 7);
  CHECK(recordErrors("t", []() -> int { throw ddprun::ConfigError("bad"); }) == 2);
  CHECK(recordErrors("t", []() -> int { throw ddprun::NetworkError("reset"); }) == 1);
}
