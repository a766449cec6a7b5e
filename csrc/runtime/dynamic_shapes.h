// Dynamic shapes for backends that do not run any size themselves (inductor, aot_eager, a user's
// backend(gm, example_inputs)): which input dims a region's graph gets as symbolic sizes, and the
// compile of that graph with fake inputs of a ShapeEnv, whose guards join the region's.
//
// framejit's own backends run any size (CompileContext::any_sizes) and need none of this. For
// the others, `dynamic` means what it means to torch.compile: None compiles a place with static
// sizes first and, when it compiles there again because a size changed, makes the dims that
// changed symbolic (automatic dynamic); True makes every dim of the frame's own tensors
// symbolic from the first compile; False never. Dims marked with framejit.mark_dynamic /
// torch._dynamo.mark_dynamic (and maybe_mark_dynamic) are symbolic from the first compile,
// mark_static ones never. A dim whose size Python reads (sizes.h) stays pinned, and so do sizes
// 0 and 1 (a backend treats them apart, as torch.compile does). An int read by source that
// changed between compiles (a position argument) is a graph input as for framejit's own
// backends, handed to the backend as a SymInt of the same ShapeEnv (0 and 1 too, as
// torch.compile does). The Python half is python/framejit/_dynamic.py.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/py.h"
#include "guards/guards.h"
#include "guards/source.h"
#include "region/rebuild.h"
#include "runtime/code_state.h"

namespace framejit {

class Tracer;

struct SymbolicDims {
  // source slot -> symbolic dims; {-1} for an int input (Value::int_input), handed to the
  // backend as a SymInt
  std::map<int, std::set<int>> by_slot;
  py::list by_input;                     // per graph input: list of dims (empty if none)
  std::string text;                      // "L['x'] dims [0]; L['y'] dims [0, 1]"
  bool empty() const { return by_slot.empty(); }
};

// Whether the region to trace at `pc` should be traced with symbolic sizes for a backend that
// does not run any size: dynamic=True, a place compiled before (its sizes may have changed), or
// a frame local marked dynamic. Borrowed: code.
bool wants_symbolic_trace(const CompileContext& ctx, const CodeState& state, int pc,
                          PyCodeObject* code, const FrameState& fs);

// The dims of the traced region's inputs to make symbolic, remembering this compile's sizes in
// `state` for the next one (empty: none, trace with constant sizes).
SymbolicDims plan_symbolic_dims(const CompileContext& ctx, CodeState& state, int pc,
                                Tracer& tracer);

// Hands the graph to ctx's backend with symbolic sizes for `dims` and returns its callable; the
// guards its ShapeEnv recorded are added to `guards`.
py::object compile_with_symbolic_sizes(const CompileContext& ctx, const SymbolicDims& dims,
                                       py::object gm, py::list example_inputs,
                                       const std::vector<Rebuild>& inputs,
                                       const SourceTable& sources, GuardSet& guards);

}  // namespace framejit
