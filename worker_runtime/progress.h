#pragma once
// Progress and liveness for ddprun's agent (docs/launcher.md#progress-watch), through the file
// the agent created for this worker (DDPRUN_PROGRESS_FILE, base/progress_file.h). Both are
// no-ops when there is none (another launcher, the watches off). Thread-safe, never throw.
namespace ddprun::runtime {

// Tells the agent that this worker made progress, for --stall-warning.
// DistributedDataParallel calls it once per synchronised backward; a program without it calls
// it once per step (or per evaluation batch). A relaxed atomic add.
void reportProgress();

// Starts this process's heartbeat, for --peer-timeout: a thread that bumps a counter at the
// period the agent asked for (a relaxed atomic add, then sleep), until the process ends. It
// beats through long steps and collectives and stops only when the whole process does
// (SIGSTOP, a debugger, a frozen cgroup): the agent then kills this worker and restarts the
// group. init() calls it first thing; a program that does not use init() may call it. Idempotent.
void startHeartbeat();

}  // namespace ddprun::runtime
