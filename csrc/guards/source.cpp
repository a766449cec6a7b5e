// Source construction (trace time) and reading (every call).
#include "guards/source.h"

#include "bytecode/version.h"
#include "common/check.h"

namespace framejit {

namespace {

// The value this source found in `dict` last time, if the dict is unchanged since (Borrowed).
// A dict whose tag does not follow its writes is never remembered, so it is looked up again.
PyObject* cached_lookup(const Source& s, PyObject* dict) {
  if (s.cached_dict != dict || s.cached_version != pyver::dict_version(dict)) return nullptr;
  return s.cached_value;
}

void remember_lookup(const Source& s, PyObject* dict, PyObject* value) {
  if (!pyver::dict_version_tracks_writes(dict)) {
    s.cached_dict = nullptr;
    return;
  }
  s.cached_dict = dict;
  s.cached_version = pyver::dict_version(dict);
  s.cached_value = value;
}

// Attribute names and str keys interned, as CPython interns attribute names and most dict keys
// (a lookup then matches by pointer instead of comparing characters).
py::object interned(py::object key) {
  if (!PyUnicode_CheckExact(key.ptr())) return key;
  PyObject* k = key.release().ptr();
  PyUnicode_InternInPlace(&k);  // may replace k, keeping one reference
  return py::reinterpret_steal<py::object>(k);
}

}  // namespace

int SourceTable::find(const Source& source) const {
  // By what the source reads, not by its text alone: two globals dicts may have the same
  // __name__ (code made with exec), and so may the sources read through them.
  for (size_t i = 0; i < sources_.size(); ++i) {
    const Source& known = sources_[i];
    if (known.text == source.text && known.kind == source.kind && known.base == source.base &&
        known.owner.ptr() == source.owner.ptr()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

int SourceTable::intern(Source source) {
  const int found = find(source);
  if (found >= 0) return found;
  sources_.push_back(std::move(source));
  return static_cast<int>(sources_.size()) - 1;
}

Source SourceTable::local(int index, const std::string& name) {
  Source s;
  s.kind = SourceKind::kLocal;
  s.index = index;
  s.text = "L['" + name + "']";
  s.name_hint = name;
  return s;
}

Source SourceTable::local_bound(int index, const std::string& name) {
  Source s;
  s.kind = SourceKind::kLocalBound;
  s.index = index;
  s.text = "bound(L['" + name + "'])";
  s.name_hint = name + "_bound";
  return s;
}

Source SourceTable::global(const std::string& name) {
  Source s;
  s.kind = SourceKind::kGlobal;
  s.key = interned(py::str(name));
  s.text = "G['" + name + "']";
  s.name_hint = name;
  return s;
}

Source SourceTable::stack(int index) {
  Source s;
  s.kind = SourceKind::kStack;
  s.index = index;
  s.text = "S[" + std::to_string(index) + "]";
  s.name_hint = "stack" + std::to_string(index);
  return s;
}

Source SourceTable::global_of(py::object globals, const std::string& name) {
  Source s;
  s.kind = SourceKind::kGlobalOf;
  s.key = py::str(name);
  const py::object module = globals.attr("get")("__name__", "?");
  s.text = "G[" + py::str(module).cast<std::string>() + "]['" + name + "']";
  s.name_hint = name;
  s.owner = std::move(globals);
  return s;
}

Source SourceTable::imported_module(const std::string& name) {
  Source s;
  s.kind = SourceKind::kGlobalOf;  // a name in a dict: sys.modules
  s.key = py::str(name);
  s.text = "sys.modules['" + name + "']";
  s.name_hint = name;
  s.owner = py::module_::import("sys").attr("modules");
  return s;
}

Source SourceTable::closure(int index) {
  Source s;
  s.kind = SourceKind::kClosure;
  s.index = index;
  s.text = "C[" + std::to_string(index) + "]";
  s.name_hint = "closure" + std::to_string(index);
  return s;
}

Source SourceTable::globals_dict() {
  Source s;
  s.kind = SourceKind::kGlobalsDict;
  s.text = "G";
  s.name_hint = "globals";
  return s;
}

Source SourceTable::attr(int base, const std::string& name) const {
  Source s;
  s.kind = SourceKind::kAttr;
  s.base = base;
  s.key = interned(py::str(name));
  s.text = sources_[base].text + "." + name;
  s.name_hint = sources_[base].name_hint + "_" + name;
  return s;
}

Source SourceTable::generic_attr(int base, const std::string& name) const {
  Source s = attr(base, name);
  s.generic = true;
  s.text = "object.__getattribute__(" + sources_[base].text + ", '" + name + "')";
  return s;
}

Source SourceTable::item(int base, py::object key) const {
  Source s;
  s.kind = SourceKind::kItem;
  s.base = base;
  const std::string key_text = safe_repr(key);
  s.text = sources_[base].text + "[" + key_text + "]";
  s.key = interned(std::move(key));
  PyObject* k = s.key.ptr();
  if (PyType_Check(k) || PyFunction_Check(k) || PyCFunction_Check(k) || PyModule_Check(k)) {
    s.owner = s.key;  // a key by identity (a class): two of one repr stay two sources
  }
  const std::string plain_key =
      PyUnicode_Check(s.key.ptr()) ? s.key.cast<std::string>() : key_text;  // x, not 'x'
  const Source& parent = sources_[base];
  const bool module_store =
      parent.kind == SourceKind::kAttr && parent.base >= 0 &&
      (parent.text.size() > 12 && (parent.text.compare(parent.text.size() - 12, 12, "._parameters") == 0 ||
                                   parent.text.compare(parent.text.size() - 9, 9, "._buffers") == 0 ||
                                   parent.text.compare(parent.text.size() - 9, 9, "._modules") == 0));
  // self._parameters['weight'] is named like self.weight.
  s.name_hint = (module_store ? sources_[parent.base].name_hint : parent.name_hint) + "_" + plain_key;
  return s;
}

Source SourceTable::context_value(int base, py::object unset) const {
  Source s;
  s.kind = SourceKind::kContextValue;
  s.base = base;
  s.text = sources_[base].text + (unset ? ".get(<unset>)" : ".get()");
  s.key = std::move(unset);
  s.name_hint = sources_[base].name_hint + "_value";
  return s;
}

Source SourceTable::weak_target(int base) const {
  Source s;
  s.kind = SourceKind::kWeakTarget;
  s.base = base;
  s.text = sources_[base].text + "()";
  s.name_hint = sources_[base].name_hint + "_target";
  return s;
}

Source SourceTable::item_by_object(int base, py::object key, int key_slot) const {
  Source s;
  s.kind = SourceKind::kItem;
  s.base = base;
  s.key = std::move(key);
  s.text = sources_[base].text + "[" + sources_[key_slot].text + "]";
  s.name_hint = sources_[base].name_hint + "_" + sources_[key_slot].name_hint;
  return s;
}

PyObject* SourceTable::read(int slot, const FrameState& frame, PyObject* const* slots) const {
  const Source& s = sources_[slot];
  switch (s.kind) {
    case SourceKind::kLocal: {
      PyObject* value = frame.localsplus[s.index];  // borrowed from the frame
      Py_XINCREF(value);
      return value;
    }
    case SourceKind::kLocalBound:
      return Py_NewRef(frame.localsplus[s.index] != nullptr ? Py_True : Py_False);
    case SourceKind::kStack: {
      if (s.index >= frame.stack_size) return nullptr;
      PyObject* value = frame.stack[s.index];  // borrowed from the runtime's stack
      Py_XINCREF(value);
      return value;
    }
    case SourceKind::kGlobalsDict:
      return Py_XNewRef(frame.globals);
    case SourceKind::kClosure: {
      PyObject* closure = frame.function ? PyFunction_GET_CLOSURE(frame.function) : nullptr;
      if (closure == nullptr || s.index >= PyTuple_GET_SIZE(closure)) return nullptr;
      PyObject* cell = PyTuple_GET_ITEM(closure, s.index);  // borrowed
      Py_INCREF(cell);
      return cell;
    }
    case SourceKind::kGlobal:
    case SourceKind::kGlobalOf: {
      PyObject* globals = s.kind == SourceKind::kGlobal ? frame.globals : s.owner.ptr();
      if (PyObject* cached = cached_lookup(s, globals)) return Py_NewRef(cached);
      PyObject* value = PyDict_GetItemWithError(globals, s.key.ptr());  // borrowed
      if (value != nullptr) remember_lookup(s, globals, value);
      if (value == nullptr && !PyErr_Occurred()) {
        value = PyDict_GetItemWithError(frame.builtins, s.key.ptr());  // borrowed
      }
      if (value == nullptr) PyErr_Clear();
      Py_XINCREF(value);
      return value;
    }
    case SourceKind::kContextValue: {
      PyObject* var = slots[s.base];
      if (var == nullptr || !PyContextVar_CheckExact(var)) return nullptr;
      PyObject* value = nullptr;
      if (PyContextVar_Get(var, s.key.ptr(), &value) < 0) {  // New, or NULL where it has no value
        PyErr_Clear();
        return nullptr;
      }
      return value;
    }
    case SourceKind::kWeakTarget: {
      PyObject* ref = slots[s.base];
      if (ref == nullptr || !PyWeakref_CheckRefExact(ref)) return nullptr;
      PyObject* target = pyver::weakref_target(ref);
      if (target == nullptr) PyErr_Clear();
      return target;
    }
    case SourceKind::kAttr: {
      PyObject* base = slots[s.base];
      if (base == nullptr) return nullptr;
      PyObject* value = s.generic ? PyObject_GenericGetAttr(base, s.key.ptr())  // New
                                  : PyObject_GetAttr(base, s.key.ptr());
      if (value == nullptr) PyErr_Clear();
      return value;
    }
    case SourceKind::kItem: {
      PyObject* base = slots[s.base];
      if (base == nullptr) return nullptr;
      if (PyDict_CheckExact(base)) {
        if (PyObject* cached = cached_lookup(s, base)) return Py_NewRef(cached);
        PyObject* value = PyDict_GetItemWithError(base, s.key.ptr());  // borrowed
        if (value == nullptr) {
          PyErr_Clear();
          return nullptr;
        }
        remember_lookup(s, base, value);
        return Py_NewRef(value);
      }
      if (PyDict_Check(base)) {  // a subclass: its own items (what its builtin views show)
        PyObject* value = PyDict_GetItemWithError(base, s.key.ptr());  // borrowed
        if (value == nullptr) {
          PyErr_Clear();
          return nullptr;
        }
        return Py_NewRef(value);
      }
      // (a tuple subclass reading its items as tuple does: a namedtuple's storage)
      const bool tuple_items = PyTuple_CheckExact(base) ||
                               (PyTuple_Check(base) && Py_TYPE(base)->tp_as_mapping != nullptr &&
                                Py_TYPE(base)->tp_as_mapping->mp_subscript == PyTuple_Type.tp_as_mapping->mp_subscript);
      if ((tuple_items || PyList_CheckExact(base)) && PyLong_CheckExact(s.key.ptr())) {
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(base);
        Py_ssize_t i = PyLong_AsSsize_t(s.key.ptr());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return nullptr;
        PyObject* value = PySequence_Fast_GET_ITEM(base, i);  // borrowed
        Py_INCREF(value);
        return value;
      }
      PyObject* value = PyObject_GetItem(base, s.key.ptr());  // New
      if (value == nullptr) PyErr_Clear();
      return value;
    }
  }
  return nullptr;
}

}  // namespace framejit
