// CompiledFunction: a vectorcall type (no Python frame of its own, so a compiled call costs one
// C call more than the plain one) that turns the hook on around the wrapped function.
#include "runtime/compiled_function.h"

#include <structmember.h>

#include "runtime/runtime_state.h"
#include "runtime/thread_state.h"

namespace framejit {

namespace {


struct CompiledFunctionObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* fn;           // Strong
  PyObject* dict;         // Strong, may be NULL: __name__, __wrapped__ set by functools.wraps
  PyObject* weakreflist;  // may be NULL
  std::shared_ptr<CompileContext>* ctx;  // owned; NULL for disable()
};

PyObject* compiled_vectorcall(PyObject* self_obj, PyObject* const* args, size_t nargsf,
                              PyObject* kwnames) {
  auto* self = reinterpret_cast<CompiledFunctionObject*>(self_obj);
  if (self->ctx == nullptr) {
    PauseScope pause;
    return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
  }
  ActiveScope active(*self->ctx);
  return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
}

int compiled_traverse(PyObject* self_obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<CompiledFunctionObject*>(self_obj);
  Py_VISIT(Py_TYPE(self_obj));
  Py_VISIT(self->fn);
  Py_VISIT(self->dict);
  return 0;
}

int compiled_clear(PyObject* self_obj) {
  auto* self = reinterpret_cast<CompiledFunctionObject*>(self_obj);
  Py_CLEAR(self->fn);
  Py_CLEAR(self->dict);
  return 0;
}

void compiled_dealloc(PyObject* self_obj) {
  auto* self = reinterpret_cast<CompiledFunctionObject*>(self_obj);
  PyTypeObject* type = Py_TYPE(self_obj);
  PyObject_GC_UnTrack(self_obj);
  if (self->weakreflist) PyObject_ClearWeakRefs(self_obj);
  compiled_clear(self_obj);
  delete self->ctx;
  self->ctx = nullptr;
  type->tp_free(self_obj);
  Py_DECREF(type);
}

// Binding as a method: `@framejit.compile` on a def inside a class body.
PyObject* compiled_descr_get(PyObject* self, PyObject* obj, PyObject*) {
  if (obj == nullptr || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);  // New
}

PyObject* compiled_repr(PyObject* self_obj) {
  auto* self = reinterpret_cast<CompiledFunctionObject*>(self_obj);
  return PyUnicode_FromFormat("<framejit.%s %R>", self->ctx ? "compiled" : "disabled", self->fn);
}

PyObject* get_fn(PyObject* self_obj, void*) {
  auto* self = reinterpret_cast<CompiledFunctionObject*>(self_obj);
  Py_INCREF(self->fn);
  return self->fn;
}

PyMemberDef kMembers[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(CompiledFunctionObject, vectorcall), READONLY,
     nullptr},
    {"__dictoffset__", T_PYSSIZET, offsetof(CompiledFunctionObject, dict), READONLY, nullptr},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(CompiledFunctionObject, weakreflist), READONLY,
     nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyGetSetDef kGetSets[] = {
    {"_framejit_fn", get_fn, nullptr, "the wrapped callable", nullptr},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

}  // namespace

PyObject* make_compiled_function_type() {
  static PyType_Slot slots[] = {
      {Py_tp_dealloc, reinterpret_cast<void*>(compiled_dealloc)},
      {Py_tp_traverse, reinterpret_cast<void*>(compiled_traverse)},
      {Py_tp_clear, reinterpret_cast<void*>(compiled_clear)},
      {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
      {Py_tp_descr_get, reinterpret_cast<void*>(compiled_descr_get)},
      {Py_tp_repr, reinterpret_cast<void*>(compiled_repr)},
      {Py_tp_members, kMembers},
      {Py_tp_getset, kGetSets},
      {0, nullptr},
  };
  static PyType_Spec spec = {
      "framejit._C.CompiledFunction",
      sizeof(CompiledFunctionObject),
      0,
      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
          Py_TPFLAGS_METHOD_DESCRIPTOR,
      slots,
  };
  runtime_state().compiled_type = PyType_FromSpec(&spec);  // New; the module keeps it alive
  return runtime_state().compiled_type;
}

PyObject* new_compiled_function(PyObject* type, PyObject* fn,
                                std::shared_ptr<CompileContext> ctx) {
  auto* tp = reinterpret_cast<PyTypeObject*>(type);
  auto* self = PyObject_GC_New(CompiledFunctionObject, tp);  // New
  if (self == nullptr) return nullptr;
  self->vectorcall = compiled_vectorcall;
  Py_INCREF(fn);
  self->fn = fn;
  self->dict = nullptr;
  self->weakreflist = nullptr;
  self->ctx = ctx ? new std::shared_ptr<CompileContext>(std::move(ctx)) : nullptr;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(self));
  return reinterpret_cast<PyObject*>(self);
}

PyObject* compiled_function_with(PyObject* compiled, PyObject* fn) {
  auto* self = reinterpret_cast<CompiledFunctionObject*>(compiled);
  if (reinterpret_cast<PyObject*>(Py_TYPE(compiled)) != runtime_state().compiled_type || self->ctx == nullptr) {
    PyErr_SetString(PyExc_TypeError, "expected a framejit compiled function");
    return nullptr;
  }
  return new_compiled_function(reinterpret_cast<PyObject*>(Py_TYPE(compiled)), fn, *self->ctx);
}

}  // namespace framejit
