#include "worker_runtime/elastic/peer_watch.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "base/errors.h"
#include "base/process.h"

namespace ddprun::runtime::elastic {

namespace {

std::string pidKey(int rank) { return "pids/" + std::to_string(rank); }

// A pid as published by exchange(): decimal, > 0, fits a pid_t. Pure.
int32_t parsePid(const std::string& text, const std::string& key) {
  errno = 0;
  char* end = nullptr;
  const long long v = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0' || v <= 0 || v > std::numeric_limits<int32_t>::max()) {
    throw BackendError("peer watch: store key '" + key + "' holds '" + text.substr(0, 32) +
                       "', not a process id");
  }
  return static_cast<int32_t>(v);
}

}  // namespace

PeerWatch::PeerWatch(std::vector<int32_t> pids, int self) : pids_(std::move(pids)), self_(self) {}

PeerWatch PeerWatch::exchange(rendezvous::Store& store, int rank, int size, Millis timeout) {
  DDPRUN_CHECK(rank >= 0 && rank < size, "rank " << rank << " of " << size);
  store.set(pidKey(rank), std::to_string(::getpid()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(pidKey(r));
  store.wait(keys, timeout);
  const std::vector<std::string> values = store.multiGet(keys);
  std::vector<int32_t> pids;
  for (int r = 0; r < size; ++r) pids.push_back(parsePid(values[r], keys[r]));
  return PeerWatch(std::move(pids), rank);
}

std::string PeerWatch::lost() const {
  for (int r = 0; r < static_cast<int>(pids_.size()); ++r) {
    if (r != self_ && processExiting(pids_[r])) {
      return "rank " + std::to_string(r) + " (pid " + std::to_string(pids_[r]) + ") died";
    }
  }
  return "";
}

}  // namespace ddprun::runtime::elastic
