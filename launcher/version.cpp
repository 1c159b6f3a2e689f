// What `ddprun --version` prints: the project's version and the git revision it was built
// from (generated at build time by cmake/GitRevision.cmake; "unknown" outside a git tree).
#include "ddprun_git_revision.h"
#include "launcher/options.h"

namespace ddprun::launcher {

std::string versionText() {
  return std::string("ddprun ") + DDPRUN_VERSION + " (git " + DDPRUN_GIT_REVISION + ")";
}

}  // namespace ddprun::launcher
