// Per-code-object state kept in co_extra: the skip decision, decoded bytecode and the regions.
#pragma once

#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include "bytecode/decode.h"
#include "common/py.h"
#include "guards/guards.h"
#include "guards/source.h"
#include "runtime/rebuild.h"

namespace framejit {

class Graph;

// What one framejit.compile(...) call asked for. Shared by its wrapper and every region it made.
struct CompileContext {
  py::object backend;  // backend(gm, example_inputs) -> callable
  std::string backend_name;
  bool fullgraph = false;
  int recompile_limit = 8;
};

enum class RegionKind : uint8_t {
  kCompiled,  // run `compiled` on the inputs, rebuild the result
  kFallback,  // these guards lead to something untraceable: CPython runs the frame
};

// One straight trace from an entry pc, keyed by its guards.
struct Region {
  RegionKind kind = RegionKind::kFallback;
  int entry_pc = 0;
  std::shared_ptr<CompileContext> ctx;
  SourceTable sources;
  GuardSet guards;
  std::vector<int> input_slots;  // graph inputs, in placeholder order
  py::object compiled;           // the backend's callable; None when the graph has no op
  Rebuild result;
  int graph_id = -1;             // __compiled_fn_<id>, -1 when no graph went to the backend
  int graph_ops = 0;
  std::string graph_text;
  std::string reason;            // kFallback: why, with the user's file:line
  uint64_t hits = 0;
};

struct CodeState {
  enum class Decision : uint8_t { kUnknown, kSkip, kRun };
  Decision decision = Decision::kUnknown;
  std::unique_ptr<Bytecode> bytecode;
  std::vector<std::unique_ptr<Region>> regions;
  bool limit_warned = false;
};

// The state of `code`, created on first use. Borrowed: code. Never NULL (raises InternalError).
CodeState* code_state(PyCodeObject* code);
// The state if it exists, else nullptr.
CodeState* find_code_state(PyCodeObject* code);
// Drops every region and skip decision of every code object (framejit.reset()).
void reset_all_code_states();
// Forgets skip decisions only (after the skip rules change).
void reset_skip_decisions();

// Frame-skip rules: file-name prefixes never traced, and prefixes traced even so.
void set_skip_rules(std::vector<std::string> skip, std::vector<std::string> allow);
bool should_skip_code(PyCodeObject* code);

}  // namespace framejit
