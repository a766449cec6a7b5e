// Tensor metadata checks that read at::Tensor directly. The implementation is the one file that
// includes libtorch headers; this header is plain C++ so the rest of framejit compiles fast.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

namespace framejit {

// Everything a traced region assumed about one input tensor.
struct TensorSpec {
  PyTypeObject* type = nullptr;  // exact Python type (Tensor, Parameter, a subclass)
  int8_t dtype = 0;              // c10::ScalarType
  int8_t device_type = 0;        // c10::DeviceType
  int16_t device_index = -1;
  bool requires_grad = false;
  uint64_t dispatch_keys = 0;    // DispatchKeySet raw representation
  bool versioned = true;         // keeps a version counter (not one made from an inference tensor)
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  // Sizes and strides are not checked, only the rank: the trace read no size into Python and
  // the backend runs any size (see GuardSet::allow_any_sizes).
  bool any_sizes = false;
  // With any_sizes: the dimensions whose size is still checked (a size the trace read into
  // Python was computed from them).
  std::vector<int32_t> fixed_dims;
  // With any_sizes, for a graph compiled with symbolic sizes by a backend that relies on
  // strides (inductor): the tensor is still dense with its dimensions in the traced stride
  // order (`stride_order`, outermost first), so its strides follow from its sizes.
  bool dense_layout = false;
  std::vector<int32_t> stride_order;
  // With any_sizes: dims whose size must stay within [lo, hi] (a comparison the trace decided,
  // `assert t <= block_size`).
  struct DimRange {
    int32_t dim;
    int64_t lo, hi;
    bool outside = false;  // the size must lie outside [lo, hi] instead (`t != 1`)
    bool holds(int64_t size) const { return (size >= lo && size <= hi) != outside; }
  };
  std::vector<DimRange> ranges;
};

// Whether obj is a torch.Tensor (or subclass). Borrowed: obj.
bool is_tensor(PyObject* obj);

// obj.size(dim) into `out`; false if obj is no tensor or has no such dim. Borrowed: obj.
bool tensor_size(PyObject* obj, int dim, int64_t& out);

// Reads the spec of a tensor. Borrowed: obj, which must satisfy is_tensor.
TensorSpec tensor_spec_of(PyObject* obj);

// The hot-path check: one pass over the fields, cheapest and likeliest-to-differ first.
// Borrowed: obj (any object; non-tensors fail).
bool tensor_matches(const TensorSpec& spec, PyObject* obj);

// Why obj does not match, for the recompiles log ("size mismatch at dim 0: expected 3, got 4").
std::string tensor_mismatch(const TensorSpec& spec, PyObject* obj);

// Readable form for the guards log: "Tensor f32 cpu sizes=[2, 3] strides=[3, 1]".
std::string tensor_spec_text(const TensorSpec& spec);

// Tracing helpers that need at::Tensor (kept here so only this file includes libtorch):
// Appends a tensor's metadata (dtype, sizes, strides, storage offset, requires_grad) to `key`.
// Borrowed: obj, a tensor.
void append_tensor_key(PyObject* obj, std::string& key);
// What a meta result must reproduce: sizes, strides, dtype, requires_grad.
struct MetaShape {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int8_t dtype = 0;
  bool requires_grad = false;
  // A result of an op that requires grad is no leaf (it has a grad_fn): in-place ops on it are
  // allowed, as in eager, where they are not on a leaf.
  bool is_leaf = true;
  bool dense = true;  // non-overlapping and dense: a clone keeps exactly these strides
  int64_t storage_offset = 0;
};
MetaShape meta_shape_of(PyObject* obj);
// A tensor's sizes and dtype code (c10::ScalarType), read without Python. Borrowed: obj.
void tensor_sizes_and_dtype(PyObject* obj, std::vector<int64_t>& sizes, int8_t& dtype);
// The dimensions of a dense tensor of these sizes and strides, outermost (largest stride)
// first, such that its strides are those of a contiguous tensor in that order; empty if it is
// not dense (a slice, an expanded tensor).
std::vector<int32_t> dense_stride_order(const std::vector<int64_t>& sizes,
                                        const std::vector<int64_t>& strides);
// Whether a strided tensor of rank > 0 is dense as dense_stride_order tells (the layout a
// symbolic-size guard can check). Borrowed: obj, any object (false for a non-tensor).
bool tensor_is_dense(PyObject* obj);

// A tensor's version counter (it counts the in-place writes into its storage, through any view);
// -1 for what keeps none (an inference tensor, a non-tensor). Borrowed: obj.
int64_t tensor_version(PyObject* obj);
// A detached copy of a tensor's data (New; nullptr, no error set, if it cannot be made), and
// writing it back into the tensor without autograd (false on failure). Borrowed: obj, snapshot.
PyObject* tensor_snapshot(PyObject* obj);
bool tensor_restore(PyObject* obj, PyObject* snapshot);
// Whether two tensors share storage (one is a view of the other, or both of a third: a write
// into either moves both version counters). Borrowed: a, b.
bool tensors_share_storage(PyObject* a, PyObject* b);
// Whether a tensor has autograd history (a grad_fn: it is the result of a recorded op or a view
// of a tensor that requires grad). A leaf that requires grad has none: data written back into it
// without autograd is as before. Borrowed: obj.
bool tensor_has_history(PyObject* obj);
// "cpu", "cuda:0", ... for a torch.device; "" for anything else. Borrowed: device.
std::string device_text(PyObject* device);
// A new meta tensor with that metadata (New reference).
PyObject* make_meta_tensor(const MetaShape& shape);
// A meta tensor with a dense tensor's sizes, strides, dtype and requires_grad (New reference);
// nullptr, with no error set, for other layouts (sparse, quantized, nested, mkldnn).
PyObject* meta_like(PyObject* tensor);
// Whether obj is exactly a torch.Tensor or an nn.Parameter (types with no __torch_function__
// of their own). Borrowed: obj.
bool is_plain_tensor_type(PyObject* obj);

// Global torch state a trace depends on: grad mode and the default dtype.
struct GlobalTorchState {
  bool grad_enabled = true;
  int8_t default_dtype = 0;
  // torch.autocast on CPU / CUDA: -1 off, else the c10::ScalarType code it casts to.
  int8_t autocast_cpu = -1;
  int8_t autocast_cuda = -1;
  // The dtype torch.autocast(device) with no dtype casts to (torch.set_autocast_dtype).
  int8_t autocast_default_cpu = -1;
  int8_t autocast_default_cuda = -1;
  bool autocast() const { return autocast_cpu >= 0 || autocast_cuda >= 0; }
};
GlobalTorchState current_global_torch_state();
// Sets the grad mode and autocast back to `state`'s (the default dtype is never changed by a
// graph).
void restore_global_torch_state(const GlobalTorchState& state);
inline bool operator==(const GlobalTorchState& a, const GlobalTorchState& b) {
  return a.grad_enabled == b.grad_enabled && a.default_dtype == b.default_dtype &&
         a.autocast_cpu == b.autocast_cpu && a.autocast_cuda == b.autocast_cuda &&
         a.autocast_default_cpu == b.autocast_default_cpu &&
         a.autocast_default_cuda == b.autocast_default_cuda;
}

}  // namespace framejit
