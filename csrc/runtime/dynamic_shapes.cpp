// Symbolic sizes for backends that do not run any size: see dynamic_shapes.h.
#include "runtime/dynamic_shapes.h"

#include <fmt/format.h>

#include "guards/tensor_check.h"
#include "runtime/eval_frame.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

// framejit._dynamic, imported on first use and kept for the process's life.
py::handle dynamic_module() {
  static py::handle module = py::module_::import("framejit._dynamic").release();
  return module;
}

// Whether obj is a tensor that torch._dynamo.mark_dynamic / maybe_mark_dynamic marked.
bool marked_dynamic(PyObject* obj) {
  if (obj == nullptr || !is_tensor(obj)) return false;
  for (const char* name : {"_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices"}) {
    const int has = PyObject_HasAttrString(obj, name);
    if (has > 0) return true;
  }
  return false;
}

}  // namespace

bool wants_symbolic_trace(const CompileContext& ctx, const CodeState& state, int pc,
                          PyCodeObject* code, const FrameState& fs) {
  if (!ctx.symbolic_backend()) return false;
  if (ctx.dynamic == 1) return true;
  for (const Region* region : state.at(pc)) {
    if (region->ctx.get() == &ctx && region->kind == RegionKind::kCompiled) return true;
  }
  for (int i = 0; i < fj_code_nlocalsplus(code); ++i) {
    if (marked_dynamic(fs.localsplus[i])) return true;
  }
  for (int i = 0; i < fs.stack_size; ++i) {
    if (marked_dynamic(fs.stack[i])) return true;
  }
  return false;
}

SymbolicDims plan_symbolic_dims(const CompileContext& ctx, CodeState& state, int pc,
                                Tracer& tracer) {
  SymbolicDims out;
  const SizeTracker& sizes = tracer.sizes();
  // A trace that read sizes the walk cannot place pins them all; the plan still remembers this
  // compile's sizes. (A trace with constant sizes pins none it knows of: a plan made on it
  // proposes dims, and the symbolic trace that follows is planned again.)
  const bool all_pinned = sizes.symbolic() && sizes.sizes_read();
  const EntryState& entry = tracer.entry();
  const std::vector<Rebuild>& inputs = entry.inputs();
  py::list values, names, pinned, own, dense;
  for (const Rebuild& input : inputs) {
    const bool slot = input.kind == Rebuild::Kind::kSlot;
    PyObject* value = slot ? entry.live_value(input.index) : nullptr;
    values.append(value ? py::handle(value) : py::handle(Py_None));
    names.append(slot ? py::str(entry.sources().at(input.index).text) : py::str(""));
    own.append(py::bool_(slot && entry.is_frame_state(input.index)));
    dense.append(py::bool_(tensor_is_dense(value)));  // the layout the guard can check
    if (all_pinned) {
      pinned.append(py::none());
      continue;
    }
    py::list dims;
    if (slot) {
      auto found = sizes.pinned_dims().find(input.index);
      if (found != sizes.pinned_dims().end()) {
        for (int dim : found->second) dims.append(dim);
      }
    }
    pinned.append(dims);
  }
  py::object dynamic = ctx.dynamic < 0 ? py::none() : py::object(py::bool_(ctx.dynamic == 1));
  py::object plan = dynamic_module().attr("plan_symbolic_dims")(values, names, pinned, own, dense,
                                                                dynamic,
                                                                state.sizes_seen,
                                                                py::make_tuple(ctx.id, pc));
  if (plan.is_none()) return out;
  out.by_input = plan.cast<py::list>();
  for (size_t i = 0; i < inputs.size(); ++i) {
    py::list dims = out.by_input[i].cast<py::list>();
    if (dims.empty()) continue;
    std::set<int>& mine = out.by_slot[inputs[i].index];
    std::string text;
    for (py::handle dim : dims) {
      mine.insert(dim.cast<int>());
      text += (text.empty() ? "" : ", ") + std::to_string(dim.cast<int>());
    }
    const bool number = mine.count(-1) > 0;  // an int input: the number itself (a SymInt)
    out.text += fmt::format("{}{}{}", out.text.empty() ? "" : "; ", names[i].cast<std::string>(),
                            number ? " (an int)" : " dims [" + text + "]");
  }
  return out;
}

py::object compile_with_symbolic_sizes(const CompileContext& ctx, const SymbolicDims& dims,
                                       py::object gm, py::list example_inputs,
                                       const std::vector<Rebuild>& inputs,
                                       const SourceTable& sources, GuardSet& guards) {
  py::list names;
  for (const Rebuild& input : inputs) {
    names.append(input.kind == Rebuild::Kind::kSlot ? sources.at(input.index).text
                                                    : std::string());
  }
  // (compiled, check, explain, [input index], [guard text]); check None: no shape guards.
  py::tuple result = dynamic_module().attr("compile_symbolic")(ctx.backend, gm, example_inputs,
                                                               dims.by_input, names);
  py::object check = result[1];
  if (!check.is_none()) {
    std::vector<int> slots;
    for (py::handle index : result[3].cast<py::list>()) {
      slots.push_back(inputs[index.cast<size_t>()].index);
    }
    std::vector<std::string> texts;
    for (py::handle text : result[4].cast<py::list>()) texts.push_back(text.cast<std::string>());
    guards.add_shape_guards(check, result[2], std::move(slots), std::move(texts));
  }
  return result[0];
}

}  // namespace framejit
