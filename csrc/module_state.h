// The one module state: every process-wide piece of framejit._C's state, one part per layer, each
// declared in its own layer (log/log.h, trace/trace_state.h, runtime/runtime_state.h) and reached
// through that layer's accessor. Made on first use and never destroyed: code objects and
// compiled functions may outlive the module during interpreter teardown. What is not here is
// per-thread (runtime/thread_state.h) or the C shim's hook flag (runtime/eval_frame.c).
#pragma once

#include "common/fault.h"
#include "log/log.h"
#include "runtime/runtime_state.h"
#include "trace/trace_state.h"

namespace framejit {

struct ModuleState {
  FaultInjection faults;  // tests only
  LogState log;
  TraceState trace;
  RuntimeState runtime;
};

ModuleState& module_state();

}  // namespace framejit
