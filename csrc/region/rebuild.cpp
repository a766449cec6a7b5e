// Building Python values at a region's exit: raw CPython API, runs on every call.
#include "region/rebuild.h"

#include "common/check.h"

namespace framejit {

Rebuild Rebuild::slot(int index) {
  Rebuild r;
  r.kind = Kind::kSlot;
  r.index = index;
  return r;
}

Rebuild Rebuild::constant(py::object value) {
  Rebuild r;
  r.kind = Kind::kConst;
  r.value = std::move(value);
  return r;
}

Rebuild Rebuild::call(py::object fn, std::vector<Rebuild> args) {
  Rebuild r;
  r.kind = Kind::kCall;
  r.value = std::move(fn);
  r.items = std::move(args);
  return r;
}

PyObject* Rebuild::build(PyObject* outputs, const SlotValues& slots,
                         MemoTable& memo_objects) const {
  if (PyObject* built = memo_objects.get(memo)) {
    Py_INCREF(built);
    return built;
  }
  PyObject* out = nullptr;
  switch (kind) {
    case Kind::kOutput:
      out = PySequence_Fast_GET_ITEM(outputs, index);  // borrowed
      Py_INCREF(out);
      break;
    case Kind::kSlot:
      out = slots[index];
      Py_INCREF(out);
      break;
    case Kind::kConst:
      out = value.ptr();
      Py_INCREF(out);
      break;
    case Kind::kNull:
      return nullptr;
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kCall: {
      const Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
      out = kind == Kind::kList ? PyList_New(n) : PyTuple_New(n);  // New
      if (out == nullptr) return nullptr;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = items[i].build(outputs, slots, memo_objects);
        if (item == nullptr) {
          Py_DECREF(out);
          return nullptr;
        }
        if (kind == Kind::kList) {
          PyList_SET_ITEM(out, i, item);  // steals item
        } else {
          PyTuple_SET_ITEM(out, i, item);  // steals item
        }
      }
      if (kind == Kind::kTuple) out = make_tuple_of_type(out, value.ptr());
      if (kind == Kind::kCall) {
        PyObject* args = out;
        out = PyObject_Call(value.ptr(), args, nullptr);  // New
        Py_DECREF(args);
      }
      if (out == nullptr) return nullptr;
      break;
    }
    case Kind::kDict: {
      out = PyDict_New();
      if (out == nullptr) return nullptr;
      for (size_t i = 0; i < items.size(); ++i) {
        PyObject* item = items[i].build(outputs, slots, memo_objects);
        if (item == nullptr || PyDict_SetItem(out, keys[i].ptr(), item) < 0) {
          Py_XDECREF(item);
          Py_DECREF(out);
          return nullptr;
        }
        Py_DECREF(item);
      }
      break;
    }
  }
  if (memo >= 0) memo_objects.set(memo, Ref::borrow(out));
  return out;
}

bool Rebuild::reads_outputs() const {
  if (kind == Kind::kOutput) return true;
  for (const Rebuild& item : items) {
    if (item.reads_outputs()) return true;
  }
  return false;
}

std::string Rebuild::to_string() const {
  switch (kind) {
    case Kind::kOutput: return "out[" + std::to_string(index) + "]";
    case Kind::kSlot: return "slot[" + std::to_string(index) + "]";
    case Kind::kConst: return safe_repr(value);
    case Kind::kNull: return "NULL";
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kDict:
    case Kind::kCall: {
      std::string out = kind == Kind::kList ? "[" : kind == Kind::kDict ? "{" : "(";
      if (kind == Kind::kCall) out = safe_repr(value) + "(";
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
