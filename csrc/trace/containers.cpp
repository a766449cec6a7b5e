// Methods of lists, tuples and dicts answered at trace time: dict views of known dicts (a
// sourced dict's keys are guarded in order), index/count on constant items, and mutations: of
// containers the trace made (rebuilt at the region's exit), and of lists and dicts that existed
// before it (make_writable: their contents are written back at the exit).
#include <algorithm>

#include "trace/pyrefs.h"
#include "trace/python_rules.h"
#include "trace/tracer.h"

namespace framejit {
namespace {

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

// Whether `item == needle` as list.index / count / remove ask it (identity first, as
// PyObject_RichCompareBool does): 1 equal, 0 not, -1 unknown at trace time (a tensor compared
// with anything but itself needs its data).
int same_item(const ValuePtr& item, const ValuePtr& needle) {
  if (item == needle) return 1;
  if (item->is_constant_tree() && needle->is_constant_tree()) {
    const py::object a = item->as_python();
    const py::object b = needle->as_python();
    if (a.ptr() == b.ptr()) return 1;
    const int equal = PyObject_RichCompareBool(a.ptr(), b.ptr(), Py_EQ);
    if (equal < 0) throw py::error_already_set();
    return equal;
  }
  return -1;
}

// Where `needle` is among a list's or tuple's items as list.index / remove find it (same_item,
// first to last), -1 if nowhere; with `count` set, how many items equal it. An item the trace
// cannot compare with it ends the region (`what` names the call).
int64_t find_item(const Value& seq, const ValuePtr& needle, const std::string& what,
                  int64_t* count = nullptr) {
  int64_t found = -1;
  for (size_t i = 0; i < seq.items.size() && (count != nullptr || found < 0); ++i) {
    const int same = same_item(seq.items[i], needle);
    if (same < 0) {
      FJ_UNSUPPORTED(kDataDependent, "{} compares {} with {}", what, seq.items[i]->describe(),
                     needle->describe());
    }
    if (same == 1 && found < 0) found = static_cast<int64_t>(i);
    if (count != nullptr) *count += same;
  }
  return found;
}

bool is_mutating_method(const std::string& name) {
  for (const char* m : {"append", "extend", "insert", "pop", "reverse", "clear", "update",
                        "setdefault", "remove", "popitem", "move_to_end"}) {
    if (name == m) return true;
  }
  return false;
}

}  // namespace

void Tracer::make_writable(const ValuePtr& container) {
  if (container->frozen) {
    FJ_UNSUPPORTED(kSideEffect, "a write into {}, a copy the trace reads (of class data, or of "
                   "the __dict__ of an object it made)", container->describe());
  }
  if (container->source < 0 || container->adopted) return;
  const bool list = container->kind == VKind::kList;
  // (a defaultdict too: its missing keys then made by the trace, Tracer::missing_key)
  const bool dict = container->is(ObjRole::kPlain) && !container->bound_self &&
                    (PyDict_CheckExact(container->obj.ptr()) ||
                     py::type::handle_of(container->obj).is(PyRefs::get().defaultdict_type));
  if (!list && !dict) {
    FJ_UNSUPPORTED(kSideEffect, "in-place change of {}, which existed before this region",
                   container->describe());
  }
  if (dict) {
    // An object's namespace (obj.__dict__, vars(obj)) is written through attributes too, and
    // those writes are replayed at the exit in their own order: left to Python.
    const Source& read = entry_.sources().at(container->source);
    bool namespace_dict = read.kind == SourceKind::kAttr && py::str(read.key).cast<std::string>() == "__dict__";
    for (const PendingWrite& write : effects_.writes()) {
      PyObject* target = write.target->obj.ptr();
      if (target == nullptr || PyType_Check(target)) continue;
      if (PyModule_Check(target)) {
        namespace_dict = namespace_dict || PyModule_GetDict(target) == container->obj.ptr();
      } else if (Py_TYPE(target)->tp_dictoffset != 0) {
        PyObject* own = PyObject_GenericGetDict(target, nullptr);  // New
        if (own == nullptr) PyErr_Clear();
        namespace_dict = namespace_dict || own == container->obj.ptr();
        Py_XDECREF(own);
      }
    }
    if (namespace_dict) {
      FJ_UNSUPPORTED(kSideEffect, "an item store into the attribute dict of {}", container->describe());
    }
  }
  entry_.note_changed(container->source);
  if (dict) {
    std::vector<std::pair<py::object, ValuePtr>> entries;
    if (!dict_by_source(container, entries)) {
      FJ_UNSUPPORTED(kSideEffect, "in-place change of {}, whose keys a guard cannot compare",
                     container->describe());
    }
    container->kind = VKind::kDict;
    if (!PyDict_CheckExact(container->obj.ptr())) {
      container->pytype = PyRefs::get().defaultdict_type;
      container->factory = entry_.load(entry_.sources().attr(container->source, "default_factory"));
      FJ_CHECK(container->factory != nullptr, "default_factory of {} unreadable", container->describe());
    }
    for (auto& [key, value] : entries) {
      container->keys.push_back(key);
      container->items.push_back(std::move(value));
    }
  }
  container->adopted = true;
  effects_.adopt(container);
}

namespace {

// keys() / values() / items() of these entries, as a list value.
ValuePtr view_list(const std::string& name, const std::vector<py::object>& keys,
                   const std::vector<ValuePtr>& values) {
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

}  // namespace

bool Tracer::reads_as_dict(const ValuePtr& value, const char* name) {
  if (value->kind != VKind::kObject || value->source < 0 || !value->is(ObjRole::kPlain) ||
      value->bound_self) {
    return false;
  }
  PyObject* obj = value->obj.ptr();
  if (is_plain_dict(obj)) return true;
  if (!PyDict_Check(obj)) return false;
  py::str key(name);
  PyTypeObject* base = PyODict_Check(obj) ? &PyODict_Type : &PyDict_Type;
  PyObject* found = _PyType_Lookup(Py_TYPE(obj), key.ptr());  // Borrowed
  if (found == nullptr || found != _PyType_Lookup(base, key.ptr())) return false;
  guard_class_attribute(value, name, true, /*same_object=*/true);
  return true;
}

ValuePtr Tracer::stored_item(const ValuePtr& dict, const py::object& key) {
  ValuePtr value = entry_.load(entry_.sources().item(dict->source, key));
  FJ_CHECK(value != nullptr, "item {} of {} unreadable", safe_repr(key), dict->describe());
  return value;
}

ValuePtr Tracer::stored_view(const ValuePtr& self, const std::string& name) {
  check_items_unchanged(self);
  // The loop or list built from the view depends on every key and their order: the view's
  // own (an OrderedDict's), past any __iter__ or keys() of a subclass.
  py::object base = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
      PyODict_Check(self->obj.ptr()) ? &PyODict_Type : &PyDict_Type));
  py::tuple guarded(py::list(base.attr("keys")(self->obj)));
  entry_.guard_dict_keys(self->source, guarded.ptr());
  std::vector<py::object> keys;
  std::vector<ValuePtr> values;
  for (const py::handle key_obj : guarded) {
    keys.push_back(py::reinterpret_borrow<py::object>(key_obj));
    // (its own items, also where the class's __getitem__ answers otherwise: ModelOutput's)
    if (name != "keys") values.push_back(stored_item(self, keys.back()));
  }
  return view_list(name, keys, values);
}

ValuePtr Tracer::dict_view(const ValuePtr& self, const std::string& name) {
  std::vector<py::object> keys;
  std::vector<ValuePtr> values;
  if (self->kind == VKind::kDict) {
    keys = self->keys;
    values = self->items;
  } else if (reads_as_dict(self, name.c_str())) {
    return stored_view(self, name);
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
  return view_list(name, keys, values);
}

ValuePtr Tracer::container_method(const std::string& name, const std::vector<ValuePtr>& args,
                                  const KwValues& kwargs) {
  if (args.empty()) return nullptr;
  const ValuePtr& self = args[0];
  const size_t n = args.size() - 1;
  if (self->is_deque()) {
    if (!kwargs.empty()) return nullptr;
    if (ValuePtr out = deque_method(name, args)) return out;
    // index, count, remove, insert, reverse, clear: as a list's (below); no other list method
    // is a deque's.
    if (name != "index" && name != "count" && name != "remove" && name != "insert" && name != "reverse" &&
        name != "clear") {
      return nullptr;
    }
  }
  if (self->kind == VKind::kDict && self->dict_of && name == "pop" && kwargs.empty() &&
      (n == 1 || n == 2) && args[1]->is_const() && PyUnicode_CheckExact(args[1]->obj.ptr())) {
    // obj.__dict__.pop(name[, default]) of an object the trace made (transformers' per-layer
    // config views): the attribute goes from the object itself, as from its real __dict__.
    const std::string attribute = args[1]->obj.cast<std::string>();
    const ValuePtr& owner = self->dict_of;
    long held = -1;  // (its own attributes, as they are now: not its class's)
    for (size_t i = 0; i < owner->keys.size(); ++i) {
      if (owner->keys[i].cast<std::string>() == attribute) held = static_cast<long>(i);
    }
    if (held < 0) {
      if (n == 2) return args[2];
      FJ_PROGRAM_RAISED(kUnsupportedValue, "__dict__.pop() of the missing key '{}'", attribute);
    }
    ValuePtr out = owner->items[held];
    new_object_delete(owner, attribute);
    const long at = self->find_key(args[1]->obj);
    if (at >= 0) {
      self->keys.erase(self->keys.begin() + at);
      self->items.erase(self->items.begin() + at);
    }
    return out;
  }
  // Any other change of a frozen copy (an object's __dict__, class data) ends the region.
  if (self->frozen && is_mutating_method(name)) make_writable(self);
  if (name == "update" && n <= 1 &&
      (self->kind == VKind::kDict || (self->is(ObjRole::kPlain) && self->source >= 0 &&
                                      PyDict_CheckExact(self->obj.ptr())))) {
    // d.update(other, **kw): the other dict's entries (a dict of the trace, or one read by
    // source, keys guarded), then the keywords.
    std::vector<std::pair<py::object, ValuePtr>> entries;
    if (n == 1 && !mapping_entries(args[1], entries)) return nullptr;
    for (const auto& [key, value] : kwargs) entries.emplace_back(py::str(key), value);
    make_writable(self);
    for (auto& [key, value] : entries) self->set_key(key, value);
    return Value::constant(py::none());
  }
  // (keywords: only an OrderedDict's `last=`, below)
  const bool last_keyword = kwargs.size() == 1 && kwargs[0].first == "last" && self->kind == VKind::kDict &&
                            (name == "popitem" || name == "move_to_end");
  if (!kwargs.empty() && !last_keyword) return nullptr;
  if ((name == "keys" || name == "values" || name == "items") && n == 0) {
    const bool sourced_dict = reads_as_dict(self, name.c_str());
    if (self->kind != VKind::kDict && !sourced_dict) return dict_view(self, name);  // ModuleDict
    // A view object, as in Python: used later it shows the dict as it is then. `obj` is an
    // empty view of the same type, for type() and `is`; nothing else reads it.
    // (an OrderedDict's views are odict_keys, ...)
    const bool ordered = self->is_ordered_dict();
    py::object empty = ordered ? self->pytype() : py::object(py::dict());
    ValuePtr view = Value::object(empty.attr(name.c_str())());
    view->role = ObjRole::kDictView;
    view->method = name;
    view->over = self;
    if (sourced_dict) {
      ValuePtr now = dict_view(self, name);
      FJ_CHECK(now != nullptr, "{}() of {} unreadable", name, self->describe());
      view->items = {std::move(now)};
    }
    return view;
  }
  if (self->is_sequence() && (name == "index" || name == "count") && n == 1) {
    // (constants compared as Python compares them, traced values such as tensors by identity,
    // as Python finds them first)
    const std::string what = self->describe() + "." + name + "()";
    if (name == "count") {
      int64_t count = 0;
      find_item(*self, args[1], what, &count);
      return Value::constant(py::int_(count));
    }
    const int64_t found = find_item(*self, args[1], what);
    if (found < 0) FJ_PROGRAM_RAISED(kUnsupportedValue, "{} of a value it does not hold", what);
    return Value::constant(py::int_(found));
  }
  // Containers built by the trace: their final state is what the exit rebuilds. Those read by
  // source: the trace's from their first change (make_writable).
  if (self->source >= 0 && !self->adopted) {
    if (self->kind == VKind::kList && name == "copy" && n == 0) return Value::list(self->items);
    if (name == "copy" && n == 0 && self->is(ObjRole::kPlain) && PyDict_CheckExact(self->obj.ptr())) {
      // d.copy() of a dict read by source: a dict of the trace holding its items (keys guarded).
      std::vector<std::pair<py::object, ValuePtr>> entries;
      if (!dict_by_source(self, entries)) return nullptr;
      ValuePtr out = Value::dict({}, {});
      for (auto& [key, value] : entries) out->set_key(std::move(key), std::move(value));
      return out;
    }
    if (!is_mutating_method(name)) return nullptr;
    make_writable(self);
  }
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
    if (name == "remove" && n == 1) {
      const int64_t found = find_item(*self, args[1], "list.remove()");
      if (found < 0) FJ_PROGRAM_RAISED(kUnsupportedValue, "list.remove() of a value the list does not hold");
      items.erase(items.begin() + found);
      return Value::constant(py::none());
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
    auto resized = [&]() {
      if (self->being_iterated()) {
        FJ_UNSUPPORTED(kSideEffect, "a dict changes size while a loop iterates it");
      }
    };
    if ((name == "pop" || name == "setdefault") && (n == 1 || n == 2) &&
        args[1]->is_constant_tree()) {
      const py::object key = args[1]->as_python();
      const long at = self->find_key(key);
      if (name == "setdefault") {
        if (at >= 0) return self->items[at];
        ValuePtr value = n == 2 ? args[2] : Value::constant(py::none());
        self->set_key(key, value);
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
    const bool ordered = self->is_ordered_dict();
    // OrderedDict's move_to_end(key, last=True) / popitem(last=True), dict's popitem() (LIFO).
    auto last_flag = [&](size_t positional_at, bool& last) {
      const ValuePtr* flag = n >= positional_at ? &args[positional_at] : nullptr;
      for (const auto& [key, value] : kwargs) {
        if (key != "last" || flag != nullptr) return false;
        flag = &value;
      }
      if (flag == nullptr) return true;
      if (!(*flag)->is_const()) return false;
      const int truth = PyObject_IsTrue((*flag)->obj.ptr());
      if (truth < 0) throw py::error_already_set();
      last = truth == 1;
      return true;
    };
    bool last = true;
    if (ordered && name == "move_to_end" && (n == 1 || n == 2) && args[1]->is_constant_tree() &&
        last_flag(2, last)) {
      const py::object key = args[1]->as_python();
      const long at = self->find_key(key);
      if (at < 0) FJ_PROGRAM_RAISED(kUnsupportedValue, "OrderedDict.move_to_end() of a missing key");
      if (self->being_iterated()) {
        FJ_UNSUPPORTED(kSideEffect, "an OrderedDict reordered while a loop iterates it");
      }
      py::object moved_key = self->keys[at];
      ValuePtr moved = self->items[at];
      self->keys.erase(self->keys.begin() + at);
      self->items.erase(self->items.begin() + at);
      self->keys.insert(last ? self->keys.end() : self->keys.begin(), std::move(moved_key));
      self->items.insert(last ? self->items.end() : self->items.begin(), std::move(moved));
      return Value::constant(py::none());
    }
    if (name == "popitem" && n <= (ordered ? 1u : 0u) && (ordered ? last_flag(1, last) : kwargs.empty())) {
      if (self->items.empty()) FJ_PROGRAM_RAISED(kUnsupportedValue, "popitem() of an empty dict");
      resized();
      const size_t at = last ? self->items.size() - 1 : 0;
      ValuePtr pair = Value::tuple({Value::constant(self->keys[at]), self->items[at]});
      self->keys.erase(self->keys.begin() + static_cast<long>(at));
      self->items.erase(self->items.begin() + static_cast<long>(at));
      return pair;
    }
    if (name == "copy" && n == 0) {
      ValuePtr out = Value::dict(self->keys, self->items);
      out->pytype = self->pytype;  // a defaultdict's copy is one, with its factory (an OrderedDict's too)
      out->factory = self->factory;
      return out;
    }
  }
  return nullptr;
}

namespace {

// The items of a deque's iterable argument (consumed where it is an iterator of the trace);
// unsupported where the trace does not know them one by one.
std::vector<ValuePtr> deque_items(const ValuePtr& iterable, const char* what) {
  std::vector<ValuePtr> items;
  if (!iterable_items(iterable, items)) {
    FJ_UNSUPPORTED(kUnsupportedValue, "{} of {}", what, iterable->describe());
  }
  if (iterable->kind == VKind::kIter) iterable->exhaust();
  return items;
}

// Drops items from the front (appends at the right) or the back (at the left) past maxlen.
void trim_deque(Value& deque, bool from_front) {
  if (deque.maxlen < 0) return;
  auto& items = deque.items;
  while (static_cast<Py_ssize_t>(items.size()) > deque.maxlen) {
    if (from_front) {
      items.erase(items.begin());
    } else {
      items.pop_back();
    }
  }
}

}  // namespace

ValuePtr Tracer::deque_call(const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  ValuePtr iterable = args.empty() ? nullptr : args[0];
  ValuePtr maxlen = args.size() >= 2 ? args[1] : nullptr;
  for (const auto& [key, value] : kwargs) {
    if (key == "iterable" && !iterable) {
      iterable = value;
    } else if (key == "maxlen" && !maxlen) {
      maxlen = value;
    } else {
      FJ_UNSUPPORTED(kUnsupportedCall, "deque() with the keyword {}", key);
    }
  }
  if (args.size() > 2) FJ_UNSUPPORTED(kUnsupportedCall, "deque() of {} arguments", args.size());
  ValuePtr out = Value::list({});
  out->pytype = PyRefs::get().deque_type;
  if (maxlen) {
    const ValuePtr bound = sizes_.concretize(maxlen);
    if (bound->is_const() && PyLong_CheckExact(bound->obj.ptr())) {
      out->maxlen = bound->obj.cast<Py_ssize_t>();
      if (out->maxlen < 0) FJ_PROGRAM_RAISED(kUnsupportedCall, "deque() with a negative maxlen (ValueError)");
    } else if (!(bound->is_const() && bound->obj.is_none())) {
      FJ_UNSUPPORTED(kUnsupportedCall, "deque() with maxlen {}", bound->describe());
    }
  }
  if (iterable) out->items = deque_items(iterable, "deque()");
  trim_deque(*out, true);
  return out;
}

ValuePtr Tracer::deque_method(const std::string& name, const std::vector<ValuePtr>& args) {
  const ValuePtr& self = args[0];
  auto& items = self->items;
  const size_t n = args.size() - 1;
  const ValuePtr none = Value::constant(py::none());
  if (name == "append" && n == 1) {
    items.push_back(args[1]);
    trim_deque(*self, true);
    return none;
  }
  if (name == "appendleft" && n == 1) {
    items.insert(items.begin(), args[1]);
    trim_deque(*self, false);
    return none;
  }
  if ((name == "pop" || name == "popleft") && n == 0) {
    if (items.empty()) FJ_PROGRAM_RAISED(kUnsupportedValue, "{}() from an empty deque (IndexError)", name);
    ValuePtr out = name == "pop" ? items.back() : items.front();
    items.erase(name == "pop" ? items.end() - 1 : items.begin());
    return out;
  }
  if (name == "extend" && n == 1) {
    for (auto& item : deque_items(args[1], "deque.extend()")) items.push_back(std::move(item));
    trim_deque(*self, true);
    return none;
  }
  if (name == "extendleft" && n == 1) {
    for (auto& item : deque_items(args[1], "deque.extendleft()")) items.insert(items.begin(), std::move(item));
    trim_deque(*self, false);
    return none;
  }
  if (name == "rotate" && n <= 1) {
    const ValuePtr steps_in = n == 1 ? sizes_.concretize(args[1]) : Value::constant(py::int_(1));
    if (!steps_in->is_const() || !PyLong_CheckExact(steps_in->obj.ptr())) {
      FJ_UNSUPPORTED(kUnsupportedValue, "deque.rotate() by {}", steps_in->describe());
    }
    if (!items.empty()) {
      const auto size = static_cast<Py_ssize_t>(items.size());
      const Py_ssize_t steps = ((steps_in->obj.cast<Py_ssize_t>() % size) + size) % size;
      std::rotate(items.begin(), items.end() - steps, items.end());  // to the right
    }
    return none;
  }
  // (an insert with room is a list's, as index, count, remove, reverse and clear: container_method)
  if (name == "insert" && n == 2 && self->maxlen >= 0 &&
      static_cast<Py_ssize_t>(items.size()) >= self->maxlen) {
    FJ_PROGRAM_RAISED(kUnsupportedValue, "deque.insert() into a full deque (IndexError)");
  }
  if ((name == "copy" || name == "__copy__") && n == 0) {
    ValuePtr out = Value::list(items);
    out->pytype = self->pytype;
    out->maxlen = self->maxlen;
    return out;
  }
  return nullptr;
}

}  // namespace framejit
