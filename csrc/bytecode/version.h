// Every bytecode difference between supported Python versions that the tracer must know.
// The tracer calls these instead of testing PY_VERSION_HEX itself.
#pragma once

#include <Python.h>

#include <cstdint>

namespace framejit::pyver {

// 3.12 and later (3.13 included).
#if PY_VERSION_HEX >= 0x030C0000
constexpr bool kIs312 = true;
#else
constexpr bool kIs312 = false;
#endif
// 3.13 and later.
#if PY_VERSION_HEX >= 0x030D0000
constexpr bool kIs313 = true;
#else
constexpr bool kIs313 = false;
#endif

// COMPARE_OP: 3.12 keeps the comparison in the high bits; 3.13 moves it one bit further up
// and uses bit 4 for "convert the result to bool" (set where a conditional jump follows).
inline int compare_op(int arg) { return kIs313 ? (arg >> 5) : kIs312 ? (arg >> 4) : arg; }
inline bool compare_to_bool(int arg) { return kIs313 && (arg & 16) != 0; }
// LOAD_GLOBAL: the name index, and whether a NULL is pushed with the value.
inline int load_global_name(int arg) { return arg >> 1; }
inline bool load_global_pushes_null(int arg) { return (arg & 1) != 0; }
// LOAD_ATTR: 3.12 folds LOAD_METHOD into LOAD_ATTR with the low bit set.
inline int load_attr_name(int arg) { return kIs312 ? (arg >> 1) : arg; }
inline bool load_attr_is_method(int arg) { return kIs312 && (arg & 1) != 0; }

// 3.12+: every generator's body is covered by a handler that turns a StopIteration leaking out
// of it into RuntimeError (CALL_INTRINSIC_1 INTRINSIC_STOPITERATION_ERROR, then RERAISE); any
// other exception, GeneratorExit included, passes through it unchanged. 3.11 has none.
inline bool is_generator_stop_handler(int op_is_call_intrinsic_1, int arg) {
  constexpr int kStopIterationError = 3;  // INTRINSIC_STOPITERATION_ERROR
  return kIs312 && op_is_call_intrinsic_1 && arg == kStopIterationError;
}

// The two stack entries under a call's arguments. 3.11 and 3.12: [NULL, callable] or
// [method, self]; 3.13: [callable, NULL] or [method, self], so the NULL that LOAD_GLOBAL,
// LOAD_ATTR and PUSH_NULL add goes above the callable. The tracer keeps CPython's layout (a
// region's exit hands its stack to CPython), and these say where.
constexpr bool kNullAboveCallable = kIs313;

// FOR_ITER on an exhausted iterator pops it and jumps; 3.12 also skips the END_FOR at target,
// 3.13 the END_FOR and the POP_TOP after it.
inline int for_iter_exhausted_pc(int target) {
  return kIs313 ? target + 2 : kIs312 ? target + 1 : target;
}
// SEND (`yield from`) on a returning receiver: 3.11 replaces the receiver with the return value;
// 3.12 pushes it above the receiver, which the END_SEND at the target pops.
constexpr bool kSendKeepsReceiver = kIs312;

// Whether a class's attribute version tag is valid: 3.11 and 3.12 flag it
// (Py_TPFLAGS_VALID_VERSION_TAG); 3.13 no longer sets the flag, and a valid tag is a nonzero one.
inline bool type_version_valid(PyTypeObject* type) {
  if constexpr (kIs313) return type->tp_version_tag != 0;
  return PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG);
}

// `name` looked up on a class (_PyType_Lookup: Borrowed, NULL when absent), giving the class a
// version tag if it has none and can have one: before 3.13 the lookup itself assigns it, 3.13
// has an API for it.
inline PyObject* type_lookup_tagging(PyTypeObject* type, PyObject* name) {
  PyObject* found = _PyType_Lookup(type, name);
#if PY_VERSION_HEX >= 0x030D0000
  if (type->tp_version_tag == 0) PyUnstable_Type_AssignVersionTag(type);
#endif
  return found;
}

// A dict's version tag (3.11, 3.12): a fresh value from a global counter whenever a dict is
// created or changed, so (address, tag) names one unchanged dict. 3.12 deprecates the field
// (it keeps watcher bits in its low byte) but still maintains it.
inline uint64_t dict_version(PyObject* dict) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#pragma GCC diagnostic pop
}
// Whether every write into `dict` gives it a new version tag. 3.13 stores an instance attribute
// straight into the object's inline values, which its materialised __dict__ shares (a split
// table), and leaves the dict's tag as it was; a combined table (module globals, a dict made by
// the program) still gets a new tag on every write.
inline bool dict_version_tracks_writes(PyObject* dict) {
  if constexpr (kIs313) return reinterpret_cast<PyDictObject*>(dict)->ma_values == nullptr;
  return true;
}

// What a weakref.ref refers to (New), None where it is dead; NULL with an exception set for
// an object that is no weakref. 3.13 deprecates PyWeakref_GetObject (a borrowed reference).
inline PyObject* weakref_target(PyObject* ref) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* target = nullptr;
  if (PyWeakref_GetRef(ref, &target) < 0) return nullptr;
  return target != nullptr ? target : Py_NewRef(Py_None);
#else
  return Py_XNewRef(PyWeakref_GetObject(ref));
#endif
}

}  // namespace framejit::pyver
