// Inlining: tracing into Python functions, methods and nn.Module.forward (argument binding,
// defaults, *args/**kwargs) and their closure cells.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "common/check.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

// Whether any global nn.Module hook is registered (then module calls are not inlined): the
// hook dicts of torch.nn.modules.module, read in C.
bool global_module_hooks() {
  PyObject* module = PyRefs::get().nn_module_module.ptr();
  static const char* kHookDicts[] = {"_global_forward_hooks", "_global_forward_pre_hooks",
                                     "_global_backward_hooks", "_global_backward_pre_hooks",
                                     "_global_forward_hooks_always_called"};
  PyObject* globals = PyModule_GetDict(module);  // Borrowed
  for (const char* name : kHookDicts) {
    PyObject* hooks = PyDict_GetItemString(globals, name);  // Borrowed
    if (hooks == nullptr) continue;
    const Py_ssize_t n = PyObject_Length(hooks);
    if (n < 0) throw py::error_already_set();
    if (n > 0) return true;
  }
  return false;
}


std::string name_of(PyObject* str) {
  const char* data = PyUnicode_AsUTF8(str);
  if (data == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return data;
}

// Values a function reached without a source may carry (defaults, closure contents) that are safe
// to bake into the trace unguarded: immutable constants and objects used by identity.
bool is_fixed_value(PyObject* obj) {
  return obj == Py_None || PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) || PyBool_Check(obj) ||
         PyUnicode_CheckExact(obj) || PyType_Check(obj) || PyFunction_Check(obj) ||
         PyCFunction_Check(obj) || PyModule_Check(obj);
}

// Such a value as the trace sees it: a constant, or (sentinels such as dataclasses'
// _HAS_DEFAULT_FACTORY) an object used by identity only (an unsourced object's state is never
// read: attribute reads of it end the region). Containers and tensors: nullptr.
ValuePtr carried_value(PyObject* obj) {
  if (is_fixed_value(obj)) return Value::constant(py::reinterpret_borrow<py::object>(obj));
  if (PyTuple_Check(obj) || PyList_Check(obj) || PyDict_Check(obj) || PyAnySet_Check(obj) ||
      is_tensor(obj)) {
    return nullptr;
  }
  return Value::object(py::reinterpret_borrow<py::object>(obj));
}

}  // namespace

std::vector<ValuePtr> Tracer::bind_arguments(PyCodeObject* code, py::handle function,
                                             const ValuePtr& fn, std::vector<ValuePtr> args,
                                             KwValues kwargs) {
  const int n_pos = code->co_argcount;
  const int n_posonly = code->co_posonlyargcount;
  const int n_kwonly = code->co_kwonlyargcount;
  const bool has_varargs = (code->co_flags & CO_VARARGS) != 0;
  const bool has_varkw = (code->co_flags & CO_VARKEYWORDS) != 0;
  const std::string fname = name_of(code->co_qualname);
  const bool made = fn && fn->is(ObjRole::kMadeFunction);
  std::vector<ValuePtr> locals(static_cast<size_t>(code->co_nlocalsplus));
  auto param = [&](int i) { return name_of(PyTuple_GET_ITEM(code->co_localsplusnames, i)); };

  // A default (or closure) value read from the function object: through a source when the
  // function has one, so tensors become inputs and everything else is guarded.
  auto from_function = [&](const char* attr, py::object key, py::handle real) -> ValuePtr {
    if (fn && fn->source >= 0) {
      ValuePtr container = entry_.load(entry_.sources().attr(fn->source, attr));
      FJ_CHECK(container != nullptr, "{}.{} unreadable", fname, attr);
      return item(container, Value::constant(std::move(key)));
    }
    if (ValuePtr value = carried_value(real.ptr())) return value;
    FJ_UNSUPPORTED(kUnsupportedValue, "default {} of {} (a function without a source)",
                   safe_repr(real), fname);
  };

  const size_t given = args.size();
  for (size_t i = 0; i < given && static_cast<int>(i) < n_pos; ++i) locals[i] = args[i];
  if (static_cast<int>(given) > n_pos) {
    if (!has_varargs) {
      FJ_UNSUPPORTED(kUnsupportedCall, "{}() takes {} positional arguments but {} were given",
                     fname, n_pos, given);
    }
    locals[n_pos + n_kwonly] =
        Value::tuple(std::vector<ValuePtr>(args.begin() + n_pos, args.end()));
  } else if (has_varargs) {
    locals[n_pos + n_kwonly] = Value::tuple({});
  }
  ValuePtr varkw = has_varkw ? Value::dict({}, {}) : nullptr;
  for (auto& [key, value] : kwargs) {
    int found = -1;
    for (int i = n_posonly; i < n_pos + n_kwonly; ++i) {
      if (param(i) == key) found = i;
    }
    if (found >= 0) {
      if (locals[found]) {
        FJ_UNSUPPORTED(kUnsupportedCall, "{}() got multiple values for '{}'", fname, key);
      }
      locals[found] = value;
    } else if (varkw) {
      varkw->keys.push_back(py::str(key));
      varkw->items.push_back(value);
    } else {
      FJ_UNSUPPORTED(kUnsupportedCall, "{}() got an unexpected keyword argument '{}'", fname, key);
    }
  }
  if (varkw) locals[n_pos + n_kwonly + (has_varargs ? 1 : 0)] = varkw;

  py::object defaults = made ? py::object(py::none())
                             : py::getattr(function, "__defaults__", py::none());
  const ValuePtr made_defaults = made ? fn->items[0] : nullptr;
  const int n_defaults = made ? (made_defaults->kind == VKind::kNull
                                     ? 0
                                     : static_cast<int>(made_defaults->items.size()))
                       : defaults.is_none() ? 0 : static_cast<int>(py::len(defaults));
  for (int i = 0; i < n_pos; ++i) {
    if (locals[i]) continue;
    const int d = i - (n_pos - n_defaults);
    if (d < 0) FJ_UNSUPPORTED(kUnsupportedCall, "{}() missing argument '{}'", fname, param(i));
    locals[i] = made ? made_defaults->items.at(d)
                     : from_function("__defaults__", py::int_(d), defaults[py::int_(d)]);
  }
  py::object kwdefaults = made ? py::object(py::none())
                               : py::getattr(function, "__kwdefaults__", py::none());
  for (int i = n_pos; i < n_pos + n_kwonly; ++i) {
    if (locals[i]) continue;
    if (made && fn->items[1]->kind == VKind::kDict) {
      const ValuePtr& kw = fn->items[1];
      for (size_t k = 0; k < kw->keys.size() && !locals[i]; ++k) {
        if (py::str(kw->keys[k]).cast<std::string>() == param(i)) locals[i] = kw->items[k];
      }
      if (locals[i]) continue;
    }
    py::str key(param(i));
    if (kwdefaults.is_none() || !py::cast<py::dict>(kwdefaults).contains(key)) {
      FJ_UNSUPPORTED(kUnsupportedCall, "{}() missing keyword argument '{}'", fname, param(i));
    }
    locals[i] = from_function("__kwdefaults__", key, kwdefaults[key]);
  }
  return locals;
}

namespace {

// The class whose special methods apply to `self`: an object the trace made (obj: its class) or
// a plain object; nullptr for a class, a bound method or a special value of the trace.
PyTypeObject* special_method_class(const ValuePtr& self) {
  if (self->is(ObjRole::kNewObject)) return reinterpret_cast<PyTypeObject*>(self->obj.ptr());
  if (!self->is(ObjRole::kPlain) || self->bound_self || PyType_Check(self->obj.ptr())) return nullptr;
  return Py_TYPE(self->obj.ptr());
}

}  // namespace

bool Tracer::inline_special_method(const ValuePtr& self, PyObject* name,
                                   std::vector<ValuePtr> rest, bool may_make_generator) {
  PyTypeObject* type = special_method_class(self);
  if (type == nullptr) return false;
  const bool made = self->is(ObjRole::kNewObject);
  PyObject* hook = _PyType_Lookup(type, name);  // Borrowed
  if (hook == nullptr || !PyFunction_Check(hook)) return false;
  const ValuePtr& guarded = made ? self->origin : self;
  if (guarded && guarded->source >= 0) {
    guard_class_attribute(guarded, py::str(name).cast<std::string>(), true, /*same_object=*/true);
  }
  rest.insert(rest.begin(), self);
  inline_call(Value::object(py::reinterpret_borrow<py::object>(hook)), hook, std::move(rest), {},
              may_make_generator);
  return true;
}

bool Tracer::inline_truth(const ValuePtr& value) {
  if (value->kind != VKind::kObject) return false;
  PyTypeObject* type = special_method_class(value);
  if (type == nullptr) return false;
  static PyObject* const kBool = PyUnicode_InternFromString("__bool__");
  static PyObject* const kLen = PyUnicode_InternFromString("__len__");
  PyObject* hook = _PyType_Lookup(type, kBool);  // Borrowed
  PyObject* name = kBool;
  if (hook == nullptr) {
    hook = _PyType_Lookup(type, kLen);
    name = kLen;
  }
  if (hook == nullptr || !PyFunction_Check(hook) || !is_user_function(host_, hook)) return false;
  if (name == kLen) {  // __bool__ must stay absent, or it would decide instead
    const ValuePtr& guarded = value->is(ObjRole::kNewObject) ? value->origin : value;
    if (guarded && guarded->source >= 0) guard_class_attribute(guarded, "__bool__", false);
  }
  if (!inline_special_method(value, name, {})) return false;
  frame().result_truth = 1;  // its result's truth, as a bool
  return true;
}

namespace {

// The class whose operator methods Python looks up for `v`: a class defined in Python (a heap
// type) of an object made in the trace or read by source; nullptr for any other value.
PyTypeObject* python_operand_class(const ValuePtr& v) {
  if (v->kind != VKind::kObject) return nullptr;
  PyTypeObject* type = special_method_class(v);
  return type != nullptr && (type->tp_flags & Py_TPFLAGS_HEAPTYPE) ? type : nullptr;
}

// Whether the builtin operand `v` answers NotImplemented to operator `name` against an instance
// of the Python class `other`: numbers, None and str (but its `%`, which formats anything)
// compare and compute only with their own kinds, tensors only with numbers and tensors (an
// `other` with __torch_function__ aside). `other` must be no subclass of those.
bool builtin_answers_not_implemented(const ValuePtr& v, PyTypeObject* other, const char* name) {
  PyTypeObject* tensor = reinterpret_cast<PyTypeObject*>(PyRefs::get().tensor_type.ptr());
  for (PyTypeObject* base : {&PyLong_Type, &PyFloat_Type, &PyComplex_Type, &PyUnicode_Type, tensor}) {
    if (PyType_IsSubtype(other, base)) return false;
  }
  if (v->is_tensor()) return true;  // (__torch_function__ on `other`: see inline_operator)
  if (!v->is_const()) return false;
  PyObject* obj = v->obj.ptr();
  if (PyUnicode_CheckExact(obj)) return std::string(name) != "__mod__";
  return obj == Py_None || PyBool_Check(obj) || PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) ||
         PyComplex_CheckExact(obj);
}

enum class OperatorAnswer {
  kNotImplemented,  // absent, or object's default ordering: nothing to try
  kPython,          // a Python function the policy traces
  kUnknown,         // C code, or code left to Python: not inlined
};

}  // namespace

bool Tracer::inline_unary_operator(const ValuePtr& v, const char* name) {
  PyTypeObject* type = python_operand_class(v);
  if (type == nullptr) return false;
  py::str key(name);
  PyObject* hook = _PyType_Lookup(type, key.ptr());  // Borrowed
  if (hook == nullptr || !PyFunction_Check(hook) || !is_user_function(host_, hook)) return false;
  return inline_special_method(v, key.ptr(), {});
}

bool Tracer::inline_operator(const ValuePtr& a, const ValuePtr& b, const OperatorMethods& op) {
  PyTypeObject* ta = python_operand_class(a);
  PyTypeObject* tb = python_operand_class(b);
  if (ta == nullptr && tb == nullptr) return false;
  if (ta == nullptr && !builtin_answers_not_implemented(a, tb, op.name)) return false;
  if (tb == nullptr && !builtin_answers_not_implemented(b, ta, op.reflected)) return false;
  static PyObject* const kTorchFunction = PyUnicode_InternFromString("__torch_function__");
  for (const auto& [value, type, other] : {std::tuple{a, ta, b}, std::tuple{b, tb, a}}) {
    // A class with __torch_function__ takes over tensor operators: not modelled here.
    if (type != nullptr && other->is_tensor() && _PyType_Lookup(type, kTorchFunction) != nullptr) return false;
  }

  struct Attempt {
    PyObject* method;  // Borrowed (kept by its class, whose lookup is guarded)
    bool reflected;
    bool negated;
  };
  std::vector<Attempt> attempts;
  struct Lookup {
    const ValuePtr* operand;
    std::string name;
    PyObject* found;  // Borrowed; nullptr: absent
  };
  std::vector<Lookup> looked_up;  // guarded once decided
  // What `name` on `type` is for this operator; `hook` / `negated` set for a Python method.
  std::function<OperatorAnswer(const ValuePtr&, PyTypeObject*, const char*, PyObject**, bool*)> answer =
      [&](const ValuePtr& v, PyTypeObject* type, const char* name, PyObject** hook, bool* negated) {
        py::str key(name);
        PyObject* found = _PyType_Lookup(type, key.ptr());  // Borrowed
        looked_up.push_back({&v, name, found});
        if (found == nullptr) return OperatorAnswer::kNotImplemented;
        if (PyFunction_Check(found)) {
          if (!is_user_function(host_, found)) return OperatorAnswer::kUnknown;
          *hook = found;
          return OperatorAnswer::kPython;
        }
        if (op.comparison && found == _PyType_Lookup(&PyBaseObject_Type, key.ptr())) {
          // object's own: `==` is identity (the final fallback), `<` NotImplemented, `!=` the
          // class's `==` negated.
          if (key.cast<std::string>() != "__ne__") return OperatorAnswer::kNotImplemented;
          const OperatorAnswer eq = answer(v, type, "__eq__", hook, negated);
          *negated = eq == OperatorAnswer::kPython;
          return eq;
        }
        return OperatorAnswer::kUnknown;
      };
  // Adds the attempt of `name` on the operand `v` (of class `type`; nullptr: a builtin, which
  // answers NotImplemented); false where it is unknown.
  auto attempt = [&](const ValuePtr& v, PyTypeObject* type, const char* name, bool reflected) {
    if (type == nullptr) return true;
    PyObject* hook = nullptr;
    bool negated = false;
    const OperatorAnswer got = answer(v, type, name, &hook, &negated);
    if (got == OperatorAnswer::kUnknown) return false;
    if (got == OperatorAnswer::kPython) attempts.push_back({hook, reflected, negated});
    return true;
  };
  // CPython's order: a right operand of a subclass goes first (for arithmetic, only where the
  // subclass overrides the reflected method); arithmetic on two operands of one class tries
  // only the left one, a comparison tries both.
  const bool subclass_first = ta != nullptr && tb != nullptr && ta != tb && PyType_IsSubtype(tb, ta) &&
                              (op.comparison || _PyType_Lookup(tb, py::str(op.reflected).ptr()) !=
                                                    _PyType_Lookup(ta, py::str(op.reflected).ptr()));
  const bool try_right = op.comparison || ta != tb;
  bool known = op.inplace == nullptr || attempt(a, ta, op.inplace, false);
  if (known && subclass_first) known = attempt(b, tb, op.reflected, true);
  if (known) known = attempt(a, ta, op.name, false);
  if (known && try_right && !subclass_first) known = attempt(b, tb, op.reflected, true);
  if (!known) return false;  // (no attempt at all: `==` is identity, anything else a TypeError)

  for (const Lookup& lookup : looked_up) {
    const ValuePtr& v = *lookup.operand;
    const ValuePtr& guarded = v->is(ObjRole::kNewObject) ? v->origin : v;
    if (!guarded || guarded->source < 0) continue;
    const bool present = lookup.found != nullptr;
    guard_class_attribute(guarded, lookup.name, present, /*same_object=*/present);
  }
  for (const auto& [value, type, other] : {std::tuple{a, ta, b}, std::tuple{b, tb, a}}) {
    const ValuePtr& guarded = value->is(ObjRole::kNewObject) ? value->origin : value;
    if (type != nullptr && other->is_tensor() && guarded && guarded->source >= 0) {
      guard_class_attribute(guarded, "__torch_function__", false);
    }
  }
  auto type_name = [](const ValuePtr& v, PyTypeObject* type) {
    if (type != nullptr) return std::string(type->tp_name);
    return v->is_tensor() ? std::string("Tensor") : std::string(Py_TYPE(v->obj.ptr())->tp_name);
  };
  std::string failure;
  const std::string name = op.name;
  if (op.comparison && (name == "__eq__" || name == "__ne__")) {
    failure = name == "__eq__" ? "is" : "is not";  // Python's answer: identity
  } else if (op.comparison) {
    failure = fmt::format("'{}' not supported between instances of '{}' and '{}'", op.symbol,
                          type_name(a, ta), type_name(b, tb));
  } else {
    failure = fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op.symbol,
                          type_name(a, ta), type_name(b, tb));
  }
  std::vector<ValuePtr> tried;
  for (const Attempt& at : attempts) {
    tried.push_back(Value::tuple({Value::object(py::reinterpret_borrow<py::object>(at.method)),
                                  Value::constant(py::bool_(at.reflected)),
                                  Value::constant(py::bool_(at.negated))}));
  }
  static py::handle form = py::object(PyRefs::get().support.attr("operator_form")).release();
  inline_call(Value::object(py::reinterpret_borrow<py::object>(form)), form,
              {a, b, Value::tuple(std::move(tried)), Value::constant(py::str(failure))}, {});
  return true;
}

bool Tracer::enter_python_with(const ValuePtr& manager) {
  PyTypeObject* type = manager->kind == VKind::kObject ? special_method_class(manager) : nullptr;
  if (type == nullptr) return false;
  const bool made = manager->is(ObjRole::kNewObject);
  static PyObject* const kEnter = PyUnicode_InternFromString("__enter__");
  static PyObject* const kExit = PyUnicode_InternFromString("__exit__");
  PyObject* enter = _PyType_Lookup(type, kEnter);  // Borrowed
  PyObject* exit = _PyType_Lookup(type, kExit);    // Borrowed
  if (enter == nullptr || exit == nullptr || !PyFunction_Check(enter) || !PyFunction_Check(exit) ||
      !is_user_function(host_, enter) || !is_user_function(host_, exit)) {
    return false;
  }
  // As BEFORE_WITH: type(manager).__exit__ bound to the manager, then what __enter__ returns.
  const ValuePtr& guarded = made ? manager->origin : manager;
  if (guarded && guarded->source >= 0) guard_class_attribute(guarded, "__exit__", true, /*same_object=*/true);
  ValuePtr bound_exit = Value::object(py::reinterpret_borrow<py::object>(exit));
  bound_exit->role = ObjRole::kWithExit;
  bound_exit->bound_self = manager;
  push(std::move(bound_exit));
  FJ_CHECK(inline_special_method(manager, kEnter, {}), "__enter__ not inlined");
  return true;
}

void Tracer::inline_call(const ValuePtr& fn, py::handle function, std::vector<ValuePtr> args,
                         KwValues kwargs, bool may_make_generator) {
  const bool made = fn && fn->is(ObjRole::kMadeFunction);
  if (!made && !PyFunction_Check(function.ptr())) {  // a partial, a callable object, a builtin
    FJ_UNSUPPORTED(kUnsupportedCall, "tracing into {}, which is not a Python function",
                   safe_repr(function));
  }
  auto* code = reinterpret_cast<PyCodeObject*>(made ? fn->obj.ptr()
                                                    : PyFunction_GET_CODE(function.ptr()));
  if (!made && fn && fn->source >= 0) {
    // The function is guarded by identity; its code can be replaced (f.__code__ = ...).
    ValuePtr code_value = entry_.load(entry_.sources().attr(fn->source, "__code__"));
    if (code_value && code_value->source >= 0) {
      entry_.guard_id(code_value->source, code_value->obj.ptr());
    }
  }
  const CallSite site = call_site_here();
  if (no_inline_ != nullptr) {
    auto it = no_inline_->find(site);
    if (it != no_inline_->end()) {
      FJ_UNSUPPORTED(kUnsupportedCall, "call to {}, which breaks inside: {}",
                     name_of(code->co_qualname), it->second);
    }
  }
  constexpr int kNotInlined = CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE;
  const bool genexpr = (code->co_flags & CO_GENERATOR) && name_of(code->co_name) == "<genexpr>";
  const bool lazy_generator = (code->co_flags & CO_GENERATOR) && !genexpr;
  if (code->co_flags & kNotInlined) {
    FJ_UNSUPPORTED(kUnsupportedCall, "call to coroutine function {}", name_of(code->co_qualname));
  }
  if (lazy_generator && !may_make_generator) {
    // (A special method or property getter that is a generator function: its caller expects
    // the frame it inlines.)
    FJ_UNSUPPORTED(kUnsupportedCall, "generator function {} called for its result",
                   name_of(code->co_qualname));
  }
  if (frames_.size() >= kMaxFrames) {
    FJ_UNSUPPORTED(kUnsupportedCall, "inlining deeper than {} frames (recursion?) at {}",
                   kMaxFrames, name_of(code->co_qualname));
  }
  auto callee = std::make_shared<TraceFrame>();
  callee->code = code;
  callee->bytecode = &host_.bytecode_of(code);
  callee->locals = bind_arguments(code, function, fn, std::move(args), std::move(kwargs));
  callee->dirty.assign(callee->locals.size(), false);
  callee->function = py::reinterpret_borrow<py::object>(function);
  callee->function_value = fn;
  callee->generator = genexpr;
  callee->globals = made ? fn->globals
                         : py::reinterpret_borrow<py::object>(PyFunction_GET_GLOBALS(function.ptr()));
  callee->call_site = instr().offset;
  if (lazy_generator) {  // called: a generator, its frame not started (generators.cpp)
    callee->lazy_generator = true;
    callee->made_at = site;
    ValuePtr it = Value::generator_iter({});
    it->iter_form = IterForm::kGenerator;
    it->gen_frame = std::move(callee);
    push(std::move(it));
    return;
  }
  frames_.push_back(std::move(callee));
}

ValuePtr Tracer::inline_module_call(const ValuePtr& module, std::vector<ValuePtr> args,
                                    KwValues kwargs) {
  args.insert(args.begin(), module);
  py::handle obj = module->obj;
  ValuePtr self = module;
  // Forward hooks and pre-hooks are traced around forward (_python_forms.trace_module_call),
  // read from the module's hook dicts by source; backward hooks make nn.Module.__call__ wrap
  // the tensors for autograd: such modules are called by the runtime instead (their forward
  // frame then meets the hook by itself). Guard that the dicts stay empty where they are.
  static const char* kHookDicts[] = {"_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                     "_backward_pre_hooks"};
  bool forward_hooks = false;
  for (const char* hooks : kHookDicts) {
    py::object dict = py::getattr(obj, hooks, py::none());
    if (!dict.is_none() && py::len(dict) > 0) {
      const bool forward_side = std::strncmp(hooks, "_forward", 8) == 0;
      if (forward_side && self->source >= 0 && PyDict_Check(dict.ptr())) {
        forward_hooks = true;  // (its items are read and guarded where the form iterates them)
        continue;
      }
      FJ_UNSUPPORTED(kUnsupportedCall, "call of module {} with {} registered",
                     Py_TYPE(obj.ptr())->tp_name, hooks);
    }
    if (self->source >= 0 && !dict.is_none()) {
      ValuePtr hooks_value = entry_.load(entry_.sources().attr(self->source, hooks));
      if (hooks_value && hooks_value->source >= 0) entry_.guard_len(hooks_value->source, 0);
    }
  }
  if (global_module_hooks()) {
    FJ_UNSUPPORTED(kUnsupportedCall, "global nn.Module hooks are registered");
  }
  // A module whose call is not nn.Module.__call__ (a class overriding __call__, or
  // Module.compile() having set _compiled_call_impl) is called by the runtime.
  py::object module_type = PyRefs::get().module_type;
  py::object call = py::getattr(py::reinterpret_borrow<py::object>(
                                    reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))),
                                "__call__", py::none());
  if (!call.is(module_type.attr("__call__")) ||
      !py::getattr(obj, "_compiled_call_impl", py::none()).is_none()) {
    FJ_UNSUPPORTED(kUnsupportedCall, "module {} is not called through nn.Module.__call__",
                   Py_TYPE(obj.ptr())->tp_name);
  }
  {
    // A forward set on the instance is what nn.Module.__call__ runs: left to the runtime.
    PyObject* own = PyObject_GenericGetDict(obj.ptr(), nullptr);  // New or NULL
    if (own == nullptr) PyErr_Clear();
    const bool shadowed = own != nullptr && PyDict_Check(own) &&
                          PyDict_GetItemString(own, "forward") != nullptr;
    Py_XDECREF(own);
    if (shadowed && (forward_hooks || self->source < 0)) {
      FJ_UNSUPPORTED(kUnsupportedCall, "module {} has a forward of its own instance",
                     Py_TYPE(obj.ptr())->tp_name);
    }
    if (shadowed) {
      // `self.forward = self.forward_slicing` in __init__ (timm's FasterNet): what
      // nn.Module.__call__ runs is that value, read by source (so guarded) and called.
      ValuePtr own_forward = attr(self, "forward");
      args.erase(args.begin());
      return Tracer::call(own_forward, std::move(args), std::move(kwargs));
    }
  }
  py::object forward = py::getattr(py::reinterpret_borrow<py::object>(
                                       reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))),
                                   "forward", py::none());
  if (!PyFunction_Check(forward.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedCall, "module {} has no Python forward",
                   Py_TYPE(obj.ptr())->tp_name);
  }
  // type(module).forward as it is now, and no forward set on the instance: replacing either
  // compiles again.
  if (self->source >= 0) guard_class_attribute(self, "forward", true, /*same_object=*/true);
  ValuePtr forward_value = Value::object(forward);
  if (self->source >= 0) {
    forward_value->class_of = self;
    forward_value->class_attr = "forward";
  }
  if (forward_hooks) {
    static PyObject* const kForm =
        py::object(py::module_::import("framejit._python_forms").attr("trace_module_call")).release().ptr();
    std::vector<py::object> key_objects;
    std::vector<ValuePtr> values;
    for (auto& [key, value] : kwargs) {
      key_objects.push_back(py::str(key));
      values.push_back(std::move(value));
    }
    std::vector<ValuePtr> form_args = {
        self, forward_value, Value::tuple(std::vector<ValuePtr>(args.begin() + 1, args.end())),
        Value::dict(std::move(key_objects), std::move(values))};
    inline_call(Value::object(py::reinterpret_borrow<py::object>(kForm)), kForm, std::move(form_args), {});
    return nullptr;
  }
  inline_call(forward_value, forward, std::move(args), std::move(kwargs));
  return nullptr;
}

bool Tracer::module_children(const ValuePtr& container, std::vector<ValuePtr>& out) {
  py::object keys = PyRefs::get().support.attr("module_container_keys")(container->obj);
  if (keys.is_none()) return false;
  const std::string store = keys[py::int_(0)].cast<std::string>();
  ValuePtr children = entry_.load(entry_.sources().attr(container->source, store));
  FJ_CHECK(children != nullptr && children->source >= 0, "{} unreadable", store);
  py::list names = keys[py::int_(1)];
  entry_.guard_len(children->source, static_cast<int64_t>(py::len(names)));
  const bool is_dict = PyObject_IsInstance(container->obj.ptr(),
                                           PyRefs::get().torch.attr("nn").attr("ModuleDict").ptr()) == 1;
  for (py::handle name : names) {
    if (is_dict) {
      out.push_back(Value::constant(py::reinterpret_borrow<py::object>(name)));
      continue;
    }
    ValuePtr child = entry_.load(entry_.sources().item(children->source, py::reinterpret_borrow<py::object>(name)));
    FJ_CHECK(child != nullptr, "child {} unreadable", safe_repr(name));
    out.push_back(child);
  }
  return true;
}

namespace {

// The parameters of nn.Module's tree generators, in order (self excluded).
const std::vector<std::string>& listing_parameters(const std::string& name) {
  static const std::map<std::string, std::vector<std::string>> kParameters = {
      {"modules", {}},
      {"children", {}},
      {"named_children", {}},
      {"named_modules", {"memo", "prefix", "remove_duplicate"}},
      {"parameters", {"recurse"}},
      {"buffers", {"recurse"}},
      {"named_parameters", {"prefix", "recurse", "remove_duplicate"}},
      {"named_buffers", {"prefix", "recurse", "remove_duplicate"}},
  };
  static const std::vector<std::string> kNone;
  auto found = kParameters.find(name);
  return found == kParameters.end() ? kNone : found->second;
}

std::string joined(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

std::vector<std::pair<std::string, ValuePtr>> Tracer::module_dict_items(const ValuePtr& module,
                                                                       const char* store) {
  ValuePtr dict = entry_.load(entry_.sources().attr(module->source, store));
  std::vector<std::pair<py::object, ValuePtr>> entries;
  if (!dict || !dict_by_source(dict, entries)) {
    FJ_UNSUPPORTED(kUnsupportedValue, "{}.{} is not a dict", module->describe(), store);
  }
  std::vector<std::pair<std::string, ValuePtr>> out;
  for (auto& [key, item] : entries) {
    if (!PyUnicode_Check(key.ptr())) {
      FJ_UNSUPPORTED(kUnsupportedValue, "{}.{} has a key that is not a str", module->describe(), store);
    }
    out.emplace_back(key.cast<std::string>(), item);
  }
  return out;
}

ValuePtr Tracer::module_listing(py::handle fn, const std::vector<ValuePtr>& args,
                                const KwValues& kwargs) {
  const std::string name = py::str(fn.attr("__name__")).cast<std::string>();
  const ValuePtr self = args.empty() ? nullptr : args[0];
  if (!self || self->kind != VKind::kObject || self->source < 0 || PyObject_IsInstance(self->obj.ptr(), PyRefs::get().module_type.ptr()) != 1) {
    FJ_UNSUPPORTED(kUnsupportedCall, "Module.{}() of a module without a source", name);
  }
  // The options, all constants: prefix, recurse, remove_duplicate (memo must stay None).
  const std::vector<std::string>& parameters = listing_parameters(name);
  std::map<std::string, py::object> options;
  if (args.size() - 1 > parameters.size()) {
    FJ_UNSUPPORTED(kUnsupportedCall, "Module.{}() with {} arguments", name, args.size() - 1);
  }
  for (size_t i = 1; i < args.size(); ++i) options[parameters[i - 1]] = sizes_.concretize(args[i])->obj;
  for (const auto& [key, value] : kwargs) options[key] = sizes_.concretize(value)->obj;
  for (const auto& [key, value] : options) {
    const bool known = std::find(parameters.begin(), parameters.end(), key) != parameters.end();
    const bool constant = value && (value.is_none() || PyBool_Check(value.ptr()) ||
                                    PyUnicode_Check(value.ptr()));
    if (!known || !constant || (key == "memo" && !value.is_none())) {
      FJ_UNSUPPORTED(kUnsupportedCall, "Module.{}({}=...) is not traced", name, key);
    }
  }
  auto option = [&](const char* key, bool fallback) {
    auto found = options.find(key);
    return found == options.end() ? fallback : PyObject_IsTrue(found->second.ptr()) == 1;
  };
  const std::string prefix =
      options.count("prefix") ? py::str(options["prefix"]).cast<std::string>() : std::string();
  const bool recurse = option("recurse", true);
  const bool remove_duplicate = option("remove_duplicate", true);

  // The module tree as named_modules() walks it: depth first, each module once (by identity).
  std::vector<std::pair<std::string, ValuePtr>> modules;
  std::set<PyObject*> seen;
  std::function<void(const ValuePtr&, const std::string&)> walk = [&](const ValuePtr& module,
                                                                     const std::string& at) {
    if (remove_duplicate) {
      // Which modules are the same object decides the listing: their identity is guarded.
      PyObject* real = entry_.live_value(module->source);
      entry_.guard_id(module->source, real);
      if (!seen.insert(real).second) return;
    }
    modules.emplace_back(at, module);
    for (const auto& [key, child] : module_dict_items(module, "_modules")) {
      if (!child->obj.is_none()) walk(child, joined(at, key));
    }
  };
  std::vector<ValuePtr> items;
  auto named = [](const std::string& label, const ValuePtr& value) {
    return Value::tuple({Value::constant(py::str(label)), value});
  };
  if (name == "children" || name == "named_children") {
    std::set<PyObject*> children;
    for (const auto& [key, child] : module_dict_items(self, "_modules")) {
      if (child->obj.is_none()) continue;
      PyObject* real = entry_.live_value(child->source);
      entry_.guard_id(child->source, real);
      if (!children.insert(real).second) continue;
      items.push_back(name == "children" ? child : named(key, child));
    }
    return Value::generator_iter(std::move(items));  // (generator functions)
  }
  if (name == "modules" || name == "named_modules") {
    walk(self, prefix);
    for (const auto& [at, module] : modules) {
      items.push_back(name == "modules" ? module : named(at, module));
    }
    return Value::generator_iter(std::move(items));
  }
  // parameters / buffers and their named forms: the members of each module of the tree.
  if (recurse) {
    walk(self, prefix);
  } else {
    modules.emplace_back(prefix, self);
  }
  const bool buffers = name.find("buffers") != std::string::npos;
  const bool with_names = name.rfind("named_", 0) == 0;
  std::set<PyObject*> members;
  for (const auto& [at, module] : modules) {
    for (const auto& [key, member] : module_dict_items(module, buffers ? "_buffers" : "_parameters")) {
      if (member->obj.is_none()) continue;
      if (remove_duplicate) {  // tensors' values hold meta tensors: compare the real ones
        PyObject* real = entry_.live_value(member->source);
        entry_.guard_id(member->source, real);
        if (!members.insert(real).second) continue;
      }
      items.push_back(with_names ? named(joined(at, key), member) : member);
    }
  }
  return Value::generator_iter(std::move(items));
}

ValuePtr Tracer::zero_arg_super() {
  PyCodeObject* code = frame().code;
  const Py_ssize_t n = PyTuple_GET_SIZE(code->co_localsplusnames);
  ValuePtr cls;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (name_of(PyTuple_GET_ITEM(code->co_localsplusnames, i)) == "__class__") {
      cls = cell_get(local(static_cast<int>(i)));
    }
  }
  if (code->co_argcount == 0 || !cls || !PyType_Check(cls->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedCall, "super() outside a method");
  }
  ValuePtr self = local(0);
  if (self->kind == VKind::kCell) self = cell_get(self);
  if (self->kind != VKind::kObject) {
    FJ_UNSUPPORTED(kUnsupportedCall, "super() with a first argument of kind {}", self->describe());
  }
  ValuePtr out = Value::object(cls->obj);
  out->role = ObjRole::kSuper;
  out->bound_self = self;
  return out;
}

ValuePtr Tracer::cell_get(const ValuePtr& cell) {
  if (cell->source >= 0 && !cell->frozen) {
    // What this region stored into a cell that existed before it (see cell_set).
    if (ValuePtr real = entry_.value_at(cell->source)) {
      if (const ValuePtr* stored = effects_.pending(real, "cell_contents")) return *stored;
    }
  }
  if (cell->kind == VKind::kObject && PyCell_Check(cell->obj.ptr()) && cell->source >= 0) {
    // A frame entered mid-way holds real cell objects.
    ValuePtr content = entry_.load(entry_.sources().attr(cell->source, "cell_contents"));
    if (content) return content;
    FJ_UNSUPPORTED(kUnsupportedValue, "free variable referenced before assignment");
  }
  FJ_CHECK(cell->kind == VKind::kCell, "LOAD_DEREF of {}", cell->describe());
  if (!cell->items.empty()) return cell->items[0];
  if (ValuePtr function = cell->own_function.lock()) return function;
  if (cell->source >= 0) {
    ValuePtr content = entry_.load(entry_.sources().attr(cell->source, "cell_contents"));
    if (content) return content;
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "free variable referenced before assignment");
}

void Tracer::cell_set(const ValuePtr& cell, ValuePtr value) {
  const bool real_cell = (cell->kind == VKind::kCell ||
                          (cell->kind == VKind::kObject && PyCell_Check(cell->obj.ptr()))) &&
                         cell->source >= 0 && !cell->frozen;
  if (real_cell) {
    // A cell that existed before the region (`nonlocal count` in the compiled function or a
    // traced one): the store is a side effect like an attribute write, replayed at the exit as
    // `cell.cell_contents = value` and read back by later loads of this trace (cell_get).
    ValuePtr real = entry_.value_at(cell->source);
    FJ_CHECK(real != nullptr && PyCell_Check(real->obj.ptr()), "closure cell of {} unread",
             cell->describe());
    effects_.record(std::move(real), "cell_contents", std::move(value), /*generic=*/true);
    return;
  }
  if (cell->kind != VKind::kCell || cell->source >= 0 || cell->frozen) {
    FJ_UNSUPPORTED(kSideEffect, "assignment to a closure variable that outlives the call");
  }
  if (value->is(ObjRole::kMadeFunction) && value->items.size() == 3 &&
      value->items[2]->kind == VKind::kTuple) {
    for (const ValuePtr& closed : value->items[2]->items) {
      if (closed == cell) {
        // def rec(): ... rec() ...: the function and its cell hold each other, as in CPython.
        // The cell holds it weakly (values are reference counted), the tracer strongly; an
        // exit fills the rebuilt cell once the function is rebuilt (ExitBuilder).
        cell->items.clear();
        cell->own_function = value;
        recursive_functions_.push_back(std::move(value));
        return;
      }
    }
  }
  cell->own_function.reset();
  cell->items.assign(1, std::move(value));
}

void Tracer::copy_free_vars(int n) {
  TraceFrame& fr = frame();
  const int first = static_cast<int>(fr.locals.size()) - n;
  if (!inlined()) {
    // The root frame at pc 0: its closure cells, read from the function (they are objects that
    // outlive the call: read-only here, written back to the frame at the exit).
    for (int i = 0; i < n; ++i) {
      ValuePtr real_cell = entry_.load(SourceTable::closure(i));
      FJ_CHECK(real_cell != nullptr, "closure cell {} unreadable", i);
      ValuePtr cell = std::make_shared<Value>();
      cell->kind = VKind::kCell;
      cell->source = real_cell->source;
      fr.locals[first + i] = cell;
      fr.dirty[first + i] = true;
    }
    return;
  }
  if (fr.function_value && fr.function_value->is(ObjRole::kMadeFunction)) {
    // A function made in the trace: its closure is the tuple of cells MAKE_FUNCTION took.
    const ValuePtr& cells = fr.function_value->items[2];
    FJ_CHECK(cells->kind == VKind::kTuple && static_cast<int>(cells->items.size()) == n,
             "closure size mismatch");
    for (int i = 0; i < n; ++i) fr.locals[first + i] = cells->items[i];
    return;
  }
  PyObject* closure = PyFunction_GET_CLOSURE(fr.function.ptr());
  FJ_CHECK(closure != nullptr && PyTuple_GET_SIZE(closure) == n, "closure size mismatch");
  ValuePtr cells;  // the function's __closure__ read by source, once needed
  auto read_cells = [&]() {
    if (!cells && fr.function_value) {
      if (ValuePtr sourced = function_source(fr.function_value)) {
        cells = entry_.load(entry_.sources().attr(sourced->source, "__closure__"));
        FJ_CHECK(cells != nullptr && cells->kind == VKind::kTuple, "__closure__ unreadable");
      }
    }
    return cells != nullptr;
  };
  for (int i = 0; i < n; ++i) {
    ValuePtr cell = std::make_shared<Value>();
    cell->kind = VKind::kCell;
    PyObject* real = PyTuple_GET_ITEM(closure, i);  // borrowed
    PyObject* content = PyCell_GET(real);  // borrowed
    // A function reached without a source (a method bound from its class, guarded there by
    // identity) carries the constants and functions in its cells as they are; anything else
    // (a registry object, a dict) is read through the class, so its state is guarded.
    const bool sourced = fr.function_value && fr.function_value->source >= 0;
    if (!sourced && fr.function_value && fr.function_value->frozen && content != nullptr) {
      // A function that is class data (a validator in a class's registry): its cells' contents
      // read as class data too, as they are now.
      cell->items.push_back(class_data(py::reinterpret_borrow<py::object>(content)));
      cell->frozen = true;
      fr.locals[first + i] = cell;
      continue;
    }
    if ((sourced || (content != nullptr && !is_fixed_value(content))) && read_cells()) {
      cell->source = cells->items.at(i)->source;
    } else {
      if (content == nullptr) FJ_UNSUPPORTED(kUnsupportedValue, "empty closure cell");
      ValuePtr value = carried_value(content);
      if (!value) FJ_UNSUPPORTED(kUnsupportedValue, "closure of a function reached without a source");
      cell->items.push_back(std::move(value));
      cell->source = -1;
      cell->frozen = true;  // a copy of a real cell's content: never stored into
    }
    fr.locals[first + i] = cell;
  }
}

ValuePtr Tracer::function_source(const ValuePtr& fn) {
  if (fn->source >= 0) return fn;
  if (!fn->class_of || fn->class_of->source < 0 || fn->class_attr.empty()) return nullptr;
  const ValuePtr& owner = fn->class_of;
  ValuePtr cls = PyType_Check(owner->obj.ptr())
                     ? owner
                     : entry_.load(entry_.sources().attr(owner->source, "__class__"));
  if (!cls || cls->source < 0) return nullptr;
  ValuePtr read = entry_.load(entry_.sources().attr(cls->source, fn->class_attr));
  if (!read || read->source < 0 || !read->obj.is(fn->obj)) return nullptr;
  return read;
}

}  // namespace framejit
