// The runtime's process-wide state: its part of the one module state (csrc/module_state.h).
// Per-thread state (is the hook on for this thread, which compile call) is ThreadState.
#pragma once

#include <Python.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/py.h"

namespace framejit {

struct CodeState;

// What the trace policy says of a file: not traced, traced, or traced only where traced code
// calls into it (inlined; never a frame of its own for the hook: the parts of the standard
// library the tracer handles, code made by exec such as dataclass methods).
enum class TraceRule : int { kSkip = 0, kTrace = 1, kInlineOnly = 2 };

struct RuntimeState {
  Py_ssize_t extra_index = -1;               // the co_extra slot of CodeState
  std::unordered_set<CodeState*> registry;   // every live CodeState (framejit.reset())
  // The trace policy: (file-name prefix, TraceRule), longest prefix first; the first that
  // matches a code object's file decides; a file no rule matches is traced.
  std::vector<std::pair<std::string, TraceRule>> path_rules;
  // Code objects inlined even though their file is skipped: framejit's own Python forms and
  // the helpers they call (_python_forms.py). Never hooked as frames. Strong references.
  std::vector<py::object> allow_codes;
  int active_threads = 0;  // threads inside a compiled function (GIL-protected)
  int next_graph_id = 0;
  int next_region_id = 0;
  PyObject* compiled_type = nullptr;  // Borrowed: the CompiledFunction type made at module init
  // Regions and decoded bytecode that framejit.reset() dropped while a compiled call ran on some
  // thread (it may be running them): freed when no compiled call runs.
  std::vector<std::shared_ptr<void>> retired;
};

RuntimeState& runtime_state();

}  // namespace framejit
