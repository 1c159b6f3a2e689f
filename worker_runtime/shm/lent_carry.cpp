#include "worker_runtime/shm/lent_carry.h"

#include <sstream>

#include "base/errors.h"

namespace ddprun::runtime::shm {

void LentCarry::keep(int lend, std::shared_ptr<SharedMapping> mapping) {
  std::lock_guard lock(mutex_);
  kept_[lend] = std::move(mapping);
}

std::shared_ptr<SharedMapping> LentCarry::take(int lend) {
  std::lock_guard lock(mutex_);
  auto it = kept_.find(lend);
  if (it == kept_.end()) return nullptr;
  std::shared_ptr<SharedMapping> mapping = std::move(it->second);
  kept_.erase(it);
  return mapping;
}

std::string formatOffer(const std::optional<LentOffer>& offer) {
  if (!offer) return "-";
  return std::to_string(offer->file.device) + " " + std::to_string(offer->file.inode) + " " +
         std::to_string(offer->bytes) + " " + std::to_string(offer->pid) + " " +
         std::to_string(offer->fd);
}

std::optional<LentOffer> parseOffer(const std::string& text) {
  if (text == "-") return std::nullopt;
  std::istringstream in(text);
  LentOffer o;
  in >> o.file.device >> o.file.inode >> o.bytes >> o.pid >> o.fd;
  std::string rest;
  if (!in || (in >> rest) || o.pid <= 0 || o.fd < 0 || o.bytes == 0) {
    throw BackendError("shm: a rank's offer of a lent buffer '" + text + "' is not valid: "
                       "expected '-' or '<device> <inode> <bytes> <pid> <fd>'");
  }
  return o;
}

std::optional<int> chooseCarried(const std::vector<std::optional<LentOffer>>& offers,
                                 size_t bytes) {
  std::optional<int> source;
  for (size_t r = 0; r < offers.size(); ++r) {
    if (!offers[r]) continue;
    if (offers[r]->bytes < bytes) return std::nullopt;
    if (!source) {
      source = static_cast<int>(r);
    } else if (!(offers[r]->file == offers[*source]->file) ||
               offers[r]->bytes != offers[*source]->bytes) {
      return std::nullopt;
    }
  }
  return source;
}

}  // namespace ddprun::runtime::shm
