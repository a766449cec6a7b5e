// Python helpers shared by every C++ file.
#include "common/py.h"

#include <algorithm>

#include <cstring>

namespace framejit {

std::string safe_repr(PyObject* obj) {
  if (obj == nullptr) return "<NULL>";
  PyObject* text = PyObject_Repr(obj);  // New
  if (text == nullptr) {
    PyErr_Clear();
    return std::string("<") + Py_TYPE(obj)->tp_name + " object>";
  }
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text, &size);  // borrowed from `text`
  std::string out = data ? std::string(data, size) : std::string("<repr failed>");
  if (!data) PyErr_Clear();
  Py_DECREF(text);
  return out;
}

std::string short_repr(PyObject* obj) {
  std::string text = safe_repr(obj);
  const size_t cut = std::min(text.find('\n'), static_cast<size_t>(60));
  if (cut < text.size()) text = text.substr(0, cut) + "...";
  return text;
}

std::string str_text(PyObject* str) {
  const char* data = str ? PyUnicode_AsUTF8(str) : nullptr;
  if (data == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return data;
}

bool is_numpy_scalar(PyObject* obj) {
  return std::strncmp(Py_TYPE(obj)->tp_name, "numpy.", 6) == 0 && is_numpy_instance(obj, "generic");
}

bool is_numpy_instance(PyObject* obj, const char* type_name) {
  PyObject* name = PyUnicode_FromString("numpy");  // New
  PyObject* numpy = name == nullptr ? nullptr : PyImport_GetModule(name);  // New or NULL
  Py_XDECREF(name);
  if (numpy == nullptr) {
    PyErr_Clear();
    return false;  // NumPy was never imported: nothing here is a NumPy object
  }
  PyObject* type = PyObject_GetAttrString(numpy, type_name);  // New
  Py_DECREF(numpy);
  const int is = type == nullptr ? -1 : PyObject_IsInstance(obj, type);
  Py_XDECREF(type);
  if (is < 0) PyErr_Clear();
  return is == 1;
}

std::string fetch_and_clear_error() {
  if (!PyErr_Occurred()) return {};
  PyObject *type, *value, *traceback;  // all New after PyErr_Fetch
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  std::string out = type ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "Error";
  if (value) {
    PyObject* text = PyObject_Str(value);  // New
    if (text) {
      const char* data = PyUnicode_AsUTF8(text);
      if (data) out += std::string(": ") + data;
      Py_DECREF(text);
    }
    PyErr_Clear();
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return out;
}

bool same_constant(PyObject* value, PyObject* expected) {
  if (value == expected) return true;
  if (Py_TYPE(value) != Py_TYPE(expected)) return false;
  if (PyFloat_CheckExact(value)) {
    const double a = PyFloat_AS_DOUBLE(value);
    const double b = PyFloat_AS_DOUBLE(expected);
    return std::memcmp(&a, &b, sizeof(double)) == 0;
  }
  if (PyComplex_CheckExact(value)) {
    const Py_complex a = PyComplex_AsCComplex(value);
    const Py_complex b = PyComplex_AsCComplex(expected);
    return std::memcmp(&a.real, &b.real, sizeof(double)) == 0 &&
           std::memcmp(&a.imag, &b.imag, sizeof(double)) == 0;
  }
  if (is_numpy_scalar(value)) {
    // Its bytes (the types are equal): -0.0 is not 0.0, and a NaN is the NaN it was.
    PyObject* a = PyObject_CallMethod(value, "tobytes", nullptr);     // New
    PyObject* b = a ? PyObject_CallMethod(expected, "tobytes", nullptr) : nullptr;  // New
    const int same = b ? PyObject_RichCompareBool(a, b, Py_EQ) : -1;
    Py_XDECREF(a);
    Py_XDECREF(b);
    if (same < 0) PyErr_Clear();
    return same == 1;
  }
  const int eq = PyObject_RichCompareBool(value, expected, Py_EQ);
  if (eq < 0) PyErr_Clear();
  return eq == 1;
}

PyObject* make_tuple_of_type(PyObject* items, PyObject* type) {
  if (type == reinterpret_cast<PyObject*>(&PyTuple_Type)) return items;
  PyObject* out = nullptr;
  if (PyObject_HasAttrString(type, "_make")) {  // collections.namedtuple, typing.NamedTuple
    out = PyObject_CallMethod(type, "_make", "(O)", items);  // (one argument: the tuple)
  } else {  // structseq (torch.return_types.*) and torch.Size take one iterable
    out = PyObject_CallOneArg(type, items);
  }
  Py_DECREF(items);
  return out;
}

}  // namespace framejit
