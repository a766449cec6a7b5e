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

/* 3.13 keeps the code object as f_executable (a code object for every frame the hook sees). */
static inline PyCodeObject* code_of(_PyInterpreterFrame* f) {
#if PY_VERSION_HEX >= 0x030D0000
  return (PyCodeObject*)f->f_executable;
#else
  return f->f_code;
#endif
}

static PyObject* fj_eval_frame(PyThreadState* tstate, _PyInterpreterFrame* frame, int throwflag) {
  return fj_on_frame(tstate, (FjFrame*)frame, throwflag);
}

static int g_installed = 0;
/* The eval-frame function installed before framejit's (a profiler, a debugger, another compiler):
 * frames framejit does not run itself go to it, and it is put back when framejit's hook comes
 * off. NULL: CPython's own. */
static _PyFrameEvalFunction g_previous = NULL;

void fj_install_hook(void) {
  PyInterpreterState* interp = PyThreadState_GET()->interp;
  _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
  if (current != &fj_eval_frame) {
    g_previous = current == &_PyEval_EvalFrameDefault ? NULL : current;
  }
  _PyInterpreterState_SetEvalFrameFunc(interp, &fj_eval_frame);
  g_installed = 1;
}

void fj_uninstall_hook(void) {
  PyInterpreterState* interp = PyThreadState_GET()->interp;
  /* One installed over framejit's since stays where it is. */
  if (_PyInterpreterState_GetEvalFrameFunc(interp) == &fj_eval_frame) {
    _PyInterpreterState_SetEvalFrameFunc(interp, g_previous ? g_previous : &_PyEval_EvalFrameDefault);
  }
  g_installed = 0;
}

int fj_hook_installed(void) { return g_installed; }

PyObject* fj_eval_default(PyThreadState* tstate, FjFrame* frame, int throwflag) {
  if (g_previous != NULL) return g_previous(tstate, as_frame(frame), throwflag);
  return _PyEval_EvalFrameDefault(tstate, as_frame(frame), throwflag);
}

/* A test probe: an eval-frame function of its own that counts the frames it sees and passes them
 * to CPython, to show that framejit chains to what was installed before it. */
static long g_probe_frames = 0;

static PyObject* probe_eval_frame(PyThreadState* tstate, _PyInterpreterFrame* frame, int throwflag) {
  ++g_probe_frames;
  return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
}

long fj_testing_probe(int action) {
  PyInterpreterState* interp = PyThreadState_GET()->interp;
  if (action == 1) {
    g_probe_frames = 0;
    _PyInterpreterState_SetEvalFrameFunc(interp, &probe_eval_frame);
  } else if (action == 2) {
    if (_PyInterpreterState_GetEvalFrameFunc(interp) == &probe_eval_frame) {
      _PyInterpreterState_SetEvalFrameFunc(interp, &_PyEval_EvalFrameDefault);
    }
  } else if (action == 3) {
    return _PyInterpreterState_GetEvalFrameFunc(interp) == &probe_eval_frame;
  }
  return g_probe_frames;
}

PyCodeObject* fj_frame_code(FjFrame* frame) { return code_of(as_frame(frame)); }

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

int fj_frame_nlocalsplus(FjFrame* frame) { return code_of(as_frame(frame))->co_nlocalsplus; }

int fj_code_nlocalsplus(PyCodeObject* code) { return code->co_nlocalsplus; }

/* 3.12 names the co_extra API PyUnstable_* (the underscore names are deprecated there). */
Py_ssize_t fj_code_extra_index(freefunc free_extra) {
#if PY_VERSION_HEX >= 0x030C0000
  return PyUnstable_Eval_RequestCodeExtraIndex(free_extra);
#else
  return _PyEval_RequestCodeExtraIndex(free_extra);
#endif
}

int fj_code_get_extra(PyCodeObject* code, Py_ssize_t index, void** extra) {
#if PY_VERSION_HEX >= 0x030C0000
  return PyUnstable_Code_GetExtra((PyObject*)code, index, extra);
#else
  return _PyCode_GetExtra((PyObject*)code, index, extra);
#endif
}

int fj_code_set_extra(PyCodeObject* code, Py_ssize_t index, void* extra) {
#if PY_VERSION_HEX >= 0x030C0000
  return PyUnstable_Code_SetExtra((PyObject*)code, index, extra);
#else
  return _PyCode_SetExtra((PyObject*)code, index, extra);
#endif
}

/* The instruction-pointer convention differs by version. 3.11 and 3.12 keep prev_instr, the
 * code unit before the next instruction to run; 3.13 keeps instr_ptr, the instruction running or
 * about to run. */
static void set_next_instruction(_PyInterpreterFrame* f, int pc, int raising) {
#if PY_VERSION_HEX >= 0x030D0000
  /* Resuming: CPython runs instr_ptr next. Raising: the error path looks the handler up at
   * instr_ptr - 1 (where a running instruction's own code units end), so instr_ptr is one unit
   * into the instruction that raised. */
  f->instr_ptr = _PyCode_CODE(code_of(f)) + pc + (raising ? 1 : 0);
#else
  /* Resuming: CPython runs prev_instr + 1 next. Raising: the error path reads the offset of the
   * instruction that raised from prev_instr itself. */
  f->prev_instr = _PyCode_CODE(code_of(f)) + pc - (raising ? 0 : 1);
#endif
}

/* The instruction being performed, as CPython shows it while inside it (tracebacks, f_lineno). */
static void set_current_instruction(_PyInterpreterFrame* f, int pc) {
#if PY_VERSION_HEX >= 0x030D0000
  f->instr_ptr = _PyCode_CODE(code_of(f)) + pc;
#else
  f->prev_instr = _PyCode_CODE(code_of(f)) + pc;
#endif
}

PyObject* fj_frame_resume(PyThreadState* tstate, FjFrame* frame, int pc, PyObject** stack,
                          int n, int throwflag) {
  _PyInterpreterFrame* f = as_frame(frame);
  const int base = code_of(f)->co_nlocalsplus;
  for (int i = 0; i < n; ++i) {
    f->localsplus[base + i] = stack[i]; /* stolen */
  }
  f->stacktop = base + n;
  set_next_instruction(f, pc, throwflag);
  return _PyEval_EvalFrameDefault(tstate, f, throwflag);
}

PyObject* fj_frame_return(PyThreadState* tstate, FjFrame* frame, int pc, PyObject* value,
                          int returns_top) {
#if PY_VERSION_HEX >= 0x030C0000
  /* 3.12 (and 3.13) moved the clearing and popping of a frame from the caller (_PyEval_Vector) into the
   * evaluator: a frame the hook answers without running must still be cleared (its locals
   * released, a frame object that outlives it given its own copy) and popped off the thread's
   * data stack. CPython does exactly that when it performs the return instruction, so the frame
   * runs that one instruction: RETURN_VALUE with the value on the stack, RETURN_CONST with none. */
  if (returns_top) return fj_frame_resume(tstate, frame, pc, &value, 1, 0);
  Py_DECREF(value);
  return fj_frame_resume(tstate, frame, pc, NULL, 0, 0);
#else
  /* 3.11: the caller clears and pops the frame after the eval-frame function returns. */
  (void)tstate;
  (void)frame;
  (void)pc;
  (void)returns_top;
  return value;
#endif
}

static _PyInterpreterFrame** current_frame_slot(PyThreadState* tstate) {
#if PY_VERSION_HEX >= 0x030D0000
  return &tstate->current_frame; /* 3.13 has no cframe */
#else
  return &tstate->cframe->current_frame;
#endif
}

void fj_frame_link(PyThreadState* tstate, FjFrame* frame, int pc) {
  _PyInterpreterFrame* f = as_frame(frame);
  _PyInterpreterFrame** current = current_frame_slot(tstate);
  f->previous = *current;
  *current = f;
  set_current_instruction(f, pc);
}

void fj_frame_unlink(PyThreadState* tstate, FjFrame* frame) {
  _PyInterpreterFrame* f = as_frame(frame);
  *current_frame_slot(tstate) = f->previous;
  f->previous = NULL;
}

int fj_tracing_active(PyThreadState* tstate) {
#if PY_VERSION_HEX >= 0x030C0000
  return tstate->c_tracefunc != NULL || tstate->c_profilefunc != NULL;
#else
  return tstate->cframe->use_tracing != 0;
#endif
}

int fj_c_recursion_left(PyThreadState* tstate) {
#if PY_VERSION_HEX >= 0x030C0000
  return tstate->c_recursion_remaining;
#else
  (void)tstate; /* 3.11 counts Python and C recursion together, against sys.getrecursionlimit() */
  return INT_MAX;
#endif
}
