// Python objects the tracer and runtime use over and over, looked up once at import.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/py.h"
#include "trace/kinds.h"

namespace framejit {

struct PyRefs {
  py::object torch;
  py::object tensor_type;      // torch.Tensor
  py::object size_type;        // torch.Size
  py::object finfo_type;       // torch.finfo, torch.iinfo: immutable, constants of the trace
  py::object iinfo_type;
  py::object device_type;      // torch.device
  py::object dtype_type;       // torch.dtype
  py::object meta_device;      // torch.device("meta")
  py::object module_type;      // torch.nn.Module
  py::object cpu_device;       // torch.device("cpu")
  py::object operator_module;  // operator
  py::object support;          // framejit._support: the Python half of tracing decisions
  py::object unsupported_error;  // framejit.Unsupported
  py::object warning_category;   // framejit.FramejitWarning
  py::object partial_type;       // functools.partial
  py::object lru_cache_type;     // functools._lru_cache_wrapper (@functools.cache / lru_cache)
  py::object generator_type;     // types.GeneratorType
  py::object signature;          // inspect.signature
  py::object environ;            // os.environ
  py::object mapping_get;        // collections.abc.Mapping.get
  py::object autograd_function;  // torch.autograd.Function
  py::object defaultdict_type;   // collections.defaultdict
  py::object ordered_dict_type;  // collections.OrderedDict
  py::object deque_type;         // collections.deque
  py::object enum_type;          // enum.Enum: its members are singletons, fixed with their class
  py::object enum_meta;          // enum.EnumMeta (EnumType), the metaclass of Enum classes
  py::object function_apply;     // torch.autograd.Function.apply's function (a classmethod's)
  py::object nn_module_module;   // torch.nn.modules.module (its global hook dicts)
  // torch._C._autograd._saved_tensors_hooks_set_tracing(bool) -> bool (the previous setting):
  // while on, saved-tensor hooks (checkpoint's, save_on_cpu's) do not see the trace's tensors.
  py::object saved_hooks_set_tracing;
  py::object version_probe;      // an interned name looked up to make CPython assign a type tag

  // Initialised by module init; part of the module state (TraceState), never destroyed
  // (interpreter teardown order).
  static PyRefs& get();
  static void init(py::object support_module);

  // An Enum member (Mode.TRAIN, an IntEnum's), or an Enum class.
  bool is_enum_member(PyObject* obj) const {
    return PyObject_TypeCheck(reinterpret_cast<PyObject*>(Py_TYPE(obj)),
                              reinterpret_cast<PyTypeObject*>(enum_meta.ptr()));
  }
  bool is_enum_class(PyObject* obj) const {
    return PyType_Check(obj) && PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(enum_meta.ptr()));
  }

  // Cached per object: framejit._support.classify_callable(fn).
  CallableKind classify(py::handle fn);
  void forget(py::handle fn) { classify_cache_.erase(fn.ptr()); }
  // Cached per object: the printed name of a call target ("torch.add", "torch.nn.functional.relu").
  const std::string& target_text(py::handle fn);
  // Cached per dtype object: "f32", "i64", ...
  const std::string& short_dtype(py::handle dtype);
  // The same name by c10::ScalarType code, for a tensor whose code was read in C++ (the tensor's
  // dtype is looked up in Python once per code).
  const std::string& short_dtype_of(int8_t code, py::handle tensor);

 private:
  std::unordered_map<PyObject*, std::pair<py::object, CallableKind>> classify_cache_;
  std::unordered_map<PyObject*, std::pair<py::object, std::string>> target_cache_;
  std::unordered_map<PyObject*, std::pair<py::object, std::string>> dtype_cache_;
  std::string dtype_by_code_[128];
};

}  // namespace framejit
