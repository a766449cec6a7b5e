// The entry state: sources read, their live values, graph inputs, and every guard of a region.
#include "trace/entry_state.h"

#include "common/check.h"
#include "guards/tensor_check.h"
#include "trace/pyrefs.h"

namespace framejit {

bool is_constant_type(PyObject* obj) {
  PyTypeObject* type = Py_TYPE(obj);
  if (obj == Py_None || obj == Py_Ellipsis || type == &PyLong_Type || type == &PyFloat_Type ||
      type == &PyBool_Type || type == &PyUnicode_Type || type == &PyBytes_Type ||
      type == &PyComplex_Type || type == &PySlice_Type) {
    return true;
  }
  const PyRefs& refs = PyRefs::get();
  if (reinterpret_cast<PyObject*>(type) == refs.dtype_type.ptr() ||
      reinterpret_cast<PyObject*>(type) == refs.device_type.ptr() ||
      reinterpret_cast<PyObject*>(type) == refs.size_type.ptr()) {
    return true;
  }
  // A small frozenset of such constants (diffusers' devices lacking float64): guarded equal.
  if (PyFrozenSet_CheckExact(obj) && PySet_GET_SIZE(obj) <= 64) {
    PyObject* iter = PyObject_GetIter(obj);  // New
    if (iter == nullptr) {
      PyErr_Clear();
      return false;
    }
    bool all_constant = true;
    while (PyObject* item = PyIter_Next(iter)) {  // New
      all_constant = all_constant && is_constant_type(item);
      Py_DECREF(item);
    }
    Py_DECREF(iter);
    return all_constant;
  }
  return false;
}

bool is_identity_object(PyObject* obj) {
  // (An Enum member is one of its class's singletons: a registry keyed by members, as
  // diffusers' attention backends are, is read with the member itself as the key.)
  return PyModule_Check(obj) || PyFunction_Check(obj) || PyCFunction_Check(obj) || PyCode_Check(obj) ||
         PyType_Check(obj) || Py_TYPE(obj) == &PyMethodDescr_Type ||
         Py_TYPE(obj) == &PyWrapperDescr_Type || Py_TYPE(obj) == &PyClassMethodDescr_Type ||
         PyRefs::get().is_enum_member(obj);
}

namespace {

// A namedtuple (collections' or typing's) that reads its items as a tuple does, with no state
// beside them: a tuple of the trace, its class guarded exactly.
bool is_plain_namedtuple(PyObject* obj) {
  if (!PyTuple_Check(obj) || PyTuple_CheckExact(obj)) return false;
  PyTypeObject* type = Py_TYPE(obj);
  static PyObject* const kFields = PyUnicode_InternFromString("_fields");
  static PyObject* const kGetitem = PyUnicode_InternFromString("__getitem__");
  PyObject* fields = _PyType_Lookup(type, kFields);  // Borrowed
  // (a class statement's sq_item calls the __getitem__ it finds: tuple's, checked here)
  return fields != nullptr && PyTuple_Check(fields) && type->tp_dictoffset == 0 &&
         type->tp_iter == PyTuple_Type.tp_iter && type->tp_getattro == PyObject_GenericGetAttr &&
         _PyType_Lookup(type, kGetitem) == _PyType_Lookup(&PyTuple_Type, kGetitem) &&
         type->tp_as_sequence != nullptr &&
         type->tp_as_sequence->sq_length == PyTuple_Type.tp_as_sequence->sq_length &&
         type->tp_as_mapping != nullptr &&
         type->tp_as_mapping->mp_subscript == PyTuple_Type.tp_as_mapping->mp_subscript;
}

// The dict holding obj's attributes, if it has one: a module's, an instance's __dict__ (made
// by CPython if it was not yet). New reference or null (no error set). Classes: null (their
// namespace is no dict a trace can change).
Ref attribute_dict(PyObject* obj) {
  if (PyModule_Check(obj)) return Ref::borrow(PyModule_GetDict(obj));
  if (PyType_Check(obj) || Py_TYPE(obj)->tp_dictoffset == 0) return Ref();
  Ref dict = Ref::steal(PyObject_GenericGetDict(obj, nullptr));
  if (!dict) PyErr_Clear();
  return dict;
}

}  // namespace

EntryState::EntryState(const FrameState& frame, int entry_pc, GraphRecorder& recorder)
    : frame_(frame), entry_pc_(entry_pc), recorder_(recorder) {}

ValuePtr EntryState::load(Source source) {
  const int known = sources_.size();
  const int slot = sources_.intern(std::move(source));
  if (slot < known) return by_slot_.at(slot);  // read and wrapped before
  live_.resize(static_cast<size_t>(slot) + 1);
  // The slots read so far, as the borrowed array SourceTable::read takes.
  live_[slot] = Ref::steal(
      sources_.read(slot, frame_, reinterpret_cast<PyObject* const*>(live_.data())));
  if (!live_[slot]) {
    sources_.pop_last();
    live_.pop_back();
    return nullptr;
  }
  if (!changed_.empty()) {
    // The trace changed a dict or list in place: reading it (or, for an attribute or a global,
    // the namespace dict it lives in) through another source would see it as it was.
    auto changed = changed_.find(live_[slot].get());
    const Source& read = sources_.at(slot);
    if (changed == changed_.end()) {
      Ref space;
      if (read.kind == SourceKind::kAttr) space = attribute_dict(live_value(read.base));
      if (read.kind == SourceKind::kGlobal) space = Ref::borrow(frame_.globals);
      if (read.kind == SourceKind::kGlobalOf) space = Ref::borrow(read.owner.ptr());
      if (space) changed = changed_.find(space.get());
      if (changed == changed_.end() && (read.kind == SourceKind::kGlobal || read.kind == SourceKind::kGlobalOf)) {
        changed = changed_.find(frame_.builtins);
      }
    }
    if (changed != changed_.end()) {
      const std::string text = read.text;
      const std::string through = sources_.at(changed->second).text;
      sources_.pop_last();
      live_.pop_back();
      FJ_UNSUPPORTED(kSideEffect, "{}, changed by this region through {}", text, through);
    }
  }
  return wrap(slot, py::reinterpret_borrow<py::object>(live_[slot].get()));
}

PyObject* EntryState::live_value(int slot) const {
  FJ_CHECK(slot >= 0 && static_cast<size_t>(slot) < live_.size() && live_[slot],
           "slot {} was not read", slot);
  return live_[slot].get();
}

int EntryState::slot_of_placeholder(Node* node) const {
  auto found = tensor_slots_.find(node);
  return found == tensor_slots_.end() ? -1 : found->second;
}

ValuePtr EntryState::wrap(int slot, py::handle real) {
  auto found = by_slot_.find(slot);
  if (found != by_slot_.end()) return found->second;
  PyRefs& refs = PyRefs::get();
  PyObject* obj = real.ptr();
  ValuePtr value;
  const bool namedtuple = is_plain_namedtuple(obj);
  const bool by_reference = is_tensor(obj) || !(is_constant_type(obj) || PyTuple_CheckExact(obj) || namedtuple ||
                                                PyList_CheckExact(obj) || is_identity_object(obj) ||
                                                PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) ||
                                                PyCFunction_Check(obj) || is_numpy_scalar(obj));
  if (by_reference) {
    auto seen = slot_of_object_.find(obj);
    if (seen != slot_of_object_.end()) {
      guards_.add_same(slot, seen->second);
      value = by_slot_.at(seen->second);
      by_slot_[slot] = value;
      return value;
    }
    slot_of_object_.emplace(obj, slot);
  }
  if (is_tensor(obj)) {
    if (!is_plain_tensor_type(obj) &&
        refs.support.attr("has_torch_function_override")(real).cast<bool>()) {
      // Meta tensors would not run the subclass's __torch_function__: shapes could differ.
      FJ_UNSUPPORTED(kUnsupportedValue, "tensor subclass {} overrides __torch_function__",
                     Py_TYPE(obj)->tp_name);
    }
    guards_.add_tensor(slot, obj);  // the tensor guard: made with the placeholder
    py::object meta = py::reinterpret_steal<py::object>(meta_like(obj));  // dense: in C++
    if (!meta) meta = refs.support.attr("make_meta")(real);
    py::object device = real.attr("device");
    Node* node = recorder_.placeholder(sources_.at(slot).name_hint, meta,
                                       GraphRecorder::meta_of(meta, device));
    inputs_.push_back(Rebuild::slot(slot));
    tensor_slots_.emplace(node, slot);
    value = Value::tensor(node, meta, device, slot);
    value->pytype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(obj)));
  } else if ((PyLong_CheckExact(obj) || PyFloat_CheckExact(obj)) &&
             (is_mid_frame_number(slot) ||
              (numbers_ != nullptr && ints_from_start_ && PyLong_CheckExact(obj)) ||
              (numbers_ != nullptr && (PyLong_CheckExact(obj) || varying_floats_) &&
               number_varies(slot, obj) && (PyFloat_CheckExact(obj) || varying_ints_)))) {
    // A number in the middle of a frame (a loop counter, the result of .item()), or a number read
    // by source that changed between compiles of this place (a learning rate a scheduler sets, a
    // step or position argument): its type is guarded, its value only where the trace needs it
    // (see SizeTracker::specialize()).
    guards_.add_type(slot, reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    value = Value::sym_num(py::object(), {}, py::reinterpret_borrow<py::object>(real));
    value->source = slot;
    // An int input (a graph input wherever a size may be one): read by source, or one of the
    // frame's own that this place saw change (a position held in a local across a break:
    // `func(*args)` in the region after `with torch.inference_mode()` of a decorated forward).
    value->int_input = PyLong_CheckExact(obj) &&
                       (!is_mid_frame_number(slot) ||
                        (numbers_ != nullptr && (ints_from_start_ || (varying_ints_ && number_varies(slot, obj)))));
  } else if (is_constant_type(obj) || is_numpy_scalar(obj)) {
    // (a NumPy scalar too: guarded by its type and value, as the constant it is; by type alone a
    // graph that holds it would keep the first one's value)
    if (obj == Py_None || obj == Py_Ellipsis) {
      guards_.add_id(slot, obj);
    } else {
      guards_.add_const(slot, obj);
    }
    value = Value::constant(py::reinterpret_borrow<py::object>(real), slot);
  } else if (PyTuple_CheckExact(obj) || PyList_CheckExact(obj) || namedtuple) {
    guards_.add_type(slot, reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    guards_.add_len(slot, n);
    std::vector<ValuePtr> items;
    for (Py_ssize_t i = 0; i < n; ++i) {
      ValuePtr item = load(sources_.item(slot, py::int_(i)));
      FJ_CHECK(item != nullptr, "item {} of {} unreadable", i, sources_.at(slot).text);
      items.push_back(std::move(item));
    }
    value = PyList_CheckExact(obj) ? Value::list(std::move(items))
            : namedtuple ? Value::tuple(std::move(items), py::reinterpret_borrow<py::object>(
                                                              reinterpret_cast<PyObject*>(Py_TYPE(obj))))
                         : Value::tuple(std::move(items));
    value->source = slot;
  } else if (PyCFunction_Check(obj) && PyCFunction_GET_SELF(obj) != nullptr &&
             PyType_Check(PyCFunction_GET_SELF(obj))) {
    // A builtin class method read off its class (itertools.chain.from_iterable, dict.fromkeys):
    // made anew by every read, so guarded equal (the same class and method), not identical.
    guards_.add_const(slot, obj);
    value = Value::object(py::reinterpret_borrow<py::object>(real), slot);
  } else if (is_identity_object(obj)) {
    guards_.add_id(slot, obj);
    value = Value::object(py::reinterpret_borrow<py::object>(real), slot);
  } else {
    guards_.add_type(slot, reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    value = Value::object(py::reinterpret_borrow<py::object>(real), slot);
  }
  by_slot_[slot] = value;
  return value;
}

bool EntryState::number_varies(int slot, PyObject* value) {
  const std::string& text = sources_.at(slot).text;
  if (numbers_->varying.count(text)) return true;
  auto [first, inserted] = numbers_->first.emplace(text, py::reinterpret_borrow<py::object>(value));
  if (inserted) return false;
  const int same = PyObject_RichCompareBool(first->second.ptr(), value, Py_EQ);
  if (same < 0) PyErr_Clear();
  if (same == 1) return false;
  numbers_->varying.insert(text);
  return true;
}

bool EntryState::is_frame_state(int slot) const {
  // Items of tuples and lists count too: the (i, t) pair a performed FOR_ITER pushed for a loop
  // over enumerate() holds the loop counter. A dict's items do not: a number in a config or an
  // optimizer's param group is a setting, specialised like one read at the frame's start.
  while (sources_.at(slot).kind == SourceKind::kItem) {
    const int base = sources_.at(slot).base;
    PyObject* container = live_[base].get();
    if (container == nullptr || !(PyTuple_Check(container) || PyList_Check(container))) return false;
    slot = base;
  }
  const SourceKind kind = sources_.at(slot).kind;
  return kind == SourceKind::kLocal || kind == SourceKind::kStack;
}

void EntryState::guard_type(int slot, PyObject* type) { guards_.add_type(slot, type); }
void EntryState::guard_id(int slot, PyObject* obj) { guards_.add_id(slot, obj); }
void EntryState::guard_const(int slot, PyObject* value) { guards_.add_const(slot, value); }
void EntryState::guard_len(int slot, int64_t n) { guards_.add_len(slot, n); }

void EntryState::guard_dict_contains(int slot, PyObject* key, bool present) {
  guards_.add_dict_contains(slot, key, present);
}

void EntryState::guard_dict_keys(int slot, PyObject* keys) { guards_.add_dict_keys(slot, keys); }

void EntryState::guard_class_attribute(int slot, PyTypeObject* type, PyObject* name,
                                       bool present) {
  guards_.add_type_version(slot, type, name, present);
}

void EntryState::guard_class_attribute_is(int slot, PyTypeObject* type, PyObject* name) {
  const char* text = PyUnicode_AsUTF8(name);
  if (text == nullptr) throw py::error_already_set();
  if (!class_attributes_guarded_.emplace(slot, text).second) return;
  PyObject* found = _PyType_Lookup(type, name);  // Borrowed; sets no error
  guards_.add_type_version(slot, type, name, found != nullptr, found);
}

void EntryState::guard_not_aliased(const ValuePtr& target, const std::string& name) {
  if (target->source < 0 || target->is_special_object() || target->bound_self) return;
  PyObject* obj = live_value(target->source);
  if (is_identity_object(obj)) return;
  if (target->kind == VKind::kTensor) {
    // A tensor's .grad written: only another tensor whose .grad this region read could turn out
    // to be it (every tensor is one value per object, see wrap()).
    std::set<int> read_it;
    for (int i = 0; i < sources_.size(); ++i) {
      const Source& s = sources_.at(i);
      if (s.kind == SourceKind::kAttr && s.base != target->source && s.key &&
          py::str(s.key).cast<std::string>() == name) {
        read_it.insert(s.base);
      }
    }
    for (int slot : read_it) {
      auto found = by_slot_.find(slot);
      if (found != by_slot_.end() && found->second->kind == VKind::kTensor && found->second != target) {
        guards_.add_distinct(slot, target->source);
      }
    }
    return;
  }
  for (const auto& [slot, value] : by_slot_) {
    PyObject* other = live_[slot].get();
    // Every slot's type is guarded (or its identity, or its value): only an object of the same
    // type can turn out to be the target.
    if (slot == target->source || other == obj || Py_TYPE(other) != Py_TYPE(obj) ||
        value->is_special_object() || value->bound_self) {
      continue;
    }
    guards_.add_distinct(slot, target->source);
  }
}

bool EntryState::namespace_changed(PyObject* obj) const {
  if (changed_.empty()) return false;
  Ref space = attribute_dict(obj);
  return space && changed_.count(space.get()) > 0;
}

void EntryState::note_changed(int slot) {
  PyObject* obj = live_value(slot);
  if (obj == frame_.globals || obj == frame_.builtins) {
    FJ_UNSUPPORTED(kSideEffect, "an item store into the globals dict");
  }
  for (const auto& [other, value] : by_slot_) {
    if (other == slot) continue;
    // The same object, or (an attribute or global read before) the namespace it was read from.
    const Source& read = sources_.at(other);
    bool reads_it = live_[other].get() == obj;
    if (!reads_it && read.kind == SourceKind::kAttr) reads_it = attribute_dict(live_value(read.base)).get() == obj;
    if (!reads_it && read.kind == SourceKind::kGlobalOf) reads_it = read.owner.ptr() == obj;
    if (reads_it) {
      FJ_UNSUPPORTED(kSideEffect, "a change of {}, which {} also reads", sources_.at(slot).text,
                     read.text);
    }
  }
  changed_.emplace(obj, slot);
}

void EntryState::guard_globals_dict(PyObject* globals) {
  guards_.add_id(sources_.intern(SourceTable::globals_dict()), globals);
}

void EntryState::allow_any_sizes(const std::map<int, std::set<int>>& fixed) {
  guards_.allow_any_sizes(fixed);
}

void EntryState::allow_symbolic_dims(const std::map<int, std::set<int>>& symbolic) {
  guards_.allow_symbolic_dims(symbolic);
}

void EntryState::bound_dims(const std::map<int, std::vector<TensorSpec::DimRange>>& ranges) {
  guards_.bound_dims(ranges);
}

}  // namespace framejit
