// Every bytecode difference between supported Python versions that the tracer must know.
// The tracer calls these instead of testing PY_VERSION_HEX itself.
#pragma once

#include <Python.h>

#include <cstdint>

namespace framejit::pyver {

#if PY_VERSION_HEX >= 0x030C0000
constexpr bool kIs312 = true;
#else
constexpr bool kIs312 = false;
#endif

// COMPARE_OP: 3.12 keeps the comparison in the high bits.
inline int compare_op(int arg) { return kIs312 ? (arg >> 4) : arg; }
// LOAD_GLOBAL: the name index, and whether a NULL is pushed before the value.
inline int load_global_name(int arg) { return arg >> 1; }
inline bool load_global_pushes_null(int arg) { return (arg & 1) != 0; }
// LOAD_ATTR: 3.12 folds LOAD_METHOD into LOAD_ATTR with the low bit set.
inline int load_attr_name(int arg) { return kIs312 ? (arg >> 1) : arg; }
inline bool load_attr_is_method(int arg) { return kIs312 && (arg & 1) != 0; }

// FOR_ITER on an exhausted iterator pops it and jumps; 3.12 also skips the END_FOR at target.
inline int for_iter_exhausted_pc(int target) { return kIs312 ? target + 1 : target; }

// A dict's version tag (3.11, 3.12): a fresh value from a global counter whenever a dict is
// created or changed, so (address, tag) names one unchanged dict. 3.12 deprecates the field
// (it keeps watcher bits in its low byte) but still maintains it.
inline uint64_t dict_version(PyObject* dict) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#pragma GCC diagnostic pop
}

}  // namespace framejit::pyver
