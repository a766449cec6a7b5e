// The callable framejit.compile returns: calls the user's function with the hook on.
#pragma once

#include <Python.h>

#include <memory>

#include "runtime/code_state.h"

namespace framejit {

// Creates the type; call once at module init. Returns a new reference to the type object.
PyObject* make_compiled_function_type();

// A new wrapper of fn (borrowed). ctx == nullptr makes a disable() wrapper: fn and every frame
// under it run in plain CPython. Returns New or NULL.
PyObject* new_compiled_function(PyObject* type, PyObject* fn, std::shared_ptr<CompileContext> ctx);

// A new compiled wrapper of fn (borrowed) sharing the compile context (backend, options, frame
// cache) of `compiled` (borrowed, a compiled wrapper made by new_compiled_function with a ctx).
// Returns New, or NULL with TypeError.
PyObject* compiled_function_with(PyObject* compiled, PyObject* fn);

}  // namespace framejit
