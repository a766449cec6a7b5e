/* The PEP 523 shim: the only file compiled with CPython's internal headers (Py_BUILD_CORE).
 * Everything here is a thin accessor; decisions live in frame_runtime.cpp. Version differences of
 * the frame layout stay in this file. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define Py_BUILD_CORE 1
#if PY_VERSION_HEX >= 0x030C0000
/* 3.12's internal headers redefine this macro from objimpl.h. */
#undef _PyGC_FINALIZED
#endif
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

#include "eval_frame.h"

struct FjFrame; /* never defined: FjFrame* is a _PyInterpreterFrame* */

static inline _PyInterpreterFrame* as_frame(FjFrame* frame) {
  return (_PyInterpreterFrame*)frame;
}

static PyObject* fj_eval_frame(PyThreadState* tstate, _PyInterpreterFrame* frame, int throwflag) {
  return fj_on_frame(tstate, (FjFrame*)frame, throwflag);
}

static int g_installed = 0;

void fj_install_hook(void) {
  _PyInterpreterState_SetEvalFrameFunc(PyThreadState_GET()->interp, &fj_eval_frame);
  g_installed = 1;
}

void fj_uninstall_hook(void) {
  _PyInterpreterState_SetEvalFrameFunc(PyThreadState_GET()->interp, &_PyEval_EvalFrameDefault);
  g_installed = 0;
}

int fj_hook_installed(void) { return g_installed; }

PyObject* fj_eval_default(PyThreadState* tstate, FjFrame* frame, int throwflag) {
  return _PyEval_EvalFrameDefault(tstate, as_frame(frame), throwflag);
}

PyCodeObject* fj_frame_code(FjFrame* frame) { return as_frame(frame)->f_code; }

PyObject** fj_frame_localsplus(FjFrame* frame) { return as_frame(frame)->localsplus; }

PyObject* fj_frame_globals(FjFrame* frame) { return as_frame(frame)->f_globals; }

PyObject* fj_frame_builtins(FjFrame* frame) { return as_frame(frame)->f_builtins; }

PyObject* fj_frame_function(FjFrame* frame) {
#if PY_VERSION_HEX >= 0x030C0000
  return as_frame(frame)->f_funcobj;
#else
  return (PyObject*)as_frame(frame)->f_func;
#endif
}

int fj_frame_has_locals_dict(FjFrame* frame) { return as_frame(frame)->f_locals != NULL; }

int fj_tracing_active(PyThreadState* tstate) {
#if PY_VERSION_HEX >= 0x030C0000
  return tstate->c_tracefunc != NULL || tstate->c_profilefunc != NULL;
#else
  return tstate->cframe->use_tracing != 0;
#endif
}
