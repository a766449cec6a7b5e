// Instances of plain user classes made by the traced code (`Point(x, y)`, dataclasses): values
// whose attributes live in the trace until a region exit builds the real object.
#include <algorithm>
#include <set>

#include "trace/entry_state.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

ValuePtr Tracer::blank_object(const ValuePtr& fn, py::handle cls) {
  auto self = std::make_shared<Value>();
  self->kind = VKind::kObject;
  self->obj = py::reinterpret_borrow<py::object>(cls);
  self->role = ObjRole::kNewObject;
  if (!PyRefs::get().support.attr("mapping_base")(cls).is_none()) self->mapping = Value::dict({}, {});
  if (fn && fn->source >= 0 && PyType_Check(fn->obj.ptr())) {
    // Methods are read from the class when the trace runs: guarded to stay those objects.
    self->origin = fn;
  }
  return self;
}

void Tracer::new_object(const ValuePtr& fn, py::handle cls, py::handle init,
                        std::vector<ValuePtr> args, KwValues kwargs) {
  ValuePtr self = blank_object(fn, cls);
  if (self->origin) guard_class_attribute(fn, "__init__", true, /*same_object=*/true);
  if (!PyFunction_Check(init.ptr())) {  // object.__init__: no arguments, nothing to run
    if (!args.empty() || !kwargs.empty()) {
      FJ_UNSUPPORTED(kUnsupportedCall, "{}() takes no arguments", py::str(cls.attr("__name__")).cast<std::string>());
    }
    push(self);
    return;
  }
  args.insert(args.begin(), self);
  inline_call(Value::object(py::reinterpret_borrow<py::object>(init)), init, std::move(args),
              std::move(kwargs));
  frame().constructed = self;  // the inlined __init__'s frame: its call results in self
}

ValuePtr class_data(py::object value) {
  if (PyDict_CheckExact(value.ptr()) && PyDict_Size(value.ptr()) <= 256) {
    std::vector<py::object> keys;
    std::vector<ValuePtr> items;
    for (auto [key, item] : py::cast<py::dict>(value)) {
      keys.push_back(py::reinterpret_borrow<py::object>(key));
      items.push_back(class_data(py::reinterpret_borrow<py::object>(item)));
    }
    ValuePtr copy = Value::dict(std::move(keys), std::move(items));
    copy->frozen = true;
    return copy;
  }
  if ((PyList_CheckExact(value.ptr()) || PyTuple_CheckExact(value.ptr())) && PyObject_Size(value.ptr()) <= 256) {
    // A list of validators, a tuple of names: items to read and iterate, never to change.
    std::vector<ValuePtr> items;
    for (py::handle item : value) items.push_back(class_data(py::reinterpret_borrow<py::object>(item)));
    if (PyTuple_CheckExact(value.ptr())) return Value::tuple(std::move(items));
    ValuePtr copy = Value::list(std::move(items));
    copy->frozen = true;
    return copy;
  }
  ValuePtr out = wrap_unsourced(std::move(value));
  // (a function too: the contents of its closure cells are class data as well)
  if (out->is(ObjRole::kPlain) && (!is_identity_object(out->obj.ptr()) || PyFunction_Check(out->obj.ptr()))) {
    out->frozen = true;
  }
  return out;
}

namespace {

// An instance of this class made in the trace has no __dict__ (its classes declare __slots__).
bool slots_only(const ValuePtr& self) {
  return reinterpret_cast<PyTypeObject*>(self->obj.ptr())->tp_dictoffset == 0;
}

}  // namespace

ValuePtr Tracer::new_object_read(const ValuePtr& self, const std::string& name, AttrLookup how) {
  static PyObject* const kGetattribute = PyUnicode_InternFromString("__getattribute__");
  PyObject* hook = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(self->obj.ptr()), kGetattribute);  // Borrowed
  if (how == AttrLookup::kGeneric || hook == nullptr || !PyFunction_Check(hook)) {
    return new_object_attr(self, name);
  }
  // Its class's own __getattribute__ (a transformers config copied in the trace): Python calls
  // it for every read, and so does the trace (as for an object read by source).
  if (how != AttrLookup::kInlinable) {
    FJ_UNSUPPORTED(kUnsupportedValue, "attribute '{}' of {}, read through its class's "
                   "__getattribute__, here", name, self->describe());
  }
  if (self->origin) guard_class_attribute(self->origin, "__getattribute__", true, /*same_object=*/true);
  ValuePtr read = Value::object(py::reinterpret_borrow<py::object>(hook));
  read->role = ObjRole::kAttrHook;
  read->bound_self = self;
  read->method = name;
  return read;
}

bool Tracer::new_object_has(const ValuePtr& self, const std::string& name) {
  for (const py::object& key : self->keys) {
    if (key.cast<std::string>() == name) return true;
  }
  if (name == "__class__" || (name == "__dict__" && !slots_only(self))) return true;
  py::tuple how = PyRefs::get().support.attr("resolve_new_object_attribute")(self->obj, name);
  if (how[0].cast<AttrKind>() == AttrKind::kMissing) {
    // Absent, unless a descriptor other than a property would make it (not traced).
    if (!PyRefs::get().support.attr("class_lacks")(self->obj, name).cast<bool>()) {
      FJ_UNSUPPORTED(kUnsupportedValue, "hasattr of '{}' on {} (a descriptor of its class decides it)",
                     name, self->describe());
    }
    return false;
  }
  if (self->origin) guard_class_attribute(self->origin, name, true, /*same_object=*/true);
  return true;
}

void Tracer::new_object_delete(const ValuePtr& self, const std::string& name) {
  for (size_t i = 0; i < self->keys.size(); ++i) {
    if (self->keys[i].cast<std::string>() == name) {
      self->keys.erase(self->keys.begin() + static_cast<long>(i));
      self->items.erase(self->items.begin() + static_cast<long>(i));
      return;
    }
  }
  // Python raises AttributeError (or a class's descriptor deletes): the runtime does.
  FJ_UNSUPPORTED(kUnsupportedValue, "del of the attribute '{}' that {} lacks", name, self->describe());
}

ValuePtr Tracer::new_object_attr(const ValuePtr& self, const std::string& name) {
  for (size_t i = 0; i < self->keys.size(); ++i) {
    if (self->keys[i].cast<std::string>() == name) return self->items[i];
  }
  if (name == "__class__") return self->origin ? self->origin : Value::object(self->obj);
  if (name == "__dict__" && slots_only(self)) {
    FJ_PROGRAM_RAISED(kUnsupportedValue, "__dict__ of an instance of a __slots__ class");
  }
  if (name == "__dict__") {
    // A copy of its attributes so far, to read (`self.__dict__.get(name)`); a write into it
    // ends the region (make_writable).
    ValuePtr copy = Value::dict(self->keys, self->items);
    copy->frozen = true;
    copy->dict_of = self;  // (where it leaves the region: the rebuilt object's own __dict__)
    return copy;
  }
  py::tuple how = PyRefs::get().support.attr("resolve_new_object_attribute")(self->obj, name);
  const auto kind = how[0].cast<AttrKind>();
  if (kind == AttrKind::kMissing) {
    FJ_UNSUPPORTED(kUnsupportedValue, "{} object has no attribute '{}' the trace can read",
                   py::str(self->obj.attr("__name__")).cast<std::string>(), name);
  }
  if (kind == AttrKind::kClassValue) {
    // A class attribute read as it is now (like methods of user classes, not guarded). A dict
    // (a dataclass's __dataclass_fields__): a copy to read, that no write may change.
    return class_data(py::reinterpret_borrow<py::object>(how[1]));
  }
  if (self->origin) guard_class_attribute(self->origin, name, true, /*same_object=*/true);
  return bind_class_attribute(kind, how[1], self, self->origin, name);
}

void Tracer::new_object_store(const ValuePtr& self, const std::string& name, ValuePtr value) {
  py::tuple how = PyRefs::get().support.attr("resolve_new_object_attribute")(self->obj, name);
  const auto kind = how[0].cast<AttrKind>();
  if (kind == AttrKind::kProperty) {
    FJ_UNSUPPORTED(kSideEffect, "assignment to .{}, a property of the class", name);
  }
  if (slots_only(self)) {
    py::object names = PyRefs::get().support.attr("slot_names")(self->obj);
    if (!PySequence_Contains(names.ptr(), py::str(name).ptr())) {
      // Python raises AttributeError: no slot and no __dict__ to hold it.
      FJ_PROGRAM_RAISED(kUnsupportedValue, "assignment to .{} of a __slots__ class without that slot", name);
    }
  }
  for (size_t i = 0; i < self->keys.size(); ++i) {
    if (self->keys[i].cast<std::string>() == name) {
      self->items[i] = std::move(value);
      return;
    }
  }
  self->keys.push_back(py::str(name));
  self->items.push_back(std::move(value));
}

ValuePtr Tracer::new_object_method(const std::string& name, std::vector<ValuePtr>& args,
                                   const KwValues& kwargs) {
  const ValuePtr self = args.at(0);
  if (name == "__delattr__" && args.size() == 2 && kwargs.empty()) {
    // object.__delattr__(self, name): deleted, past the class's own __delattr__.
    const ValuePtr attribute = sizes_.concretize(args[1]);
    if (!attribute->is_const() || !PyUnicode_CheckExact(attribute->obj.ptr())) {
      FJ_UNSUPPORTED(kUnsupportedCall, "object.__delattr__ with a name not known at trace time");
    }
    new_object_delete(self, attribute->obj.cast<std::string>());
    return Value::constant(py::none());
  }
  if (name == "__setattr__" && args.size() == 3 && kwargs.empty()) {
    // object.__setattr__(self, name, value): stored, past the class's own __setattr__.
    const ValuePtr attribute = sizes_.concretize(args[1]);
    if (!attribute->is_const() || !PyUnicode_CheckExact(attribute->obj.ptr())) {
      FJ_UNSUPPORTED(kUnsupportedCall, "object.__setattr__ with a name not known at trace time");
    }
    new_object_store(self, attribute->obj.cast<std::string>(), args[2]);
    return Value::constant(py::none());
  }
  if (!self->mapping) {
    FJ_UNSUPPORTED(kUnsupportedCall, "method {} of {} is not traced yet", name, self->describe());
  }
  // The dict's own methods, on its items (past any override in the class: super() or a method
  // the class does not define).
  std::vector<ValuePtr> on_items = args;
  on_items[0] = self->mapping;
  if (kwargs.empty() && name == "__setitem__" && args.size() == 3) {
    store_item(self->mapping, args[1], args[2]);
    return Value::constant(py::none());
  }
  if (kwargs.empty() && name == "__getitem__" && args.size() == 2) return item(self->mapping, args[1]);
  if (kwargs.empty() && name == "__len__" && args.size() == 1) {
    return Value::constant(py::int_(self->mapping->items.size()));
  }
  if (kwargs.empty() && name == "__contains__" && args.size() == 2 && args[1]->is_constant_tree()) {
    return Value::constant(py::bool_(self->mapping->find_key(args[1]->as_python()) >= 0));
  }
  if (kwargs.empty() && name == "get" && (args.size() == 2 || args.size() == 3) &&
      args[1]->is_constant_tree()) {
    const long at = self->mapping->find_key(args[1]->as_python());
    if (at >= 0) return self->mapping->items[at];
    return args.size() == 3 ? args[2] : Value::constant(py::none());
  }
  if (kwargs.empty() && name == "__iter__" && args.size() == 1) return Value::iter_over(self->mapping);
  if (name == "__init__") {  // dict.__init__(self, ...) (a subclass's super().__init__()): update
    if (args.size() == 1 && kwargs.empty()) return Value::constant(py::none());
    if (!container_method("update", on_items, kwargs)) {
      FJ_UNSUPPORTED(kUnsupportedCall, "dict.__init__ of {} with these arguments", self->describe());
    }
    return Value::constant(py::none());
  }
  if (ValuePtr out = container_method(name, on_items, kwargs)) return out;
  FJ_UNSUPPORTED(kUnsupportedCall, "method {} of {} is not traced yet", name, self->describe());
}

ValuePtr Tracer::partial_call(const ValuePtr& fn, py::handle callable, std::vector<ValuePtr>& args,
                              KwValues& kwargs) {
  PyObject* partial_type = PyRefs::get().partial_type.ptr();  // Borrowed: functools.partial
  if (!fn->is(ObjRole::kPartial) && callable.ptr() == partial_type) {
    if (args.empty()) FJ_UNSUPPORTED(kUnsupportedCall, "functools.partial() without a function");
    bool fixed = true;
    // (an object read by source whose attributes the call reads, a module: kept as the
    // trace's value, so those reads stay guarded reads by source)
    for (const ValuePtr& a : args) {
      fixed = fixed && (a->is_constant_tree() ||
                        (a->is(ObjRole::kPlain) && !a->bound_self &&
                         (a->source < 0 || is_identity_object(a->obj.ptr()))));
    }
    for (const auto& kw : kwargs) fixed = fixed && kw.second->is_constant_tree();
    if (fixed) {  // partial(f, *args, **kw) of values fixed at trace time: the real object
      py::list py_args;
      for (const ValuePtr& a : args) py_args.append(a->is_constant_tree() ? a->as_python() : a->obj);
      py::dict py_kwargs;
      for (const auto& [key, value] : kwargs) py_kwargs[py::str(key)] = value->as_python();
      return Value::object(py::reinterpret_borrow<py::object>(partial_type)(*py::tuple(py_args), **py_kwargs));
    }
    // Of values made in the trace (`partial(torch.mul, w * 2)`): a partial of the trace. One of
    // a partial of the trace is flattened into it, as functools.partial flattens.
    ValuePtr func = args[0];
    std::vector<ValuePtr> stored(args.begin() + 1, args.end());
    std::vector<ValuePtr> pairs;
    if (func->is(ObjRole::kPartial)) {
      stored.insert(stored.begin(), func->items[1]->items.begin(), func->items[1]->items.end());
      pairs = func->items[2]->items;
      func = func->items[0];
    }
    for (const auto& [key, value] : kwargs) {
      auto same = [&](const ValuePtr& pair) { return py::str(pair->items[0]->obj).cast<std::string>() == key; };
      pairs.erase(std::remove_if(pairs.begin(), pairs.end(), same), pairs.end());
      pairs.push_back(Value::tuple({Value::constant(py::str(key)), value}));
    }
    auto made = Value::object(py::reinterpret_borrow<py::object>(partial_type));
    made->role = ObjRole::kPartial;
    made->items = {func, Value::tuple(std::move(stored)), Value::list(std::move(pairs))};
    return made;
  }
  if (!fn->is(ObjRole::kPartial) &&
      !PyObject_TypeCheck(callable.ptr(), reinterpret_cast<PyTypeObject*>(partial_type))) {
    return nullptr;
  }
  // Calling a partial: read its parts through its source (guarded), as they are for one made
  // in this trace from fixed values, or from a partial of the trace.
  ValuePtr func, stored_args, stored_kw;
  if (fn->is(ObjRole::kPartial)) {
    func = fn->items[0];
    stored_args = fn->items[1];
    stored_kw = fn->items[2];
  } else if (fn->source >= 0) {
    func = entry_.load(entry_.sources().attr(fn->source, "func"));
    stored_args = entry_.load(entry_.sources().attr(fn->source, "args"));
    stored_kw = entry_.load(entry_.sources().attr(fn->source, "keywords"));
    stored_kw = dict_view(stored_kw, "items");
  } else {
    func = wrap_unsourced(callable.attr("func"));
    std::vector<ValuePtr> items;
    for (py::handle a : callable.attr("args")) items.push_back(wrap_unsourced(py::reinterpret_borrow<py::object>(a)));
    stored_args = Value::tuple(std::move(items));
    std::vector<ValuePtr> pairs;
    for (auto kv : py::reinterpret_borrow<py::dict>(callable.attr("keywords"))) {
      pairs.push_back(Value::tuple({Value::constant(py::reinterpret_borrow<py::object>(kv.first)),
                                    wrap_unsourced(py::reinterpret_borrow<py::object>(kv.second))}));
    }
    stored_kw = Value::list(std::move(pairs));
  }
  if (!func || !stored_args || !stored_kw || !stored_args->is_sequence()) {
    FJ_UNSUPPORTED(kUnsupportedValue, "functools.partial whose parts cannot be read");
  }
  std::vector<ValuePtr> all_args = stored_args->items;
  all_args.insert(all_args.end(), args.begin(), args.end());
  KwValues all_kwargs;
  for (const ValuePtr& pair : stored_kw->items) {
    all_kwargs.emplace_back(py::str(pair->items[0]->obj).cast<std::string>(), pair->items[1]);
  }
  for (auto& kw : kwargs) {  // call-site keywords override the stored ones
    auto same = [&](const auto& have) { return have.first == kw.first; };
    all_kwargs.erase(std::remove_if(all_kwargs.begin(), all_kwargs.end(), same), all_kwargs.end());
    all_kwargs.push_back(kw);
  }
  ValuePtr out = call(func, std::move(all_args), std::move(all_kwargs));
  return out ? out : Value::null();
}

ValuePtr Tracer::made_set(py::object set) {
  made_sets_.push_back(set);
  return Value::constant(std::move(set));
}

namespace {

// The Python items of a set's argument: a constant iterable, or a tuple / list of the trace
// whose items are constants (sizes pinned); false for anything else.
bool constant_items(SizeTracker& sizes, const ValuePtr& value, py::list& out) {
  if (value->is_sequence()) {
    for (const ValuePtr& item_in : value->items) {
      const ValuePtr item = sizes.concretize(item_in);
      if (!item->is_constant_tree()) return false;
      out.append(item->as_python());
    }
    return true;
  }
  if (!value->is_const()) return false;
  PyObject* obj = value->obj.ptr();
  if (!(PyTuple_CheckExact(obj) || PyList_CheckExact(obj) || PyAnySet_CheckExact(obj) ||
        PyUnicode_CheckExact(obj) || PyDict_CheckExact(obj) || Py_TYPE(obj) == &PyRange_Type ||
        (Py_TYPE(obj) == &PyDictProxy_Type && value->source < 0))) {  // signature.parameters
    return false;
  }
  for (py::handle item : value->obj) out.append(item);
  return true;
}

}  // namespace

ValuePtr Tracer::set_call(py::handle callable, const std::vector<ValuePtr>& args,
                          const KwValues& kwargs) {
  PyObject* type = callable.ptr();
  if ((type != reinterpret_cast<PyObject*>(&PySet_Type) &&
       type != reinterpret_cast<PyObject*>(&PyFrozenSet_Type)) ||
      !kwargs.empty() || args.size() > 1) {
    return nullptr;
  }
  py::list items;
  if (!args.empty() && !constant_items(sizes_, args[0], items)) {
    FJ_UNSUPPORTED(kUnsupportedValue, "a set of {}", args[0]->describe());
  }
  py::object made = py::reinterpret_steal<py::object>(PyObject_CallOneArg(type, items.ptr()));
  if (!made) {
    PyErr_Clear();  // unhashable items: Python raises TypeError here
    FJ_UNSUPPORTED(kUnsupportedValue, "a set of items that cannot be hashed");
  }
  return type == reinterpret_cast<PyObject*>(&PySet_Type) ? made_set(std::move(made))
                                                          : Value::constant(std::move(made));
}

ValuePtr Tracer::set_method(const ValuePtr& self, const std::string& name,
                            const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  if (!self->is_const() || !PyAnySet_CheckExact(self->obj.ptr()) || !kwargs.empty()) return nullptr;
  static const std::set<std::string> kChanging = {
      "add", "update", "discard", "remove", "clear", "difference_update",
      "intersection_update", "symmetric_difference_update"};
  static const std::set<std::string> kReading = {
      "union", "intersection", "difference", "symmetric_difference", "issubset", "issuperset",
      "isdisjoint", "copy"};
  const bool changing = kChanging.count(name) > 0;
  if (!changing && !kReading.count(name)) return nullptr;
  if (changing) {  // only a set the trace made is its own to change
    auto own = [&](const py::object& set) { return set.ptr() == self->obj.ptr(); };
    if (std::none_of(made_sets_.begin(), made_sets_.end(), own)) return nullptr;
  }
  py::list py_args;
  for (size_t i = 1; i < args.size(); ++i) {
    const ValuePtr arg = sizes_.concretize(args[i]);
    if (name == "add" || name == "discard" || name == "remove") {
      if (!arg->is_constant_tree()) FJ_UNSUPPORTED(kUnsupportedValue, "a set of {}", arg->describe());
      py_args.append(arg->as_python());
      continue;
    }
    py::list items;
    if (!constant_items(sizes_, arg, items)) {
      FJ_UNSUPPORTED(kUnsupportedValue, "set.{} with {}", name, arg->describe());
    }
    py_args.append(items);
  }
  py::object result;
  try {
    result = self->obj.attr(name.c_str())(*py::tuple(py_args));
  } catch (const py::error_already_set& e) {  // s.remove(missing), unhashable items
    FJ_PROGRAM_RAISED(kUnsupportedValue, "set.{} raised: {}", name, e.what());
  }
  if (PySet_CheckExact(result.ptr())) return made_set(std::move(result));
  return Value::constant(std::move(result));
}

ValuePtr Tracer::partial_attr(const ValuePtr& partial, const std::string& name) {
  if (name == "func") return partial->items[0];
  if (name == "args") return partial->items[1];
  if (name == "keywords") {
    std::vector<py::object> keys;
    std::vector<ValuePtr> values;
    for (const ValuePtr& pair : partial->items[2]->items) {
      keys.push_back(pair->items[0]->obj);
      values.push_back(pair->items[1]);
    }
    return Value::dict(std::move(keys), std::move(values));
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "attribute '{}' of a functools.partial made in the trace", name);
}

}  // namespace framejit
