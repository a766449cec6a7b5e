// Fault injection for tests: the tracer, the export of a region to a GraphModule, or the backend
// call fails at its Nth opportunity (framejit.testing.inject_fault, FRAMEJIT_INJECT_FAULT=site:n),
// to show that every internal fault falls back to plain Python with one warning and the right
// result. Off unless armed; one compare per opportunity.
#pragma once

#include <cstdint>

namespace framejit {

enum class FaultSite : uint8_t { kNone, kTrace, kExport, kBackend };

struct FaultInjection {
  FaultSite site = FaultSite::kNone;  // armed for this site, or none
  int64_t countdown = 0;              // opportunities left until it fires (1: the next)
};

// Part of the one module state (csrc/module_state.h).
FaultInjection& fault_injection();

// Whether the armed fault fires now at `site` (then it is disarmed).
inline bool fault_due(FaultSite site) {
  FaultInjection& fault = fault_injection();
  if (fault.site != site || --fault.countdown > 0) return false;
  fault.site = FaultSite::kNone;
  return true;
}

}  // namespace framejit
