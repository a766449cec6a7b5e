// Grad and inference mode inside one graph: `with torch.no_grad()` / `enable_grad()` /
// `set_grad_enabled(mode)` record torch._C._set_grad_enabled(mode) nodes, `with
// torch.inference_mode()` records enter/exit nodes. The real mode is switched while the body is
// traced (so meta results get eager's requires_grad) and restored when the trace ends. A region
// that ends inside a grad-mode body leaves a real __exit__ on the stack
// (_support.grad_mode_exit); one that would end inside an inference_mode body is traced again
// with that block left to the runtime.
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {
namespace {

bool real_grad_enabled() {
  return PyRefs::get().torch.attr("is_grad_enabled")().cast<bool>();
}

py::object grad_mode_module() { return PyRefs::get().torch.attr("autograd").attr("grad_mode"); }

// A kObject standing for a mode object of the trace (see the markers in value.h).
ValuePtr mode_value(const char* marker, py::object obj) {
  auto value = std::make_shared<Value>();
  value->kind = VKind::kObject;
  value->obj = std::move(obj);
  value->method = marker;
  return value;
}

}  // namespace

Node* Tracer::record_mode_switch(py::handle fn, const char* target_text, Arg arg,
                                 const char* name_hint) {
  Node* node = graph_.add_call(NodeKind::kCallFunction, py::reinterpret_borrow<py::object>(fn),
                               target_text, "", {std::move(arg)}, {}, py::none(), {}, false,
                               instr().line, name_hint);
  locate(node);
  return node;
}

void Tracer::push_with_exit(ValuePtr exit) {
  push(std::move(exit));
  push(Value::constant(py::none()));  // what __enter__ returns
}

ValuePtr Tracer::grad_mode_manager(py::handle cls) {
  // no_grad() / enable_grad(): no effect until entered.
  return mode_value(kGradModeManager, py::reinterpret_borrow<py::object>(cls)());
}

ValuePtr Tracer::set_grad_enabled_call(const std::vector<ValuePtr>& args) {
  if (args.size() != 1 || !args[0]->is_const() || !PyBool_Check(args[0]->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedCall, "torch.set_grad_enabled with a mode not known at trace time");
  }
  const bool prev = real_grad_enabled();
  const bool mode = args[0]->obj.cast<bool>();
  switch_grad_mode(mode);  // set_grad_enabled switches when it is made
  return mode_value(kGradModeSet, py::make_tuple(py::bool_(prev), py::bool_(mode)));
}

void Tracer::switch_grad_mode(bool enabled) {
  py::object set_grad = PyRefs::get().torch.attr("_C").attr("_set_grad_enabled");
  record_mode_switch(set_grad, "torch._C._set_grad_enabled", Arg::constant(py::bool_(enabled)),
                     "set_grad_enabled");
  if (!grad_at_start_) grad_at_start_ = real_grad_enabled();
  set_grad(enabled);
}

void Tracer::restore_grad_mode() {
  py::object exit_inference = grad_mode_module().attr("_exit_inference_mode");
  while (!inference_contexts_.empty()) {  // innermost first
    exit_inference(inference_contexts_.back());
    inference_contexts_.pop_back();
  }
  inference_sites_.clear();
  if (!grad_at_start_) return;
  PyRefs::get().torch.attr("_C").attr("_set_grad_enabled")(*grad_at_start_);
  grad_at_start_.reset();
}

ValuePtr Tracer::inference_mode_call(const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  ValuePtr mode = !args.empty() ? args[0] : (!kwargs.empty() ? kwargs[0].second : Value::constant(py::bool_(true)));
  if (args.size() + kwargs.size() > 1 || (!kwargs.empty() && kwargs[0].first != "mode") ||
      !mode->is_const() || !PyBool_Check(mode->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedCall, "torch.inference_mode with a mode not known at trace time");
  }
  // No effect until entered.
  return mode_value(kInferenceManager, PyRefs::get().torch.attr("inference_mode")(mode->obj));
}

void Tracer::enter_inference_mode(const ValuePtr& manager) {
  const CallSite site{frame().code, instr().offset};
  if (no_inline_ != nullptr && no_inline_->count(site)) {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "with torch.inference_mode(): the runtime enters it (the region breaks inside)");
  }
  py::object enter = grad_mode_module().attr("_enter_inference_mode");
  py::object mode = manager->obj.attr("mode");
  Node* node = record_mode_switch(enter, "torch.autograd.grad_mode._enter_inference_mode",
                                  Arg::constant(mode), "inference_mode");
  if (!grad_at_start_) grad_at_start_ = real_grad_enabled();
  py::object context = enter(mode);  // the real thread state while the body is traced
  inference_contexts_.push_back(context);
  inference_sites_.push_back(site);
  ValuePtr exit = mode_value(kInferenceExit, context);
  exit->node = node;
  push_with_exit(std::move(exit));
}

void Tracer::check_no_open_inference_block(const std::string& why) {
  if (inference_sites_.empty()) return;
  throw InlineBreak{inference_sites_.back(), why + " (inside `with torch.inference_mode()`)"};
}

void Tracer::enter_with(const ValuePtr& manager) {
  const std::string& kind = manager->kind == VKind::kObject ? manager->method : std::string();
  if (kind == kInferenceManager) {
    enter_inference_mode(manager);
  } else if (kind == kGradModeSet) {
    // `with torch.set_grad_enabled(mode):` switched when it was made; __enter__ sets it again,
    // __exit__ restores the mode from before it was made.
    ValuePtr exit = mode_value(kGradModeExit, manager->obj[py::int_(0)]);
    switch_grad_mode(manager->obj[py::int_(1)].cast<bool>());
    push_with_exit(std::move(exit));
  } else if (kind == kGradModeManager) {
    const bool enabled =
        PyObject_IsInstance(manager->obj.ptr(), PyRefs::get().torch.attr("enable_grad").ptr()) == 1;
    ValuePtr exit = mode_value(kGradModeExit, py::bool_(real_grad_enabled()));  // what __exit__ restores
    switch_grad_mode(enabled);
    push_with_exit(std::move(exit));
  } else {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "with {}: the runtime enters it", manager->describe());
  }
}

ValuePtr Tracer::exit_with(const ValuePtr& exit, const std::vector<ValuePtr>& args) {
  for (const ValuePtr& arg : args) {
    if (!arg->is_const() || !arg->obj.is_none()) {
      FJ_UNSUPPORTED(kUnsupportedCall, "__exit__ of a grad-mode block with an exception");
    }
  }
  if (exit->method == kInferenceExit) {
    FJ_CHECK(!inference_contexts_.empty() && inference_contexts_.back().is(exit->obj),
             "inference_mode blocks exited out of order");
    py::object leave = grad_mode_module().attr("_exit_inference_mode");
    record_mode_switch(leave, "torch.autograd.grad_mode._exit_inference_mode", Arg::of(exit->node),
                       "exit_inference_mode");
    leave(exit->obj);
    inference_contexts_.pop_back();
    inference_sites_.pop_back();
  } else {
    switch_grad_mode(exit->obj.cast<bool>());
  }
  return Value::constant(py::none());
}

}  // namespace framejit
