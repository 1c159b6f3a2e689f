// The parts of nccl_communicator.h that exist in every build: the unique-id exchange (testable
// anywhere) and, when ddprun is built without NCCL, the factories that say so.
#include "worker_runtime/nccl_communicator.h"

#include <unistd.h>

#include "base/errors.h"

namespace ddprun::runtime {

bool nvidiaDriverPresent(const std::string& root) {
  for (const char* path : {"/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg"}) {
    if (::access((root + path).c_str(), F_OK) == 0) return true;
  }
  return false;
}

std::string exchangeUniqueId(rendezvous::Store& store, const std::string& key, int rank,
                             const std::function<std::string()>& generate, Millis timeout,
                             size_t expectedBytes) {
  std::string id;
  if (rank == 0) {
    id = generate();
    store.set(key, id);
  } else {
    store.wait({key}, timeout);
    id = store.get(key);
  }
  if (id.size() != expectedBytes) {
    throw BackendError("NCCL unique id under store key '" + key + "' has " +
                       std::to_string(id.size()) + " bytes, expected " +
                       std::to_string(expectedBytes));
  }
  return id;
}

#ifndef DDPRUN_HAVE_NCCL
bool ncclBuilt() { return false; }
int visibleGpuCount() { return 0; }

std::string generateNcclUniqueId() {
  throw ConfigError("this ddprun was built without NCCL (CUDA toolkit or NCCL not found)");
}

std::shared_ptr<Communicator> makeNcclCommunicator(std::shared_ptr<rendezvous::Store>,
                                                   NcclOptions) {
  throw ConfigError(
      "backend nccl: this ddprun was built without NCCL (CUDA toolkit or NCCL not found)");
}
#endif

}  // namespace ddprun::runtime
