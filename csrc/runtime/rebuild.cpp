// Building return values from graph outputs: raw CPython API, runs on every call.
#include "runtime/rebuild.h"

#include "common/check.h"

namespace framejit {

namespace {

// New reference to a tuple/namedtuple/structseq of `items` (stolen) of exact type `type`.
PyObject* make_tuple_of_type(PyObject* items, PyObject* type) {
  if (type == reinterpret_cast<PyObject*>(&PyTuple_Type)) return items;
  PyObject* out = nullptr;
  if (PyObject_HasAttrString(type, "_make")) {  // collections.namedtuple
    out = PyObject_CallMethod(type, "_make", "O", items);
  } else {  // structseq (torch.return_types.*) and torch.Size take one iterable
    out = PyObject_CallOneArg(type, items);
  }
  Py_DECREF(items);
  return out;
}

}  // namespace

PyObject* Rebuild::build(PyObject* outputs, const SlotValues& slots) const {
  switch (kind) {
    case Kind::kOutput: {
      PyObject* value = PySequence_Fast_GET_ITEM(outputs, index);  // borrowed
      Py_INCREF(value);
      return value;
    }
    case Kind::kSlot: {
      PyObject* value = slots[index];
      Py_INCREF(value);
      return value;
    }
    case Kind::kConst:
      Py_INCREF(value.ptr());
      return value.ptr();
    case Kind::kTuple:
    case Kind::kList: {
      const Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
      PyObject* out = kind == Kind::kTuple ? PyTuple_New(n) : PyList_New(n);  // New
      if (out == nullptr) return nullptr;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = items[i].build(outputs, slots);
        if (item == nullptr) {
          Py_DECREF(out);
          return nullptr;
        }
        if (kind == Kind::kTuple) {
          PyTuple_SET_ITEM(out, i, item);  // steals item
        } else {
          PyList_SET_ITEM(out, i, item);  // steals item
        }
      }
      return kind == Kind::kTuple ? make_tuple_of_type(out, value.ptr()) : out;
    }
    case Kind::kDict: {
      PyObject* out = PyDict_New();  // New
      if (out == nullptr) return nullptr;
      for (size_t i = 0; i < items.size(); ++i) {
        PyObject* item = items[i].build(outputs, slots);
        if (item == nullptr || PyDict_SetItem(out, keys[i].ptr(), item) < 0) {
          Py_XDECREF(item);
          Py_DECREF(out);
          return nullptr;
        }
        Py_DECREF(item);
      }
      return out;
    }
  }
  PyErr_SetString(PyExc_SystemError, "framejit: bad rebuild kind");
  return nullptr;
}

std::string Rebuild::to_string() const {
  switch (kind) {
    case Kind::kOutput: return "out[" + std::to_string(index) + "]";
    case Kind::kSlot: return "slot[" + std::to_string(index) + "]";
    case Kind::kConst: return safe_repr(value);
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kDict: {
      std::string out = kind == Kind::kList ? "[" : kind == Kind::kDict ? "{" : "(";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        if (kind == Kind::kDict) out += safe_repr(keys[i]) + ": ";
        out += items[i].to_string();
      }
      return out + (kind == Kind::kList ? "]" : kind == Kind::kDict ? "}" : ")");
    }
  }
  return "?";
}

}  // namespace framejit
