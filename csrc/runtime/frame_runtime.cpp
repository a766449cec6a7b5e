// The frame runtime: for each frame the hook hands over, find a region whose guards pass (or
// trace and compile one), run it, and return the frame's result; else let CPython run the frame.
#include <fmt/format.h>

#include <atomic>

#include "common/check.h"
#include "graph/fx_export.h"
#include "graph/printer.h"
#include "log/log.h"
#include "runtime/eval_frame.h"
#include "runtime/frame_runtime.h"
#include "runtime/thread_state.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

int g_active_threads = 0;  // threads inside a compiled function (GIL-protected)
int g_next_graph_id = 0;
thread_local ThreadState t_state;

std::string code_location(PyCodeObject* code, int line) {
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  const char* name = PyUnicode_AsUTF8(code->co_qualname);
  if (!file || !name) PyErr_Clear();
  return fmt::format("{} ({}:{})", name ? name : "?", file ? file : "?", line);
}

std::string source_line(PyCodeObject* code, int line) {
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  if (!file) {
    PyErr_Clear();
    return {};
  }
  return linecache_source(file)(line);
}

int line_of(PyCodeObject* code, const Bytecode& bytecode, int pc) {
  const int index = bytecode.index_at(pc);
  if (index < 0) return code->co_firstlineno;
  const int line = bytecode.instrs()[index].line;
  return line >= 0 ? line : code->co_firstlineno;
}

// Makes a fallback region from what a failed trace had assumed so far.
std::unique_ptr<Region> fallback_region(Tracer& tracer, const std::shared_ptr<CompileContext>& ctx,
                                        std::string reason) {
  auto region = std::make_unique<Region>();
  region->kind = RegionKind::kFallback;
  region->ctx = ctx;
  region->sources = std::move(tracer.sources());
  region->guards = std::move(tracer.guards());
  region->reason = std::move(reason);
  return region;
}

void raise_fullgraph(const std::string& message) {
  PyErr_SetString(PyRefs::get().unsupported_error.ptr(), message.c_str());
}

// Traces the frame from pc 0 and compiles the graph. Returns NULL with a Python exception set
// only for fullgraph=True failures; every other failure gives a fallback region.
std::unique_ptr<Region> compile_region(CodeState& state, PyCodeObject* code,
                                       const FrameState& frame,
                                       const std::shared_ptr<CompileContext>& ctx) {
  PauseScope pause;
  if (!state.bytecode) state.bytecode = Bytecode::from_code(code);
  if (log_enabled(Artifact::bytecode)) {
    log_emit(Artifact::bytecode, fmt::format("BYTECODE {}\n{}",
                                             code_location(code, code->co_firstlineno),
                                             state.bytecode->to_string()));
  }
  Tracer tracer(code, *state.bytecode, frame);
  try {
    tracer.run();
  } catch (const Unsupported& e) {
    const int line = line_of(code, *state.bytecode, e.pc);
    std::string reason = fmt::format("{} [{}] at {}: {}", e.what(), break_kind_name(e.kind()),
                                     code_location(code, line), source_line(code, line));
    if (ctx->fullgraph) {
      raise_fullgraph("framejit (fullgraph=True): cannot trace " + reason);
      return nullptr;
    }
    log_emit(Artifact::graph_breaks,
             fmt::format("frame {} runs in plain Python: {}",
                         code_location(code, code->co_firstlineno), reason));
    return fallback_region(tracer, ctx, std::move(reason));
  } catch (const InternalError& e) {
    std::string reason = fmt::format("internal error while tracing {}: {}",
                                     code_location(code, code->co_firstlineno), e.what());
    warn("framejit: " + reason + "; the frame runs in plain Python");
    return fallback_region(tracer, ctx, std::move(reason));
  } catch (const py::error_already_set& e) {
    std::string reason = fmt::format("Python error while tracing {}: {}",
                                     code_location(code, code->co_firstlineno), e.what());
    warn("framejit: " + reason + "; the frame runs in plain Python");
    return fallback_region(tracer, ctx, std::move(reason));
  }

  auto region = std::make_unique<Region>();
  region->kind = RegionKind::kCompiled;
  region->ctx = ctx;
  Graph& graph = tracer.graph();
  graph.lint();
  region->result = tracer.result();
  region->input_slots = tracer.input_slots();
  region->graph_ops = graph.num_calls();
  region->compiled = py::none();
  region->sources = std::move(tracer.sources());
  region->guards = std::move(tracer.guards());
  if (region->graph_ops == 0) return region;  // nothing for a backend: rebuild from inputs only

  region->graph_id = g_next_graph_id++;
  region->graph_text = print_graph(graph, linecache_source(graph.filename()));
  if (log_enabled(Artifact::graph_code)) {
    log_emit(Artifact::graph_code,
             fmt::format("TRACED GRAPH\n ===== __compiled_fn_{} =====\n{}", region->graph_id,
                         region->graph_text));
  }
  if (log_enabled(Artifact::guards)) {
    log_emit(Artifact::guards, fmt::format("GUARDS __compiled_fn_{} ({}):\n{}", region->graph_id,
                                           code_location(code, code->co_firstlineno),
                                           region->guards.to_string(region->sources)));
  }
  // Example inputs are this call's live values; the list is dropped right after the backend
  // returns, so the cache never keeps an input tensor alive.
  try {
    SlotValues slots;
    FJ_CHECK(region->guards.check(region->sources, frame, slots),
             "the guards of a fresh trace fail on the state it was traced from");
    py::object gm = export_fx(graph);
    py::list example_inputs;
    for (int slot : region->input_slots) {
      example_inputs.append(py::reinterpret_borrow<py::object>(slots[slot]));
    }
    region->compiled = ctx->backend(gm, example_inputs);
  } catch (const std::exception& e) {
    std::string reason = fmt::format("backend '{}' failed on __compiled_fn_{} of {}: {}",
                                     ctx->backend_name, region->graph_id,
                                     code_location(code, code->co_firstlineno), e.what());
    if (ctx->fullgraph) {
      PyErr_Clear();
      raise_fullgraph("framejit (fullgraph=True): " + reason);
      return nullptr;
    }
    PyErr_Clear();
    warn("framejit: " + reason + "; the frame runs in plain Python");
    region->kind = RegionKind::kFallback;
    region->reason = std::move(reason);
    region->compiled = py::none();
  }
  return region;
}

// Runs a compiled region on the slot values its guards read. Returns New or NULL.
PyObject* run_region(Region& region, const SlotValues& slots) {
  ++region.hits;
  if (region.graph_ops == 0) return region.result.build(nullptr, slots);
  // Hot path: raw vectorcall, inputs borrowed from the slots.
  constexpr size_t kInline = 16;
  PyObject* inline_args[kInline];
  std::vector<PyObject*> heap_args;
  PyObject** args = inline_args;
  const size_t n = region.input_slots.size();
  if (n > kInline) {
    heap_args.resize(n);
    args = heap_args.data();
  }
  for (size_t i = 0; i < n; ++i) args[i] = slots[region.input_slots[i]];
  PyObject* outputs;
  {
    PauseScope pause;
    outputs = PyObject_Vectorcall(region.compiled.ptr(), args, n, nullptr);  // New
  }
  if (outputs == nullptr) return nullptr;
  if (!PyTuple_Check(outputs) && !PyList_Check(outputs)) {
    PyErr_Format(PyExc_TypeError,
                 "framejit: backend '%s' returned %s from a compiled graph, expected a tuple",
                 region.ctx->backend_name.c_str(), Py_TYPE(outputs)->tp_name);
    Py_DECREF(outputs);
    return nullptr;
  }
  PyObject* result = region.result.build(outputs, slots);
  Py_DECREF(outputs);
  return result;
}

PyObject* handle_frame(PyThreadState* tstate, FjFrame* frame, CodeState& state,
                       PyCodeObject* code) {
  ThreadState& ts = t_state;
  CompileContext* ctx = ts.ctx;
  const FrameState fs{fj_frame_localsplus(frame), fj_frame_globals(frame),
                      fj_frame_builtins(frame)};
  SlotValues slots;
  int tried = 0;
  for (auto& region : state.regions) {
    if (region->ctx.get() != ctx) continue;
    ++tried;
    if (!region->guards.check(region->sources, fs, slots)) continue;
    if (region->kind == RegionKind::kFallback) {
      slots.clear();
      return fj_eval_default(tstate, frame, 0);
    }
    return run_region(*region, slots);
  }
  slots.clear();
  if (tried >= ctx->recompile_limit) {
    if (!state.limit_warned) {
      state.limit_warned = true;
      warn(fmt::format("framejit: {} hit recompile_limit ({}); it now runs in plain Python for "
                       "inputs that match none of its {} compiled versions",
                       code_location(code, code->co_firstlineno), ctx->recompile_limit, tried));
    }
    return fj_eval_default(tstate, frame, 0);
  }
  if (tried > 0 && log_enabled(Artifact::recompiles)) {
    for (auto& region : state.regions) {
      if (region->ctx.get() != ctx) continue;
      std::string failure;
      {
        PauseScope pause;
        failure = region->guards.first_failure(region->sources, fs);
      }
      log_emit(Artifact::recompiles,
               fmt::format("Recompiling {}\n    triggered by the guard failure: {}",
                           code_location(code, code->co_firstlineno), failure));
      break;
    }
  }
  std::unique_ptr<Region> region = compile_region(state, code, fs, ts.ctx_owner);
  if (region == nullptr) return nullptr;  // fullgraph error set
  Region* raw = region.get();
  state.regions.push_back(std::move(region));
  if (raw->kind == RegionKind::kFallback) return fj_eval_default(tstate, frame, 0);
  if (!raw->guards.check(raw->sources, fs, slots)) {
    raw->kind = RegionKind::kFallback;
    raw->reason = "internal error: guards fail on the state they were traced from";
    warn("framejit: " + raw->reason + " in " + code_location(code, code->co_firstlineno));
    slots.clear();
    return fj_eval_default(tstate, frame, 0);
  }
  return run_region(*raw, slots);
}

}  // namespace

ThreadState& thread_state() { return t_state; }

ActiveScope::ActiveScope(const std::shared_ptr<CompileContext>& ctx)
    : prev_(t_state.ctx_owner), prev_paused_(t_state.paused) {
  if (!prev_ && g_active_threads++ == 0) fj_install_hook();
  t_state.ctx_owner = ctx;
  t_state.ctx = ctx.get();
  t_state.paused = 0;
}

ActiveScope::~ActiveScope() {
  t_state.paused = prev_paused_;
  t_state.ctx_owner = std::move(prev_);
  t_state.ctx = t_state.ctx_owner.get();
  if (!t_state.ctx && --g_active_threads == 0) fj_uninstall_hook();
}

int graphs_compiled() { return g_next_graph_id; }

}  // namespace framejit

extern "C" PyObject* fj_on_frame(PyThreadState* tstate, FjFrame* frame, int throwflag) {
  using namespace framejit;
  ThreadState& ts = t_state;
  if (ts.ctx == nullptr || ts.paused > 0 || throwflag || fj_frame_has_locals_dict(frame) ||
      fj_tracing_active(tstate)) {
    return fj_eval_default(tstate, frame, throwflag);
  }
  PyCodeObject* code = fj_frame_code(frame);
  CodeState* state = nullptr;
  try {
    state = code_state(code);
    if (state->decision == CodeState::Decision::kUnknown) {
      state->decision = should_skip_code(code) ? CodeState::Decision::kSkip
                                               : CodeState::Decision::kRun;
    }
    if (state->decision == CodeState::Decision::kSkip) {
      return fj_eval_default(tstate, frame, throwflag);
    }
    return handle_frame(tstate, frame, *state, code);
  } catch (const std::exception& e) {
    // Nothing of the frame has run yet: CPython can still run all of it.
    PyErr_Clear();
    warn(std::string("framejit: internal error in the frame hook: ") + e.what());
    if (state) state->decision = CodeState::Decision::kSkip;
    return fj_eval_default(tstate, frame, throwflag);
  }
}
