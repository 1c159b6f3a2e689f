#pragma once
// The spare template's wire format (docs/recovery.md#spare-template): what the agent
// (launcher/spare_template.h) and the template process (worker_runtime/spare/spare_template.h) say
// on the socket pair between them. Here because both sides use it and both depend on
// rendezvous/, never on each other.
//
//   agent -> template   Output + SCM_RIGHTS{fd}     first, to a template forked from a rank:
//                                                   where its own lines go (ddprun's stderr)
//   template -> agent   Reply{Loading, pid}         first, from a template forked from a rank
//                                                   (the agent knows no other pid of it)
//   template -> agent   Reply{Ready, pid}           once, when it can fork (loaded, one thread)
//   agent -> template   Request + SCM_RIGHTS{control, status, stdout, stderr}, then
//                       `envBytes` of the spare's environment ("KEY=VALUE\0" entries)
//   template -> agent   Reply{Forked, guard pid} or Reply{Failed, errno}, one per request
//
// The four descriptors are those of a guarded worker (launcher/guarded_process.h): the forked
// guard reads the control socket and writes StatusRecords on the status pipe, as a guard does.
// Fixed-size records on a stream socket: each side reads whole records.
#include <cstdint>

namespace ddprun::rendezvous::spare_fork {

// The variable that makes a worker program's init() a template: the descriptor number of its
// end of the socket.
inline constexpr const char* kTemplateFdVariable = "DDPRUN_SPARE_TEMPLATE_FD";
// Instead, to local rank 0 (shrink without spares): the descriptor of the template's socket,
// on which rank 0 forks the template at its init() (worker_runtime/spare/spare_template.h).
inline constexpr const char* kTemplateForkFdVariable = "DDPRUN_SPARE_TEMPLATE_FORK_FD";
// "1" when the agent started the template under SCHED_IDLE (a background template: shrink
// without spares), so that out of SCHED_IDLE it knows a grow back waits for it.
inline constexpr const char* kTemplateIdleVariable = "DDPRUN_SPARE_TEMPLATE_IDLE";

inline constexpr uint32_t kRequestMagic = 0x64647370;  // "ddsp"
inline constexpr uint32_t kOutputMagic = 0x6464736f;   // "ddso"

struct Output {
  uint32_t magic = kOutputMagic;
};

struct Request {
  uint32_t magic = kRequestMagic;
  int32_t spareId = -1;    // the new spare's DDPRUN_SPARE
  int32_t idle = 0;        // 1: SCHED_IDLE (a spare started while training runs); 0: SCHED_OTHER
  uint32_t envBytes = 0;   // the environment that follows (at most kMaxEnvBytes)
};
inline constexpr uint32_t kMaxEnvBytes = 1U << 20;

struct Reply {
  enum Kind : int32_t { Ready = 1, Forked = 2, Failed = 3, Loading = 4 };
  int32_t kind = 0;
  int32_t value = 0;
};

// A guard's records on the status pipe (the same as launcher::GuardRecord, which asserts it).
struct StatusRecord {
  enum Kind : int32_t { Started = 1, ExecFailed = 2, Exited = 3 };
  int32_t kind;
  int32_t value;
};

}  // namespace ddprun::rendezvous::spare_fork
