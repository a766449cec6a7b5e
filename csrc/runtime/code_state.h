// Per-code-object state kept in co_extra: the skip decision, decoded bytecode and the regions.
#pragma once

#include <Python.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bytecode/decode.h"
#include "bytecode/opcodes.h"
#include "common/py.h"
#include "guards/guards.h"
#include "guards/source.h"
#include "region/exit.h"
#include "region/rebuild.h"
#include "trace/sizes.h"
#include "trace/trace_host.h"

namespace framejit {

class Graph;

// What one framejit.compile(...) call asked for. Shared by its wrapper and every region it made.
struct CompileContext {
  uint64_t id = 0;     // unique per process (never reused, unlike the address)
  py::object backend;  // backend(gm, example_inputs) -> callable
  std::string backend_name;
  bool fullgraph = false;
  bool warm_branches = false;
  int recompile_limit = 8;
  // The backend runs any size (its callable has framejit_shape_generic): regions that read no
  // size into Python guard ranks, not sizes.
  bool any_sizes = false;
  // framejit.compile(dynamic=...): -1 None (automatic: a size that changed between compiles at
  // one place becomes symbolic), 0 False (never symbolic), 1 True (symbolic from the start).
  int dynamic = -1;
  // A backend that does not run any size (inductor, a user's callable) and sizes may be
  // symbolic: a region whose input sizes changed is traced again with symbolic sizes and its
  // graph handed over with fake inputs of a ShapeEnv (python/framejit/_dynamic.py).
  bool symbolic_backend() const { return !any_sizes && dynamic != 0; }
  py::object on_region;  // None, or called with a dict per new region (framejit.explain)
  // The compiled function's own code where the trace policy would not hook it as a frame
  // (torch.nn.Linear compiled on its own, a function made by exec): hooked as this context's
  // frame only, so compiling it does not change how it runs anywhere else.
  py::object entry_code;
};

enum class RegionKind : uint8_t {
  kCompiled,  // run the graph, rebuild the exit state, perform or resume at the exit
  kFallback,  // these guards lead to something untraceable at the entry: CPython runs from here
};

// One straight trace from an entry pc, keyed by its entry stack shape and its guards.
struct Region {
  int id = -1;  // unique per process, for explain() and code_stats()
  RegionKind kind = RegionKind::kFallback;
  int entry_pc = 0;
  std::vector<bool> entry_nulls;  // per entry stack position: NULL (a callable marker)
  std::shared_ptr<CompileContext> ctx;
  SourceTable sources;
  GuardSet guards;
  std::vector<Rebuild> inputs;  // graph inputs in placeholder order (slots, or scalar expressions)
  // Per graph output: its meta tensor and real device, to stand in for it when warm_branches
  // traces what lies behind this region without running it.
  std::vector<std::pair<py::object, py::object>> output_metas;
  py::object compiled;          // the backend's callable; None when the graph has no op
  RegionExit exit;
  int graph_id = -1;  // __compiled_fn_<id>, -1 when no graph went to the backend
  int graph_ops = 0;
  // A trace whose only ops switched the grad mode (the region between torch.optim's graph
  // breaks, inside its no_grad): no graph; the runtime makes the last switch itself, where the
  // graph would have run, as torch.compile drops such graphs. Null when there is none.
  py::object grad_switch;       // torch._C._set_grad_enabled
  py::object grad_switch_mode;  // its argument: True or False
  // The graph may write into a tensor: when it raises, the frame can run the region again in
  // plain Python only if no input's version counter moved (see run_graph).
  bool graph_mutates = false;
  std::vector<int> mutated_inputs;  // the inputs (by index) the graph writes into
  // mutated_inputs as a mask over all inputs (read per input on every call of such a graph): an
  // input of no counter (an inference tensor) rules out a rerun only where it is set.
  std::vector<bool> may_write_input;
  bool unversioned_writes = false;  // some of them where version counters do not show it
  // Raised at the region's entry, an exception would lose something eager keeps: the region
  // writes attributes or globals, or spans a try block its entry is outside of.
  bool raise_at_entry_loses = false;
  bool raise_warned = false;  // told the user once that its graph raised after such a write
  std::string graph_text;
  std::string reason;  // kFallback: why, with the user's file:line
  bool warmed = false;  // compiled ahead of need by warm_branches
  uint64_t hits = 0;
};

struct CodeState {
  // kSkip: the trace policy does not hook it (unless it is a compiled function's own entry
  // code); kGivenUp: the runtime stopped hooking it (an internal error, or a helper that makes
  // no graph) until reset().
  enum class Decision : uint8_t { kUnknown, kSkip, kRun, kGivenUp };
  Decision decision = Decision::kUnknown;
  std::unique_ptr<Bytecode> bytecode;
  std::vector<std::unique_ptr<Region>> regions;  // all, in the order they were made
  bool limit_warned = false;
  // (pc, compile context) of the regions a thread is tracing or compiling now: another thread
  // arriving there runs that part in plain Python meanwhile instead of compiling it again.
  std::vector<std::pair<int, const CompileContext*>> compiling;
  // Automatic dynamic shapes: the input sizes each place compiled for, by (compile context id,
  // pc, source text), and the dims seen to change (python/framejit/_dynamic.py keeps them).
  py::dict sizes_seen;
  // Numbers in the middle of the frame each place pinned, by (compile context id, pc): see
  // PinnedNumbers (trace/entry_state.h).
  std::map<std::pair<uint64_t, int>, PinnedNumbers> pinned_numbers;

  // The regions that start at `pc`, oldest first: the lookup at each region entry reads only
  // these (one index, no hashing), so it does not grow with the regions elsewhere in the frame.
  const std::vector<Region*>& at(int pc) const {
    static const std::vector<Region*> kNone;
    return pc >= 0 && static_cast<size_t>(pc) < by_entry_.size() ? by_entry_[pc] : kNone;
  }
  Region* add(std::unique_ptr<Region> region) {
    Region* raw = region.get();
    if (static_cast<size_t>(raw->entry_pc) >= by_entry_.size()) by_entry_.resize(raw->entry_pc + 1);
    by_entry_[raw->entry_pc].push_back(raw);
    regions.push_back(std::move(region));
    return raw;
  }
  // Every region, handed over (the code state has none after).
  std::vector<std::unique_ptr<Region>> take_regions() {
    by_entry_.clear();
    return std::move(regions);
  }

 private:
  std::vector<std::vector<Region*>> by_entry_;  // by entry pc (code unit)
};

// The state of `code`, created on first use. Borrowed: code. Never NULL (raises InternalError).
CodeState* code_state(PyCodeObject* code);
// The state if it exists, else nullptr.
CodeState* find_code_state(PyCodeObject* code);
// Drops every region and skip decision of every code object (framejit.reset()).
void reset_all_code_states();
// Forgets skip decisions only (after the skip rules change).
void reset_skip_decisions();

// The trace policy: (file-name prefix, TraceRule as an int); the longest matching prefix
// decides, a file none matches is traced.
void set_trace_rules(const std::vector<std::pair<std::string, int>>& rules);
// One code object traced even if its file is skipped (held for the process's life).
void allow_code(py::object code);
// Whether the hook runs `code` as plain Python: as a frame of its own (`as_frame`), or inlined
// into traced code (false).
bool should_skip_code(PyCodeObject* code, bool as_frame);

// The code object's decoded bytecode, decoded on first use (and logged under `bytecode`) and kept
// in its CodeState. Borrowed: code.
const Bytecode& decoded_bytecode(PyCodeObject* code, CodeState& state);

// The runtime's side of trace/trace_host.h: the skip rules above and the bytecode kept in each
// code object's CodeState.
TraceHost& runtime_trace_host();

}  // namespace framejit
