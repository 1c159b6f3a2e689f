#pragma once
// runElastic(): a training loop that survives a peer's death without leaving its process, in
// the spirit of Horovod's hvd.elastic.run (docs/recovery.md has the whole sequence).
//
//   runtime::ElasticState state;  ... register model, optimizer, counters (elastic_state.h)
//   runtime::runElastic(*rt, state, {
//       .reset = [&] { ddp.emplace(model, rt->comm()); },   // what uses the communicator
//       .body  = [&] { for (; step < end; ++step) { train(step); state.commit(); } }});
//
// Under `ddprun --recovery=in-process|auto` on one node (Runtime::inProcessRecovery()):
//   - start: reset(), commit, and the runtime tells the agent it holds the state;
//   - a collective of body() fails (BackendError or TimeoutError: a peer died; the shm
//     transport notices a dead peer within its poll period, a TCP peer's death closes the
//     connection): this rank aborts its communicator (peers still waiting on it wake at once),
//     waits -- bounded by DDPRUN_RECOVERY_TIMEOUT (60 s) -- for the agent's next generation,
//     builds that generation's communicator under keys of its own, rolls back to its last
//     commit, and the state of the lowest rank that holds one (a survivor) is broadcast to all:
//     the replacement heals from a survivor's memory, never from disk. Then reset(), commit,
//     and body() again, from the committed counters;
//   - a replacement (started by the agent in generation g) does the same from "builds": it
//     holds nothing, so it only receives;
//   - under --recovery-policy=shrink no replacement comes: generation g has the survivors only,
//     numbered densely (Runtime::reform), so rt.rank() and rt.worldSize() may differ when
//     reset() runs: reset() rebuilds whatever depends on them (the sampler's split, the global
//     batch, who is rank 0), from the committed counters (the sampler position).
//   - grow back (--recovery-policy=shrink): once a replacement is ready the launcher publishes a
//     generation with one rank more while the ranks train; each rank takes it at its next
//     commit (state.commit() throws an internal signal, caught here: a program's body lets it
//     through as it does a collective's error), re-forms, and the replacement heals from the
//     lowest rank's memory. A rank already in the next step's collective fails and rolls
//     back that one step. The runtime's watch thread (Runtime::watchNextGeneration) is what
//     makes the check at a commit a load of a flag, not a store round trip.
// A failure during a recovery starts the next one (the agent publishes a newer generation, or
// the wait ends with an error). No generation within the bound: the collective's error is
// thrown, with why, and the program exits as without recovery (the launcher restarts).
// Elsewhere (restart mode, no agent store, several nodes, one rank): reset() then body(),
// once; commits do nothing; errors propagate.
// Errors other than BackendError / TimeoutError (a bad setting, a full disk) always propagate.
#include <functional>

#include "worker_runtime/elastic/elastic_state.h"
#include "worker_runtime/runtime.h"

namespace ddprun::runtime {

struct ElasticLoop {
  // Builds what holds the communicator (DDP, a metrics reducer): at the start and after each
  // recovery, when the state is in place. Collective: every rank runs it at the same point.
  std::function<void()> reset;
  // The loop, from the state's counters to the end; state.commit() at each consistent point
  // (after an optimizer step). Must be re-entrant: after a recovery it runs again from the
  // restored counters.
  std::function<void()> body;
};

// What happened, for logs and tests.
struct ElasticRunStats {
  int recoveries = 0;   // generations this process moved to after a failure
  int regroups = 0;     // generations with more ranks it moved to (grow back): no failure
  bool healed = false;  // it started as a replacement and received the state
};

ElasticRunStats runElastic(Runtime& rt, ElasticState& state, const ElasticLoop& loop);

}  // namespace ddprun::runtime
