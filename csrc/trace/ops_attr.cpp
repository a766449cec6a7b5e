// Opcode handlers: attribute loads, method loads, subscripts and stores.
#include "bytecode/version.h"
#include "common/check.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

// Whether self's methods are looked up on its type and bound to the value itself (tensors,
// constants, containers of the trace, dicts read by source): the type they are found on, or an
// empty object.
py::object method_owner(Tracer& t, const ValuePtr& self, const std::string& name) {
  // (a class's methods are its own attributes, found past its metaclass: object.__setattr__)
  if (self->kind == VKind::kConst && PyType_Check(self->obj.ptr())) return py::object();
  const bool bound_to_self = self->kind == VKind::kTensor || self->kind == VKind::kConst ||
                             self->kind == VKind::kList || self->kind == VKind::kTuple ||
                             self->kind == VKind::kDict ||
                             (self->kind == VKind::kObject &&
                              (is_plain_dict(self->obj.ptr()) ||
                               (PyDict_Check(self->obj.ptr()) && t.reads_as_dict(self, name.c_str()))));
  if (!bound_to_self) return py::object();
  switch (self->kind) {
    case VKind::kTensor:
      if (self->ndarray) return ndarray_type();
      return self->pytype ? self->pytype : PyRefs::get().tensor_type;
    case VKind::kList:  // (a deque's class: its own methods)
      return self->is_deque() ? self->pytype
                              : py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyList_Type));
    case VKind::kDict:  // (a defaultdict's or OrderedDict's class: its own methods)
      return self->pytype ? self->pytype
                          : py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyDict_Type));
    case VKind::kTuple:
      return self->pytype;
    default:
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(self->obj.ptr())));
  }
}

// The [method, self] / [NULL, attribute] pair CALL expects, shared by 3.11's LOAD_METHOD and
// 3.12's LOAD_ATTR with the method bit.
void push_method(Tracer& t, const std::string& name) {
  ValuePtr self = t.pop();
  if (py::object type = method_owner(t, self, name)) {
    // CPython pushes the function found on the type, then self; keep the same object so the
    // runtime can make the call, or CPython resume, with the stack it expects.
    py::object function = py::getattr(type, name.c_str(), py::none());
    if (function.is_none() ||
        !PyType_HasFeature(Py_TYPE(function.ptr()), Py_TPFLAGS_METHOD_DESCRIPTOR)) {
      t.push(self);
      FJ_UNSUPPORTED(kUnsupportedValue, "method {} of {} is not a plain method", name,
                     self->describe());
    }
    ValuePtr method = Value::object(function);
    method->role = ObjRole::kTypeMethod;
    method->method = name;
    t.push(method);
    t.push(self);
    return;
  }
  ValuePtr attribute = t.attr(self, name, Tracer::AttrLookup::kInlinable);
  if (attribute->is(ObjRole::kProperty) || attribute->is(ObjRole::kAttrHook)) {
    // A property's value, or a read through the class's own __getattribute__, called next: the
    // getter is inlined and its result lands above the NULL (CPython's [NULL, attribute]), or
    // under it on 3.13 ([attribute, NULL]).
    if (!pyver::kNullAboveCallable) t.push(Value::null());
    if (ValuePtr value = t.finish_read(attribute)) {
      t.push(std::move(value));
      if (pyver::kNullAboveCallable) t.push(Value::null());
    } else if (pyver::kNullAboveCallable) {
      t.frame().null_above_result = true;  // the getter's frame, inlined: pushed on its return
    }
    return;
  }

  if (attribute->kind == VKind::kObject && attribute->bound_self &&
      PyFunction_Check(attribute->obj.ptr())) {
    // CPython's own layout for a Python method: [function, self].
    ValuePtr function = Value::object(attribute->obj);
    function->class_of = attribute->class_of;  // where its closure is read
    function->class_attr = attribute->class_attr;
    t.push(std::move(function));
    t.push(attribute->bound_self);
    return;
  }
  t.push_with_null(attribute);
}

void op_load_attr(Tracer& t, const Instr& i) {
  const std::string name = t.co_name(pyver::load_attr_name(i.arg));
  if (pyver::load_attr_is_method(i.arg)) {
    push_method(t, name);
    return;
  }
  ValuePtr base = t.pop();
  if (base->kind == VKind::kList || base->kind == VKind::kDict ||
      (base->kind == VKind::kObject && !base->is_special_object() && !base->bound_self && base->source >= 0 &&
       PyDict_Check(base->obj.ptr()))) {
    // d.get, lst.append read as values (max(d, key=d.get)): the type's method bound to the
    // container, called (or rebuilt at an exit) as a method of it.
    py::object type = method_owner(t, base, name);
    py::object function = type ? py::getattr(type, name.c_str(), py::none()) : py::object();
    if (function && PyType_HasFeature(Py_TYPE(function.ptr()), Py_TPFLAGS_METHOD_DESCRIPTOR)) {
      ValuePtr method = Value::object(function);
      method->role = ObjRole::kTypeMethod;
      method->method = name;
      method->bound_self = base;
      t.push(std::move(method));
      return;
    }
  }
  if (ValuePtr value = t.read_attribute(base, name)) t.push(std::move(value));
}

void op_load_method(Tracer& t, const Instr& i) { push_method(t, t.co_name(i.arg)); }

// 3.12: super().name as one instruction: [super, class, self] -> the attribute (arg bit 0: the
// method pair CALL expects; bits 2 on: the name). Traced as the super() value it stands for.
void op_load_super_attr(Tracer& t, const Instr& i) {
  ValuePtr self = t.pop();
  ValuePtr cls = t.pop();
  ValuePtr global_super = t.pop();
  if (!global_super->is_const() && global_super->kind != VKind::kObject) {
    FJ_UNSUPPORTED(kUnsupportedValue, "super() through {}", global_super->describe());
  }
  if (global_super->obj.ptr() != reinterpret_cast<PyObject*>(&PySuper_Type) ||
      (cls->kind != VKind::kObject && cls->kind != VKind::kConst) || !PyType_Check(cls->obj.ptr()) ||
      self->kind != VKind::kObject) {
    t.push(global_super);
    t.push(cls);
    t.push(self);
    FJ_UNSUPPORTED(kUnsupportedValue, "super() of {} in {}", self->describe(), cls->describe());
  }
  ValuePtr proxy = Value::object(cls->obj);
  proxy->role = ObjRole::kSuper;
  proxy->bound_self = self;
  const std::string name = t.co_name(i.arg >> 2);
  t.push(proxy);
  if (i.arg & 1) {
    push_method(t, name);
    return;
  }
  ValuePtr base = t.pop();
  if (ValuePtr value = t.read_attribute(base, name)) t.push(std::move(value));
}

bool is_nn_module(PyObject* obj) {
  const int is = PyObject_IsInstance(obj, PyRefs::get().module_type.ptr());
  if (is < 0) PyErr_Clear();
  return is == 1;
}

// Whether obj.__module__ is the module `name`.
bool module_is(PyObject* obj, const char* name) {
  static PyObject* const kModule = PyUnicode_InternFromString("__module__");
  py::object module = py::reinterpret_steal<py::object>(PyObject_GetAttr(obj, kModule));
  if (!module) PyErr_Clear();
  return module && PyUnicode_Check(module.ptr()) && PyUnicode_CompareWithASCIIString(module.ptr(), name) == 0;
}

// typing's own forms (List, Optional, List[int]) and builtin generic aliases (list[int]).
bool is_annotation(PyObject* obj) {
  if (Py_TYPE(obj) == &Py_GenericAliasType) return true;
  return module_is(reinterpret_cast<PyObject*>(Py_TYPE(obj)), "typing");
}

// collections.abc's classes (Callable[[T], Any], Mapping[str, int]: their __class_getitem__
// makes an alias, as typing's forms do).
bool is_abc_class(PyObject* obj) { return PyType_Check(obj) && module_is(obj, "collections.abc"); }

// The Python object a subscript key stands for where it is known at trace time: a constant,
// a class (torch.Tensor in List[torch.Tensor]), an annotation, or a tuple of those
// (Dict[str, Optional[Tensor]]).
bool annotation_key(const ValuePtr& key, py::object& out) {
  if (key->kind == VKind::kObject && key->is(ObjRole::kPlain) && !key->bound_self &&
      is_annotation(key->obj.ptr())) {
    out = key->obj;
    return true;
  }
  const bool tuple = key->kind == VKind::kTuple && key->pytype.ptr() == reinterpret_cast<PyObject*>(&PyTuple_Type);
  if (tuple || key->kind == VKind::kList) {  // (a list: Callable[[int, T], Any]'s arguments)
    py::list parts;
    for (const auto& item : key->items) {
      py::object part;
      if (!annotation_key(item, part)) return false;
      parts.append(part);
    }
    out = tuple ? py::object(py::tuple(parts)) : py::object(parts);
    return true;
  }
  return key->as_key(out);
}

// List[torch.Tensor], Optional[int], tuple[int, ...]: an annotation made from constants (timm's
// `torch.jit.annotate(List[torch.Tensor], [])`), made at trace time as Python makes it (typing
// caches them): typing's own forms and builtin generic aliases only.
ValuePtr annotation_subscript(Tracer& t, const ValuePtr& base, const ValuePtr& key) {
  if ((!base->is(ObjRole::kPlain) && !base->is_const()) || base->bound_self) return nullptr;
  PyObject* obj = base->obj.ptr();
  // (a builtin class: list[int] is type.__class_getitem__'s alias)
  const bool builtin_class = PyType_Check(obj) &&
                             !(reinterpret_cast<PyTypeObject*>(obj)->tp_flags & Py_TPFLAGS_HEAPTYPE);
  if (!builtin_class && !is_annotation(obj) && !is_abc_class(obj)) return nullptr;
  py::object k;
  if (!annotation_key(t.sizes().concretize(key), k)) return nullptr;
  PyObject* made = PyObject_GetItem(base->obj.ptr(), k.ptr());  // New
  if (made == nullptr) {
    PyErr_Clear();
    return nullptr;  // (Python raises it: the trace reports the subscript)
  }
  return Value::object(py::reinterpret_steal<py::object>(made));
}

void op_binary_subscr(Tracer& t, const Instr&) {
  ValuePtr key = t.pop();
  ValuePtr base = t.pop();
  if (ValuePtr annotation = annotation_subscript(t, base, key)) {
    t.push(std::move(annotation));
    return;
  }
  if (ValuePtr found = t.environ_lookup(base, key, nullptr, false)) {  // os.environ[key]
    t.push(std::move(found));
    return;
  }
  // A class with __getitem__ in Python (a Mapping subclass, a registry): traced. Module
  // containers (ModuleList[i], Sequential[1:]) are read by source instead (Tracer::item).
  static PyObject* const kGetitem = PyUnicode_InternFromString("__getitem__");
  PyObject* obj = base->obj.ptr();
  if (base->is(ObjRole::kPlain) && !is_plain_dict(obj) && !PyList_Check(obj) &&
      !PyTuple_Check(obj) && !is_nn_module(obj) && t.inline_special_method(base, kGetitem, {key})) {
    return;
  }
  if (base->is(ObjRole::kNewObject)) {  // its class's __getitem__, or its dict's items
    if (t.inline_special_method(base, kGetitem, {key})) return;
    if (base->mapping) {
      if (t.missing_key(base, key)) return;
      t.push(t.item(base->mapping, key));
      return;
    }
  }
  if (t.missing_key(base, key)) return;
  t.push(t.item(base, key));
}

void op_binary_slice(Tracer& t, const Instr&) {  // 3.12: container[start:stop]
  ValuePtr stop = t.pop();
  ValuePtr start = t.pop();
  ValuePtr base = t.pop();
  t.push(t.item(base, t.sizes().slice_of({start, stop})));
}

void op_store_subscr(Tracer& t, const Instr&) {
  ValuePtr key = t.pop();
  ValuePtr container = t.pop();
  ValuePtr value = t.pop();
  if (t.store_item(container, key, value)) t.frame().discard_result = true;
}

void op_store_slice(Tracer& t, const Instr&) {  // 3.12: container[start:stop] = value
  ValuePtr stop_in = t.pop();
  ValuePtr start_in = t.pop();
  ValuePtr container = t.pop();
  ValuePtr value = t.pop();
  if (container->is_tensor()) {  // as BINARY_SLICE: bounds that are sizes stay graph values
    if (t.store_item(container, t.sizes().slice_of({start_in, stop_in}), value)) t.frame().discard_result = true;
    return;
  }
  ValuePtr stop = t.sizes().concretize(stop_in);
  ValuePtr start = t.sizes().concretize(start_in);
  if (!start->is_const() || !stop->is_const()) {
    FJ_UNSUPPORTED(kUnsupportedValue, "a slice store with bounds {} and {}", start->describe(), stop->describe());
  }
  py::object bounds = py::reinterpret_steal<py::object>(PySlice_New(start->obj.ptr(), stop->obj.ptr(), nullptr));
  if (!bounds) throw py::error_already_set();
  if (t.store_item(container, Value::constant(std::move(bounds)), value)) t.frame().discard_result = true;
}

void op_delete_subscr(Tracer& t, const Instr&) {  // [container, key] -> del container[key]
  ValuePtr key = t.pop();
  ValuePtr container = t.pop();
  t.delete_item(container, key);
}

void op_store_attr(Tracer& t, const Instr& i) {  // [value, owner] -> owner.name = value
  ValuePtr owner = t.pop();
  ValuePtr value = t.pop();
  if (t.store_attr(owner, t.co_name(i.arg), std::move(value))) t.frame().discard_result = true;
}

void op_delete_attr(Tracer& t, const Instr& i) {  // [owner] -> del owner.name
  ValuePtr owner = t.pop();
  if (t.delete_attr(owner, t.co_name(i.arg))) t.frame().discard_result = true;
}

void op_store_global(Tracer& t, const Instr& i) {
  t.store_global(t.co_name(i.arg), t.pop());
}

}  // namespace

void register_attr_ops(HandlerTable& table) {
  auto set = [&](Op op, OpHandler handler) { table[static_cast<size_t>(op)] = handler; };
  set(Op::LOAD_ATTR, op_load_attr);
  set(Op::LOAD_METHOD, op_load_method);
  set(Op::LOAD_SUPER_ATTR, op_load_super_attr);
  set(Op::BINARY_SUBSCR, op_binary_subscr);
  set(Op::BINARY_SLICE, op_binary_slice);
  set(Op::STORE_SUBSCR, op_store_subscr);
  set(Op::STORE_SLICE, op_store_slice);
  set(Op::DELETE_SUBSCR, op_delete_subscr);
  set(Op::STORE_ATTR, op_store_attr);
  set(Op::DELETE_ATTR, op_delete_attr);
  set(Op::STORE_GLOBAL, op_store_global);
}

}  // namespace framejit
