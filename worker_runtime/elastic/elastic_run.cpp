#include "worker_runtime/elastic/elastic_run.h"

#include <chrono>
#include <exception>

#include "base/errors.h"
#include "base/log.h"
#include "base/timeline.h"

namespace ddprun::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string whatOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

// Every rank's state becomes that of the lowest rank holding a commit, rolled back to it
// (ElasticState::heal). Throws BackendError when nobody holds one.
int heal(Runtime& rt, ElasticState& state) {
  const auto root = state.heal(*rt.comm());
  if (!root) {
    throw BackendError("in-process recovery: no rank of generation " +
                       std::to_string(rt.generation()) + " holds the training state (every "
                       "survivor died too): the group must restart");
  }
  return *root;
}

// Thrown by the commit boundary (ElasticState::setBoundary) when the launcher has published the
// next generation while this rank trains (grow back): the rank re-forms right there, at a
// commit, so it has nothing to roll back. Internal to runElastic, which always catches it.
struct GenerationAtCommit final : std::exception {
  const char* what() const noexcept override {
    return "the launcher published a new generation of the group (seen at a commit)";
  }
};

bool atCommit(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const GenerationAtCommit&) {
    return true;
  } catch (...) {
    return false;
  }
}

// A collective's failure, or a new generation seen at a commit: the kinds in-process recovery
// answers. Anything else propagates.
template <typename Fn>
std::exception_ptr collectiveFailure(Fn&& fn) {
  try {
    fn();
  } catch (const BackendError&) {
    return std::current_exception();
  } catch (const TimeoutError&) {
    return std::current_exception();
  } catch (const GenerationAtCommit&) {
    return std::current_exception();
  }
  return nullptr;
}

// Removes the boundary check from the state when runElastic returns (it refers to the runtime).
struct BoundaryGuard {
  ElasticState& state;
  ~BoundaryGuard() { state.setBoundary(nullptr); }
};

}  // namespace

ElasticRunStats runElastic(Runtime& rt, ElasticState& state, const ElasticLoop& loop) {
  ElasticRunStats stats;
  if (!rt.inProcessRecovery()) {
    loop.reset();
    loop.body();
    return stats;
  }
  state.enable();
  // Grow back: a generation the launcher publishes while every rank trains (a replacement is
  // ready) is taken at the next commit. The check is a relaxed load of a flag the runtime's
  // watch thread sets (Runtime::watchNextGeneration): no store round trip in a step. The first
  // rank to see it aborts its communicator there; a peer already in the next step's collective
  // fails and comes back to the same commit (it rolls back at most that one step), so every
  // rank re-forms from the same commit.
  state.setBoundary([&rt] {
    if (rt.nextGenerationPublished()) throw GenerationAtCommit();
  });
  BoundaryGuard guard{state};
  const bool replacement = rt.generation() > 0;
  std::exception_ptr failure;
  // Start: a replacement heals first (from its own generation's communicator, built by init).
  failure = collectiveFailure([&] {
    if (replacement) {
      const auto start = Clock::now();
      const int root = heal(rt, state);
      stats.healed = true;
      DDPRUN_LOG(INFO, "runtime") << "rank " << rt.rank() << " joined generation "
                                  << rt.generation() << " and healed from rank " << root
                                  << "'s memory (" << state.bytes() << " bytes) in "
                                  << static_cast<int64_t>(msSince(start)) << " ms";
    }
    loop.reset();
    // A heal made the root's state every rank's commit already (adoptAsCommit).
    if (!replacement) state.commit();
    rt.announceState();
  });
  for (;;) {
    if (!failure) {
      // Once, before the first body: its connection is made here, not in a recovery nor in a
      // replacement's heal, which the others wait for.
      rt.watchNextGeneration();
      failure = collectiveFailure([&] { loop.body(); });
      if (!failure) return stats;
    }
    // A peer died (or a collective failed): wait for the agent's next generation, bounded.
    // Or the next generation is there already, seen at a commit (grow back): no wait.
    const std::string why = whatOf(failure);
    const bool regroup = atCommit(failure);
    const auto start = Clock::now();
    const int64_t startUs = ddprun::timeline::nowUs();
    const ddprun::timeline::FaultCount faults;
    const Millis bound = rt.recoveryTimeout();
    if (!regroup) {
      DDPRUN_LOG(WARN, "runtime") << "rank " << rt.rank() << " (generation " << rt.generation()
                                  << "): " << why << ": waiting up to " << bound.count() / 1000.0
                                  << " s for the launcher's next generation (in-process recovery)";
    }
    if (rt.comm()) rt.comm()->abort();
    if (!regroup) rt.reportCollectiveFailure();
    int g = 0;
    try {
      g = rt.awaitNextGeneration(bound);
    } catch (const TimeoutError& e) {
      throw BackendError(why + "; " + e.what());
    }
    const int rankBefore = rt.rank();
    const int worldBefore = rt.worldSize();
    failure = collectiveFailure([&] {
      rt.reform(g);
      heal(rt, state);  // every rank's commit is now the root's: no commit() after the reset
      loop.reset();
      rt.announceState();
    });
    if (failure) continue;  // a death during the recovery: the next generation
    const std::string cause = rt.generationCause(g);
    const bool grew = rt.worldSize() > worldBefore;
    ddprun::timeline::span(grew ? "grow" : "recovery", "runtime", startUs,
                           ddprun::timeline::nowUs() - startUs,
                           faults.addTo(ddprun::timeline::Args()
                                            .add("generation", g)
                                            .add("cause", cause)));
    const std::string place =
        rt.worldSize() != worldBefore
            ? " as rank " + std::to_string(rt.rank()) + " of " + std::to_string(rt.worldSize()) +
                  " (was rank " + std::to_string(rankBefore) + " of " +
                  std::to_string(worldBefore) + "; the group " +
                  (grew ? "grew" : "shrank") + ")"
            : std::string();
    if (grew) {
      // Grow back: no failure. A rank that saw the generation at its commit lost nothing; one
      // that was already in the next step's collective rolled that step back.
      ++stats.regroups;
      DDPRUN_LOG(INFO, "runtime") << "rank " << rt.rank() << " re-formed in "
                                  << static_cast<int64_t>(msSince(start)) << " ms: generation "
                                  << g << (cause.empty() ? std::string() : " (" + cause + ")")
                                  << ", at commit " << state.commits()
                                  << (regroup ? "" : " (this rank rolled back the step it was in)")
                                  << "; this process keeps running" << place;
      continue;
    }
    ++stats.recoveries;
    DDPRUN_LOG(WARN, "runtime") << "rank " << rt.rank() << " recovered in process in "
                                << static_cast<int64_t>(msSince(start)) << " ms: generation " << g
                                << (cause.empty() ? std::string() : " (" + cause + ")")
                                << ", back to commit " << state.commits()
                                << "; this process keeps running" << place;
  }
}

}  // namespace ddprun::runtime
