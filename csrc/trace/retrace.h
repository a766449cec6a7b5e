// The signals a trace throws to its caller (the runtime's compile loop) to be traced again
// differently: with a call site not inlined, or with sizes as constants.
#pragma once

#include <Python.h>

#include <string>
#include <utility>
#include <vector>

namespace framejit {

// A call site whose callee must not be inlined, because tracing through it broke; the region
// then ends at that call instead. The whole path of inlined calls that reached it, each a
// (code object, code unit of its CALL), from the region's own frame down: a shared helper
// (collections.abc's Mapping.get) that breaks when one caller reaches it stays inlined for the
// others.
using CallSite = std::vector<std::pair<PyCodeObject*, int>>;

// Thrown out of Tracer::run when an inlined callee cannot be traced: the caller retraces with
// `site` not inlined (at most a few times: once per level of inlining).
struct InlineBreak {
  CallSite site;
  std::string reason;
};

// Thrown out of Tracer::run when a region with symbolic sizes ends at an instruction that had a
// size expression among its operands: the caller retraces with sizes as constants (specialised),
// so a symbolic size never makes a region shorter than a constant one would. `ints_only`: the
// operands held int inputs (Value::int_input) but no tensor size: only those are pinned.
struct StaticSizesRetrace {
  bool ints_only = false;
};

// Thrown out of Tracer::run when the traced program raised (Unsupported::program_raised) after
// the trace had answered a compiling flag (`is_torchdynamo_compiling()`, ...) True: the
// library's compile-only path fails where its eager one does not (switch_transformers leaves
// its attention mask None "under compile", then indexes it), or called a higher-order op only
// torch.compile's tracer handles (Mamba's associative_scan). The caller retraces with the
// flags answering False, as eager's Python would.
struct CompilingFlagRetrace {
  std::string reason;  // what failed on the compile-only path (logged as a graph break)
};

}  // namespace framejit
