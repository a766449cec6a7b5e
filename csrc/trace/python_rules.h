// How the trace treats the Python values and callables it meets: shared rules of the handler
// families (access.cpp, calls.cpp, torch_calls.cpp), not state of a trace.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "common/py.h"
#include "trace/kinds.h"
#include "trace/value.h"

namespace framejit {

// A value read from somewhere the guards do not cover (a torch namespace, a class attribute):
// constants for None/numbers/str/dtype/device, else an object used by reference.
ValuePtr wrap_unsourced(py::object value);

// Data of a class read at trace time, unguarded, as its methods are (a dataclass's
// __dataclass_fields__ and its Field objects, a registry of validator functions): a dict or
// list becomes a copy no write may change (a tuple, one of the same items), an object a
// `frozen` kObject whose own attributes (a function: its closure's contents) are read the
// same way.
ValuePtr class_data(py::object value);

// A method call's receiver: self bound to the function's value (LOAD_ATTR), or the first argument
// (after LOAD_METHOD); `at`: where the method's own arguments start. `self` is null for a call
// with neither.
struct MethodReceiver {
  ValuePtr self;
  size_t at = 0;
};
inline MethodReceiver method_receiver(const ValuePtr& fn, const std::vector<ValuePtr>& args) {
  if (fn->bound_self) return {fn->bound_self, 0};
  return {args.empty() ? nullptr : args[0], 1};
}

// Whether a guard can compare this key (of a dict read by source) or item (of a set read by
// source) by value: str, int, bool or None.
inline bool guard_comparable(PyObject* obj) {
  return PyUnicode_CheckExact(obj) || PyLong_CheckExact(obj) || PyBool_Check(obj) || obj == Py_None;
}

// numpy.ndarray: the type of a NumPy array of the trace (numpy_calls.cpp; NumPy imported then).
py::object ndarray_type();

// The Python type a traced value has at run time (tensors: their exact type).
py::object type_of(const ValuePtr& value);

// What a defaultdict's factory makes for a missing key, as a fresh value of the trace (list,
// dict, tuple, int, float, bool, str); nullptr for None and for factories the trace cannot call
// here.
ValuePtr defaultdict_factory_made(py::handle factory);

// A function-like class attribute resolved for `self` by framejit._support (is_function_like),
// bound as Python binds it: methods and property getters to self, classmethods to self's class.
// A plain function read off the class of `read_through` (or off `read_through`, a class), a value
// with a source, as `name`, remembers where (Value::class_of): its closure is read through it.
// Borrowed: fn.
ValuePtr bind_class_attribute(AttrKind kind, py::handle fn, const ValuePtr& self,
                              const ValuePtr& read_through = nullptr, const std::string& name = {});

// The items a value yields when iterated, if the trace knows them one by one (tuples, lists,
// an unrolled iterator's remaining items, constant tuples and ranges). Reading does not consume
// an iterator: the caller marks it exhausted once the use is traced.
bool iterable_items(const ValuePtr& v, std::vector<ValuePtr>& out);

// A constant set the trace made (not one read by source), which may be iterated in the order
// Python iterates it now: the same items inserted the same way give that order again. Equal
// sets read by source may iterate in other orders, which no guard on their value sees.
bool ordered_set(const ValuePtr& v);

// Whether the last dotted part of `text` ("split" of "torch.split", or a bare method name) is
// one of `names`.
bool base_name_in(const std::string& text, std::initializer_list<const char*> names);

// A dict, or a dict subclass whose item reads are dict's own (no __getitem__ of its own: a
// registry class): its items read by source are its raw items. Borrowed: obj.
bool reads_items_as_dict(PyObject* obj);

// What the Tensor method `name` is to the tracer (cached _support.tensor_method_kind).
TensorMethodKind tensor_method_kind(const std::string& name);

}  // namespace framejit
