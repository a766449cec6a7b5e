// Methods of lists, tuples and dicts answered at trace time: dict views of known dicts (a
// sourced dict's keys are guarded in order), index/count on constant items, and mutations of
// containers the trace created itself (they are rebuilt at the region's exit, so nothing
// outside the trace sees them change).
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {
namespace {

bool all_constant_items(const ValuePtr& v) {
  for (const ValuePtr& item : v->items) {
    if (!item->is_constant_tree()) return false;
  }
  return true;
}

// Python's index for a constant int argument, against a container of n items (insert/pop).
Py_ssize_t normalised_index(const ValuePtr& arg, Py_ssize_t n, bool clamp) {
  if (!arg->is_const() || !PyLong_CheckExact(arg->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedValue, "list index {} not known at trace time", arg->describe());
  }
  Py_ssize_t i = arg->obj.cast<Py_ssize_t>();
  if (i < 0) i += n;
  if (clamp) return std::max<Py_ssize_t>(0, std::min(i, n));
  if (i < 0 || i >= n) FJ_UNSUPPORTED(kUnsupportedValue, "list index {} out of range", i);
  return i;
}

}  // namespace

ValuePtr Tracer::dict_view(const ValuePtr& self, const std::string& name) {
  std::vector<py::object> keys;
  std::vector<ValuePtr> values;
  if (self->kind == VKind::kDict) {
    keys = self->keys;
    values = self->items;
  } else if (self->kind == VKind::kObject && self->source >= 0 && PyDict_CheckExact(self->obj.ptr())) {
    // The loop or list built from the view depends on every key and their order.
    py::tuple guarded(PyDict_GET_SIZE(self->obj.ptr()));
    Py_ssize_t pos = 0, i = 0;
    PyObject* key;  // Borrowed
    while (PyDict_Next(self->obj.ptr(), &pos, &key, nullptr)) {
      guarded[i++] = py::reinterpret_borrow<py::object>(key);
    }
    entry_.guard_dict_keys(self->source, guarded.ptr());
    for (const py::handle key_obj : guarded) {
      keys.push_back(py::reinterpret_borrow<py::object>(key_obj));
      if (name != "keys") values.push_back(item(self, Value::constant(keys.back())));
    }
  } else if (self->kind == VKind::kObject && self->source >= 0 &&
             PyObject_IsInstance(self->obj.ptr(), PyRefs::get().torch.attr("nn").attr("ModuleDict").ptr()) == 1) {
    std::vector<ValuePtr> names;
    if (!module_children(self, names)) return nullptr;  // guards the children's count
    for (const ValuePtr& child_name : names) {
      keys.push_back(child_name->obj);
      if (name != "keys") values.push_back(item(self, child_name));
    }
  } else {
    return nullptr;
  }
  std::vector<ValuePtr> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (name == "keys") {
      out.push_back(Value::constant(keys[i]));
    } else if (name == "values") {
      out.push_back(values[i]);
    } else {
      out.push_back(Value::tuple({Value::constant(keys[i]), values[i]}));
    }
  }
  return Value::list(std::move(out));
}

ValuePtr Tracer::container_method(const std::string& name, const std::vector<ValuePtr>& args,
                                  const KwValues& kwargs) {
  if (!kwargs.empty() || args.empty()) return nullptr;
  const ValuePtr& self = args[0];
  const size_t n = args.size() - 1;
  if ((name == "keys" || name == "values" || name == "items") && n == 0) {
    const bool sourced_dict = self->kind == VKind::kObject && self->source >= 0 &&
                              PyDict_CheckExact(self->obj.ptr());
    if (self->kind != VKind::kDict && !sourced_dict) return dict_view(self, name);  // ModuleDict
    // A view object, as in Python: used later it shows the dict as it is then. `obj` is an
    // empty view of the same type, for type() and `is`; nothing else reads it.
    ValuePtr view = Value::object(py::dict().attr(name.c_str())());
    view->role = ObjRole::kDictView;
    view->method = name;
    view->over = self;
    if (sourced_dict) view->items = {dict_view(self, name)};
    return view;
  }
  if (self->is_sequence() && (name == "index" || name == "count") && n == 1 &&
      args[1]->is_constant_tree() && all_constant_items(self)) {
    return Value::constant(self->as_python().attr(name.c_str())(args[1]->as_python()));
  }
  // Containers built by the trace: their final state is what the exit rebuilds.
  if (self->source >= 0) return nullptr;
  if (self->kind == VKind::kList) {
    auto& items = self->items;
    const auto size = static_cast<Py_ssize_t>(items.size());
    if (name == "pop" && n <= 1) {
      if (items.empty()) FJ_UNSUPPORTED(kUnsupportedValue, "pop from an empty list");
      const Py_ssize_t i = n == 0 ? size - 1 : normalised_index(args[1], size, false);
      ValuePtr out = items[i];
      items.erase(items.begin() + i);
      return out;
    }
    if (name == "insert" && n == 2) {
      items.insert(items.begin() + normalised_index(args[1], size, true), args[2]);
      return Value::constant(py::none());
    }
    if (name == "reverse" && n == 0) {
      std::reverse(items.begin(), items.end());
      return Value::constant(py::none());
    }
    if (name == "clear" && n == 0) {
      items.clear();
      return Value::constant(py::none());
    }
    if (name == "copy" && n == 0) return Value::list(items);
  }
  if (self->kind == VKind::kDict) {
    auto find = [&](const py::object& key) -> long {
      for (size_t i = 0; i < self->keys.size(); ++i) {
        if (self->keys[i].equal(key)) return static_cast<long>(i);
      }
      return -1;
    };
    auto resized = [&]() {
      if (self->iterated) {
        FJ_UNSUPPORTED(kSideEffect, "a dict changes size while a loop iterates it");
      }
    };
    auto set = [&](const py::object& key, const ValuePtr& value) {
      const long at = find(key);
      if (at >= 0) {
        self->items[at] = value;
      } else {
        resized();
        self->keys.push_back(key);
        self->items.push_back(value);
      }
    };
    if (name == "update" && n == 1 && args[1]->kind == VKind::kDict) {
      for (size_t i = 0; i < args[1]->keys.size(); ++i) set(args[1]->keys[i], args[1]->items[i]);
      return Value::constant(py::none());
    }
    if ((name == "pop" || name == "setdefault") && (n == 1 || n == 2) &&
        args[1]->is_constant_tree()) {
      const py::object key = args[1]->as_python();
      const long at = find(key);
      if (name == "setdefault") {
        if (at >= 0) return self->items[at];
        ValuePtr value = n == 2 ? args[2] : Value::constant(py::none());
        set(key, value);
        return value;
      }
      if (at < 0) {
        if (n == 2) return args[2];
        FJ_UNSUPPORTED(kUnsupportedValue, "dict.pop of a missing key raises KeyError");
      }
      resized();
      ValuePtr out = self->items[at];
      self->keys.erase(self->keys.begin() + at);
      self->items.erase(self->items.begin() + at);
      return out;
    }
    if (name == "copy" && n == 0) {
      ValuePtr out = Value::dict(self->keys, self->items);
      return out;
    }
  }
  return nullptr;
}

}  // namespace framejit
