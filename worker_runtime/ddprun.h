#pragma once
// Everything a training program needs from ddprun::runtime, in one include.
#include "base/timeline.h"  // ddprun::timeline::Scope: your own spans on the job's timeline
#include "worker_runtime/backend.h"
#include "worker_runtime/checkpoint.h"
#include "worker_runtime/communicator.h"
#include "worker_runtime/ddp.h"
#include "worker_runtime/elastic/elastic_run.h"
#include "worker_runtime/elastic/elastic_state.h"
#include "worker_runtime/env.h"
#include "worker_runtime/error_file.h"
#include "worker_runtime/gloo_communicator.h"
#include "worker_runtime/nccl_communicator.h"
#include "worker_runtime/progress.h"
#include "worker_runtime/runtime.h"
#include "worker_runtime/sampler.h"
