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

bool Tracer::is_grad_mode_manager_class(py::handle callable) {
  py::object torch = PyRefs::get().torch;
  return callable.ptr() == torch.attr("no_grad").ptr() || callable.ptr() == torch.attr("enable_grad").ptr();
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
  if (!grad_at_start_) return;
  PyRefs::get().torch.attr("_C").attr("_set_grad_enabled")(*grad_at_start_);
  grad_at_start_.reset();
}

void Tracer::enter_with(const ValuePtr& manager) {
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
  switch_grad_mode(exit->obj.cast<bool>());
  return Value::constant(py::none());
}

}  // namespace framejit
