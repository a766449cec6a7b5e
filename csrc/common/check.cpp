// Names of break categories, as they appear in logs and fullgraph errors.
#include "common/check.h"

namespace framejit {

const char* break_kind_name(BreakKind kind) {
  switch (kind) {
    case BreakKind::kUnsupportedOpcode: return "unsupported_opcode";
    case BreakKind::kUnsupportedCall: return "unsupported_call";
    case BreakKind::kDataDependent: return "data_dependent";
    case BreakKind::kSideEffect: return "side_effect";
    case BreakKind::kMetaFailure: return "meta_failure";
    case BreakKind::kUnsupportedValue: return "unsupported_value";
    case BreakKind::kTraceTooLong: return "trace_too_long";
  }
  return "unknown";
}

}  // namespace framejit
