// The native backend's Python bindings: NativeProgram and make_native_function (see
// framejit/_native.py for the lowering that builds the programs).
#pragma once

#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace framejit::native {

void register_native(py::module_& m);

}  // namespace framejit::native
