// The one module state and the per-layer accessors into it.
#include "module_state.h"

namespace framejit {

ModuleState& module_state() {
  static ModuleState* state = new ModuleState();  // never destroyed: see the header
  return *state;
}

FaultInjection& fault_injection() { return module_state().faults; }
LogState& log_state() { return module_state().log; }
TraceState& trace_state() { return module_state().trace; }
RuntimeState& runtime_state() { return module_state().runtime; }

}  // namespace framejit
