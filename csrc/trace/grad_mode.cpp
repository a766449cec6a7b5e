// `with torch.no_grad():` / `with torch.enable_grad():` inside one graph: entering records
// torch._C._set_grad_enabled(mode) and switches the real mode while the body is traced (so meta
// results get eager's requires_grad); the block's __exit__ call records the switch back. A region
// that ends inside the body leaves a real __exit__ on the stack (_support.grad_mode_exit).
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {
namespace {

bool real_grad_enabled() {
  return PyRefs::get().torch.attr("is_grad_enabled")().cast<bool>();
}

}  // namespace

ValuePtr Tracer::grad_mode_manager(py::handle cls) {
  auto value = std::make_shared<Value>();
  value->kind = VKind::kObject;
  value->obj = py::reinterpret_borrow<py::object>(cls)();  // no_grad() / enable_grad(): no effect yet
  value->method = kGradModeManager;
  return value;
}

ValuePtr Tracer::set_grad_enabled_call(const std::vector<ValuePtr>& args) {
  if (args.size() != 1 || !args[0]->is_const() || !PyBool_Check(args[0]->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedCall, "torch.set_grad_enabled with a mode not known at trace time");
  }
  const bool prev = real_grad_enabled();
  const bool mode = args[0]->obj.cast<bool>();
  switch_grad_mode(mode);
  auto value = std::make_shared<Value>();
  value->kind = VKind::kObject;
  value->obj = py::make_tuple(py::bool_(prev), py::bool_(mode));
  value->method = kGradModeSet;
  return value;
}

void Tracer::switch_grad_mode(bool enabled) {
  py::object set_grad = PyRefs::get().torch.attr("_C").attr("_set_grad_enabled");
  locate(graph_.add_call(NodeKind::kCallFunction, set_grad, "torch._C._set_grad_enabled", "",
                         {Arg::constant(py::bool_(enabled))}, {}, py::none(), {}, false,
                         instr().line, "set_grad_enabled"));
  if (!grad_at_start_) grad_at_start_ = real_grad_enabled();
  set_grad(enabled);
}

void Tracer::restore_grad_mode() {
  py::object exit_inference = PyRefs::get().torch.attr("autograd").attr("grad_mode").attr("_exit_inference_mode");
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
  auto value = std::make_shared<Value>();
  value->kind = VKind::kObject;
  value->obj = PyRefs::get().torch.attr("inference_mode")(mode->obj);  // no effect until entered
  value->method = kInferenceManager;
  return value;
}

void Tracer::enter_inference_mode(const ValuePtr& manager) {
  const CallSite site{frame().code, instr().offset};
  if (no_inline_ != nullptr && no_inline_->count(site)) {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "with torch.inference_mode(): the runtime enters it (the region breaks inside)");
  }
  py::object grad_mode = PyRefs::get().torch.attr("autograd").attr("grad_mode");
  py::object enter = grad_mode.attr("_enter_inference_mode");
  py::object mode = manager->obj.attr("mode");
  Node* node = graph_.add_call(NodeKind::kCallFunction, enter,
                               "torch.autograd.grad_mode._enter_inference_mode", "",
                               {Arg::constant(mode)}, {}, py::none(), {}, false, instr().line,
                               "inference_mode");
  locate(node);
  if (!grad_at_start_) grad_at_start_ = real_grad_enabled();
  py::object context = enter(mode);  // the real thread state while the body is traced
  inference_contexts_.push_back(context);
  inference_sites_.push_back(site);
  auto exit = std::make_shared<Value>();
  exit->kind = VKind::kObject;
  exit->obj = context;
  exit->node = node;
  exit->method = kInferenceExit;
  push(exit);
  push(Value::constant(py::none()));
}

void Tracer::check_no_open_inference_block(const std::string& why) {
  if (inference_sites_.empty()) return;
  throw InlineBreak{inference_sites_.back(), why + " (inside `with torch.inference_mode()`)"};
}

void Tracer::enter_with(const ValuePtr& manager) {
  if (manager->kind == VKind::kObject && manager->method == kInferenceManager) {
    enter_inference_mode(manager);
    return;
  }
  if (manager->kind == VKind::kObject && manager->method == kGradModeSet) {
    // `with torch.set_grad_enabled(mode):` switched when it was made; __enter__ sets it again,
    // __exit__ restores the mode from before it was made.
    auto exit = std::make_shared<Value>();
    exit->kind = VKind::kObject;
    exit->obj = manager->obj[py::int_(0)];
    exit->method = kGradModeExit;
    switch_grad_mode(manager->obj[py::int_(1)].cast<bool>());
    push(exit);
    push(Value::constant(py::none()));
    return;
  }
  if (manager->kind != VKind::kObject || manager->method != kGradModeManager) {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "with {}: the runtime enters it", manager->describe());
  }
  const bool enabled = PyObject_IsInstance(manager->obj.ptr(), PyRefs::get().torch.attr("enable_grad").ptr()) == 1;
  auto exit = std::make_shared<Value>();
  exit->kind = VKind::kObject;
  exit->obj = py::bool_(real_grad_enabled());  // the mode __exit__ restores
  exit->method = kGradModeExit;
  switch_grad_mode(enabled);
  push(exit);
  push(Value::constant(py::none()));  // what __enter__ returns
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
    py::object leave = PyRefs::get().torch.attr("autograd").attr("grad_mode").attr("_exit_inference_mode");
    locate(graph_.add_call(NodeKind::kCallFunction, leave,
                           "torch.autograd.grad_mode._exit_inference_mode", "",
                           {Arg::of(exit->node)}, {}, py::none(), {}, false, instr().line,
                           "exit_inference_mode"));
    leave(exit->obj);
    inference_contexts_.pop_back();
    inference_sites_.pop_back();
    return Value::constant(py::none());
  }
  switch_grad_mode(exit->obj.cast<bool>());
  return Value::constant(py::none());
}

}  // namespace framejit
