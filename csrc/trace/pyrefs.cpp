// One-time lookups of torch and framejit Python objects, and small per-object caches.
#include "trace/pyrefs.h"

#include "common/check.h"
#include "trace/trace_state.h"

namespace framejit {

namespace {

const std::string& cached(std::unordered_map<PyObject*, std::pair<py::object, std::string>>& cache,
                          py::handle key, const char* helper, py::object& support) {
  auto it = cache.find(key.ptr());
  if (it != cache.end()) return it->second.second;
  std::string text = support.attr(helper)(key).cast<std::string>();
  // Keep a reference so the pointer key cannot be reused by another object.
  auto& slot = cache[key.ptr()];
  slot = {py::reinterpret_borrow<py::object>(key), std::move(text)};
  return slot.second;
}
}  // namespace

PyRefs& PyRefs::get() {
  TraceState& state = trace_state();
  FJ_CHECK(state.refs_ready, "framejit._C used before _init");
  return state.refs;
}

void PyRefs::init(py::object support_module) {
  TraceState& state = trace_state();
  state.refs_ready = true;
  PyRefs& r = state.refs;
  r.torch = py::module_::import("torch");
  r.tensor_type = r.torch.attr("Tensor");
  r.size_type = r.torch.attr("Size");
  r.finfo_type = r.torch.attr("finfo");
  r.iinfo_type = r.torch.attr("iinfo");
  r.device_type = r.torch.attr("device");
  r.dtype_type = r.torch.attr("dtype");
  r.meta_device = r.device_type("meta");
  r.module_type = r.torch.attr("nn").attr("Module");
  r.cpu_device = r.device_type("cpu");
  r.operator_module = py::module_::import("operator");
  r.support = std::move(support_module);
  r.unsupported_error = r.support.attr("Unsupported");
  r.warning_category = r.support.attr("FramejitWarning");
  r.partial_type = py::module_::import("functools").attr("partial");
  r.lru_cache_type = py::module_::import("functools").attr("_lru_cache_wrapper");
  r.generator_type = py::module_::import("types").attr("GeneratorType");
  r.signature = py::module_::import("inspect").attr("signature");
  r.environ = py::module_::import("os").attr("environ");
  r.mapping_get = py::module_::import("collections.abc").attr("Mapping").attr("get");
  r.autograd_function = r.torch.attr("autograd").attr("Function");
  r.defaultdict_type = py::module_::import("collections").attr("defaultdict");
  r.ordered_dict_type = py::module_::import("collections").attr("OrderedDict");
  r.deque_type = py::module_::import("collections").attr("deque");
  r.enum_type = py::module_::import("enum").attr("Enum");
  r.enum_meta = py::module_::import("enum").attr("EnumMeta");
  r.function_apply = r.autograd_function.attr("apply").attr("__func__");
  r.nn_module_module = py::module_::import("torch.nn.modules.module");
  r.saved_hooks_set_tracing =
      r.torch.attr("_C").attr("_autograd").attr("_saved_tensors_hooks_set_tracing");
  r.version_probe = py::reinterpret_steal<py::object>(
      PyUnicode_InternFromString("__framejit_version_probe__"));
}

CallableKind PyRefs::classify(py::handle fn) {
  auto it = classify_cache_.find(fn.ptr());
  if (it != classify_cache_.end()) return it->second.second;
  const auto kind = support.attr("classify_callable")(fn).cast<CallableKind>();
  // The reference keeps the pointer key from being reused by another object.
  classify_cache_[fn.ptr()] = {py::reinterpret_borrow<py::object>(fn), kind};
  return kind;
}

const std::string& PyRefs::target_text(py::handle fn) {
  return cached(target_cache_, fn, "target_text", support);
}

const std::string& PyRefs::short_dtype(py::handle dtype) {
  return cached(dtype_cache_, dtype, "short_dtype", support);
}

const std::string& PyRefs::short_dtype_of(int8_t code, py::handle tensor) {
  std::string& name = dtype_by_code_[static_cast<uint8_t>(code) & 127];
  if (name.empty()) name = short_dtype(tensor.attr("dtype"));
  return name;
}

}  // namespace framejit
