// The frame runtime: for each frame the hook hands over, chain regions from pc 0: find one whose
// guards pass at the current pc (or trace and compile one), run its graph, write the Python state
// back into the real frame, perform the instruction it stopped at, and go on. Whatever it does not
// perform, CPython resumes mid-frame (deopt).
#include "runtime/frame_runtime.h"

#include <fmt/format.h>

#include <pthread.h>

#include <cstdint>
#include <map>
#include <optional>
#include <unordered_set>

#include "bytecode/version.h"
#include "common/fault.h"
#include "common/pause.h"
#include "common/check.h"
#include "graph/graph_runner.h"
#include "graph/printer.h"
#include "log/log.h"
#include "runtime/dynamic_shapes.h"
#include "runtime/eval_frame.h"
#include "runtime/runtime_state.h"
#include "runtime/thread_state.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

thread_local ThreadState t_state;

// The frame's value stack between regions: owned references, NULL entries allowed.
class ValueStack {
 public:
  void clear() { items_.clear(); }
  void push(Ref item) { items_.push_back(std::move(item)); }
  void drop(size_t n) { items_.resize(items_.size() - n); }
  PyObject* top() const { return items_.back().get(); }  // Borrowed
  // The entries as an array of borrowed pointers (Ref is one pointer wide): FrameState::stack,
  // and the arguments of a call the runtime makes.
  PyObject** data() { return reinterpret_cast<PyObject**>(items_.data()); }
  size_t size() const { return items_.size(); }
  void replace(std::vector<Ref> items) { items_ = std::move(items); }
  // Hands every reference to the caller (for fj_frame_resume, which steals them).
  std::vector<PyObject*> release() {
    std::vector<PyObject*> out;
    out.reserve(items_.size());
    for (Ref& item : items_) out.push_back(item.release());
    items_.clear();
    return out;
  }

 private:
  std::vector<Ref> items_;
};

// One execution of one frame through the runtime.
struct FrameRun {
  PyThreadState* tstate;
  FjFrame* frame;
  PyCodeObject* code;
  CodeState& state;
  std::shared_ptr<CompileContext> ctx;
  // This run's decoded bytecode: framejit.reset() on another thread (or in a call this frame
  // makes) retires the code state's copy, which stays alive while any compiled call runs.
  const Bytecode* bytecode = nullptr;
  int pc = 0;
  ValueStack stack;

  FrameState frame_state() {
    return FrameState{fj_frame_localsplus(frame), fj_frame_globals(frame),
                      fj_frame_builtins(frame), stack.data(), static_cast<int>(stack.size()),
                      fj_frame_function(frame)};
  }
};

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

int line_at(PyCodeObject* code, const Bytecode& bytecode, int pc) {
  const int index = bytecode.index_at(pc);
  const int line = index >= 0 ? bytecode.instrs()[index].line : -1;
  return line >= 0 ? line : code->co_firstlineno;
}

// "<why> at fn (file:line): <source text>"
std::string located(PyCodeObject* code, const Bytecode& bytecode, int pc, const std::string& why) {
  const int line = line_at(code, bytecode, pc);
  return fmt::format("{} at {}: {}", why, code_location(code, line), source_line(code, line));
}

// CPython resumes the frame at `pc` with the runtime's stack (raising the pending exception there
// if `raising`). Returns New or NULL.
PyObject* resume(FrameRun& run, int pc, bool raising) {
  std::vector<PyObject*> stack = run.stack.release();
  return fj_frame_resume(run.tstate, run.frame, pc, stack.data(), static_cast<int>(stack.size()),
                         raising ? 1 : 0);
}

void raise_fullgraph(const std::string& message) {
  PyErr_SetString(PyRefs::get().unsupported_error.ptr(), message.c_str());
}

// Tells the regions log and the compile's on_region callback (framejit.explain, the rank check
// under torch.distributed) about a new region. `recompile`: the guard that failed on the
// region compiled before at this pc, or empty. Returns false with the Python exception set when
// the callback raised: the compile is refused (the rank check found ranks diverging).
bool report_region(const CompileContext& ctx, PyCodeObject* code, const Region& region,
                   const Bytecode& bytecode, const std::string& recompile = {}) {
  if (log_enabled(Artifact::regions)) {
    log_emit(Artifact::regions,
             fmt::format("region {} pc {} -> {} at pc {} ({}), {} graph ops{}",
                         code_location(code, line_at(code, bytecode, region.entry_pc)),
                         region.entry_pc, exit_kind_name(region.exit.kind), region.exit.pc,
                         region.kind == RegionKind::kFallback ? "fallback" : "compiled",
                         region.graph_ops, region.warmed ? ", warmed" : ""));
  }
  if (!ctx.on_region || ctx.on_region.is_none()) return true;
  try {
    py::dict info;
    info["id"] = region.id;
    info["code"] = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(code));
    info["entry_pc"] = region.entry_pc;
    info["entry_line"] = line_at(code, bytecode, region.entry_pc);
    info["kind"] = region.kind == RegionKind::kCompiled ? "compiled" : "fallback";
    info["exit"] = exit_kind_name(region.exit.kind);
    info["exit_line"] = line_at(code, bytecode, region.exit.op_pc);
    info["reason"] = region.kind == RegionKind::kFallback ? region.reason : region.exit.reason;
    info["graph_id"] = region.graph_id;
    info["graph"] = region.graph_text;
    info["graph_ops"] = region.graph_ops;
    info["warmed"] = region.warmed;
    {
      PauseScope pause;
      info["guards"] = region.guards.to_string(region.sources);
    }
    info["recompile"] = recompile;
    ctx.on_region(info);
  } catch (py::error_already_set& e) {
    e.restore();
    return false;
  }
  return true;
}

std::unique_ptr<Region> fallback_region(Tracer& tracer, FrameRun& run, int pc,
                                        std::string reason) {
  auto region = std::make_unique<Region>();
  region->kind = RegionKind::kFallback;
  region->entry_pc = pc;
  region->entry_nulls = tracer.entry_nulls();
  region->ctx = run.ctx;
  region->sources = tracer.entry().take_sources();
  region->guards = tracer.entry().take_guards();
  region->exit.kind = ExitKind::kDeopt;
  region->exit.pc = pc;
  region->reason = std::move(reason);
  region->id = runtime_state().next_region_id++;
  return region;
}

// A compiled region turned into a fallback at its entry: CPython runs from `pc` for these guards.
// While a region compiles (the trace, the backend, warming), saved-tensor hooks do not fire:
// the trace's meta tensors and a backend's own tracing are not the program's saves. A
// checkpoint(fn, x) that runs a compiled fn counted them as saves of its forward, so its
// recomputation in backward (which saves only the real ones) raised CheckpointError; a
// save_on_cpu hook would copy meta tensors. As torch.compile's AOT tracing does.
class SavedTensorHooksPause {
 public:
  SavedTensorHooksPause() {
    PyObject* prior = PyObject_CallOneArg(PyRefs::get().saved_hooks_set_tracing.ptr(), Py_True);
    if (prior == nullptr) {
      PyErr_Clear();
      return;
    }
    prior_ = prior == Py_True;
    paused_ = true;
    Py_DECREF(prior);
  }
  ~SavedTensorHooksPause() {
    if (!paused_) return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);  // an exception on its way out stays set
    PyObject* r = PyObject_CallOneArg(PyRefs::get().saved_hooks_set_tracing.ptr(),
                                      prior_ ? Py_True : Py_False);
    if (r == nullptr) PyErr_Clear();
    Py_XDECREF(r);
    PyErr_Restore(type, value, traceback);
  }
  SavedTensorHooksPause(const SavedTensorHooksPause&) = delete;
  SavedTensorHooksPause& operator=(const SavedTensorHooksPause&) = delete;

 private:
  bool paused_ = false;
  bool prior_ = false;
};

void fall_back(Region& region, int pc, std::string reason) {
  region.kind = RegionKind::kFallback;
  region.reason = std::move(reason);
  region.compiled = py::none();
  region.exit = RegionExit();
  region.exit.pc = pc;
}

// A graph whose every op is torch._C._set_grad_enabled(mode) goes to no backend: the region
// keeps the last switch for the runtime to make (Region::grad_switch).
void take_grad_switches(const Graph& graph, Region& region) {
  const Node* last = nullptr;
  for (const auto& node : graph.nodes()) {
    if (node->kind != NodeKind::kCallFunction && node->kind != NodeKind::kCallMethod) continue;
    if (node->target_text != "torch._C._set_grad_enabled") return;
    last = node.get();
  }
  if (last == nullptr) return;
  region.grad_switch = last->target;
  region.grad_switch_mode = last->args.at(0).value;
  region.graph_ops = 0;
}

// Traces a region from `pc` with the state `fs` and compiles its graph. Returns nullptr with a
// Python exception set only for fullgraph=True failures; other failures give a fallback region.
// A compiled region's guards are evaluated once, here, on `fs`: `slots` holds the values they
// read, for the region's first run (and the backend's example inputs).
std::unique_ptr<Region> compile_region(FrameRun& run, int pc, const FrameState& fs, bool warmed,
                                       SlotValues& slots) {
  PauseScope pause;
  GcPause no_gc;
  SavedTensorHooksPause no_saved_hooks;
  PyCodeObject* code = run.code;
  CodeState& state = run.state;
  const CompileContext& ctx = *run.ctx;
  const Bytecode& bytecode = decoded_bytecode(code, state);
  // A callee that breaks while inlined is not inlined at that call site on the next attempt,
  // so the region ends at the call in this frame (and the callee's frame meets the hook itself).
  std::map<CallSite, std::string> no_inline;
  std::unique_ptr<Tracer> traced;
  std::string failure;  // set: framejit could not trace here for a reason of its own
  // Sizes stay graph values where the backend runs any size, or where a backend that does not
  // is to get symbolic sizes (runtime/dynamic_shapes.h); a region that ends at an instruction
  // using one is traced again with sizes as constants (see StaticSizesRetrace).
  bool symbolic_sizes = ctx.any_sizes || wants_symbolic_trace(ctx, state, pc, code, fs);
  // What compiling flags answer: True, unless the program raised on the path that took
  // (see CompilingFlagRetrace).
  bool compiling_answer = true;
  // Whether ints read by source that vary may be graph inputs: until an instruction a region
  // ends at had one among its operands (StaticSizesRetrace::ints_only).
  bool varying_ints = true;
  // Returns false with the Python exception set for Ctrl-C while tracing (the user's, not ours).
  auto trace = [&]() {
    constexpr int kMaxAttempts = 64;
    for (int i = 0;; ++i) {
      traced = std::make_unique<Tracer>(runtime_trace_host(), code, bytecode, fs, pc, &no_inline);
      traced->sizes().set_symbolic(symbolic_sizes);
      traced->sizes().set_number_inputs(ctx.any_sizes);
      traced->modes().set_inference_in_graph(ctx.any_sizes);
      // dynamic=True keeps every number in the middle of the frame a run-time number.
      if (ctx.dynamic != 1) traced->sizes().set_pinned_numbers(&state.pinned_numbers[{ctx.id, pc}]);
      // A number read by source that varies becomes a run-time number, unless dynamic=False:
      // a float where numbers may be graph inputs (backends that run any size; others may bake
      // an example number into their code); an int only while sizes are symbolic (the trace
      // again with constant sizes pins ints too; a backend that does not run any size gets it
      // as a SymInt input, see dynamic_shapes.h), and with dynamic=True from the first compile.
      if (ctx.dynamic != 0 && (ctx.any_sizes || ctx.symbolic_backend())) {
        traced->entry().set_varying_numbers(&state.pinned_numbers[{ctx.id, pc}],
                                            symbolic_sizes && varying_ints, ctx.dynamic == 1,
                                            ctx.any_sizes);
      }
      traced->set_compiling_answer(compiling_answer);
      try {
        traced->run();
        return true;
      } catch (const CompilingFlagRetrace& retrace) {
        compiling_answer = false;
        if (log_enabled(Artifact::graph_breaks)) {
          log_emit(Artifact::graph_breaks,
                   "tracing again with torch.compiler.is_compiling() False: the compile-only path "
                   "failed: " + retrace.reason);
        }
      } catch (const StaticSizesRetrace& retrace) {
        if (retrace.ints_only) {
          varying_ints = false;
        } else {
          symbolic_sizes = false;
        }
      } catch (const InlineBreak& inner) {
        if (i + 1 >= kMaxAttempts || no_inline.count(inner.site)) {
          failure = "internal error: inlining does not settle";
          return true;
        }
        no_inline.emplace(inner.site, inner.reason);
      } catch (const InternalError& e) {
        failure = std::string("internal error: ") + e.what();
        return true;
      } catch (py::error_already_set& e) {
        if (e.matches(PyExc_KeyboardInterrupt)) {
          e.restore();
          return false;
        }
        failure = std::string("Python error: ") + e.what();
        return true;
      }
    }
  };
  if (!trace()) return nullptr;
  // A backend that does not run any size: the dims to hand it as symbolic, by graph input. The
  // plan also remembers this compile's sizes for the next one. A plan made on a trace with
  // constant sizes (a tensor marked dynamic deeper than the frame's locals) traces again with
  // symbolic sizes; a symbolic trace that gets no symbolic dim traces again with constant
  // sizes, the graph the backend would get without dynamic shapes.
  SymbolicDims symbolic;
  if (failure.empty() && ctx.symbolic_backend()) {
    symbolic = plan_symbolic_dims(ctx, state, pc, *traced);
    if (!symbolic_sizes && !symbolic.empty()) {
      symbolic_sizes = true;
      if (!trace()) return nullptr;
      symbolic = failure.empty() && symbolic_sizes ? plan_symbolic_dims(ctx, state, pc, *traced)
                                                   : SymbolicDims();
    }
    if (!symbolic_sizes) {
      symbolic = SymbolicDims();
    } else if (symbolic.empty()) {
      symbolic_sizes = false;
      if (!trace()) return nullptr;
    }
  }
  Tracer& tracer = *traced;
  if (!failure.empty()) {
    std::string reason = located(code, bytecode, pc, failure);
    warn("framejit: " + reason + "; this part runs in plain Python");
    return fallback_region(tracer, run, pc, std::move(reason));
  }
  RegionExit& exit = tracer.exit();
  if (exit.kind != ExitKind::kReturn) {
    const std::string where = located(code, bytecode, exit.op_pc, exit.reason);
    if (ctx.fullgraph) {
      raise_fullgraph("framejit (fullgraph=True): graph break: " + where);
      return nullptr;
    }
    exit.reason = where;
    if (tracer.instructions_traced() == 0 && exit.kind == ExitKind::kDeopt) {
      log_emit(Artifact::graph_breaks,
               fmt::format("{} runs in plain Python from here: {}",
                           code_location(code, code->co_firstlineno), where));
      return fallback_region(tracer, run, pc, where);
    }
    log_emit(Artifact::graph_breaks, fmt::format("graph break ({}): {}",
                                                 exit_kind_name(exit.kind), where));
  }

  auto region = std::make_unique<Region>();
  region->id = runtime_state().next_region_id++;
  region->kind = RegionKind::kCompiled;
  region->entry_pc = pc;
  region->entry_nulls = tracer.entry_nulls();
  region->ctx = run.ctx;
  region->warmed = warmed;
  Graph& graph = tracer.recorder().graph();
  graph.lint();
  region->exit = std::move(exit);
  region->inputs = tracer.entry().inputs();
  region->graph_ops = graph.num_calls();
  take_grad_switches(graph, *region);
  // The inputs the graph writes into: their placeholders' meta tensors (fresh, at version 0)
  // had an op write into them, or into a view of them, while tracing.
  // So are the placeholders passed directly to a node that may write into its arguments
  // (F.batch_norm's running statistics: no counter moves on meta tensors).
  const std::vector<Node*> placeholders = graph.placeholders();
  std::unordered_set<const Node*> written;
  for (const auto& node : graph.nodes()) {
    for (const Arg* arg : written_arguments(*node)) {
      if (arg->kind == Arg::Kind::kNode) written.insert(arg->node);
    }
  }
  region->may_write_input.assign(placeholders.size(), false);
  for (size_t i = 0; i < placeholders.size(); ++i) {
    const int64_t version = placeholders[i]->fake ? tensor_version(placeholders[i]->fake.ptr()) : 0;
    if (version > 0 || written.count(placeholders[i])) {
      region->mutated_inputs.push_back(static_cast<int>(i));
    }
    // A meta tensor of no counter (an inference tensor's) cannot tell: a write into it outside
    // inference_mode fails on meta already, so only the direct arguments of writing ops count.
    region->may_write_input[i] = version > 0 || written.count(placeholders[i]) > 0;
  }
  region->graph_mutates = graph.mutates_tensors() || !region->mutated_inputs.empty();
  region->unversioned_writes = graph.writes_without_version();
  region->raise_at_entry_loses = tracer.crosses_handlers() || !region->exit.attr_writes.empty();
  region->compiled = py::none();
  for (const Arg& out : graph.output()->args[0].items) {
    region->output_metas.emplace_back(out.node->fake, py::str(out.node->metas.at(0).device));
  }
  const SizeTracker& sizes = tracer.sizes();
  if (ctx.any_sizes && !sizes.sizes_read()) tracer.entry().allow_any_sizes(sizes.pinned_dims());
  if (!symbolic.empty()) tracer.entry().allow_symbolic_dims(symbolic.by_slot);
  tracer.entry().bound_dims(sizes.dim_ranges());
  region->sources = tracer.entry().take_sources();
  region->guards = tracer.entry().take_guards();
  if (!region->guards.check(region->sources, fs, slots)) {
    slots.clear();
    fall_back(*region, pc, "internal error: guards fail on the state they were traced from");
    warn("framejit: " + region->reason + " in " + code_location(code, code->co_firstlineno));
    return region;
  }
  if (region->graph_ops == 0) return region;  // nothing for a backend

  region->graph_id = runtime_state().next_graph_id++;
  region->graph_text = print_graph(graph, linecache_source(graph.filename()));
  if (log_enabled(Artifact::graph_code)) {
    log_emit(Artifact::graph_code,
             fmt::format("TRACED GRAPH\n ===== __compiled_fn_{} =====\n{}", region->graph_id,
                         region->graph_text));
  }
  if (log_enabled(Artifact::guards)) {
    std::string sizes_note;
    if (!symbolic.empty()) {
      sizes_note = "sizes symbolic: " + symbolic.text + "\n";
    } else if (ctx.any_sizes && sizes.sizes_read()) {
      sizes_note = fmt::format("sizes specialised: the trace read {}\n", sizes.size_read());
    } else if (ctx.any_sizes && !sizes.pinned_dims().empty()) {
      sizes_note = "sizes specialised where shown (`with size(d) = n`):\n";
      for (const std::string& read : sizes.dim_reads()) sizes_note += "  " + read + "\n";
    }
    log_emit(Artifact::guards, fmt::format("GUARDS __compiled_fn_{} ({}):\n{}{}", region->graph_id,
                                           code_location(code, line_at(code, bytecode, pc)),
                                           sizes_note, region->guards.to_string(region->sources)));
  }
  std::optional<std::string> backend_failed;  // why the backend failed, if it did
  // Example inputs are this call's live values; the list is dropped right after the backend
  // returns, so the cache never keeps an input tensor alive.
  try {
    // The backend gets a GraphModule whose forward runs the IR; the FX graph and its code are
    // made only if the backend asks for them (python/framejit/_graph_module.py).
    if (fault_due(FaultSite::kExport)) throw std::runtime_error("injected fault in the export");
    py::object runner = py::reinterpret_steal<py::object>(
        new_graph_runner(std::make_unique<Graph>(std::move(graph))));  // graph: moved from here on
    if (!runner) throw py::error_already_set();
    py::object gm = PyRefs::get().support.attr("FramejitGraphModule")(
        runner, fmt::format("__compiled_fn_{}", region->graph_id));
    py::list example_inputs;
    MemoTable memo(0);  // graph inputs are never memoised
    for (const Rebuild& input : region->inputs) {
      PyObject* value = input.build(nullptr, slots, memo);
      if (value == nullptr) throw py::error_already_set();
      example_inputs.append(py::reinterpret_steal<py::object>(value));
    }
    if (fault_due(FaultSite::kBackend)) throw std::runtime_error("injected fault in the backend");
    region->compiled = symbolic.empty()
                           ? ctx.backend(gm, example_inputs)
                           : compile_with_symbolic_sizes(ctx, symbolic, gm, example_inputs,
                                                         region->inputs, region->sources,
                                                         region->guards);
    if (!PyCallable_Check(region->compiled.ptr())) {
      throw std::runtime_error(fmt::format("it returned {}, not a callable (a backend returns "
                                           "the function that runs the graph, e.g. gm.forward)",
                                           safe_repr(region->compiled)));
    }
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_KeyboardInterrupt)) {  // Ctrl-C while the backend compiles
      e.restore();
      return nullptr;
    }
    backend_failed = e.what();
  } catch (const std::exception& e) {
    backend_failed = e.what();
  }
  if (log_enabled(Artifact::guards) && !backend_failed && region->guards.has_shape_guards()) {
    log_emit(Artifact::guards, fmt::format("SHAPE GUARDS __compiled_fn_{} (from the backend's "
                                           "ShapeEnv):\n{}", region->graph_id,
                                           region->guards.shape_guards_text()));
  }
  if (backend_failed) {
    std::string reason = fmt::format("backend '{}' failed on __compiled_fn_{} of {}: {}",
                                     ctx.backend_name, region->graph_id,
                                     code_location(code, code->co_firstlineno), *backend_failed);
    PyErr_Clear();
    if (ctx.fullgraph) {
      raise_fullgraph("framejit (fullgraph=True): " + reason);
      return nullptr;
    }
    warn("framejit: " + reason + "; this part runs in plain Python");
    fall_back(*region, pc, std::move(reason));
  }
  return region;
}

// Runs the region's graph on its inputs. Returns the outputs (New), Py_None for a region without
// graph, or NULL with an exception set. `rerunnable`: the graph wrote into no input, so the frame
// is still as at the region's entry and CPython could run the region's code instead.
PyObject* run_graph(Region& region, const SlotValues& slots, bool& rerunnable) {
  rerunnable = true;
  if (region.graph_ops == 0) {
    if (region.grad_switch && !Ref::steal(PyObject_CallOneArg(region.grad_switch.ptr(),
                                                              region.grad_switch_mode.ptr()))) {
      return nullptr;
    }
    Py_RETURN_NONE;
  }
  // Hot path: raw vectorcall, slot inputs borrowed, computed scalars owned until the call ends.
  constexpr size_t kInline = 16;
  PyObject* inline_args[kInline];
  std::vector<PyObject*> heap_args;
  std::vector<Ref> owned;
  MemoTable memo(0);  // graph inputs are never memoised
  const size_t n = region.inputs.size();
  PyObject** args = inline_args;
  if (n > kInline) {
    heap_args.resize(n);
    args = heap_args.data();
  }
  for (size_t i = 0; i < n; ++i) {
    const Rebuild& input = region.inputs[i];
    if (input.kind == Rebuild::Kind::kSlot) {
      args[i] = slots[input.index];
      continue;
    }
    args[i] = input.build(nullptr, slots, memo);
    if (args[i] == nullptr) return nullptr;  // nothing ran yet
    owned.push_back(Ref::steal(args[i]));
  }
  // A graph that may write into tensors: its inputs' version counters, to tell after an error
  // whether it wrote into one before raising.
  std::vector<int64_t> versions;
  if (region.graph_mutates) {
    versions.resize(n);
    for (size_t i = 0; i < n; ++i) versions[i] = tensor_version(args[i]);
  }
  // A region whose error, raised at its entry, would lose writes or skip a try block, and whose
  // graph writes into inputs: a copy of those inputs, to put back if the graph raises, so the
  // region can still run again as Python. Only inputs without autograd history (leaves) can be
  // put back (one with history must then be one the graph did not reach).
  std::vector<Ref> saved;  // by input index: its copy, or null
  if (region.raise_at_entry_loses && !region.mutated_inputs.empty()) {
    saved.resize(n);
    for (int i : region.mutated_inputs) {
      if (tensor_has_history(args[i])) continue;
      saved[i] = Ref::steal(tensor_snapshot(args[i]));
      if (!saved[i]) PyErr_Clear();
    }
  }
  PyObject* outputs;
  {
    PauseScope pause;
    outputs = PyObject_Vectorcall(region.compiled.ptr(), args, n, nullptr);  // New
  }
  // The graph's error waits while the inputs are examined (CPython calls must not run with an
  // exception set); it is set again before returning.
  PyObject *error_type = nullptr, *error_value = nullptr, *error_tb = nullptr;
  if (outputs == nullptr) {
    // A graph that raised inside a `with torch.no_grad()` it entered: the frame resumes at the
    // region's entry, so the thread's grad mode must be the entry's again.
    restore_global_torch_state(region.guards.entry_state());
    PyErr_Fetch(&error_type, &error_value, &error_tb);
  }
  // Input i is as before the call: its counter did not move (an inference tensor keeps none:
  // one the graph may write into counts as written).
  auto unwritten = [&](size_t i) {
    return versions[i] == tensor_version(args[i]) &&
           (versions[i] >= 0 || !is_tensor(args[i]) || !region.may_write_input.at(i));
  };
  // Writes no counter shows (batch norm's statistics) may have happened whatever they say.
  rerunnable = !region.unversioned_writes;
  for (size_t i = 0; i < versions.size() && rerunnable; ++i) rerunnable = unwritten(i);
  if (outputs == nullptr && !rerunnable && !saved.empty() &&
      !PyErr_GivenExceptionMatches(error_type, PyExc_KeyboardInterrupt)) {
    // Put the written inputs back as they were: then nothing the graph did is visible, and
    // CPython can run the region again. One the graph did not reach is left alone (it may be
    // one no copy can go back into: an expanded tensor, whose in-place op is the error), unless
    // the graph writes some input without a counter. Every other input must be unwritten, or
    // share storage with one put back (the same tensor passed twice: the graph wrote it
    // through the other).
    bool restored = true;
    std::vector<size_t> put_back;
    for (size_t i = 0; i < versions.size() && restored; ++i) {
      if (region.may_write_input.at(i) && (region.unversioned_writes || !unwritten(i))) {
        restored = saved[i] && tensor_restore(args[i], saved[i].get());
        put_back.push_back(i);
      }
    }
    for (size_t i = 0; i < versions.size() && restored; ++i) {
      if (region.may_write_input.at(i) || unwritten(i)) continue;
      restored = std::any_of(put_back.begin(), put_back.end(),
                             [&](size_t j) { return tensors_share_storage(args[i], args[j]); });
    }
    rerunnable = restored;
  }
  if (outputs == nullptr) PyErr_Restore(error_type, error_value, error_tb);
  owned.clear();
  if (outputs != nullptr && !PyTuple_Check(outputs) && !PyList_Check(outputs)) {
    PyErr_Format(PyExc_TypeError,
                 "framejit: backend '%s' returned %s from a compiled graph, expected a tuple",
                 region.ctx->backend_name.c_str(), Py_TYPE(outputs)->tp_name);
    Py_CLEAR(outputs);
  }
  return outputs;
}

// Everything a region's exit hands to Python, built before any of it is applied: building runs
// only the exit's own arithmetic, so an error there leaves the frame and every object as the
// graph left them, and the region can still run again as Python.
struct ExitValues {
  std::vector<std::pair<Ref, Ref>> attrs;  // target, value: one per attribute write
  std::vector<Ref> keys;                   // the key of each item write (null for the others)
  // The lists and dicts whose new contents are in already, each with a copy of its old ones.
  std::vector<std::pair<Ref, Ref>> replaced;
  std::vector<std::pair<int, Ref>> locals;
  std::vector<Ref> stack;
  Ref result;  // kReturn
};

// Puts `contents` (a list or dict) into the list or dict `target`. False on error.
bool replace_contents(PyObject* target, PyObject* contents) {
  if (PyList_CheckExact(target)) return PyList_SetSlice(target, 0, PY_SSIZE_T_MAX, contents) == 0;
  PyDict_Clear(target);
  return PyDict_Update(target, contents) == 0;
}

// Puts the old contents back into the lists and dicts build_exit_values replaced (an exit
// that failed to build); the exception set stays.
void restore_contents(ExitValues& values) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  for (auto it = values.replaced.rbegin(); it != values.replaced.rend(); ++it) {
    if (!replace_contents(it->first.get(), it->second.get())) PyErr_Clear();
  }
  values.replaced.clear();
  PyErr_Restore(type, value, tb);
}

bool build_exit_values_in(const RegionExit& exit, PyObject* outputs, const SlotValues& slots,
                          ExitValues& values) {
  MemoTable memo(static_cast<size_t>(exit.memo_size));
  for (const Rebuild& check : exit.checks) {  // run-time arithmetic that may raise
    if (!Ref::steal(check.build(outputs, slots, memo))) return false;
  }
  for (const RegionExit::AttrWrite& write : exit.attr_writes) {
    Ref target = Ref::steal(write.target.build(outputs, slots, memo));
    if (!target) return false;
    Ref value = Ref::steal(write.value.build(outputs, slots, memo));
    if (!value) return false;
    Ref key;
    if (write.item) {
      key = Ref::steal(write.key.build(outputs, slots, memo));
      if (!key) return false;
    }
    values.attrs.emplace_back(std::move(target), std::move(value));
    values.keys.push_back(std::move(key));
  }
  // The lists and dicts the region changed get their new contents before the locals and the
  // stack are built: an iterator the exit makes over one of them (a loop the region leaves
  // mid-way) must start from what it holds now.
  for (size_t i = 0; i < values.attrs.size(); ++i) {
    if (exit.attr_writes[i].name.ptr() != Py_None) continue;
    PyObject* target = values.attrs[i].first.get();
    Ref old = Ref::steal(PyList_CheckExact(target) ? PyList_GetSlice(target, 0, PY_SSIZE_T_MAX)
                                                   : PyDict_Copy(target));
    if (!old) return false;
    if (!replace_contents(target, values.attrs[i].second.get())) return false;
    values.replaced.emplace_back(Ref::borrow(target), std::move(old));
  }
  if (exit.kind == ExitKind::kReturn) {
    values.result = Ref::steal(exit.result.build(outputs, slots, memo));
    return static_cast<bool>(values.result);
  }
  for (const auto& [index, rebuild] : exit.locals) {
    Ref value = Ref::steal(rebuild.build(outputs, slots, memo));
    if (!value && rebuild.kind != Rebuild::Kind::kNull) return false;
    values.locals.emplace_back(index, std::move(value));
  }
  for (const Rebuild& rebuild : exit.stack) {
    Ref value = Ref::steal(rebuild.build(outputs, slots, memo));
    if (!value && rebuild.kind != Rebuild::Kind::kNull) return false;
    values.stack.push_back(std::move(value));
  }
  return true;
}

// False with an exception set on error, and then nothing changed.
bool build_exit_values(const RegionExit& exit, PyObject* outputs, const SlotValues& slots,
                       ExitValues& values) {
  if (build_exit_values_in(exit, outputs, slots, values)) return true;
  restore_contents(values);
  return false;
}

// setattr for each attribute write of the region, in program order (the lists and dicts it
// changed have their new contents already: build_exit_values). False on error.
bool apply_attr_writes(const RegionExit& exit, const ExitValues& values) {
  for (size_t i = 0; i < values.attrs.size(); ++i) {
    const auto& [target, value] = values.attrs[i];
    PyObject* name = exit.attr_writes[i].name.ptr();
    if (name == Py_None) continue;
    if (exit.attr_writes[i].item) {
      if (PyObject_SetItem(target.get(), values.keys[i].get(), value.get()) < 0) return false;
      continue;
    }
    if (exit.attr_writes[i].call) {
      if (!Ref::steal(PyObject_CallMethodOneArg(target.get(), name, value.get()))) return false;
      continue;
    }
    const int failed = exit.attr_writes[i].generic
                           ? PyObject_GenericSetAttr(target.get(), name, value.get())
                           : PyObject_SetAttr(target.get(), name, value.get());
    if (failed < 0) return false;
  }
  return true;
}

// Writes the exit's locals into the frame and replaces the value stack.
void write_exit_state(FrameRun& run, ExitValues& values) {
  PyObject** localsplus = fj_frame_localsplus(run.frame);
  for (auto& [index, value] : values.locals) {
    PyObject* old = localsplus[index];
    localsplus[index] = value.release();  // the frame owns it now
    Py_XDECREF(old);
  }
  run.stack.replace(std::move(values.stack));
}

Region* find_region(FrameRun& run, const FrameState& fs, SlotValues& slots, int& tried) {
  tried = 0;
  PauseScope pause;  // a guard reading an attribute may run Python (a __getattr__): not traced
  for (Region* region : run.state.at(run.pc)) {
    if (region->ctx != run.ctx) continue;
    ++tried;
    if (region->entry_nulls.size() != run.stack.size()) continue;
    bool nulls_match = true;
    for (size_t i = 0; i < run.stack.size() && nulls_match; ++i) {
      nulls_match = region->entry_nulls[i] == (run.stack.data()[i] == nullptr);
    }
    if (!nulls_match) continue;
    if (region->guards.check(region->sources, fs, slots)) return region;
  }
  slots.clear();
  return nullptr;
}

// A frame state that exists only for warming: the locals and stack a region would leave,
// built from placeholder tensors of the right metadata.
struct SyntheticState {
  std::vector<Ref> locals;
  std::vector<Ref> stack;
  // As the borrowed arrays a FrameState reads (Ref is one pointer wide).
  PyObject** locals_data() { return reinterpret_cast<PyObject**>(locals.data()); }
  PyObject* const* stack_data() { return reinterpret_cast<PyObject* const*>(stack.data()); }
};

constexpr int kMaxWarmDepth = 16;

void warm_target(FrameRun& run, int pc, const FrameState& fs, int depth);

// The state `region` would leave if entered with `fs`, with empty tensors standing for its graph's
// outputs (tracing reads only their metadata). False if it cannot be built.
bool synthesize_exit_state(FrameRun& run, Region& region, const FrameState& fs,
                           SyntheticState& out) {
  SlotValues slots;
  if (!region.guards.check(region.sources, fs, slots)) return false;
  try {
    PauseScope pause;
    py::list made;
    py::object empty_strided = PyRefs::get().torch.attr("empty_strided");
    for (const auto& [meta, device] : region.output_metas) {
      py::dict kwargs;
      kwargs["dtype"] = meta.attr("dtype");
      kwargs["device"] = device;
      kwargs["requires_grad"] = meta.attr("requires_grad");
      made.append(empty_strided(meta.attr("shape"), meta.attr("stride")(), **kwargs));
    }
    py::tuple outputs(made);
    MemoTable memo(static_cast<size_t>(region.exit.memo_size));
    const int n_locals = fj_frame_nlocalsplus(run.frame);
    out.locals.clear();
    for (int i = 0; i < n_locals; ++i) out.locals.push_back(Ref::borrow(fs.localsplus[i]));
    for (const auto& [index, rebuild] : region.exit.locals) {
      Ref value = Ref::steal(rebuild.build(outputs.ptr(), slots, memo));
      if (!value && rebuild.kind != Rebuild::Kind::kNull) throw py::error_already_set();
      out.locals[index] = std::move(value);
    }
    for (const Rebuild& rebuild : region.exit.stack) {
      Ref value = Ref::steal(rebuild.build(outputs.ptr(), slots, memo));
      if (!value && rebuild.kind != Rebuild::Kind::kNull) throw py::error_already_set();
      out.stack.push_back(std::move(value));
    }
  } catch (const py::error_already_set&) {
    PyErr_Clear();
    return false;
  }
  return true;
}

// Both sides of the branch that ends a region entered with `fs`.
void warm_branch_sides(FrameRun& run, Region& region, const FrameState& fs, int depth) {
  const RegionExit& exit = region.exit;
  if (exit.kind != ExitKind::kBranch || depth > kMaxWarmDepth) return;
  SyntheticState state;
  if (!synthesize_exit_state(run, region, fs, state)) return;
  const bool or_pop = exit.op == Op::JUMP_IF_TRUE_OR_POP || exit.op == Op::JUMP_IF_FALSE_OR_POP;
  for (const int target : {exit.target_pc, exit.next_pc}) {
    // X_OR_POP keeps the condition on the side that jumps; every other branch pops it.
    const bool keeps = or_pop && target == exit.target_pc;
    FrameState side{state.locals_data(), fs.globals, fs.builtins, state.stack_data(),
                    static_cast<int>(state.stack.size()) - (keeps ? 0 : 1), fs.function};
    warm_target(run, target, side, depth + 1);
  }
}

// warm_branches: compiles the region at `pc` for state `fs` if none exists, and, through its own
// branch, the regions behind it, so a first call leaves every branch target compiled.
void warm_target(FrameRun& run, int pc, const FrameState& fs, int depth) {
  if (!run.ctx->warm_branches || depth > kMaxWarmDepth) return;
  for (Region* region : run.state.at(pc)) {
    if (region->ctx == run.ctx) return;
  }
  SlotValues slots;
  std::unique_ptr<Region> region = compile_region(run, pc, fs, /*warmed=*/true, slots);
  if (region == nullptr) {  // fullgraph error while warming: reported when that side runs
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) return;  // left set: the user's
    PyErr_Clear();
    return;
  }
  if (!report_region(*run.ctx, run.code, *region, *run.bytecode)) {
    // The callback refused a warmed region: reported when that side runs, if it ever does.
    if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) PyErr_Clear();
    return;
  }
  Region* raw = run.state.add(std::move(region));
  if (raw->kind == RegionKind::kCompiled) warm_branch_sides(run, *raw, fs, depth);
}

// At a branch the runtime performs: the side not taken, with the state of this call.
void warm_other_side(FrameRun& run, int other_pc, bool other_keeps_condition) {
  if (!run.ctx->warm_branches) return;
  FrameState fs = run.frame_state();
  if (!other_keeps_condition) fs.stack_size -= 1;
  warm_target(run, other_pc, fs, 0);
}

// The branch at a kBranch exit: its condition is on top of the stack. False on error.
bool perform_branch(FrameRun& run, const RegionExit& exit) {
  const int truth = PyObject_IsTrue(run.stack.top());
  if (truth < 0) return false;
  bool jump_if = true;
  bool pops_always = true;
  switch (exit.op) {
    case Op::POP_JUMP_FORWARD_IF_FALSE:
    case Op::POP_JUMP_BACKWARD_IF_FALSE:
    case Op::POP_JUMP_IF_FALSE:
      jump_if = false;
      break;
    case Op::JUMP_IF_TRUE_OR_POP:
      pops_always = false;
      break;
    case Op::JUMP_IF_FALSE_OR_POP:
      jump_if = false;
      pops_always = false;
      break;
    default:
      break;
  }
  const bool jumps = (truth == 1) == jump_if;
  const int taken = jumps ? exit.target_pc : exit.next_pc;
  const int other = jumps ? exit.next_pc : exit.target_pc;
  // X_OR_POP keeps the value on the side that jumps.
  const bool other_keeps = !pops_always && !jumps;
  warm_other_side(run, other, other_keeps);
  if (PyErr_Occurred()) return false;  // Ctrl-C while warming
  if (pops_always || !jumps) run.stack.drop(1);
  run.pc = taken;
  return true;
}

// The call at a kCall exit, with the frame linked as the current frame at the call's line.
bool perform_call(FrameRun& run, const RegionExit& exit) {
  PyObject* result = nullptr;
  fj_frame_link(run.tstate, run.frame, exit.op_pc);
  size_t consumed;
  if (exit.nargs >= 0) {
    // [NULL | method, callable | self, args...]; 3.13: [callable | method, NULL | self, args...]
    // (and CALL_KW's names above the arguments)
    const size_t n = static_cast<size_t>(exit.nargs);
    const size_t above = exit.kwnames_on_stack ? 1 : 0;
    PyObject** base = run.stack.data() + run.stack.size() - n - 2 - above;
    const bool method = pyver::kNullAboveCallable ? base[1] != nullptr : base[0] != nullptr;
    PyObject* callable = method || pyver::kNullAboveCallable ? base[0] : base[1];
    PyObject** args = method ? base + 1 : base + 2;
    const size_t total = method ? n + 1 : n;
    PyObject* kwnames = exit.kwnames.is_none() ? nullptr : exit.kwnames.ptr();
    const size_t positional = total - (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    result = PyObject_Vectorcall(callable, args, positional, kwnames);  // New
    consumed = n + 2 + above;
  } else {
    // CALL_FUNCTION_EX: [NULL, callable, args, (kwargs)]; 3.13: [callable, NULL, ...]
    const bool has_kwargs = exit.nargs == -2;
    PyObject** base = run.stack.data() + run.stack.size() - (has_kwargs ? 4 : 3);
    PyObject* callable = base[pyver::kNullAboveCallable ? 0 : 1];
    PyObject* args = PySequence_Tuple(base[2]);  // New
    PyObject* kwargs = nullptr;
    if (args != nullptr && has_kwargs && base[3] != nullptr) {
      kwargs = PyDict_New();  // New
      if (kwargs != nullptr && PyDict_Update(kwargs, base[3]) < 0) Py_CLEAR(kwargs);
    }
    if (args != nullptr && (!has_kwargs || kwargs != nullptr || base[3] == nullptr)) {
      result = PyObject_Call(callable, args, kwargs);  // New
    }
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    consumed = has_kwargs ? 4 : 3;
  }
  fj_frame_unlink(run.tstate, run.frame);
  if (result == nullptr) return false;
  run.stack.drop(consumed);
  run.stack.push(Ref::steal(result));
  run.pc = exit.next_pc;
  return true;
}

// GET_ITER / FOR_ITER at a kIter exit.
bool perform_iter(FrameRun& run, const RegionExit& exit) {
  if (exit.op == Op::GET_ITER) {
    PyObject* iterator = PyObject_GetIter(run.stack.top());  // New
    if (iterator == nullptr) return false;
    run.stack.drop(1);
    run.stack.push(Ref::steal(iterator));
    run.pc = exit.next_pc;
    return true;
  }
  PyObject* iterator = run.stack.top();
  fj_frame_link(run.tstate, run.frame, exit.op_pc);
  PyObject* next = (*Py_TYPE(iterator)->tp_iternext)(iterator);  // New or NULL
  fj_frame_unlink(run.tstate, run.frame);
  if (next != nullptr) {
    run.stack.push(Ref::steal(next));
    run.pc = exit.next_pc;
    return true;
  }
  if (PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_StopIteration)) return false;
    PyErr_Clear();
  }
  run.stack.drop(1);
  run.pc = pyver::for_iter_exhausted_pc(exit.target_pc);
  return true;
}

// BEFORE_WITH at a kWith exit: [manager] -> [manager.__exit__, manager.__enter__()].
bool perform_with(FrameRun& run, const RegionExit& exit) {
  PyObject* manager = run.stack.top();
  PyObject* enter = PyObject_GetAttrString(manager, "__enter__");  // New
  if (enter == nullptr) return false;
  PyObject* on_exit = PyObject_GetAttrString(manager, "__exit__");  // New
  if (on_exit == nullptr) {
    Py_DECREF(enter);
    return false;
  }
  fj_frame_link(run.tstate, run.frame, exit.op_pc);
  PyObject* entered = PyObject_CallNoArgs(enter);  // New
  fj_frame_unlink(run.tstate, run.frame);
  Py_DECREF(enter);
  if (entered == nullptr) {
    Py_DECREF(on_exit);
    return false;
  }
  run.stack.drop(1);
  run.stack.push(Ref::steal(on_exit));
  run.stack.push(Ref::steal(entered));
  run.pc = exit.next_pc;
  return true;
}

// BINARY_SUBSCR at a kSubscr exit: [container, key] -> [container[key]].
bool perform_subscr(FrameRun& run, const RegionExit& exit) {
  PyObject** top = run.stack.data() + run.stack.size() - 2;
  fj_frame_link(run.tstate, run.frame, exit.op_pc);
  PyObject* item = PyObject_GetItem(top[0], top[1]);  // New
  fj_frame_unlink(run.tstate, run.frame);
  if (item == nullptr) return false;
  run.stack.drop(2);
  run.stack.push(Ref::steal(item));
  run.pc = exit.next_pc;
  return true;
}

PyObject* run_frame(FrameRun& run) {
  CodeState& state = run.state;
  const CompileContext& ctx = *run.ctx;
  while (true) {
    // Ctrl-C between regions: the runtime performs branches and calls without CPython's eval
    // loop, which would check for signals; raised at this region's first instruction.
    if (PyErr_CheckSignals() < 0) return resume(run, run.bytecode->at(run.pc).offset, true);
    const FrameState fs = run.frame_state();
    SlotValues slots;
    int tried = 0;
    Region* region = find_region(run, fs, slots, tried);
    if (region == nullptr) {
      if (tried >= ctx.recompile_limit) {
        bool graphless = true;  // nothing of this code went to a backend, in any version
        for (const auto& r : state.regions) graphless = graphless && r->graph_id < 0;
        if (graphless) {
          // A helper that makes no graph (a config's __getattribute__ called from plain Python
          // with a new name each time, keyed on it): plain Python from now on, which loses
          // nothing (as torch.compile skips a frame with no tensor work). No warning.
          if (log_enabled(Artifact::recompiles)) {
            log_emit(Artifact::recompiles,
                     fmt::format("{} made no graph in its {} compiled versions: it runs in plain "
                                 "Python from now on",
                                 code_location(run.code, run.code->co_firstlineno), tried));
          }
          state.decision = CodeState::Decision::kGivenUp;
          return resume(run, run.pc, false);
        }
        if (!state.limit_warned) {
          state.limit_warned = true;
          warn(fmt::format("framejit: {} hit recompile_limit ({}) at pc {}; from there it runs in "
                           "plain Python for inputs that match none of its {} compiled versions",
                           code_location(run.code, run.code->co_firstlineno), ctx.recompile_limit,
                           run.pc, tried));
        }
        return resume(run, run.pc, false);
      }
      // Why the regions compiled before at this pc do not hold (the recompiles log, and the
      // rank check under torch.distributed).
      std::string recompile;
      if (tried > 0 && (log_enabled(Artifact::recompiles) ||
                        (ctx.on_region && !ctx.on_region.is_none()))) {
        for (Region* r : state.at(run.pc)) {
          if (r->ctx != run.ctx) continue;
          {
            PauseScope pause;
            recompile = r->guards.first_failure(r->sources, fs);
          }
          if (recompile.empty()) recompile = "value stack shape";
          break;
        }
        if (log_enabled(Artifact::recompiles)) {
          log_emit(Artifact::recompiles,
                   fmt::format("Recompiling {} at pc {}\n    triggered by the guard failure: {}",
                               code_location(run.code, run.code->co_firstlineno), run.pc,
                               recompile));
        }
      }
      // Another thread compiles this region now (tracing and backends let the GIL go): this
      // call runs it in plain Python rather than compile a duplicate.
      const std::pair<int, const CompileContext*> key{run.pc, run.ctx.get()};
      auto& compiling = state.compiling;
      if (std::find(compiling.begin(), compiling.end(), key) != compiling.end()) {
        slots.clear();
        return resume(run, run.pc, false);
      }
      compiling.push_back(key);
      struct Done {
        std::vector<std::pair<int, const CompileContext*>>& list;
        std::pair<int, const CompileContext*> key;
        ~Done() { list.erase(std::find(list.begin(), list.end(), key)); }
      } done{compiling, key};
      // Its guards were checked on this state as it was made: `slots` holds what they read.
      std::unique_ptr<Region> fresh = compile_region(run, run.pc, fs, /*warmed=*/false, slots);
      if (fresh == nullptr) {
        // Ctrl-C while tracing or compiling: raised in the frame at this instruction, so its
        // own try/except sees it. A fullgraph error is raised to the caller as it is.
        if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
          return resume(run, run.bytecode->at(run.pc).offset, true);
        }
        return nullptr;
      }
      if (!report_region(ctx, run.code, *fresh, *run.bytecode, recompile)) {
        slots.clear();
        return nullptr;  // raised to the caller, as a fullgraph error is
      }
      region = state.add(std::move(fresh));
    }
    ++region->hits;
    if (region->kind == RegionKind::kFallback) {
      slots.clear();
      return resume(run, run.pc, false);
    }
    const RegionExit& exit = region->exit;
    bool rerunnable = true;
    PyObject* outputs = nullptr;
    bool checked = true;
    if (!exit.checks_before.empty()) {  // may raise: before anything runs
      MemoTable memo(static_cast<size_t>(exit.memo_size));
      for (const Rebuild& check : exit.checks_before) {
        checked = checked && static_cast<bool>(Ref::steal(check.build(nullptr, slots, memo)));
      }
    }
    if (checked) outputs = run_graph(*region, slots, rerunnable);
    ExitValues values;
    if (outputs == nullptr || !build_exit_values(exit, outputs, slots, values)) {
      Py_XDECREF(outputs);
      slots.clear();
      if (rerunnable && !PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
        // The graph (or the exit's arithmetic on its numbers) raised, and nothing it did is
        // visible: CPython runs the region's code from its first instruction, so the error
        // comes from its own line, after the Python effects before it (applied only at the
        // exit), and the frame's try/except around it catches it.
        const std::string error = fetch_and_clear_error();
        if (log_enabled(Artifact::graph_breaks)) {
          log_emit(Artifact::graph_breaks,
                   fmt::format("__compiled_fn_{} raised {}; its region runs again in plain "
                               "Python from its first instruction: {}",
                               region->graph_id, error,
                               located(run.code, *run.bytecode, run.pc, "region start")));
        }
        return resume(run, run.pc, false);
      }
      // It wrote into an input before raising (BatchNorm's num_batches_tracked += 1 in
      // training, an in-place op on an argument): running the region again would write twice.
      // Raised at the region's first instruction; what the region did in Python before the
      // failing op is not done, and the user is told so once per region.
      if (region->raise_at_entry_loses && !region->raise_warned &&
          !PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
        region->raise_warned = true;
        PyObject *type, *value, *tb;  // the graph's exception, put back after the warning
        PyErr_Fetch(&type, &value, &tb);
        const std::string error = safe_repr(value ? value : type);
        warn(fmt::format("framejit: __compiled_fn_{} raised {} after writing into one of its "
                         "input tensors, so its region cannot run again as Python: the "
                         "exception comes from the region's first line, before the region's "
                         "attribute writes and outside the try blocks it opens. {}",
                         region->graph_id, error,
                         located(run.code, *run.bytecode, run.pc, "The region starts")));
        PyErr_Restore(type, value, tb);
      }
      return resume(run, run.bytecode->at(run.pc).offset, true);
    }
    Py_DECREF(outputs);
    slots.clear();
    if (!apply_attr_writes(exit, values)) {
      // A setter raised: reported like a graph error, at the region's first instruction, whose
      // stack is the one the runtime still holds.
      return resume(run, run.bytecode->at(run.pc).offset, true);
    }
    if (exit.kind == ExitKind::kReturn) {
      return fj_frame_return(run.tstate, run.frame, exit.pc, values.result.release(),
                             exit.op == Op::RETURN_VALUE ? 1 : 0);
    }
    write_exit_state(run, values);
    bool ok = true;
    switch (exit.kind) {
      case ExitKind::kDeopt:
        return resume(run, exit.pc, false);
      case ExitKind::kBranch:
        ok = perform_branch(run, exit);
        break;
      case ExitKind::kCall:
        ok = perform_call(run, exit);
        break;
      case ExitKind::kIter:
        ok = perform_iter(run, exit);
        break;
      case ExitKind::kWith:
        ok = perform_with(run, exit);
        break;
      case ExitKind::kSubscr:
        ok = perform_subscr(run, exit);
        break;
      case ExitKind::kReturn:
        break;
    }
    // The instruction raised: CPython raises it again at that instruction, with the stack as it
    // was before it, so the frame's own except/finally run and the traceback shows this line.
    if (!ok) return resume(run, exit.op_pc, true);
  }
}

}  // namespace

ThreadState& thread_state() { return t_state; }

size_t c_stack_left() {
  // The lowest address of this thread's stack, found once per thread (stacks grow down here).
  static thread_local uintptr_t low = [] {
    pthread_attr_t attr;
    void* addr = nullptr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return uintptr_t{0};
    pthread_attr_getstack(&attr, &addr, &size);
    pthread_attr_destroy(&attr);
    return reinterpret_cast<uintptr_t>(addr);
  }();
  char here = 0;
  const auto at = reinterpret_cast<uintptr_t>(&here);
  return low == 0 || at < low ? SIZE_MAX : at - low;
}

ActiveScope::ActiveScope(const std::shared_ptr<CompileContext>& ctx)
    : prev_(t_state.ctx_owner), prev_paused_(hook_pause_depth()) {
  if (!prev_ && runtime_state().active_threads++ == 0) fj_install_hook();
  t_state.ctx_owner = ctx;
  t_state.ctx = ctx.get();
  hook_pause_depth() = 0;
}

ActiveScope::~ActiveScope() {
  hook_pause_depth() = prev_paused_;
  t_state.ctx_owner = std::move(prev_);
  t_state.ctx = t_state.ctx_owner.get();
  if (!t_state.ctx && --runtime_state().active_threads == 0) {
    fj_uninstall_hook();
    runtime_state().retired.clear();  // no compiled call runs: what reset() dropped can go
  }
}

int graphs_compiled() { return runtime_state().next_graph_id; }

namespace {

bool is_disable_wrapper(PyCodeObject* code) {
  // torch._dynamo's DisableContext wrapper code, looked up on the first frame (kept for the
  // process's life). No C++ static guard: the lookup runs Python, which may let another thread
  // in (the GIL orders these plain statics); frames meanwhile see no wrapper.
  static bool looked_up = false;
  static PyObject* wrapper_code = nullptr;
  if (!looked_up) {
    looked_up = true;
    PauseScope pause;  // the lookup imports Python: its frames must not come back here
    try {
      wrapper_code = py::object(PyRefs::get().support.attr("dynamo_disable_code")()).release().ptr();
    } catch (const std::exception&) {
      PyErr_Clear();
    }
  }
  return wrapper_code != nullptr && reinterpret_cast<PyObject*>(code) == wrapper_code;
}

}  // namespace

}  // namespace framejit

extern "C" PyObject* fj_on_frame(PyThreadState* tstate, FjFrame* frame, int throwflag) {
  using namespace framejit;
  ThreadState& ts = t_state;
  if (ts.ctx == nullptr || hook_pause_depth() > 0 || throwflag || fj_frame_has_locals_dict(frame) ||
      fj_tracing_active(tstate)) {
    return fj_eval_default(tstate, frame, throwflag);
  }
  // With a frame hook installed every Python call is a C call too, so deep recursion runs out
  // of C stack long before sys.getrecursionlimit(). Near the end of the stack this frame and
  // everything it calls run in plain CPython with the hook off (CPython then makes Python calls
  // without C recursion, as eager does); at the very end a call raises RecursionError instead
  // of overflowing the stack.
  const size_t stack_left = c_stack_left();
  if (stack_left < kStackForTracing || fj_c_recursion_left(tstate) < kCallsForTracing) {
    if (stack_left < kStackReserve) {
      PyErr_SetString(PyExc_RecursionError,
                      "maximum recursion depth exceeded (the C stack, with framejit's frame hook "
                      "on: every Python call is a C call)");
      return fj_eval_default(tstate, frame, 1);
    }
    fj_uninstall_hook();
    PyObject* result = fj_eval_default(tstate, frame, throwflag);
    if (runtime_state().active_threads > 0) fj_install_hook();
    return result;
  }
  PyCodeObject* code = fj_frame_code(frame);
  if (is_disable_wrapper(code)) {
    // torch.compiler.disable(fn) / torch._dynamo.disable(fn) of a user's function: the wrapper
    // and everything it calls run in plain Python, as under torch.compile (the trace breaks at
    // a call to it; this keeps the hook off the frames the call then runs).
    bool honoured = true;
    try {
      PauseScope pause;
      honoured = PyRefs::get().support.attr("honours_disable")(
                     py::handle(fj_frame_function(frame))).cast<bool>();
    } catch (const std::exception&) {
      PyErr_Clear();
    }
    if (honoured) {
      PauseScope pause;
      return fj_eval_default(tstate, frame, throwflag);
    }
  }
  CodeState* state = nullptr;
  try {
    state = code_state(code);
    if (state->decision == CodeState::Decision::kUnknown) {
      state->decision = should_skip_code(code, true) ? CodeState::Decision::kSkip
                                               : CodeState::Decision::kRun;
    }
    if (state->decision == CodeState::Decision::kGivenUp ||
        (state->decision == CodeState::Decision::kSkip &&
         ts.ctx->entry_code.ptr() != reinterpret_cast<PyObject*>(code))) {
      return fj_eval_default(tstate, frame, throwflag);
    }
  } catch (const std::exception& e) {
    PyErr_Clear();
    warn(std::string("framejit: internal error in the frame hook: ") + e.what());
    return fj_eval_default(tstate, frame, throwflag);
  }
  FrameRun run{tstate, frame, code, *state, ts.ctx_owner};
  try {
    run.bytecode = &decoded_bytecode(code, *state);
    return run_frame(run);
  } catch (const std::exception& e) {
    // Regions already run have written their state into the frame: CPython goes on from the
    // current pc, never from the start, so nothing runs twice.
    PyErr_Clear();
    warn(std::string("framejit: internal error in the frame runtime: ") + e.what() +
         "; the rest of the frame runs in plain Python");
    state->decision = CodeState::Decision::kGivenUp;
    return resume(run, run.pc, false);
  }
}
