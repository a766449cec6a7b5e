// Instances of plain user classes made by the traced code (`Point(x, y)`, dataclasses): values
// whose attributes live in the trace until a region exit builds the real object.
#include <algorithm>

#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

void Tracer::new_object(const ValuePtr& fn, py::handle cls, py::handle init,
                        std::vector<ValuePtr> args, KwValues kwargs) {
  auto self = std::make_shared<Value>();
  self->kind = VKind::kObject;
  self->obj = py::reinterpret_borrow<py::object>(cls);
  self->role = ObjRole::kNewObject;
  if (fn->source >= 0 && PyType_Check(fn->obj.ptr())) {
    // Methods are read from the class when the trace runs: guarded to stay those objects.
    self->origin = fn;
    guard_class_attribute(fn, "__init__", true, /*same_object=*/true);
  }
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

ValuePtr Tracer::new_object_attr(const ValuePtr& self, const std::string& name) {
  for (size_t i = 0; i < self->keys.size(); ++i) {
    if (self->keys[i].cast<std::string>() == name) return self->items[i];
  }
  if (name == "__class__") return Value::object(self->obj);
  py::tuple how = PyRefs::get().support.attr("resolve_new_object_attribute")(self->obj, name);
  const auto kind = how[0].cast<AttrKind>();
  if (kind == AttrKind::kMissing) {
    FJ_UNSUPPORTED(kUnsupportedValue, "{} object has no attribute '{}' the trace can read",
                   py::str(self->obj.attr("__name__")).cast<std::string>(), name);
  }
  if (kind == AttrKind::kClassValue) {
    // A class attribute read as it is now (like methods of user classes, not guarded).
    return wrap_unsourced(py::reinterpret_borrow<py::object>(how[1]));
  }
  if (self->origin) guard_class_attribute(self->origin, name, true, /*same_object=*/true);
  return bind_class_attribute(kind, how[1], self);
}

void Tracer::new_object_store(const ValuePtr& self, const std::string& name, ValuePtr value) {
  py::tuple how = PyRefs::get().support.attr("resolve_new_object_attribute")(self->obj, name);
  const auto kind = how[0].cast<AttrKind>();
  if (kind == AttrKind::kProperty) {
    FJ_UNSUPPORTED(kSideEffect, "assignment to .{}, a property of the class", name);
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

ValuePtr Tracer::partial_call(const ValuePtr& fn, py::handle callable, std::vector<ValuePtr>& args,
                              KwValues& kwargs) {
  PyObject* partial_type = PyRefs::get().partial_type.ptr();  // Borrowed: functools.partial
  if (callable.ptr() == partial_type) {
    // partial(f, *args, **kw) of values fixed at trace time: the real object, used by reference.
    bool fixed = !args.empty();
    for (const ValuePtr& a : args) fixed = fixed && (a->is_constant_tree() || (a->is(ObjRole::kPlain) && !a->bound_self));
    for (const auto& kw : kwargs) fixed = fixed && kw.second->is_constant_tree();
    if (!fixed) FJ_UNSUPPORTED(kUnsupportedCall, "functools.partial of values made in the trace");
    py::list py_args;
    for (const ValuePtr& a : args) py_args.append(a->is_constant_tree() ? a->as_python() : a->obj);
    py::dict py_kwargs;
    for (const auto& [key, value] : kwargs) py_kwargs[py::str(key)] = value->as_python();
    return Value::object(py::reinterpret_borrow<py::object>(partial_type)(*py::tuple(py_args), **py_kwargs));
  }
  if (!PyObject_TypeCheck(callable.ptr(), reinterpret_cast<PyTypeObject*>(partial_type))) return nullptr;
  // Calling a partial: read its parts through its source (guarded), or as they are for one made
  // in this trace from fixed values.
  ValuePtr func, stored_args, stored_kw;
  if (fn->source >= 0) {
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

}  // namespace framejit
