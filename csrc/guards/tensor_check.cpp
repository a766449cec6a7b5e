// The only translation unit that includes libtorch: tensor guards read at::Tensor fields directly,
// without Python attribute access (this is on every call's hot path).
#include "guards/tensor_check.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>
#include <c10/core/DefaultDtype.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <sstream>

namespace framejit {

bool is_tensor(PyObject* obj) { return THPVariable_Check(obj); }

bool tensor_size(PyObject* obj, int dim, int64_t& out) {
  if (obj == nullptr || !THPVariable_Check(obj)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (dim < 0 || dim >= t.dim()) return false;
  out = t.sizes()[dim];
  return true;
}

namespace {

// False for an inference tensor and for one whose `.data` was set from a normal tensor: that one
// keeps the inference tensor's missing version counter (in-place writes into it outside
// inference mode write and then raise), though its dispatch keys are a normal tensor's.
bool keeps_version_counter(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->version_counter().enabled();
}

// Whether the strides are those of a dense tensor whose dimensions, outermost first, are
// `order` (a size-1 dimension may have any stride, as in torch's contiguity check).
bool dense_in_order(at::IntArrayRef sizes, at::IntArrayRef strides,
                    const std::vector<int32_t>& order) {
  int64_t expected = 1;
  for (size_t i = order.size(); i-- > 0;) {
    const int32_t dim = order[i];
    if (sizes[dim] != 1 && strides[dim] != expected) return false;
    expected *= sizes[dim];
  }
  return true;
}

}  // namespace

TensorSpec tensor_spec_of(PyObject* obj) {
  const at::Tensor& t = THPVariable_Unpack(obj);
  TensorSpec spec;
  spec.type = Py_TYPE(obj);
  spec.dtype = static_cast<int8_t>(t.scalar_type());
  spec.device_type = static_cast<int8_t>(t.device().type());
  spec.device_index = t.device().index();
  spec.requires_grad = t.requires_grad();
  spec.dispatch_keys = t.key_set().raw_repr();
  spec.versioned = keeps_version_counter(t);
  spec.sizes.assign(t.sizes().begin(), t.sizes().end());
  spec.strides.assign(t.strides().begin(), t.strides().end());
  return spec;
}

bool tensor_matches(const TensorSpec& spec, PyObject* obj) {
  if (Py_TYPE(obj) != spec.type) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  const size_t ndim = static_cast<size_t>(t.dim());
  if (ndim != spec.sizes.size()) return false;
  if (static_cast<int8_t>(t.scalar_type()) != spec.dtype) return false;
  const c10::Device device = t.device();
  if (static_cast<int8_t>(device.type()) != spec.device_type ||
      device.index() != spec.device_index) {
    return false;
  }
  if (t.requires_grad() != spec.requires_grad) return false;
  if (t.key_set().raw_repr() != spec.dispatch_keys) return false;
  if (keeps_version_counter(t) != spec.versioned) return false;
  const auto sizes = t.sizes();
  if (spec.any_sizes) {
    for (int32_t dim : spec.fixed_dims) {
      if (sizes[dim] != spec.sizes[dim]) return false;
    }
    for (const TensorSpec::DimRange& range : spec.ranges) {
      if (!range.holds(sizes[range.dim])) return false;
    }
    return !spec.dense_layout || dense_in_order(sizes, t.strides(), spec.stride_order);
  }
  const auto strides = t.strides();
  for (size_t i = 0; i < ndim; ++i) {
    if (sizes[i] != spec.sizes[i] || strides[i] != spec.strides[i]) return false;
  }
  return true;
}

namespace {

std::string join(const std::vector<int64_t>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

std::string range_text(const TensorSpec::DimRange& range) {
  return (range.outside ? "outside [" : "in [") +
         (range.lo == INT64_MIN ? std::string("-inf") : std::to_string(range.lo)) + ", " +
         (range.hi == INT64_MAX ? std::string("inf") : std::to_string(range.hi)) + "]";
}

}  // namespace

std::string tensor_mismatch(const TensorSpec& spec, PyObject* obj) {
  if (!is_tensor(obj)) return std::string("expected a tensor, got ") + Py_TYPE(obj)->tp_name;
  if (Py_TYPE(obj) != spec.type) {
    return std::string("type changed: expected ") + spec.type->tp_name + ", got " +
           Py_TYPE(obj)->tp_name;
  }
  const TensorSpec now = tensor_spec_of(obj);
  std::ostringstream out;
  if (now.sizes.size() != spec.sizes.size()) {
    out << "rank changed: expected " << spec.sizes.size() << ", got " << now.sizes.size();
  } else if (now.dtype != spec.dtype) {
    out << "dtype changed: expected " << c10::toString(static_cast<c10::ScalarType>(spec.dtype))
        << ", got " << c10::toString(static_cast<c10::ScalarType>(now.dtype));
  } else if (now.device_type != spec.device_type || now.device_index != spec.device_index) {
    out << "device changed";
  } else if (now.requires_grad != spec.requires_grad) {
    out << "requires_grad changed: expected " << spec.requires_grad;
  } else if (now.dispatch_keys != spec.dispatch_keys) {
    out << "dispatch keys changed";
  } else if (now.versioned != spec.versioned) {
    out << (spec.versioned ? "lost its version counter (made from an inference tensor)"
                           : "has a version counter now");
  } else if (spec.any_sizes) {
    for (int32_t dim : spec.fixed_dims) {
      if (now.sizes[dim] != spec.sizes[dim]) {
        out << "size(" << dim << ") changed: expected " << spec.sizes[dim] << ", got "
            << now.sizes[dim];
        return out.str();
      }
    }
    for (const TensorSpec::DimRange& range : spec.ranges) {
      if (!range.holds(now.sizes[range.dim])) {
        out << "size(" << range.dim << ") = " << now.sizes[range.dim] << " is not "
            << range_text(range);
        return out.str();
      }
    }
    if (spec.dense_layout && !dense_in_order(now.sizes, now.strides, spec.stride_order)) {
      out << "layout changed: strides " << join(now.strides) << " are not dense in the traced order";
    } else {
      out << "matches";
    }
  } else if (now.sizes != spec.sizes) {
    out << "sizes changed: expected " << join(spec.sizes) << ", got " << join(now.sizes);
  } else if (now.strides != spec.strides) {
    out << "strides changed: expected " << join(spec.strides) << ", got " << join(now.strides);
  } else {
    out << "matches";
  }
  return out.str();
}

std::string tensor_spec_text(const TensorSpec& spec) {
  std::ostringstream out;
  out << spec.type->tp_name << " " << c10::toString(static_cast<c10::ScalarType>(spec.dtype))
      << " " << c10::Device(static_cast<c10::DeviceType>(spec.device_type), spec.device_index)
      << " sizes=" << join(spec.sizes) << " strides=" << join(spec.strides)
      << (spec.any_sizes ? " (any sizes of this rank" : "");
  for (size_t i = 0; spec.any_sizes && i < spec.fixed_dims.size(); ++i) {
    const int32_t dim = spec.fixed_dims[i];
    out << (i ? ", " : " with ") << "size(" << dim << ") = " << spec.sizes[dim];
  }
  for (size_t i = 0; spec.any_sizes && i < spec.ranges.size(); ++i) {
    out << ((i || !spec.fixed_dims.empty()) ? ", " : " with ") << "size(" << spec.ranges[i].dim
        << ") " << range_text(spec.ranges[i]);
  }
  out << (spec.any_sizes ? ")" : "") << (spec.dense_layout ? " dense" : "") << " requires_grad=" << (spec.requires_grad ? "True" : "False");
  return out.str();
}

void restore_global_torch_state(const GlobalTorchState& state) {
  c10::GradMode::set_enabled(state.grad_enabled);
  // Autocast entered by a graph that raised (its _enter_autocast nodes hold no RAII guard).
  const GlobalTorchState now = current_global_torch_state();
  if (now == state) return;
  auto restore = [](c10::DeviceType device, int8_t enabled_dtype, int8_t dtype) {
    at::autocast::set_autocast_enabled(device, enabled_dtype >= 0);
    at::autocast::set_autocast_dtype(device, static_cast<c10::ScalarType>(dtype));
  };
  restore(at::kCPU, state.autocast_cpu, state.autocast_default_cpu);
  restore(at::kCUDA, state.autocast_cuda, state.autocast_default_cuda);
  if (!state.autocast()) {  // no autocast at the entry: no block is open any more
    while (at::autocast::decrement_nesting() > 0) {
    }
    at::autocast::clear_cache();
  }
}

void append_tensor_key(PyObject* obj, std::string& key) {
  const at::Tensor& t = THPVariable_Unpack(obj);
  key += 'T';
  key += std::to_string(static_cast<int>(t.scalar_type()));
  for (int64_t size : t.sizes()) key += ',' + std::to_string(size);
  key += ';';
  for (int64_t stride : t.strides()) key += ',' + std::to_string(stride);
  key += '+' + std::to_string(t.storage_offset());
  key += t.requires_grad() ? 'g' : 'n';
}

MetaShape meta_shape_of(PyObject* obj) {
  const at::Tensor& t = THPVariable_Unpack(obj);
  MetaShape shape;
  shape.sizes.assign(t.sizes().begin(), t.sizes().end());
  shape.strides.assign(t.strides().begin(), t.strides().end());
  shape.dtype = static_cast<int8_t>(t.scalar_type());
  shape.requires_grad = t.requires_grad();
  shape.is_leaf = t.is_leaf();
  shape.dense = t.is_non_overlapping_and_dense();
  shape.storage_offset = t.storage_offset();
  return shape;
}

std::vector<int32_t> dense_stride_order(const std::vector<int64_t>& sizes,
                                        const std::vector<int64_t>& strides) {
  std::vector<int32_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  // Outermost first: larger strides first, ties (size-1 dimensions) in dimension order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return strides[a] > strides[b]; });
  if (!dense_in_order(sizes, strides, order)) return {};
  return order;
}

bool tensor_is_dense(PyObject* obj) {
  if (obj == nullptr || !THPVariable_Check(obj)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (t.layout() != c10::kStrided || t.dim() == 0) return false;
  const std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  const std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
  return !dense_stride_order(sizes, strides).empty();
}

void tensor_sizes_and_dtype(PyObject* obj, std::vector<int64_t>& sizes, int8_t& dtype) {
  const at::Tensor& t = THPVariable_Unpack(obj);
  sizes.assign(t.sizes().begin(), t.sizes().end());
  dtype = static_cast<int8_t>(t.scalar_type());
}

int64_t tensor_version(PyObject* obj) {
  try {
    if (!THPVariable_Check(obj)) return -1;  // may ask isinstance, which may raise
  } catch (const std::exception&) {
    PyErr_Clear();
    return -1;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!keeps_version_counter(t)) return -1;  // inference tensors and those made from them
  try {
    return static_cast<int64_t>(t._version());
  } catch (const c10::Error&) {
    return -1;
  }
}

PyObject* tensor_snapshot(PyObject* obj) {
  try {
    c10::NoGradGuard no_grad;
    return THPVariable_Wrap(THPVariable_Unpack(obj).detach().clone());
  } catch (const std::exception&) {
    PyErr_Clear();
    return nullptr;
  }
}

bool tensor_restore(PyObject* obj, PyObject* snapshot) {
  try {
    at::Tensor dst = THPVariable_Unpack(obj);
    // Inference mode where an inference tensor (or one made from it) takes writes
    // (InferenceMode(false) turns grad mode on: the no-grad guard comes after it).
    c10::InferenceMode mode(!keeps_version_counter(dst));
    c10::NoGradGuard no_grad;
    dst.copy_(THPVariable_Unpack(snapshot));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool tensors_share_storage(PyObject* a, PyObject* b) {
  if (!THPVariable_Check(a) || !THPVariable_Check(b)) return false;
  try {
    return THPVariable_Unpack(a).is_alias_of(THPVariable_Unpack(b));
  } catch (const std::exception&) {
    return false;
  }
}

bool tensor_has_history(PyObject* obj) {
  return THPVariable_Check(obj) && THPVariable_Unpack(obj).grad_fn() != nullptr;
}

std::string device_text(PyObject* device) {
  if (!THPDevice_Check(device)) return {};
  return reinterpret_cast<THPDevice*>(device)->device.str();
}

PyObject* make_meta_tensor(const MetaShape& shape) {
  at::Tensor t = at::empty_strided(
      shape.sizes, shape.strides,
      at::TensorOptions().dtype(static_cast<c10::ScalarType>(shape.dtype)).device(c10::kMeta));
  if (shape.requires_grad) {
    t.set_requires_grad(true);
    if (!shape.is_leaf && shape.dense) {
      // A clone has a grad_fn and keeps the strides: a non-leaf like the op's own result.
      at::AutoGradMode grad(true);
      t = t.clone(at::MemoryFormat::Preserve);
    }
  }
  return THPVariable_Wrap(std::move(t));
}

PyObject* meta_like(PyObject* tensor) {
  const at::Tensor& t = THPVariable_Unpack(tensor);
  if (t.layout() != c10::kStrided || t.is_quantized() || t.is_nested() || t.is_mkldnn()) {
    return nullptr;
  }
  MetaShape shape = meta_shape_of(tensor);
  shape.storage_offset = 0;
  // An inference tensor stands for one, any other tensor not, whatever the mode while tracing
  // (an argument first read inside `with torch.inference_mode():`).
  c10::InferenceMode mode(t.is_inference());
  return make_meta_tensor(shape);
}

bool is_plain_tensor_type(PyObject* obj) {
  return THPVariable_CheckExact(obj);
}

GlobalTorchState current_global_torch_state() {
  GlobalTorchState state;
  state.grad_enabled = c10::GradMode::is_enabled();
  state.default_dtype = static_cast<int8_t>(c10::get_default_dtype_as_scalartype());
  state.autocast_default_cpu = static_cast<int8_t>(at::autocast::get_autocast_dtype(at::kCPU));
  state.autocast_default_cuda = static_cast<int8_t>(at::autocast::get_autocast_dtype(at::kCUDA));
  if (at::autocast::is_autocast_enabled(at::kCPU)) state.autocast_cpu = state.autocast_default_cpu;
  if (at::autocast::is_autocast_enabled(at::kCUDA)) state.autocast_cuda = state.autocast_default_cuda;
  return state;
}

}  // namespace framejit
