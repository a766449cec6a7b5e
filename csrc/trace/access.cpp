// Attribute loads, subscripts and item stores on abstract values.
#include <fmt/format.h>

#include "bytecode/version.h"
#include "common/check.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

void guard_instance_dict(Tracer& t, const ValuePtr& base, const std::string& store,
                         const std::string& name, bool present);
void guard_attribute_absent(Tracer& t, const ValuePtr& base, const std::string& name);

// How obj.name resolves in the common cases, read in C as framejit._support.resolve_attribute
// would answer them: instance state (the instance __dict__, or, when the class has nothing of
// that name, an nn.Module's _parameters / _buffers / _modules) and plain functions defined on
// the class. False for anything else
// (classes, properties, other descriptors, class values, missing names): ask resolve_attribute.
bool quick_resolve(PyObject* obj, const std::string& name, AttrKind& kind, py::object& value) {
  if (PyType_Check(obj) || Py_TYPE(obj)->tp_dictoffset == 0) return false;
  py::str key(name);
  PyObject* on_class = _PyType_Lookup(Py_TYPE(obj), key.ptr());  // Borrowed; sets no error
  if (on_class != nullptr && PyObject_TypeCheck(on_class, &PyProperty_Type)) return false;
  PyObject* dict = PyObject_GenericGetDict(obj, nullptr);  // New
  if (dict == nullptr) {
    PyErr_Clear();
    return false;
  }
  py::object own = py::reinterpret_steal<py::object>(dict);
  if (!PyDict_Check(dict)) return false;
  if (PyDict_GetItemWithError(dict, key.ptr()) != nullptr) {  // Borrowed
    kind = AttrKind::kInstance;
    value = py::str("__dict__");
    return true;
  }
  // nn.Module's stores are read by its __getattr__, which Python calls only when the class has
  // nothing of that name: a method `lin` wins over a submodule `lin`.
  for (const char* store : {"_parameters", "_buffers", "_modules"}) {
    if (on_class != nullptr) break;
    PyObject* held = PyDict_GetItemString(dict, store);  // Borrowed
    if (held != nullptr && PyDict_Check(held) && PyDict_GetItemWithError(held, key.ptr()) != nullptr) {
      kind = AttrKind::kInstance;
      value = py::str(store);
      return true;
    }
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  if (on_class != nullptr && PyFunction_Check(on_class)) {
    kind = AttrKind::kFunction;
    value = py::reinterpret_borrow<py::object>(on_class);
    return true;
  }
  return false;
}

bool is_torch_module(PyObject* module) {
  const char* name = PyModule_GetName(module);
  if (name == nullptr) {
    PyErr_Clear();
    return false;
  }
  const std::string text = name;
  return text == "torch" || text.rfind("torch.", 0) == 0 || text == "math" ||
         text == "operator" || text == "builtins";
}

// Attributes of these are assumed not to change (framejit does not guard torch.add's identity).
bool is_stable_namespace(PyObject* obj) {
  if (PyModule_Check(obj)) return is_torch_module(obj);
  if (PyType_Check(obj)) {
    PyObject* module = PyObject_GetAttrString(obj, "__module__");  // New
    if (module == nullptr) {
      PyErr_Clear();
      return false;
    }
    bool stable = false;
    if (PyUnicode_Check(module)) {
      const std::string text = PyUnicode_AsUTF8(module);
      stable = text == "torch" || text.rfind("torch.", 0) == 0 || text == "builtins";
    }
    Py_DECREF(module);
    return stable;
  }
  return false;
}


}  // namespace

ValuePtr wrap_unsourced(py::object value) {
  PyObject* obj = value.ptr();
  const bool constant = obj == Py_None || PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) ||
                        PyBool_Check(obj) || PyUnicode_CheckExact(obj) ||
                        Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(PyRefs::get().dtype_type.ptr()) ||
                        Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(PyRefs::get().device_type.ptr());
  return constant ? Value::constant(std::move(value)) : Value::object(std::move(value));
}

bool reads_items_as_dict(PyObject* obj) {
  if (PyDict_CheckExact(obj)) return true;
  static PyObject* const kGetitem = PyUnicode_InternFromString("__getitem__");
  return PyDict_Check(obj) && _PyType_Lookup(Py_TYPE(obj), kGetitem) == _PyType_Lookup(&PyDict_Type, kGetitem);
}

ValuePtr bind_class_attribute(AttrKind kind, py::handle fn, const ValuePtr& self,
                              const ValuePtr& read_through, const std::string& name) {
  ValuePtr method = Value::object(py::reinterpret_borrow<py::object>(fn));
  if (kind == AttrKind::kFunction || kind == AttrKind::kProperty) method->bound_self = self;
  if (kind == AttrKind::kFunction && read_through && read_through->source >= 0) {
    method->class_of = read_through;
    method->class_attr = name;
  }
  if (kind == AttrKind::kClassMethod) {
    const bool self_is_class = self->kind == VKind::kObject && !self->is(ObjRole::kNewObject) &&
                               PyType_Check(self->obj.ptr());
    method->bound_self = self_is_class ? self : Value::object(type_of(self));
  }
  if (kind == AttrKind::kProperty) method->role = ObjRole::kProperty;
  if (kind == AttrKind::kBuiltinMethod) {  // dict.get / object.__setattr__, bound to self
    method->role = ObjRole::kTypeMethod;
    method->method = py::str(fn.attr("__name__")).cast<std::string>();
    method->bound_self = self;
  }
  return method;
}

ValuePtr Tracer::enum_member_attr(const ValuePtr& member, const std::string& name) {
  if (name != "value" && name != "name" && name != "_value_" && name != "_name_") return nullptr;
  PyRefs& refs = PyRefs::get();
  PyObject* obj = member->obj.ptr();
  if (member->role != ObjRole::kPlain || member->bound_self || !refs.is_enum_member(obj)) return nullptr;
  // Mode.TRAIN.value / .name: fixed when the class made its members (enum's own properties read
  // _value_ and _name_), so constants of the trace once the member is known: guarded by
  // identity. A class that defines value or name itself is not answered here.
  py::str key(name);
  if (name[0] != '_' &&
      _PyType_Lookup(Py_TYPE(obj), key.ptr()) != _PyType_Lookup(reinterpret_cast<PyTypeObject*>(refs.enum_type.ptr()), key.ptr())) {
    return nullptr;
  }
  py::object value = py::getattr(member->obj, key, py::none());
  if (value.is_none() && !PyObject_HasAttr(obj, key.ptr())) return nullptr;
  if (member->source >= 0) entry_.guard_id(member->source, obj);
  if (PyTuple_CheckExact(value.ptr())) {
    bool constant = true;
    for (py::handle item : value) constant = constant && wrap_unsourced(py::reinterpret_borrow<py::object>(item))->is_const();
    if (constant) return Value::constant(std::move(value));
  }
  return wrap_unsourced(std::move(value));
}

ValuePtr Tracer::enum_as_constant(const ValuePtr& value) {
  if (value->kind != VKind::kObject || value->role != ObjRole::kPlain || value->bound_self ||
      !PyRefs::get().is_enum_member(value->obj.ptr())) {
    return value;
  }
  if (value->source >= 0) entry_.guard_id(value->source, value->obj.ptr());
  return Value::constant(value->obj);
}

ValuePtr Tracer::attr(const ValuePtr& base, const std::string& name, AttrLookup how) {
  switch (base->kind) {
    case VKind::kTensor:
      return tensor_attr(base, name);
    case VKind::kConst: {
      py::object value;
      try {
        value = base->obj.attr(name.c_str());
      } catch (const py::error_already_set&) {
        FJ_UNSUPPORTED(kUnsupportedValue, "{} has no attribute '{}'", base->describe(), name);
      }
      if (PyType_Check(base->obj.ptr()) && PyCallable_Check(value.ptr()) && !PyMethod_Check(value.ptr())) {
        // A class's function (object.__setattr__, a staticmethod's function): as read off it.
        return wrap_unsourced(std::move(value));
      }
      if (PyCallable_Check(value.ptr()) && !PyType_Check(value.ptr())) {
        FJ_UNSUPPORTED(kUnsupportedValue, "bound method {} of a constant", name);
      }
      // (einops' cached recipe's fields; a class: inspect.Parameter.empty as a default)
      return Value::constant_tree(std::move(value));
    }
    case VKind::kTuple: {
      // Named fields of namedtuples and structseqs (torch.return_types.max(...).values).
      if (base->pytype.ptr() == reinterpret_cast<PyObject*>(&PyTuple_Type)) break;
      py::list indices;
      for (size_t i = 0; i < base->items.size(); ++i) indices.append(py::int_(i));
      try {
        py::object probe = PyObject_HasAttrString(base->pytype.ptr(), "_make")
                               ? base->pytype.attr("_make")(indices)
                               : base->pytype(py::tuple(indices));
        py::object index = probe.attr(name.c_str());
        if (PyLong_CheckExact(index.ptr())) return base->items[index.cast<size_t>()];
      } catch (const py::error_already_set&) {
      }
      // Class data of a namedtuple (_fields, _field_defaults): read as it is, like a class's
      // methods.
      if (!name.empty() && name[0] == '_' && name != "__class__") {
        PyObject* found = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(base->pytype.ptr()),
                                         py::str(name).ptr());  // Borrowed
        if (found != nullptr && (PyTuple_CheckExact(found) || PyDict_CheckExact(found))) {
          return class_data(py::reinterpret_borrow<py::object>(found));
        }
      }
      break;
    }
    case VKind::kObject: {
      if (base->is(ObjRole::kSuper)) {
        // (first: its obj is the class super() was called in, which must not be read as such;
        // a class of torch's own is a stable namespace below)
        py::tuple resolved = PyRefs::get().support.attr("resolve_super_attribute")(
            base->obj, type_of(base->bound_self),
            py::bool_(!base->bound_self->is(ObjRole::kNewObject) &&
                      PyType_Check(base->bound_self->obj.ptr())),
            name);
        // super().method: the parent's function, bound to the traced self.
        const auto kind = resolved[0].cast<AttrKind>();
        if (kind == AttrKind::kObjectGetattribute) {  // inside a class's own __getattribute__
          ValuePtr lookup = Value::object(py::reinterpret_borrow<py::object>(
              reinterpret_cast<PyObject*>(&PyBaseObject_Type)).attr("__getattribute__"));
          lookup->role = ObjRole::kGenericGetattr;
          lookup->bound_self = base->bound_self;
          return lookup;
        }
        if (kind == AttrKind::kMissing) {
          FJ_UNSUPPORTED(kUnsupportedValue, "super().{} is not a method or property", name);
        }
        guard_super_attribute(base, name);
        return bind_class_attribute(kind, resolved[1], base->bound_self);
      }
      if (base->is(ObjRole::kNewObject)) return new_object_read(base, name, how);
      if (base->is(ObjRole::kPartial)) return partial_attr(base, name);
      if (base->is(ObjRole::kDictView)) {
        FJ_UNSUPPORTED(kUnsupportedValue, "attribute '{}' of a dict view", name);
      }
      if (base->is(ObjRole::kContextToken)) {
        FJ_UNSUPPORTED(kUnsupportedValue, "attribute '{}' of a ContextVar token", name);
      }
      if (const ValuePtr* stored = effects_.pending(base, name)) return *stored;
      PyObject* obj = base->obj.ptr();
      if (ValuePtr fixed = enum_member_attr(base, name)) return fixed;
      if (ValuePtr method = context_var_method(base, name)) return method;
      if (is_stable_namespace(obj)) {
        py::object value;
        try {
          value = base->obj.attr(name.c_str());
        } catch (const py::error_already_set&) {
          FJ_UNSUPPORTED(kUnsupportedValue, "{} has no attribute '{}'", base->describe(), name);
        }
        return wrap_unsourced(std::move(value));
      }
      if (base->source >= 0 && PyModule_Check(obj)) {
        ValuePtr value = entry_.load(entry_.sources().attr(base->source, name));
        if (!value) {
          FJ_UNSUPPORTED(kUnsupportedValue, "{} has no attribute '{}'", base->describe(), name);
        }
        return value;
      }
      if (PyModule_Check(obj)) break;
      if (how != AttrLookup::kGeneric && !base->is_special_object() && !base->bound_self &&
          !PyType_Check(obj)) {
        // A class with its own __getattribute__ (transformers' configs remap names through
        // one): Python calls it for every read, so the trace inlines it (see op_load_attr).
        static PyObject* const kGetattribute = PyUnicode_InternFromString("__getattribute__");
        PyObject* hook = _PyType_Lookup(Py_TYPE(obj), kGetattribute);  // Borrowed
        if (hook != nullptr && PyFunction_Check(hook)) {
          if (how != AttrLookup::kInlinable) {
            FJ_UNSUPPORTED(kUnsupportedValue, "attribute '{}' of {}, read through its class's "
                           "__getattribute__, here", name, base->describe());
          }
          if (base->source >= 0) guard_class_attribute(base, "__getattribute__", true, /*same_object=*/true);
          ValuePtr read = Value::object(py::reinterpret_borrow<py::object>(hook));
          read->role = ObjRole::kAttrHook;
          read->bound_self = base;
          read->method = name;
          return read;
        }
      }
      if (PyCode_Check(obj) && name.rfind("co_", 0) == 0) {
        // A code object is immutable (and guarded by identity where read by source).
        py::object value;
        try {
          value = base->obj.attr(name.c_str());
        } catch (const py::error_already_set&) {
          FJ_UNSUPPORTED(kUnsupportedValue, "code object has no attribute '{}'", name);
        }
        return Value::constant(std::move(value));
      }
      if (PyFunction_Check(obj) && name == "__get__") {
        // func.__get__ (the descriptor protocol by hand: torch's LR schedulers wrap the
        // optimizer's step with `func.__get__(opt, type(opt))(...)`): called, the function bound
        // to the instance (Tracer::call).
        ValuePtr getter = Value::object(py::getattr(py::type::of(base->obj), "__get__"));
        getter->role = ObjRole::kTypeMethod;
        getter->method = name;
        getter->bound_self = base;
        return getter;
      }
      const bool names = name == "__name__" || name == "__qualname__" || name == "__module__";
      if ((PyFunction_Check(obj) && (names || name == "__doc__" || name == "__code__" ||
                                     name == "__defaults__" || name == "__kwdefaults__" ||
                                     name == "__globals__")) ||
          (PyType_Check(obj) && names)) {
        // A function's own attributes (functools.wraps copies them; decorators read
        // func.__name__, func.__code__.co_varnames), a class's names: read, and guarded, by
        // source (a constant for a value read without one).
        if (base->source < 0) return wrap_unsourced(base->obj.attr(name.c_str()));
        ValuePtr value = entry_.load(entry_.sources().attr(base->source, name));
        if (!value) FJ_UNSUPPORTED(kUnsupportedValue, "{} has no attribute '{}'", base->describe(), name);
        return value;
      }
      if (name == "__class__" && !base->is_special_object() && !base->bound_self) {
        // type(obj), as object.__class__ gives it (a class can only lie about it through a
        // property, which _PyType_Lookup would find first).
        // (object's own descriptor through _PyType_Lookup: a static builtin type's tp_dict is
        // NULL on 3.12, where it lives in the interpreter state.)
        py::str key(name);
        PyObject* on_class = _PyType_Lookup(Py_TYPE(obj), key.ptr());  // Borrowed
        if (on_class != nullptr && on_class == _PyType_Lookup(&PyBaseObject_Type, key.ptr())) {
          if (base->source >= 0) {
            ValuePtr cls = entry_.load(entry_.sources().attr(base->source, "__class__"));
            if (cls) return cls;
          }
          return Value::object(type_of(base));
        }
      }
      if (name == "__dict__" && base->source >= 0 && !PyType_Check(obj) &&
          PyObject_HasAttrString(obj, "__dict__")) {
        ValuePtr state = entry_.load(how == AttrLookup::kGeneric
                                         ? entry_.sources().generic_attr(base->source, "__dict__")
                                         : entry_.sources().attr(base->source, "__dict__"));
        if (state && PyDict_CheckExact(state->obj.ptr())) return state;  // the instance dict
      }
      if (base->source < 0 && base->remake && PyExceptionInstance_Check(obj)) {
        // An exception the trace made from constants (`except ValueError as e: e.args`): its
        // attributes as they are; nothing else holds it.
        py::object value;
        try {
          value = base->obj.attr(name.c_str());
        } catch (const py::error_already_set&) {
          FJ_UNSUPPORTED(kUnsupportedValue, "{} has no attribute '{}'", base->describe(), name);
        }
        if (PyTuple_CheckExact(value.ptr())) {  // e.args: a constant if its items are
          bool constant = true;
          for (py::handle item : value) constant = constant && wrap_unsourced(py::reinterpret_borrow<py::object>(item))->is_const();
          if (constant) return Value::constant(std::move(value));
        }
        return wrap_unsourced(std::move(value));
      }
      AttrKind kind = AttrKind::kMissing;
      py::object found;
      if (!quick_resolve(obj, name, kind, found)) {
        py::tuple resolved = PyRefs::get().support.attr("resolve_attribute")(base->obj, name);
        kind = resolved[0].cast<AttrKind>();
        found = resolved[1];
      }
      const bool own_state = kind == AttrKind::kInstance &&
                             (py::str(found).cast<std::string>() == "__dict__" ||
                              py::str(found).cast<std::string>() == "__slots__");
      if (kind == AttrKind::kInstance && base->source >= 0 && !own_state) {
        // A parameter, buffer or submodule: read from the module's own dict on every call
        // (C dict lookups), not through nn.Module.__getattr__ (a Python call per attribute).
        ValuePtr store = entry_.load(entry_.sources().attr(base->source, py::str(found).cast<std::string>()));
        FJ_CHECK(store != nullptr && store->source >= 0, "module store unreadable");
        return item(store, Value::constant(py::str(name)));
      }
      if (kind == AttrKind::kInstance || kind == AttrKind::kClassValue) {
        if (base->source < 0 && base->frozen) {  // class data: read as it is now
          try {
            py::object read = base->obj.attr(name.c_str());
            if (PyMethod_Check(read.ptr()) && PyMethod_GET_SELF(read.ptr()) == base->obj.ptr() &&
                PyFunction_Check(PyMethod_GET_FUNCTION(read.ptr()))) {
              // A method of its own kept in its dict (self.act = self._gelu_python): bound to
              // this value, so the call is traced as self.method(...) is.
              return bind_class_attribute(AttrKind::kFunction, PyMethod_GET_FUNCTION(read.ptr()), base,
                                          nullptr, name);
            }
            return class_data(std::move(read));
          } catch (const py::error_already_set&) {
            FJ_UNSUPPORTED(kUnsupportedValue, "{} has no attribute '{}'", base->describe(), name);
          }
        }
        if (base->source < 0) break;
        ValuePtr value = entry_.load(how == AttrLookup::kGeneric
                                         ? entry_.sources().generic_attr(base->source, name)
                                         : entry_.sources().attr(base->source, name));
        if (!value) {
          FJ_UNSUPPORTED(kUnsupportedValue, "{} has no attribute '{}'", base->describe(), name);
        }
        return value;
      }
      if (is_function_like(kind)) {
        // Bound from the class as it is now: a method replaced on the class compiles again.
        if (base->source >= 0) guard_class_attribute(base, name, true, /*same_object=*/true);
        if (kind == AttrKind::kClassMethod && base->source >= 0 && !PyType_Check(base->obj.ptr())) {
          // obj.per_side(x) of a classmethod: bound to type(obj), read by source (guarded to
          // stay that class), so `cls.sides` in it is read as any class attribute is.
          ValuePtr cls = entry_.load(entry_.sources().attr(base->source, "__class__"));
          if (cls && cls->source >= 0) {
            ValuePtr method = Value::object(found);
            method->bound_self = cls;
            return method;
          }
        }
        return bind_class_attribute(kind, found, base, base, name);
      }
      if (kind == AttrKind::kMissing && base->source >= 0) {
        // A functools.lru_cache function on the class (transformers' logger.warning_once): bound
        // to the object, guarded by identity (the cache keys on it), called as any cached
        // function is (with constants: at trace time, its result what the cache answers).
        py::object bound = PyRefs::get().support.attr("cached_method")(base->obj, name);
        if (!bound.is_none()) {
          entry_.guard_id(base->source, obj);
          guard_class_attribute(base, name, true, /*same_object=*/true);
          return Value::object(std::move(bound));
        }
      }
      if (kind == AttrKind::kMissing) {
        if (ValuePtr hook = missing_attribute_hook(base, name, how)) return hook;
        if (ValuePtr raise = missing_attribute_raise(base, name, how)) return raise;
      }
      break;
    }
    default:
      break;
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "attribute '{}' of {} is not traced yet", name,
                 base->describe());
}

ValuePtr Tracer::read_attribute(const ValuePtr& base, const std::string& name, AttrLookup how) {
  return finish_read(attr(base, name, how));
}

ValuePtr Tracer::finish_read(const ValuePtr& attribute) {
  if (attribute->is(ObjRole::kAttrHook)) {  // type(base).__getattribute__(base, name), inlined
    inline_call(Value::object(attribute->obj), attribute->obj,
                {attribute->bound_self, Value::constant(py::str(attribute->method))}, {});
    return nullptr;
  }
  if (attribute->is(ObjRole::kProperty)) {  // the getter's result is the attribute
    if (PyFunction_Check(attribute->obj.ptr())) {
      inline_call(Value::object(attribute->obj), attribute->obj, {attribute->bound_self}, {});
      return nullptr;
    }
    // A getter that is a functools.partial or a callable object: called like any callable.
    return call(Value::object(attribute->obj), {attribute->bound_self}, {});
  }
  return attribute;
}

bool Tracer::dict_by_source(const ValuePtr& dict,
                            std::vector<std::pair<py::object, ValuePtr>>& out) {
  // (dict(d), d.update(e), {**d}: storage when the class's __iter__ is dict's; an
  // OrderedDict subclass is read through keys() and its __getitem__)
  if (!reads_as_dict(dict, "keys") || !reads_as_dict(dict, "__iter__")) return false;
  if (PyODict_Check(dict->obj.ptr()) && !PyODict_CheckExact(dict->obj.ptr()) &&
      !reads_as_dict(dict, "__getitem__")) {
    return false;
  }
  check_items_unchanged(dict);
  py::tuple keys(py::list(dict->obj));  // in insertion order
  for (py::handle key : keys) {
    if (!guard_comparable(key.ptr())) return false;
  }
  entry_.guard_dict_keys(dict->source, keys.ptr());
  for (py::handle key : keys) {
    ValuePtr item = entry_.load(entry_.sources().item(dict->source, py::reinterpret_borrow<py::object>(key)));
    FJ_CHECK(item != nullptr, "item {} of {} unreadable", safe_repr(key), dict->describe());
    out.emplace_back(py::reinterpret_borrow<py::object>(key), item);
  }
  return true;
}

ValuePtr Tracer::attribute_builtin(py::handle fn, const std::vector<ValuePtr>& args,
                                   const KwValues& kwargs) {
  const std::string which = py::str(fn.attr("__name__")).cast<std::string>();
  if (which == "vars") {
    // vars(obj) is obj.__dict__, read as Python reads it (through the class's own
    // __getattribute__). vars() (the caller's locals) and an object with no __dict__ (Python's
    // TypeError) are left to Python.
    const ValuePtr* v = args.size() == 1 && kwargs.empty() ? &args[0] : nullptr;
    if (v && ((*v)->kind == VKind::kObject || (*v)->is(ObjRole::kNewObject))) {
      PyTypeObject* type = (*v)->is(ObjRole::kNewObject) ? reinterpret_cast<PyTypeObject*>((*v)->obj.ptr())
                                                         : Py_TYPE((*v)->obj.ptr());
      if (type->tp_dictoffset != 0) return read_attribute(*v, "__dict__", AttrLookup::kInlinable);
    }
    FJ_UNSUPPORTED(kUnsupportedCall, "vars() of {}", v ? (*v)->describe() : std::string("the caller's locals"));
  }
  const size_t most = which == "hasattr" ? 2 : 3;
  if (!kwargs.empty() || args.size() < 2 || args.size() > most ||
      (which == "setattr" && args.size() != 3)) {
    FJ_UNSUPPORTED(kUnsupportedCall, "{}() with {} arguments", which, args.size());
  }
  const ValuePtr name_value = sizes_.concretize(args[1]);
  if (!name_value->is_const() || !PyUnicode_Check(name_value->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedCall, "{}() with a name not known at trace time", which);
  }
  const std::string name = name_value->obj.cast<std::string>();
  if (which == "setattr") {  // as `obj.name = value` (STORE_ATTR)
    if (!store_attr(args[0], name, args[2])) return Value::constant(py::none());
    frame().on_found = Value::constant(py::none());  // setattr() returns None, not __setattr__'s result
    return nullptr;
  }
  const ValuePtr& base = args[0];
  if (which == "delattr") {  // as `del obj.name` (DELETE_ATTR)
    if (args.size() != 2) FJ_UNSUPPORTED(kUnsupportedCall, "delattr() with {} arguments", args.size());
    if (!delete_attr(base, name)) return Value::constant(py::none());
    frame().on_found = Value::constant(py::none());
    return nullptr;
  }
  static PyObject* const kGetattr = PyUnicode_InternFromString("__getattr__");
  const bool made = base->is(ObjRole::kNewObject);
  // (An object the trace made holds its class in obj.)
  PyTypeObject* type = made ? reinterpret_cast<PyTypeObject*>(base->obj.ptr()) : Py_TYPE(base->obj.ptr());
  if ((made || (base->is(ObjRole::kPlain) && !base->bound_self && !PyType_Check(base->obj.ptr()))) &&
      (which == "hasattr" || args.size() == 3) && _PyType_Lookup(type, kGetattr) == nullptr) {
    // Code decides what the lookup finds, with no __getattr__ to fall back on: a class's own
    // __getattribute__ (called with the name), else a property's getter. The trace inlines it;
    // an AttributeError from a lookup it makes gives the default (hasattr: False).
    static PyObject* const kGetattribute = PyUnicode_InternFromString("__getattribute__");
    py::object function;
    std::vector<ValuePtr> call_args = {base};
    std::string decided_by;  // the class attribute guarded to stay that function or property
    PyObject* hook = _PyType_Lookup(type, kGetattribute);  // Borrowed
    PyObject* found = _PyType_Lookup(type, py::str(name).ptr());  // Borrowed
    if (hook != nullptr && PyFunction_Check(hook)) {
      function = py::reinterpret_borrow<py::object>(hook);
      call_args.push_back(Value::constant(py::str(name)));
      decided_by = "__getattribute__";
    } else if (found != nullptr && PyObject_TypeCheck(found, &PyProperty_Type)) {
      function = py::reinterpret_borrow<py::object>(found).attr("fget");  // getattr(cache, "is_compileable", False)
      decided_by = name;
    }
    if (function && PyFunction_Check(function.ptr())) {
      const ValuePtr& guarded = made ? base->origin : base;
      if (guarded && guarded->source >= 0) {
        guard_class_attribute(guarded, decided_by, true, /*same_object=*/true);
        guard_class_attribute(guarded, "__getattr__", false);
      }
      inline_call(Value::object(function), function, std::move(call_args), {});
      frame().on_missing = which == "hasattr" ? Value::constant(py::bool_(false)) : args[2];
      if (which == "hasattr") frame().on_found = Value::constant(py::bool_(true));
      return nullptr;
    }
  }
  if (base->is(ObjRole::kPlain) && !base->bound_self && !PyType_Check(base->obj.ptr()) &&
      base->source >= 0 && (which == "hasattr" || args.size() == 3)) {
    // A class with a __getattr__ of its own (diffusers' ModelMixin forwarding old config
    // names, a wrapper forwarding to what it wraps) and an attribute the instance and the
    // class lack: Python asks that __getattr__, whose AttributeError (its own, or nn.Module's
    // through super()) gives the default. The absence and the hook are guarded, the hook traced.
    PyObject* hook = _PyType_Lookup(type, kGetattr);  // Borrowed
    static PyObject* const kModuleGetattr =
        py::object(PyRefs::get().module_type.attr("__getattr__")).release().ptr();
    if (hook != nullptr && hook != kModuleGetattr && PyFunction_Check(hook) &&
        is_user_function(host_, hook)) {
      py::tuple how = PyRefs::get().support.attr("attribute_presence")(base->obj, name, true);
      if (how[0].cast<Presence>() == Presence::kAbsent) {
        guard_attribute_absent(*this, base, name);
        guard_class_attribute(base, "__getattr__", true, /*same_object=*/true);
        inline_call(Value::object(py::reinterpret_borrow<py::object>(hook)), hook,
                    {base, Value::constant(py::str(name))}, {});
        frame().on_missing = which == "hasattr" ? Value::constant(py::bool_(false)) : args[2];
        if (which == "hasattr") frame().on_found = Value::constant(py::bool_(true));
        return nullptr;
      }
    }
  }
  if (which == "getattr" && args.size() == 2) {
    // As `obj.name`: through a class's own __getattribute__ or a property's getter (inlined);
    // a missing attribute raises there.
    return read_attribute(base, name, AttrLookup::kInlinable);
  }
  const bool present = attribute_present(base, name);
  if (which == "hasattr") return Value::constant(py::bool_(present));
  if (present) return read_attribute(args[0], name, AttrLookup::kValue);
  if (args.size() == 3) return args[2];
  // The runtime makes the call and raises the AttributeError.
  FJ_UNSUPPORTED(kUnsupportedValue, "getattr() of the missing attribute '{}'", name);
}

namespace {

bool has_instance_dict(PyObject* obj) { return Py_TYPE(obj)->tp_dictoffset != 0; }

// A class's attribute version tag, assigned first if it has none (0: it cannot get one, as
// when CPython's tags ran out). CPython resets the tag whenever an attribute of the class or
// of a base is set or deleted (PyType_Modified).
unsigned int type_version(PyTypeObject* type) {
  if (!pyver::type_version_valid(type)) {
    pyver::type_lookup_tagging(type, PyRefs::get().version_probe.ptr());  // for the tag only
  }
  return pyver::type_version_valid(type) ? type->tp_version_tag : 0;
}

// A guard that the instance dict `store` of `base` (its "__dict__", or an nn.Module's
// "_parameters" / "_buffers" / "_modules"), read by source, holds `name` iff `present`. Nothing
// when it has no such dict (slots: the class decides, and is guarded apart).
void guard_instance_dict(Tracer& t, const ValuePtr& base, const std::string& store,
                         const std::string& name, bool present) {
  ValuePtr dict = t.entry().load(t.entry().sources().attr(base->source, store));
  if (dict && dict->source >= 0 && PyDict_Check(dict->obj.ptr())) {
    t.entry().guard_dict_contains(dict->source, py::str(name).ptr(), present);
  }
}

// Guards that `name`, which attribute_presence found ABSENT, stays missing: from base's
// instance dicts (an nn.Module's parameter, buffer and module dicts too) and from its class.
void guard_attribute_absent(Tracer& t, const ValuePtr& base, const std::string& name) {
  for (py::handle store : PyRefs::get().support.attr("absent_attribute_stores")(base->obj)) {
    guard_instance_dict(t, base, store.cast<std::string>(), name, false);
  }
  t.guard_class_attribute(base, name, false);
}

}  // namespace

ValuePtr Tracer::missing_attribute_hook(const ValuePtr& base, const std::string& name, AttrLookup how) {
  // Python calls type(obj).__getattr__(obj, name) for a name that neither the class nor the
  // instance has (a wrapper forwarding to what it wraps: PEFT's models, a module's
  // `__getattr__` that tries super() first). Inlined like a class's own __getattribute__.
  PyObject* obj = base->obj.ptr();
  if (how == AttrLookup::kGeneric || base->source < 0 || base->is_special_object() ||
      base->bound_self || PyType_Check(obj)) {
    return nullptr;
  }
  static PyObject* const kGetattr = PyUnicode_InternFromString("__getattr__");
  PyObject* hook = _PyType_Lookup(Py_TYPE(obj), kGetattr);  // Borrowed
  if (hook == nullptr || !PyFunction_Check(hook) || !is_user_function(host_, hook)) return nullptr;
  if (how != AttrLookup::kInlinable) {
    FJ_UNSUPPORTED(kUnsupportedValue, "attribute '{}' of {}, made by its class's __getattr__, "
                   "here", name, base->describe());
  }
  // Missing while the class and the instance dict still lack it; the hook stays that function.
  guard_class_attribute(base, name, false);
  guard_class_attribute(base, "__getattr__", true, /*same_object=*/true);
  if (has_instance_dict(obj)) guard_instance_dict(*this, base, "__dict__", name, false);
  ValuePtr read = Value::object(py::reinterpret_borrow<py::object>(hook));
  read->role = ObjRole::kAttrHook;
  read->bound_self = base;
  read->method = name;
  return read;
}

ValuePtr Tracer::missing_attribute_raise(const ValuePtr& base, const std::string& name, AttrLookup how) {
  // An attribute neither the instance nor its class has, and no __getattr__: read where a
  // hasattr / getattr default or a try block may catch it (a class's __getattr__ forwarding to
  // what it wraps, asked by hasattr), the AttributeError is raised in the trace
  // (_python_forms.trace_missing_attribute, inlined); its absence is guarded.
  PyObject* obj = base->obj.ptr();
  if (how != AttrLookup::kInlinable || base->source < 0 || !base->is(ObjRole::kPlain) ||
      base->bound_self || PyType_Check(obj) || PyModule_Check(obj)) {
    return nullptr;
  }
  PyRefs& refs = PyRefs::get();
  py::tuple presence = refs.support.attr("attribute_presence")(base->obj, name, false);
  if (presence[0].cast<Presence>() != Presence::kAbsent) return nullptr;
  guard_attribute_absent(*this, base, name);
  static PyObject* const kRaise =
      py::object(py::module_::import("framejit._python_forms").attr("trace_missing_attribute")).release().ptr();
  ValuePtr read = Value::object(py::reinterpret_borrow<py::object>(kRaise));
  read->role = ObjRole::kAttrHook;
  read->bound_self = base;
  read->method = name;
  return read;
}

void Tracer::guard_super_attribute(const ValuePtr& proxy, const std::string& name) {
  // super().name is the first class after this one in type(self)'s MRO whose own dict has the
  // name: that class, read by source as an item of type(self).__mro__ (the tuple guarded item by
  // item), keeps it (a method replaced on the parent after the compile compiles again).
  const ValuePtr& self = proxy->bound_self;
  if (self->source < 0) return;  // made in the trace: its class was read where it was made
  ValuePtr cls = entry_.load(entry_.sources().attr(self->source, "__class__"));
  if (!cls || cls->source < 0 || !PyType_Check(cls->obj.ptr())) return;
  PyObject* mro = reinterpret_cast<PyTypeObject*>(cls->obj.ptr())->tp_mro;  // Borrowed
  if (mro == nullptr || !PyTuple_Check(mro)) return;
  py::str key(name);
  bool after = false;
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(mro); ++k) {
    PyObject* klass = PyTuple_GET_ITEM(mro, k);
    if (!after) {
      after = klass == proxy->obj.ptr();
      continue;
    }
    PyObject* dict = reinterpret_cast<PyTypeObject*>(klass)->tp_dict;
    if (dict == nullptr || PyDict_GetItemWithError(dict, key.ptr()) == nullptr) {
      PyErr_Clear();
      continue;
    }
    ValuePtr order = entry_.load(entry_.sources().attr(cls->source, "__mro__"));
    ValuePtr owner = order && order->source >= 0
                         ? entry_.load(entry_.sources().item(order->source, py::int_(k)))
                         : nullptr;
    if (owner && owner->source >= 0 && owner->obj.ptr() == klass) {
      entry_.guard_class_attribute_is(owner->source, reinterpret_cast<PyTypeObject*>(klass), key.ptr());
    }
    return;
  }
}

void Tracer::guard_class_attribute(const ValuePtr& base, const std::string& name, bool present,
                                   bool same_object) {
  // A class read by source: the class itself; an instance: its __class__.
  ValuePtr cls = PyType_Check(base->obj.ptr()) ? base : entry_.load(entry_.sources().attr(base->source, "__class__"));
  if (!cls || cls->source < 0 || !PyType_Check(cls->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedValue, "the attributes of {}'s class cannot be guarded", base->describe());
  }
  auto* type = reinterpret_cast<PyTypeObject*>(cls->obj.ptr());
  // A class without a version tag (3.13 gives a class at most 1000: FX's tracer patching
  // nn.Module.__call__ on every trace spends them for every module class) is guarded by
  // looking the name up on every check instead.
  type_version(type);
  if (same_object) {
    entry_.guard_class_attribute_is(cls->source, type, py::str(name).ptr());
    if (cls != base && base->source >= 0 && Py_TYPE(base->obj.ptr())->tp_dictoffset != 0) {
      // Bound from the class because the instance has no attribute of that name: an instance
      // attribute set later (obj.meth = ..., module.forward = ...) shadows it.
      guard_instance_dict(*this, base, "__dict__", name, false);
    }
  } else {
    entry_.guard_class_attribute(cls->source, type, py::str(name).ptr(), present);
  }
}

bool Tracer::attribute_present(const ValuePtr& base, const std::string& name, bool generic) {
  switch (base->kind) {
    case VKind::kConst:
      return PyObject_HasAttrString(base->obj.ptr(), name.c_str()) == 1;
    case VKind::kTensor:
      // A tensor's attributes are its class's (attributes set on a tensor object are not
      // traced).
      if (PyObject_HasAttrString(PyRefs::get().tensor_type.ptr(), name.c_str()) == 1) return true;
      if (base->source < 0) return false;  // made in the trace: nothing was set on it
      if (PyObject_HasAttrString(entry_.live_value(base->source), name.c_str()) == 1 ||
          !has_instance_dict(entry_.live_value(base->source))) {
        FJ_UNSUPPORTED(kUnsupportedValue, "hasattr of '{}' on a tensor", name);
      }
      // torch.Tensor's attributes are stable (as torch's namespaces): the tensor's own dict
      // must keep lacking it (transformers asks `hasattr(x, "jax")`).
      guard_instance_dict(*this, base, "__dict__", name, false);
      return false;
    case VKind::kObject: {
      if (base->is(ObjRole::kNewObject)) return new_object_has(base, name);  // (its class has no __getattr__)
      if (base->is_special_object() || base->bound_self) {
        FJ_UNSUPPORTED(kUnsupportedValue, "hasattr of '{}' on {}", name, base->describe());
      }
      if (effects_.pending(base, name)) return true;  // stored earlier in this region
      py::tuple how = PyRefs::get().support.attr("attribute_presence")(base->obj, name, generic);
      const auto verdict = how[0].cast<Presence>();
      if (verdict == Presence::kUnknown) {
        FJ_UNSUPPORTED(kUnsupportedValue, "hasattr of '{}' on {} (a property, slot or __getattr__ "
                       "could decide it)", name, base->describe());
      }
      const bool present = verdict == Presence::kPresent;
      if (base->source < 0) return present;  // read through unguarded constants (torch.nn.functional)
      // Guarded: the instance dicts hold it (or not), and the class is unchanged.
      py::object stores = present ? py::object(py::make_tuple(how[1]))
                                  : PyRefs::get().support.attr("absent_attribute_stores")(base->obj);
      for (py::handle store : stores) {
        if (store.is_none()) continue;  // present on the class
        guard_instance_dict(*this, base, store.cast<std::string>(), name, present);
      }
      // The class must keep (or keep lacking) it too, where the instance dicts do not decide.
      if (!PyModule_Check(base->obj.ptr()) && how[1].is_none()) {
        guard_class_attribute(base, name, present);
      }
      return present;
    }
    default:  // containers the trace models: their type's attributes
      return PyObject_HasAttrString(type_of(base).ptr(), name.c_str()) == 1;
  }
}

void Tracer::check_items_unchanged(const ValuePtr& dict) {
  if (dict->kind == VKind::kObject && effects_.items_written(dict->obj.ptr())) {
    FJ_UNSUPPORTED(kSideEffect, "{} read whole after this region stored an item into it",
                   dict->describe());
  }
}

void Tracer::raise_missing_key(const ValuePtr& dict, const py::object& key) {
  static PyObject* const kMissing = PyUnicode_InternFromString("__missing__");
  if (_PyType_Lookup(Py_TYPE(dict->obj.ptr()), kMissing) != nullptr) {
    // defaultdict, Counter: the lookup inserts or answers a default, which the runtime does.
    FJ_UNSUPPORTED(kSideEffect, "a missing key of {}, whose class defines __missing__",
                   dict->describe());
  }
  // KeyError, as CPython raises it: caught by a try block in the trace (Mapping.get on a
  // registry), else the region ends here. The key's absence is guarded.
  entry_.guard_dict_contains(dict->source, key.ptr(), false);
  ValuePtr exc = simple_exception(py::handle(PyExc_KeyError), py::make_tuple(key), py::dict());
  FJ_CHECK(exc != nullptr, "KeyError not constructible");
  throw TracedRaise{std::move(exc)};
}

ValuePtr Tracer::item_by_object(const ValuePtr& base, const ValuePtr& key) {
  if (base->kind != VKind::kObject || base->source < 0 || !reads_items_as_dict(base->obj.ptr()) ||
      key->source < 0 || (key->kind != VKind::kTensor && !key->is(ObjRole::kPlain))) {
    return nullptr;
  }
  PyObject* real_key = entry_.live_value(key->source);
  static PyObject* const kHash = PyUnicode_InternFromString("__hash__");
  PyObject* hash = _PyType_Lookup(Py_TYPE(real_key), kHash);  // Borrowed
  const bool by_identity = key->kind == VKind::kTensor ||
                           hash == _PyType_Lookup(&PyBaseObject_Type, kHash);
  if (!by_identity || is_identity_object(real_key)) return nullptr;  // (classes, functions: constants)
  // The same object on every call: the entry the trace reads is the one for this key.
  entry_.guard_id(key->source, real_key);
  if (const ValuePtr* stored = effects_.pending_item(base, real_key)) return *stored;
  py::object k = py::reinterpret_borrow<py::object>(real_key);
  const int contains = PyDict_Contains(base->obj.ptr(), real_key);
  if (contains < 0) throw py::error_already_set();
  if (contains == 0) {
    static PyObject* const kDefaultDict =
        py::object(py::module_::import("collections").attr("defaultdict")).release().ptr();
    if (Py_TYPE(base->obj.ptr()) == reinterpret_cast<PyTypeObject*>(kDefaultDict)) {
      // defaultdict(dict) / defaultdict(list) (an optimizer's state on its first step): the new
      // empty container is the trace's, stored as base[key] at the exit.
      ValuePtr factory = entry_.load(entry_.sources().attr(base->source, "default_factory"));
      PyObject* made_by = factory ? factory->obj.ptr() : nullptr;
      if (made_by == reinterpret_cast<PyObject*>(&PyDict_Type) ||
          made_by == reinterpret_cast<PyObject*>(&PyList_Type)) {
        entry_.guard_dict_contains(base->source, real_key, false);
        ValuePtr made = made_by == reinterpret_cast<PyObject*>(&PyDict_Type) ? Value::dict({}, {})
                                                                             : Value::list({});
        effects_.record_item(base, key, std::move(k), made);
        return made;
      }
    }
    raise_missing_key(base, k);
  }
  ValuePtr value = entry_.load(entry_.sources().item_by_object(base->source, k, key->source));
  FJ_CHECK(value != nullptr, "present key {} unreadable", entry_.sources().at(key->source).text);
  return value;
}

bool Tracer::missing_key(const ValuePtr& base, const ValuePtr& key_in) {
  const bool made_mapping = base->is(ObjRole::kNewObject) && base->mapping;
  const bool sourced = base->kind == VKind::kObject && base->is(ObjRole::kPlain) && base->source >= 0 &&
                       !base->bound_self && PyDict_Check(base->obj.ptr());
  if (!made_mapping && !sourced && (base->kind != VKind::kDict || !base->factory)) return false;
  const ValuePtr key = sizes_.concretize(key_in);
  if (!key->is_constant_tree()) return false;
  const py::object k = key->as_python();
  if (PyObject_Hash(k.ptr()) == -1) {
    PyErr_Clear();
    return false;  // unhashable: TypeError, as item() reports it
  }
  static PyObject* const kMissing = PyUnicode_InternFromString("__missing__");
  if (made_mapping) {  // an instance the trace made (a Counter): its class's __missing__
    return base->mapping->find_key(k) < 0 && inline_special_method(base, kMissing, {key});
  }
  if (sourced) {
    const int contains = PyDict_Contains(base->obj.ptr(), k.ptr());
    if (contains < 0) throw py::error_already_set();
    if (contains == 1) return false;  // read by source
    if (!py::type::handle_of(base->obj).is(PyRefs::get().defaultdict_type)) {
      if (!reads_items_as_dict(base->obj.ptr())) return false;
      PyObject* hook = _PyType_Lookup(Py_TYPE(base->obj.ptr()), kMissing);  // Borrowed
      if (hook == nullptr || !PyFunction_Check(hook)) return false;
      entry_.guard_dict_contains(base->source, k.ptr(), false);
      return inline_special_method(base, kMissing, {key});
    }
    make_writable(base);  // its keys guarded; its contents and factory now the trace's
  }
  if (base->find_key(k) >= 0 || base->factory->obj.is_none() || defaultdict_factory_made(base->factory->obj)) {
    return false;  // present, or item() answers it
  }
  // defaultdict's __missing__: `value = factory(); d[key] = value`, traced.
  static PyObject* const kForm =
      py::object(PyRefs::get().support.attr("defaultdict_missing")).release().ptr();
  inline_call(Value::object(py::reinterpret_borrow<py::object>(kForm)), kForm,
              {base, base->factory, key}, {});
  return true;
}

ValuePtr Tracer::item(const ValuePtr& base, const ValuePtr& key_in) {
  if (base->kind == VKind::kTensor) {
    // A slice with a size expression for a bound stays a graph value (`x[:, 0:T]` takes any
    // T); every other number in the index is pinned.
    auto index = [this](const ValuePtr& part) {
      return SizeTracker::is_symbolic_slice(part) ? part : sizes_.concretize(part);
    };
    const ValuePtr key = key_in->kind == VKind::kTuple ? Value::map_items(key_in, index) : index(key_in);
    if (base->ndarray) return ndarray_operator("getitem", {base, key});
    ValuePtr result = record_operator("getitem", "[]", {base, key});
    if (result) sizes_.note_slice_lengths(result, base, key);
    return result;
  }
  if (ValuePtr found = item_by_object(base, key_in)) return found;
  const ValuePtr key = sizes_.concretize(key_in);
  py::object k;
  if (!key->as_key(k)) {
    FJ_UNSUPPORTED(kUnsupportedValue, "subscript of {} with {}", base->describe(),
                   key->describe());
  }
  switch (base->kind) {
    case VKind::kTuple:
    case VKind::kList: {
      const Py_ssize_t n = static_cast<Py_ssize_t>(base->items.size());
      if (PyLong_CheckExact(k.ptr())) {
        Py_ssize_t i = k.cast<Py_ssize_t>();
        if (i < 0) i += n;
        if (i < 0 || i >= n) FJ_UNSUPPORTED(kUnsupportedValue, "index {} out of range", i);
        return base->items[i];
      }
      if (PySlice_Check(k.ptr()) && base->is_deque()) {
        FJ_PROGRAM_RAISED(kUnsupportedValue, "a slice of a deque (TypeError)");
      }
      if (PySlice_Check(k.ptr())) {
        Py_ssize_t start, stop, step, length;
        if (PySlice_GetIndicesEx(k.ptr(), n, &start, &stop, &step, &length) < 0) {
          throw py::error_already_set();
        }
        std::vector<ValuePtr> items;
        for (Py_ssize_t i = 0, at = start; i < length; ++i, at += step) {
          items.push_back(base->items[at]);
        }
        if (base->kind == VKind::kList) return Value::list(std::move(items));
        if (base->pytype.is(PyRefs::get().size_type)) {  // x.shape[1:] is a torch.Size
          return Value::tuple(std::move(items), base->pytype);
        }
        return Value::tuple(std::move(items));
      }
      break;
    }
    case VKind::kDict: {
      const long at = base->find_key(k);
      if (at >= 0) return base->items[at];
      if (base->factory && !base->factory->obj.is_none()) {
        if (ValuePtr made = defaultdict_factory_made(base->factory->obj)) {  // __missing__: stored
          base->set_key(k, made);
          return made;
        }
        // Another factory is called by the trace, from a subscript (missing_key).
        FJ_UNSUPPORTED(kUnsupportedValue, "a missing key of a defaultdict whose factory {} is called here",
                       base->factory->describe());
      }
      // KeyError, as CPython raises it: a try block in the trace may catch it.
      ValuePtr exc = simple_exception(py::handle(PyExc_KeyError), py::make_tuple(k), py::dict());
      FJ_CHECK(exc != nullptr, "KeyError not constructible");
      throw TracedRaise{std::move(exc)};
    }
    case VKind::kConst: {
      try {
        return Value::constant(base->obj[k]);
      } catch (const py::error_already_set& e) {
        FJ_PROGRAM_RAISED(kUnsupportedValue, "subscript raised: {}", e.what());
      }
    }
    case VKind::kObject:
      if (base->source >= 0 && PySlice_Check(k.ptr()) &&
          PyObject_IsInstance(base->obj.ptr(), PyRefs::get().torch.attr("nn").attr("ModuleList").ptr()) == 1) {
        // self.layers[1:]: the children in that range (a list; iterating and indexing it is all
        // a forward does with a ModuleList slice).
        std::vector<ValuePtr> children;
        if (module_children(base, children)) {
          return item(Value::list(std::move(children)), key);
        }
      }
      if (base->source >= 0 && (PyLong_CheckExact(k.ptr()) || PyUnicode_Check(k.ptr()))) {
        // self.layers[0], self.blocks["head"]: the child, read by source.
        std::vector<ValuePtr> children;
        if (module_children(base, children)) {
          py::object keys = PyRefs::get().support.attr("module_container_keys")(base->obj);
          py::list names = keys[py::int_(1)];
          // (a ModuleDict's children here are its names: no index reads one; a ModuleList's
          // may be None, which ModuleList holds as it holds modules)
          const bool is_dict = PyObject_IsInstance(
              base->obj.ptr(), PyRefs::get().torch.attr("nn").attr("ModuleDict").ptr()) == 1;
          if (PyLong_CheckExact(k.ptr()) && !is_dict) {
            Py_ssize_t i = k.cast<Py_ssize_t>();
            const Py_ssize_t n = static_cast<Py_ssize_t>(children.size());
            if (i < 0) i += n;
            if (i >= 0 && i < n) return children[i];
          }
          if (PyUnicode_Check(k.ptr())) {
            const std::string store = keys[py::int_(0)].cast<std::string>();
            ValuePtr all = entry_.load(entry_.sources().attr(base->source, store));
            ValuePtr child = all ? entry_.load(entry_.sources().item(all->source, k)) : nullptr;
            if (child) return child;
          }
          FJ_UNSUPPORTED(kUnsupportedValue, "index {} of {}", safe_repr(k), base->describe());
        }
      }
      if (base->source >= 0 && reads_items_as_dict(base->obj.ptr())) {
        if (!PyDict_Contains(base->obj.ptr(), k.ptr())) {
          raise_missing_key(base, k);
        }
        ValuePtr value = entry_.load(entry_.sources().item(base->source, k));
        FJ_CHECK(value != nullptr, "present key {} unreadable", safe_repr(k));
        return value;
      }
      break;
    default:
      break;
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "subscript of {} is not traced yet", base->describe());
}

bool Tracer::store_attr(const ValuePtr& target, const std::string& name, ValuePtr value) {
  if (target->is(ObjRole::kNewObject)) {
    // A class's own __setattr__ (ModelOutput's) runs for every store: inlined.
    static PyObject* const kSetattr = PyUnicode_InternFromString("__setattr__");
    if (inline_special_method(target, kSetattr, {Value::constant(py::str(name)), value})) return true;
    new_object_store(target, name, std::move(value));
    return false;
  }
  if (target->kind == VKind::kTensor && name == "grad" && target->source >= 0 &&
      (value->kind == VKind::kTensor || (value->is_const() && value->obj.is_none()))) {
    // An input's gradient set (zero_grad's `p.grad = None`): replayed at the exit, read back by
    // later loads of this trace.
    effects_.record(target, name, std::move(value));
    return false;
  }
  if (target->kind == VKind::kTensor && name == "requires_grad" && target->source < 0 &&
      value->is_const() && PyBool_Check(value->obj.ptr())) {
    // flag of a tensor the graph makes (T5's position bias under gradient checkpointing): the
    // graph's t.requires_grad_(flag), run on the meta tensor too (a result of an op that
    // records gradients raises there, as it does in Python).
    record_call(NodeKind::kCallMethod, py::none(), "requires_grad_", {target, value}, {}, "",
                "requires_grad_");
    return false;
  }
  if (target->kind != VKind::kObject || target->source < 0 || PyModule_Check(target->obj.ptr()) ||
      PyType_Check(target->obj.ptr()) || target->is_special_object() || target->bound_self) {
    FJ_UNSUPPORTED(kSideEffect, "attribute assignment .{} on {}", name, target->describe());
  }
  // A class's own __setattr__ (a config's validators, a renaming one) runs for the store: it is
  // inlined, and the object.__setattr__ it ends in is the write recorded.
  // (nn.Module's own __setattr__ is replayed at the exit: its stores are what reads expect.)
  static PyObject* const kSetattr = PyUnicode_InternFromString("__setattr__");
  PyObject* hook = _PyType_Lookup(Py_TYPE(target->obj.ptr()), kSetattr);  // Borrowed
  if (hook != nullptr && PyFunction_Check(hook) &&
      PyObject_IsInstance(target->obj.ptr(), PyRefs::get().module_type.ptr()) != 1) {
    if (host_.traces_into(reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(hook))) &&
        inline_special_method(target, kSetattr, {Value::constant(py::str(name)), value})) {
      return true;
    }
    FJ_UNSUPPORTED(kSideEffect, "assignment to .{} of {}, whose class has its own __setattr__",
                   name, target->describe());
  }
  return record_store(target, name, std::move(value), /*generic=*/false);
}

bool Tracer::delete_attr(const ValuePtr& target, const std::string& name) {
  if (!target->is(ObjRole::kNewObject)) {
    FJ_UNSUPPORTED(kSideEffect, "deletion of the attribute .{} of {}", name, target->describe());
  }
  // A class's own __delattr__ runs for the deletion: inlined (its object.__delattr__ deletes).
  static PyObject* const kDelattr = PyUnicode_InternFromString("__delattr__");
  if (inline_special_method(target, kDelattr, {Value::constant(py::str(name))})) return true;
  py::tuple how = PyRefs::get().support.attr("resolve_new_object_attribute")(target->obj, name);
  if (how[0].cast<AttrKind>() == AttrKind::kProperty) {
    FJ_UNSUPPORTED(kSideEffect, "deletion of .{}, a property of the class", name);
  }
  new_object_delete(target, name);
  return false;
}

bool Tracer::record_store(const ValuePtr& target, const std::string& name, ValuePtr value,
                          bool generic) {
  py::tuple how = PyRefs::get().support.attr("resolve_attribute")(target->obj, name);
  const auto kind = how[0].cast<AttrKind>();
  if (kind == AttrKind::kProperty || kind == AttrKind::kFunction) {
    FJ_UNSUPPORTED(kSideEffect, "assignment to .{}, which the class defines", name);
  }
  if (entry_.namespace_changed(target->obj.ptr())) {
    FJ_UNSUPPORTED(kSideEffect, "assignment to .{} of {}, whose dict this region changed", name,
                   target->describe());
  }
  effects_.record(target, name, std::move(value), generic);
  return false;
}

bool Tracer::store_item(const ValuePtr& container_in, const ValuePtr& key_in, const ValuePtr& value) {
  if (container_in->kind == VKind::kTensor) {
    if (container_in->ndarray) {
      ndarray_operator("setitem", {container_in, key_in, value});
      return false;
    }
    record_operator("setitem", "", {container_in, key_in, value});
    return false;
  }
  static PyObject* const kSetitem = PyUnicode_InternFromString("__setitem__");
  if (container_in->is(ObjRole::kNewObject) && inline_special_method(container_in, kSetitem, {key_in, value})) {
    return true;
  }
  // An object the trace made that is a dict (subclass): its items.
  const ValuePtr& container = container_in->is(ObjRole::kNewObject) && container_in->mapping
                                  ? container_in->mapping : container_in;
  if (container->kind == VKind::kObject && container->source >= 0 &&
      PyDict_CheckExact(container->obj.ptr()) && key_in->is_const()) {
    // `inputs["y"] += x` stores back the very tensor it read (mutated in place): no side effect.
    const int slot = entry_.sources().find(entry_.sources().item(container->source, key_in->obj));
    if (slot >= 0 && entry_.value_at(slot) == value) return false;
  }
  const ValuePtr key = container->kind == VKind::kList ? sizes_.concretize(key_in) : key_in;
  if (!key->is_constant_tree()) {
    FJ_UNSUPPORTED(kUnsupportedValue, "item assignment with key {}", key->describe());
  }
  const py::object k = key->as_python();
  if (container->kind == VKind::kList && PySlice_Check(k.ptr())) {
    // l[a:b] = items: the slice replaced (any length for a step of 1, else as many items).
    std::vector<ValuePtr> replacement;
    if (!(value->is_sequence() || value->kind == VKind::kIter || value->is_const()) ||
        !iterable_items(value, replacement)) {
      FJ_UNSUPPORTED(kUnsupportedValue, "slice assignment of {}", value->describe());
    }
    Py_ssize_t start = 0, stop = 0, step = 1;
    if (PySlice_Unpack(k.ptr(), &start, &stop, &step) < 0) throw py::error_already_set();
    auto& items = container->items;
    const Py_ssize_t length =
        PySlice_AdjustIndices(static_cast<Py_ssize_t>(items.size()), &start, &stop, step);
    if (step != 1 && static_cast<size_t>(length) != replacement.size()) {
      FJ_PROGRAM_RAISED(kUnsupportedValue, "a slice of {} items assigned {} (ValueError at run time)",
                        length, replacement.size());
    }
    make_writable(container);
    if (value->kind == VKind::kIter) value->exhaust();
    if (step == 1) {
      stop = std::max(stop, start);
      items.erase(items.begin() + start, items.begin() + stop);
      items.insert(items.begin() + start, replacement.begin(), replacement.end());
    } else {
      for (Py_ssize_t i = 0; i < length; ++i) items[start + i * step] = replacement[i];
    }
    return false;
  }
  make_writable(container);
  if (container->kind == VKind::kList && PyLong_CheckExact(k.ptr())) {
    const Py_ssize_t n = static_cast<Py_ssize_t>(container->items.size());
    Py_ssize_t i = k.cast<Py_ssize_t>();
    if (i < 0) i += n;
    if (i < 0 || i >= n) FJ_UNSUPPORTED(kUnsupportedValue, "index {} out of range", i);
    container->items[i] = value;
    return false;
  }
  if (container->kind == VKind::kDict) {
    container->set_key(k, value);
    return false;
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "item assignment into {}", container->describe());
}

void Tracer::delete_item(const ValuePtr& container, const ValuePtr& key_in) {
  const ValuePtr key = sizes_.concretize(key_in);
  if (!key->is_constant_tree() || container->kind == VKind::kTensor) {
    FJ_UNSUPPORTED(kUnsupportedValue, "del of {}[{}]", container->describe(), key->describe());
  }
  const py::object k = key->as_python();
  if (container->kind == VKind::kList && PySlice_Check(k.ptr())) {  // del l[a:b]
    Py_ssize_t start = 0, stop = 0, step = 1;
    if (PySlice_Unpack(k.ptr(), &start, &stop, &step) < 0) throw py::error_already_set();
    auto& items = container->items;
    const Py_ssize_t length =
        PySlice_AdjustIndices(static_cast<Py_ssize_t>(items.size()), &start, &stop, step);
    make_writable(container);
    std::vector<bool> gone(items.size(), false);
    for (Py_ssize_t i = 0; i < length; ++i) gone[start + i * step] = true;
    std::vector<ValuePtr> kept;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!gone[i]) kept.push_back(items[i]);
    }
    items = std::move(kept);
    return;
  }
  const bool list_index = container->kind == VKind::kList && PyLong_CheckExact(k.ptr());
  const bool dict = container->kind == VKind::kDict ||
                    (container->is(ObjRole::kPlain) && PyDict_CheckExact(container->obj.ptr()));
  if (!list_index && !dict) {
    FJ_UNSUPPORTED(kUnsupportedValue, "del of {}[{}]", container->describe(), key->describe());
  }
  make_writable(container);
  auto& items = container->items;
  if (list_index) {
    const Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
    Py_ssize_t i = k.cast<Py_ssize_t>();
    if (i < 0) i += n;
    if (i < 0 || i >= n) FJ_UNSUPPORTED(kUnsupportedValue, "del of index {} out of range", i);
    items.erase(items.begin() + i);
    return;
  }
  for (size_t i = 0; i < container->keys.size(); ++i) {
    if (!container->keys[i].equal(k)) continue;
    if (container->being_iterated()) FJ_UNSUPPORTED(kSideEffect, "a dict changes size while a loop iterates it");
    container->keys.erase(container->keys.begin() + static_cast<long>(i));
    items.erase(items.begin() + static_cast<long>(i));
    return;
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "del of the missing key {} (KeyError at run time)", safe_repr(k));
}

}  // namespace framejit
