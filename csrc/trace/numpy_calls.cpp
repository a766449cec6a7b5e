// NumPy in traced code: an array the trace makes (x.numpy(), a NumPy call on one) is a tensor
// value marked `ndarray`. Every NumPy function, method, operator or attribute applied to it is a
// graph node whose target runs torch._numpy's version on tensors (python/framejit/_numpy.py), so
// the graph keeps NumPy's semantics and a backend tracing it sees torch ops. The exit turns the
// arrays that leave the region into np.ndarrays (ExitBuilder). Mixing an array with a torch
// tensor, or handing one to a torch function other than the conversions, ends the region.
#include "common/check.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

py::object numpy_module() {
  static PyObject* const kModule =  // (never released: interpreter teardown order)
      py::module_::import("framejit._numpy").release().ptr();
  return py::reinterpret_borrow<py::object>(kModule);
}

// The same graph value as an array (x.numpy() shares x's memory). An input's source stays: the
// exit reads the tensor from it.
ValuePtr as_array(const ValuePtr& tensor) {
  ValuePtr out = std::make_shared<Value>(*tensor);
  out->ndarray = true;
  out->pytype = py::object();
  return out;
}

// Marks the tensors a NumPy node gave as arrays (a tuple of arrays for np.split, ...).
ValuePtr mark_arrays(const ValuePtr& result) {
  if (result->kind == VKind::kTensor) {
    result->ndarray = true;
    return result;
  }
  for (const ValuePtr& item : result->items) mark_arrays(item);
  return result;
}

bool holds_plain_tensor(const ValuePtr& value) {
  if (value->kind == VKind::kTensor) return !value->ndarray;
  for (const ValuePtr& item : value->items) {
    if (holds_plain_tensor(item)) return true;
  }
  return false;
}

void no_plain_tensors(const std::vector<ValuePtr>& args, const KwValues& kwargs, const std::string& what) {
  for (const ValuePtr& arg : args) {
    if (holds_plain_tensor(arg)) FJ_UNSUPPORTED(kUnsupportedCall, "{} of a NumPy array and a torch tensor", what);
  }
  for (const auto& kw : kwargs) {
    if (holds_plain_tensor(kw.second)) FJ_UNSUPPORTED(kUnsupportedCall, "{} of a NumPy array and a torch tensor", what);
  }
}

}  // namespace

py::object ndarray_type() { return numpy_module().attr("np").attr("ndarray"); }

bool Tracer::holds_ndarray(const ValuePtr& value) {
  if (value->kind == VKind::kTensor) return value->ndarray;
  for (const ValuePtr& item : value->items) {
    if (holds_ndarray(item)) return true;
  }
  return false;
}

ValuePtr Tracer::tensor_to_numpy(const ValuePtr& tensor, const std::vector<ValuePtr>& args,
                                 const KwValues& kwargs) {
  bool force = false;
  if (args.size() == 2 && kwargs.empty()) {
    if (!args[1]->is_const() || !PyBool_Check(args[1]->obj.ptr())) FJ_UNSUPPORTED(kUnsupportedCall, "Tensor.numpy({})", args[1]->describe());
    force = args[1]->obj.ptr() == Py_True;
  } else if (args.size() == 1 && kwargs.size() == 1 && kwargs[0].first == "force" && kwargs[0].second->is_const()) {
    force = kwargs[0].second->obj.ptr() == Py_True;
  } else if (args.size() != 1 || !kwargs.empty()) {
    FJ_UNSUPPORTED(kUnsupportedCall, "Tensor.numpy() with these arguments");
  }
  if (tensor->ndarray) FJ_UNSUPPORTED(kUnsupportedCall, "numpy() of a NumPy array");
  ValuePtr source = tensor;
  const bool cpu = py::str(tensor->device.attr("type")).cast<std::string>() == "cpu";
  const bool grad = tensor->obj.attr("requires_grad").cast<bool>();
  if (!force && (!cpu || grad)) {
    // Eager raises here (a tensor that requires grad, or not on the CPU): left to it.
    FJ_UNSUPPORTED(kUnsupportedCall, "Tensor.numpy() of a tensor {}", grad ? "that requires grad" : "not on the CPU");
  }
  if (force && grad) source = record_call(NodeKind::kCallMethod, py::none(), "detach", {source}, {}, "", "detach");
  if (force && !cpu) source = record_call(NodeKind::kCallMethod, py::none(), "cpu", {source}, {}, "", "cpu");
  return as_array(source);
}

ValuePtr Tracer::numpy_function_call(py::handle fn, const std::vector<ValuePtr>& args, const KwValues& kwargs,
                                     bool has_array) {
  PyRefs& refs = PyRefs::get();
  py::object torch = refs.torch;
  if (has_array && (fn.is(torch.attr("from_numpy")) || fn.is(torch.attr("as_tensor")) ||
                    fn.is(torch.attr("asarray")) || fn.is(torch.attr("tensor")))) {
    // torch.from_numpy(a) / as_tensor(a) share a's memory: the same graph value as a tensor;
    // torch.tensor(a) copies it. Any other argument (dtype=, device=) is a conversion after.
    if (args.empty() || args[0]->kind != VKind::kTensor || !args[0]->ndarray) {
      FJ_UNSUPPORTED(kUnsupportedCall, "a torch conversion of a structure holding NumPy arrays");
    }
    ValuePtr tensor = Value::plain_tensor(args[0]);
    if (fn.is(torch.attr("tensor"))) {
      tensor = record_call(NodeKind::kCallMethod, py::none(), "clone", {tensor}, {}, "", "clone");
    }
    if (args.size() > 1 || !kwargs.empty()) {
      if (fn.is(torch.attr("from_numpy"))) FJ_UNSUPPORTED(kUnsupportedCall, "torch.from_numpy() with more arguments");
      KwValues to_kwargs;
      for (const auto& kw : kwargs) {
        if (kw.first != "dtype" && kw.first != "device") FJ_UNSUPPORTED(kUnsupportedCall, "torch conversion with {}=", kw.first);
        to_kwargs.push_back(kw);
      }
      if (args.size() > 1) FJ_UNSUPPORTED(kUnsupportedCall, "torch conversion with positional arguments");
      tensor = record_call(NodeKind::kCallMethod, py::none(), "to", {tensor}, std::move(to_kwargs), "", "to");
    }
    return tensor;
  }
  py::object target = numpy_module().attr("function_target")(fn, py::bool_(has_array));
  if (target.is_none()) {
    if (has_array) {
      FJ_UNSUPPORTED(kUnsupportedCall, "{}() of a NumPy array is not traced",
                     py::str(py::getattr(fn, "__name__", py::str("?"))).cast<std::string>());
    }
    return nullptr;
  }
  no_plain_tensors(args, kwargs, "numpy." + py::str(target.attr("__qualname__")).cast<std::string>());
  return mark_arrays(record_call(NodeKind::kCallFunction, target, "", args, kwargs, "",
                                 py::str(target.attr("__name__")).cast<std::string>()));
}

ValuePtr Tracer::ndarray_method(const std::string& name, const std::vector<ValuePtr>& args,
                                const KwValues& kwargs) {
  py::object target = numpy_module().attr("method_target")(name);
  if (target.is_none()) FJ_UNSUPPORTED(kUnsupportedCall, "ndarray.{}() is not traced", name);
  no_plain_tensors(args, kwargs, "ndarray." + name);
  ValuePtr result = record_call(NodeKind::kCallFunction, target, "", args, kwargs, "", name);
  if (result->kind == VKind::kTensor && result == args[0]) return result;  // (in place)
  return mark_arrays(result);
}

ValuePtr Tracer::ndarray_operator(const char* op, const std::vector<ValuePtr>& args) {
  no_plain_tensors(args, {}, std::string("operator.") + op);
  py::object target = numpy_module().attr("numpy_operator")(op);
  ValuePtr result = record_call(NodeKind::kCallFunction, target, "", args, {}, "", op);
  if (result->kind == VKind::kTensor) result->ndarray = true;
  return result;
}

ValuePtr Tracer::ndarray_attr(const ValuePtr& array, const std::string& name) {
  const py::object meta = array->obj;
  if (name == "shape") {
    ValuePtr shape = sizes_.tensor_shape(array, "ndarray.shape");
    if (shape->is_const()) {  // a plain tuple, as NumPy's
      return Value::constant(py::reinterpret_steal<py::object>(PySequence_Tuple(shape->obj.ptr())));
    }
    return Value::tuple(shape->items);
  }
  if (name == "ndim") return Value::constant(meta.attr("dim")());
  if (name == "size") return sizes_.tensor_numel(array);
  if (name == "dtype") return Value::constant(numpy_module().attr("numpy_dtype")(meta.attr("dtype")));
  if (name == "itemsize") return Value::constant(meta.attr("element_size")());
  if (name == "nbytes") {
    sizes_.note_sizes_read(array, "ndarray.nbytes");
    return Value::constant(py::int_(meta.attr("numel")().cast<int64_t>() * meta.attr("element_size")().cast<int64_t>()));
  }
  if (name == "T" || name == "mT" || name == "real" || name == "imag") {
    py::object target = numpy_module().attr("numpy_attribute")(name);
    return mark_arrays(record_call(NodeKind::kCallFunction, target, "", {array}, {}, "", name));
  }
  if (name == "__class__") return Value::object(ndarray_type());
  FJ_UNSUPPORTED(kUnsupportedValue, "attribute '{}' of a NumPy array is not traced", name);
}

}  // namespace framejit
