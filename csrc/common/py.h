// The one include for Python and pybind11, and small helpers shared by every C++ file.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <string>

namespace framejit {

namespace py = pybind11;

// repr() of an object as UTF-8, never throwing (used in messages and printed graphs).
std::string safe_repr(PyObject* obj);
inline std::string safe_repr(const py::handle& obj) { return safe_repr(obj.ptr()); }
// safe_repr for messages: its first line, at most 60 characters (a config or a model output
// prints pages).
std::string short_repr(PyObject* obj);
inline std::string short_repr(const py::handle& obj) { return short_repr(obj.ptr()); }

// An exact dict or an exact collections.OrderedDict: a mapping whose items a trace reads by
// source with dict's semantics (an OrderedDict's order is its own: read its keys by iterating
// it, never with PyDict_Next). Borrowed: obj.
inline bool is_plain_dict(PyObject* obj) { return PyDict_CheckExact(obj) || PyODict_CheckExact(obj); }

// The UTF-8 text of a str object (a code object's file or name), "?" if it has none. Never throws.
std::string str_text(PyObject* str);

// isinstance(obj, numpy.<type_name>) ("generic": a NumPy scalar, "ndarray"); false where NumPy
// was never imported (then nothing is a NumPy object). Never throws. Borrowed: obj.
bool is_numpy_instance(PyObject* obj, const char* type_name);

// A NumPy scalar (np.float32(2.0), np.prod(shape) as np.int64): a value like a number, guarded
// and traced as the constant it is. Borrowed: obj.
bool is_numpy_scalar(PyObject* obj);

// A tuple of class `type` holding `items` (a tuple; stolen): a namedtuple through its _make, a
// structseq or torch.Size from the one iterable they take, a plain tuple as it is. New
// reference, or null with an error set.
PyObject* make_tuple_of_type(PyObject* items, PyObject* type);

// The current Python exception as "Type: message", cleared. Empty if none is set.
std::string fetch_and_clear_error();

// Whether `value` is the same constant as `expected`, for a guard or a cache key that bakes the
// value in: the same type and equal, with floats and complex numbers compared by their bits
// (-0.0 == 0.0, but 1 / -0.0 is -inf; NaN != NaN would miss on every call). An error from ==
// is cleared and counts as different. Borrowed: both.
bool same_constant(PyObject* value, PyObject* expected);

// Python's cyclic GC paused for a scope (tracing and FX export): the many new container objects
// they make would otherwise trigger collections that scan the whole heap (a fifth of the compile
// time of a 1,000-op chain). Nothing made there is garbage yet; the next collection sees it.
class GcPause {
 public:
  GcPause() : was_enabled_(PyGC_Disable()) {}
  ~GcPause() {
    if (was_enabled_) PyGC_Enable();
  }
  GcPause(const GcPause&) = delete;
  GcPause& operator=(const GcPause&) = delete;

 private:
  int was_enabled_;
};

}  // namespace framejit
