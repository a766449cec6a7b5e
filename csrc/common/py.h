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

// The current Python exception as "Type: message", cleared. Empty if none is set.
std::string fetch_and_clear_error();

}  // namespace framejit
