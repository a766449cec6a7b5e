// Grad and inference mode and autocast inside one graph: `with torch.no_grad()` /
// `enable_grad()` / `set_grad_enabled(mode)` record torch._C._set_grad_enabled(mode) nodes,
// `with torch.inference_mode()` and `with torch.autocast(...)` record enter/exit nodes. The real
// mode is switched while the body is traced (so meta results get eager's requires_grad) and
// restored when the trace ends (ModeStack). A region that ends inside a grad-mode body leaves a
// real __exit__ on the stack (_support.grad_mode_exit); one that would end inside an
// inference_mode or autocast body is traced again with that block left to the runtime.
#include "trace/modes.h"

#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {
namespace {

py::object grad_mode_module() { return PyRefs::get().torch.attr("autograd").attr("grad_mode"); }

// A kObject standing for a mode object of the trace (see the mode roles in value.h).
ValuePtr mode_value(ObjRole role, py::object obj) {
  auto value = std::make_shared<Value>();
  value->kind = VKind::kObject;
  value->obj = std::move(obj);
  value->role = role;
  return value;
}

// A node calling fn(*args) that switches a mode (no result the graph reads, except inference
// mode's and autocast's context, which their exit node takes).
Node* record_mode_switch(Tracer& t, py::handle fn, const char* target_text, std::vector<Arg> args,
                         const char* name_hint) {
  NodeSpec spec;
  spec.target = py::reinterpret_borrow<py::object>(fn);
  spec.target_text = target_text;
  spec.args = std::move(args);
  spec.fake = py::none();
  spec.name_hint = name_hint;
  return t.recorder().add(std::move(spec));
}

// BEFORE_WITH's results: the __exit__, then what __enter__ returns (None).
void push_with_exit(Tracer& t, ValuePtr exit) {
  t.push(std::move(exit));
  t.push(Value::constant(py::none()));
}

void switch_grad_mode(Tracer& t, bool enabled) {
  py::object set_grad = PyRefs::get().torch.attr("_C").attr("_set_grad_enabled");
  record_mode_switch(t, set_grad, "torch._C._set_grad_enabled",
                     {Arg::constant(py::bool_(enabled))}, "set_grad_enabled");
  t.modes().set_grad_enabled(enabled);
}

void enter_mode_block(Tracer& t, const ValuePtr& manager, ObjRole exit_role, py::object enter,
                      const char* enter_text, std::vector<Arg> enter_args, py::tuple real_args,
                      py::object leave, const char* name_hint) {
  const CallSite site = t.call_site_here();
  if (!t.may_inline(site)) {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "with {}: the runtime enters it (the region breaks inside)",
                   manager->describe());
  }
  Node* node = record_mode_switch(t, enter, enter_text, std::move(enter_args), name_hint);
  t.modes().remember_grad();
  py::object context = enter(*real_args);  // the real thread state while the body is traced
  t.modes().open_block(site, std::move(leave), context);
  ValuePtr exit = mode_value(exit_role, context);
  exit->node = node;
  push_with_exit(t, std::move(exit));
}

void enter_inference_mode(Tracer& t, const ValuePtr& manager) {
  if (!t.modes().inference_in_graph()) {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "with {}: the runtime enters it (a graph for this backend "
                   "does not enter inference mode)", manager->describe());
  }
  py::object mode = manager->obj.attr("mode");
  enter_mode_block(t, manager, ObjRole::kInferenceExit,
                   grad_mode_module().attr("_enter_inference_mode"),
                   "torch.autograd.grad_mode._enter_inference_mode", {Arg::constant(mode)},
                   py::make_tuple(mode), grad_mode_module().attr("_exit_inference_mode"),
                   "inference_mode");
}

}  // namespace

ValuePtr make_grad_mode_manager(py::handle cls) {
  // no_grad() / enable_grad(): no effect until entered.
  return mode_value(ObjRole::kGradManager, py::reinterpret_borrow<py::object>(cls)());
}

ValuePtr set_grad_enabled_call(Tracer& t, const std::vector<ValuePtr>& args) {
  if (args.size() != 1 || !args[0]->is_const() || !PyBool_Check(args[0]->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedCall, "torch.set_grad_enabled with a mode not known at trace time");
  }
  const bool prev = ModeStack::grad_enabled();
  const bool mode = args[0]->obj.cast<bool>();
  switch_grad_mode(t, mode);  // set_grad_enabled switches when it is made
  return mode_value(ObjRole::kGradSet, py::make_tuple(py::bool_(prev), py::bool_(mode)));
}

ValuePtr inference_mode_call(const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  ValuePtr mode = !args.empty()     ? args[0]
                  : !kwargs.empty() ? kwargs[0].second
                                    : Value::constant(py::bool_(true));
  if (args.size() + kwargs.size() > 1 || (!kwargs.empty() && kwargs[0].first != "mode") ||
      !mode->is_const() || !PyBool_Check(mode->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedCall, "torch.inference_mode with a mode not known at trace time");
  }
  // No effect until entered.
  return mode_value(ObjRole::kInferenceManager,
                    PyRefs::get().torch.attr("inference_mode")(mode->obj));
}

ValuePtr autocast_call(const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  py::list real_args;
  py::dict real_kwargs;
  for (const auto& a : args) {
    if (!a->is_const()) FJ_UNSUPPORTED(kUnsupportedCall, "torch.autocast with {}", a->describe());
    real_args.append(a->obj);
  }
  for (const auto& [key, value] : kwargs) {
    if (!value->is_const()) {
      FJ_UNSUPPORTED(kUnsupportedCall, "torch.autocast with {}={}", key, value->describe());
    }
    real_kwargs[py::str(key)] = value->obj;
  }
  py::object manager;
  try {
    manager = PyRefs::get().torch.attr("autocast")(*py::tuple(real_args), **real_kwargs);
  } catch (const py::error_already_set& e) {
    FJ_UNSUPPORTED(kUnsupportedCall, "torch.autocast raised at trace time: {}", e.what());
  }
  // The call's arguments as _enter_autocast takes them, unresolved: a dtype left out is the
  // autocast default when the graph runs (torch.set_autocast_dtype), as in eager.
  py::object bound = py::module_::import("inspect")
                         .attr("signature")(PyRefs::get().torch.attr("autocast").attr("__init__"))
                         .attr("bind")(py::none(), *real_args, **real_kwargs);
  py::dict given = bound.attr("arguments");
  ValuePtr value = mode_value(ObjRole::kAutocastManager, std::move(manager));  // not entered yet
  for (const char* name : {"device_type", "dtype", "enabled", "cache_enabled"}) {
    value->items.push_back(Value::constant(
        given.contains(name)                 ? py::object(given[name])
        : std::string(name) == "enabled" ? py::object(py::bool_(true))
                                             : py::object(py::none())));
  }
  return value;
}

ValuePtr null_context_call(py::handle cls, const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  if (!kwargs.empty()) {
    FJ_UNSUPPORTED(kUnsupportedCall, "{} with keyword arguments", safe_repr(cls));
  }
  ValuePtr value = mode_value(ObjRole::kNullManager, py::reinterpret_borrow<py::object>(cls));
  value->items = args;  // its enter_result (nullcontext), name and args (record_function)
  return value;
}

void check_no_open_mode_block(Tracer& t, const std::string& why) {
  if (!t.modes().in_block()) return;
  throw InlineBreak{t.modes().innermost_site(), why + " (inside `with torch.inference_mode()`)"};
}

void enter_with(Tracer& t, const ValuePtr& manager) {
  if (manager->is(ObjRole::kInferenceManager)) {
    enter_inference_mode(t, manager);
  } else if (manager->is(ObjRole::kAutocastManager)) {
    // _enter_autocast(device_type, dtype, enabled, cache_enabled), as the manager holds them.
    py::object amp = PyRefs::get().torch.attr("amp").attr("autocast_mode");
    py::tuple vals = py::make_tuple(manager->items[0]->obj, manager->items[1]->obj,
                                    manager->items[2]->obj, manager->items[3]->obj);
    std::vector<Arg> enter_args;
    for (py::handle v : vals) {
      enter_args.push_back(Arg::constant(py::reinterpret_borrow<py::object>(v)));
    }
    enter_mode_block(t, manager, ObjRole::kAutocastExit, amp.attr("_enter_autocast"),
                     "torch.amp.autocast_mode._enter_autocast", std::move(enter_args), vals,
                     amp.attr("_exit_autocast"), "enter_autocast");
  } else if (manager->is(ObjRole::kGradSet)) {
    // `with torch.set_grad_enabled(mode):` switched when it was made; __enter__ sets it again,
    // __exit__ restores the mode from before it was made.
    ValuePtr exit = mode_value(ObjRole::kGradExit, manager->obj[py::int_(0)]);
    switch_grad_mode(t, manager->obj[py::int_(1)].cast<bool>());
    push_with_exit(t, std::move(exit));
  } else if (manager->is(ObjRole::kGradManager)) {
    const bool enabled =
        PyObject_IsInstance(manager->obj.ptr(), PyRefs::get().torch.attr("enable_grad").ptr()) == 1;
    // What __exit__ restores.
    ValuePtr exit = mode_value(ObjRole::kGradExit, py::bool_(ModeStack::grad_enabled()));
    switch_grad_mode(t, enabled);
    push_with_exit(t, std::move(exit));
  } else if (manager->is(ObjRole::kNullManager)) {
    const bool null_context =
        manager->obj.is(py::module_::import("contextlib").attr("nullcontext"));
    t.push(mode_value(ObjRole::kNullExit, py::none()));
    t.push(null_context && !manager->items.empty() ? manager->items[0] : Value::constant(py::none()));
  } else {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "with {}: the runtime enters it", manager->describe());
  }
}

ValuePtr exit_with(Tracer& t, const ValuePtr& exit, const std::vector<ValuePtr>& args) {
  for (const ValuePtr& arg : args) {
    if (!arg->is_const() || !arg->obj.is_none()) {
      FJ_UNSUPPORTED(kUnsupportedCall, "__exit__ of a grad-mode block with an exception");
    }
  }
  if (exit->is(ObjRole::kNullExit)) return Value::constant(py::none());
  if (exit->is(ObjRole::kInferenceExit) || exit->is(ObjRole::kAutocastExit)) {
    const bool inference = exit->is(ObjRole::kInferenceExit);
    py::object leave = t.modes().close_block(exit->obj);
    record_mode_switch(t, leave,
                       inference ? "torch.autograd.grad_mode._exit_inference_mode"
                                 : "torch.amp.autocast_mode._exit_autocast",
                       {Arg::of(exit->node)}, inference ? "exit_inference_mode" : "exit_autocast");
  } else {
    switch_grad_mode(t, exit->obj.cast<bool>());
  }
  return Value::constant(py::none());
}

}  // namespace framejit
