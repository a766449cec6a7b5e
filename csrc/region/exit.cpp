// Names of exit kinds, for logs and explain().
#include "region/exit.h"

namespace framejit {

const char* exit_kind_name(ExitKind kind) {
  switch (kind) {
    case ExitKind::kReturn: return "return";
    case ExitKind::kBranch: return "branch";
    case ExitKind::kCall: return "call";
    case ExitKind::kIter: return "iterate";
    case ExitKind::kWith: return "with";
    case ExitKind::kSubscr: return "subscript";
    case ExitKind::kDeopt: return "deopt";
  }
  return "?";
}

}  // namespace framejit
