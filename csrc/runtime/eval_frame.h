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

/* Runs the frame in CPython's own evaluator. Returns a new reference or NULL. */
PyObject* fj_eval_default(PyThreadState* tstate, FjFrame* frame, int throwflag);

/* Frame accessors. All returned references are borrowed from the frame. */
PyCodeObject* fj_frame_code(FjFrame* frame);
PyObject** fj_frame_localsplus(FjFrame* frame);
PyObject* fj_frame_globals(FjFrame* frame);
PyObject* fj_frame_builtins(FjFrame* frame);
PyObject* fj_frame_function(FjFrame* frame);
/* Whether the frame executes with a locals dict (module and class bodies, exec). */
int fj_frame_has_locals_dict(FjFrame* frame);

/* Whether sys.settrace / sys.setprofile is active on this thread (then frames run unchanged). */
int fj_tracing_active(PyThreadState* tstate);

#ifdef __cplusplus
}
#endif

#endif
