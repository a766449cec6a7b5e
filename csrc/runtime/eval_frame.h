/* The narrow C API over CPython's internal frame: the only surface C++ code sees of it. */
#ifndef FRAMEJIT_EVAL_FRAME_H
#define FRAMEJIT_EVAL_FRAME_H

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An interpreter frame (_PyInterpreterFrame), opaque outside eval_frame.c. */
typedef struct FjFrame FjFrame;

/* Implemented in C++ (frame_runtime.cpp): decides what to do with each frame while the hook is
 * installed. Returns a new reference, or NULL with an exception set. */
PyObject* fj_on_frame(PyThreadState* tstate, FjFrame* frame, int throwflag);

/* Installs / removes the PEP 523 hook on the current interpreter. */
void fj_install_hook(void);
void fj_uninstall_hook(void);
int fj_hook_installed(void);

/* Runs a frame framejit does not run itself: in the eval-frame function installed before
 * framejit's (if any), else in CPython's own evaluator. Returns a new reference or NULL. */
PyObject* fj_eval_default(PyThreadState* tstate, FjFrame* frame, int throwflag);

/* Test probe of the chaining: 1 installs a counting eval-frame function (count reset), 2 removes
 * it, 3 says whether it is installed, 0 reads the count of frames it saw. */
long fj_testing_probe(int action);

/* Frame accessors. All returned references are borrowed from the frame. */
PyCodeObject* fj_frame_code(FjFrame* frame);
PyObject** fj_frame_localsplus(FjFrame* frame);
PyObject* fj_frame_globals(FjFrame* frame);
PyObject* fj_frame_builtins(FjFrame* frame);
PyObject* fj_frame_function(FjFrame* frame);
/* Whether the frame executes with a locals dict (module and class bodies, exec). */
int fj_frame_has_locals_dict(FjFrame* frame);

/* Deopt: pushes `n` values (stolen; NULL entries allowed) onto the frame's value stack and lets
 * CPython run the frame from code unit `pc`. With throwflag=1 the pending exception is raised at
 * the instruction at `pc`, so the frame's own except/finally and traceback apply. Returns New or
 * NULL. The frame's stack must be empty (it is: the runtime keeps the stack itself). */
PyObject* fj_frame_resume(PyThreadState* tstate, FjFrame* frame, int pc, PyObject** stack,
                          int n, int throwflag);

/* Ends the frame with `value` (stolen) as its result: the region stopped before the return
 * instruction at code unit `pc`, which returns the top of the stack (returns_top=1, RETURN_VALUE)
 * or its constant (0, RETURN_CONST; `value` is that constant). The frame is cleared and popped
 * under the version's rules for a frame the hook does not run to its end. Returns New or NULL. */
PyObject* fj_frame_return(PyThreadState* tstate, FjFrame* frame, int pc, PyObject* value,
                          int returns_top);

/* Makes the frame the thread's current frame, with its instruction pointer at code unit `pc`,
 * while the runtime calls out (so tracebacks, sys._getframe and logging see the user's line).
 * Must be paired with fj_frame_unlink. */
void fj_frame_link(PyThreadState* tstate, FjFrame* frame, int pc);
void fj_frame_unlink(PyThreadState* tstate, FjFrame* frame);

/* Number of localsplus entries (locals, cells, free variables) of the frame's code. */
int fj_frame_nlocalsplus(FjFrame* frame);

/* Whether sys.settrace / sys.setprofile is active on this thread (then frames run unchanged). */
int fj_tracing_active(PyThreadState* tstate);

/* How many units of C recursion the thread has left where the version counts them apart from
 * Python recursion (3.12: every evaluator entry and C-level call); INT_MAX where it does not. */
int fj_c_recursion_left(PyThreadState* tstate);

/* Number of localsplus entries of a code object (the frame's locals, cells and free variables). */
int fj_code_nlocalsplus(PyCodeObject* code);

/* The code objects' extra slots (co_extra), under each version's name for them: an index with its
 * free function, and get / set of a code object's pointer there (0, or -1 with an exception). */
Py_ssize_t fj_code_extra_index(freefunc free_extra);
int fj_code_get_extra(PyCodeObject* code, Py_ssize_t index, void** extra);
int fj_code_set_extra(PyCodeObject* code, Py_ssize_t index, void* extra);

#ifdef __cplusplus
}
#endif

#endif
