// The trace layer's process-wide state: its part of the one module state (csrc/module_state.h).
// Nothing in trace/ keeps mutable state anywhere else.
#pragma once

#include <string>
#include <unordered_map>

#include "trace/kinds.h"
#include "trace/pyrefs.h"
#include "trace/recorder.h"

namespace framejit {

struct TraceState {
  PyRefs refs;  // set by framejit._C._init
  bool refs_ready = false;
  MetaMemo meta;  // survives framejit.reset(): a pure function of torch's ops
  std::unordered_map<std::string, TensorMethodKind> tensor_method_kinds;
};

TraceState& trace_state();

}  // namespace framejit
