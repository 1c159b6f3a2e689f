#pragma once
// Error files for C++ programs: what PyTorch's @record decorator does for Python ones.
//
// The launcher (ddprun or torchrun) names a file per worker in TORCHELASTIC_ERROR_FILE. A worker
// that fails writes its error there, and the launcher shows it in its failure report instead of
// a bare exit code. ddprun also reads whether the error can go away by retrying: a bad setting,
// an incompatible checkpoint or missing data fail the same way on every restart, so ddprun ends
// the job at once with that message instead of spending the whole restart budget.
//
// The file is @record's JSON (docs/launcher.md), with ddprun's fields in extraInfo, which torch
// ignores:
//   {"message": {"message": "IncompatibleCheckpoint: checkpoint ... does not fit this model: ...",
//                "extraInfo": {"timestamp": "1795311549",
//                              "exceptionType": "ddprun::runtime::IncompatibleCheckpoint",
//                              "retryable": false}}}
// It is written atomically (a temporary file in the same directory, then rename), so the
// launcher never reads half of one.
//
//   int main(int argc, char** argv) {
//     return ddprun::runtime::recordErrors("my_trainer", [&] { ...; return 0; });
//   }
#include <exception>
#include <functional>
#include <optional>
#include <string>

#include "worker_runtime/env.h"

namespace ddprun::runtime {

// Whether running again can help: false for ConfigError (bad settings or environment) and
// IncompatibleCheckpoint; true for everything else (a peer died, a timeout, an I/O error).
bool isRetryable(const std::exception& e);

// The exception's dynamic type, demangled: "ddprun::runtime::IncompatibleCheckpoint", or without
// namespaces "IncompatibleCheckpoint".
std::string exceptionTypeName(const std::exception& e, bool qualified = true);

// Writes the error file named by TORCHELASTIC_ERROR_FILE (nothing when it is unset). Returns
// whether a file was written; a failure to write is logged, never thrown.
bool writeErrorFile(const std::string& message, const std::string& exceptionType, bool retryable,
                    const EnvLookup& env = processEnv);

// writeErrorFile for `e`: message "<Type>: <what>", retryable as given or isRetryable(e).
bool recordError(const std::exception& e, std::optional<bool> retryable = std::nullopt,
                 const EnvLookup& env = processEnv);

// Runs `body` and returns its exit code. An exception escaping it is recorded (recordError),
// printed on stderr as "<program>: error: <what>", and ends the program with exit code 2 when
// it is not retryable, 1 otherwise.
int recordErrors(const std::string& program, const std::function<int()>& body);

}  // namespace ddprun::runtime
