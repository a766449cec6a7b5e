// Recording torch calls: arguments turned into meta values, the call run on meta tensors for the
// output metadata, the real device inferred beside it, and one graph node per call.
#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <unordered_map>

#include "common/check.h"
#include "guards/tensor_check.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

// The first line of the pending Python error's message, for Unsupported reasons.
std::string error_summary(const py::error_already_set& error) {
  std::string text = error.what();
  const auto newline = text.find('\n');
  if (newline != std::string::npos) text = text.substr(0, newline);
  if (text.size() > 200) text = text.substr(0, 200) + "...";
  return text;
}

// Ops whose number of results depends on the input's sizes.
bool splits_by_size(const std::string& target_text) {
  return base_name_in(target_text, {"split", "chunk", "unbind", "tensor_split", "hsplit", "vsplit",
                                    "dsplit", "unsafe_split", "unsafe_chunk", "split_with_sizes"});
}

// In-place ops that change the shape of the tensor they mutate.
bool changes_shape_inplace(const std::string& target_text) {
  return base_name_in(target_text, {"t_", "transpose_", "swapdims_", "swapaxes_", "unsqueeze_",
                                    "squeeze_", "resize_", "resize_as_", "as_strided_", "set_"});
}

py::object meta_value(const ValuePtr& value) {
  switch (value->kind) {
    case VKind::kSymNum:  // a scalar graph input: its trace-time value gives the metadata
    case VKind::kTensor:
    case VKind::kConst:
    case VKind::kObject:
      return value->obj;
    case VKind::kTuple:
    case VKind::kList:
    case VKind::kDict: {
      if (value->kind == VKind::kDict) {
        py::dict out;
        for (size_t i = 0; i < value->items.size(); ++i) {
          out[value->keys[i]] = meta_value(value->items[i]);
        }
        return std::move(out);
      }
      py::list items;
      for (const auto& item : value->items) items.append(meta_value(item));
      if (value->kind == VKind::kList) return std::move(items);
      if (value->pytype.ptr() == reinterpret_cast<PyObject*>(&PyTuple_Type)) {
        return py::tuple(items);
      }
      return value->pytype(py::tuple(items));
    }
    case VKind::kNull:
    case VKind::kIter:
    case VKind::kCell:
      break;
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "{} passed to a torch call", value->describe());
}

Arg arg_of(const ValuePtr& value) {
  switch (value->kind) {
    case VKind::kSymNum:
      FJ_CHECK(value->node != nullptr, "number {} reached a graph call unlowered",
               value->describe());
      return Arg::of(value->node);
    case VKind::kTensor:
      return Arg::of(value->node);
    case VKind::kConst:
    case VKind::kObject:
      return Arg::constant(value->obj);
    case VKind::kTuple:
    case VKind::kList: {
      std::vector<Arg> items;
      for (const auto& item : value->items) items.push_back(arg_of(item));
      if (value->kind == VKind::kTuple &&
          value->pytype.ptr() != reinterpret_cast<PyObject*>(&PyTuple_Type)) {
        if (value->is_constant_tree()) return Arg::constant(value->as_python());
        FJ_UNSUPPORTED(kUnsupportedValue, "a {} holding tensors passed to a torch call",
                       safe_repr(value->pytype));
      }
      return value->kind == VKind::kTuple ? Arg::tuple(std::move(items))
                                          : Arg::list(std::move(items));
    }
    case VKind::kDict: {
      std::vector<std::string> keys;
      std::vector<Arg> items;
      for (size_t i = 0; i < value->items.size(); ++i) {
        if (!PyUnicode_Check(value->keys[i].ptr())) {
          FJ_UNSUPPORTED(kUnsupportedValue, "dict with non-string keys passed to a torch call");
        }
        keys.push_back(value->keys[i].cast<std::string>());
        items.push_back(arg_of(value->items[i]));
      }
      return Arg::dict(std::move(keys), std::move(items));
    }
    case VKind::kNull:
    case VKind::kIter:
    case VKind::kCell:
      break;
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "{} passed to a torch call", value->describe());
}

void collect_tensor_devices(const ValuePtr& value, std::vector<py::object>& out) {
  if (value->kind == VKind::kTensor) {
    out.push_back(value->device);
    return;
  }
  for (const auto& item : value->items) collect_tensor_devices(item, out);
}

bool has_tensor(const ValuePtr& value) {
  if (value->kind == VKind::kTensor) return true;
  for (const auto& item : value->items) {
    if (has_tensor(item)) return true;
  }
  return false;
}

// torch.device(...) of a device-like constant (str, int, torch.device), or an empty object.
py::object as_device(const ValuePtr& value) {
  PyRefs& refs = PyRefs::get();
  if (value->kind != VKind::kConst || value->obj.is_none()) return py::object();
  PyObject* obj = value->obj.ptr();
  if (Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(refs.device_type.ptr())) return value->obj;
  if (PyUnicode_Check(obj) || PyLong_CheckExact(obj)) {
    try {
      return refs.device_type(value->obj);
    } catch (const py::error_already_set&) {
      return py::object();
    }
  }
  return py::object();
}

bool is_device_type(const std::string& device, const char* type) {
  return device.rfind(type, 0) == 0;
}

// Calls that mutate their first argument and return None (tensor[...] = value).
bool returns_none_inplace(const std::string& target_text) {
  return target_text == "operator.setitem";
}

bool is_inplace_operator(const std::string& target_text) {
  static const char* kInplace[] = {"iadd", "iand", "ifloordiv", "ilshift", "imatmul", "imul",
                                   "imod", "ior", "ipow", "irshift", "isub", "itruediv", "ixor"};
  for (const char* name : kInplace) {
    if (target_text == std::string("operator.") + name) return true;
  }
  return false;
}

// Tensors, and perhaps some Nones (F.multi_head_attention_forward's weights when not asked for).
bool tensors_or_none(py::handle sequence) {
  bool any_tensor = false;
  for (py::handle item : sequence) {
    if (is_tensor(item.ptr())) {
      any_tensor = true;
    } else if (!item.is_none()) {
      return false;
    }
  }
  return any_tensor;
}


// ---- The meta-result cache ----
// Running a torch op on meta tensors costs 100-500 us (many meta kernels are Python
// decompositions); the same op on the same metadata recurs constantly (layers, unrolled loops).
// Results are cached by (op, argument metadata and constants, grad mode, default dtype) and
// rebuilt as fresh meta tensors. In-place ops, results that alias an input object and results
// with a storage offset are never cached.

struct CachedMeta {
  py::object fn;  // held, so the address in the key can never name another object
  bool sequence = false;
  py::object sequence_type;  // tuple, list, or a structseq type
  std::vector<MetaShape> outputs;
};

std::unordered_map<std::string, CachedMeta>& meta_cache() {
  static auto* cache = new std::unordered_map<std::string, CachedMeta>();  // lives forever
  return *cache;
}

bool append_value_key(PyObject* obj, std::string& key) {
  const PyRefs& refs = PyRefs::get();
  if (is_tensor(obj)) {
    append_tensor_key(obj, key);
    return true;
  }
  if (obj == Py_None) {
    key += 'N';
  } else if (obj == Py_Ellipsis) {
    key += 'E';
  } else if (PyBool_Check(obj)) {
    key += obj == Py_True ? "b1" : "b0";
  } else if (PyLong_CheckExact(obj)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow) return false;
    key += 'i' + std::to_string(v);
  } else if (PyFloat_CheckExact(obj)) {
    key += fmt::format("f{:a}", PyFloat_AS_DOUBLE(obj));
  } else if (PyUnicode_CheckExact(obj)) {
    const char* text = PyUnicode_AsUTF8(obj);
    if (text == nullptr) {
      PyErr_Clear();
      return false;
    }
    key += 's';
    key += text;
    key += '\x01';
  } else if (PyTuple_Check(obj) || PyList_Check(obj)) {
    key += PyList_Check(obj) ? '[' : '(';
    key += Py_TYPE(obj)->tp_name;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    for (Py_ssize_t i = 0; i < n; ++i) {
      key += ',';
      if (!append_value_key(PySequence_Fast_GET_ITEM(obj, i), key)) return false;
    }
    key += ')';
  } else if (PySlice_Check(obj)) {
    auto* slice = reinterpret_cast<PySliceObject*>(obj);
    key += "sl(";
    if (!append_value_key(slice->start, key) || !append_value_key(slice->stop, key) ||
        !append_value_key(slice->step, key)) {
      return false;
    }
    key += ')';
  } else if (Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(refs.dtype_type.ptr()) ||
             Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(refs.device_type.ptr())) {
    key += 'o' + safe_repr(obj);
  } else {
    return false;  // memory formats, layouts, generators, functions...: not worth keying
  }
  return true;
}

// The cache key of a call, or "" if it cannot be cached.
std::string meta_key(PyObject* fn, const std::string& method, const py::list& args,
                     const py::dict& kwargs, const GlobalTorchState& global) {
  if (kwargs.contains("out")) return {};
  std::string key = method.empty() ? fmt::format("F{}", static_cast<const void*>(fn)) : "M" + method;
  key += global.grad_enabled ? "|g" : "|n";
  key += std::to_string(global.default_dtype);
  for (py::handle arg : args) {
    key += '|';
    if (!append_value_key(arg.ptr(), key)) return {};
  }
  for (auto item : kwargs) {
    key += '|' + py::str(item.first).cast<std::string>() + '=';
    if (!append_value_key(item.second.ptr(), key)) return {};
  }
  return key;
}

void remember_meta(const std::string& key, py::handle fn, const py::object& result,
                   const py::list& args) {
  CachedMeta entry;
  entry.fn = py::reinterpret_borrow<py::object>(fn);
  std::vector<PyObject*> outputs;
  if (is_tensor(result.ptr())) {
    outputs.push_back(result.ptr());
  } else if (PyTuple_Check(result.ptr()) || PyList_Check(result.ptr())) {
    entry.sequence = true;
    entry.sequence_type = py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(Py_TYPE(result.ptr())));
    for (py::handle item : result) {
      if (!is_tensor(item.ptr())) return;
      outputs.push_back(item.ptr());
    }
  } else {
    return;
  }
  for (PyObject* out : outputs) {
    for (py::handle arg : args) {
      if (arg.ptr() == out) return;  // the op returned an input itself: keep that identity
    }
    entry.outputs.push_back(meta_shape_of(out));
    if (entry.outputs.back().storage_offset != 0) return;
  }
  auto& cache = meta_cache();
  if (cache.size() > 100000) cache.clear();  // bound the memory of long sessions
  cache.emplace(key, std::move(entry));
}

py::object replay_meta(const CachedMeta& entry) {
  if (!entry.sequence) {
    return py::reinterpret_steal<py::object>(make_meta_tensor(entry.outputs[0]));
  }
  py::list items;
  for (const MetaShape& shape : entry.outputs) {
    items.append(py::reinterpret_steal<py::object>(make_meta_tensor(shape)));
  }
  if (entry.sequence_type.ptr() == reinterpret_cast<PyObject*>(&PyList_Type)) return std::move(items);
  if (entry.sequence_type.ptr() == reinterpret_cast<PyObject*>(&PyTuple_Type)) {
    return py::tuple(items);
  }
  return entry.sequence_type(py::tuple(items));  // torch.return_types.* take one sequence
}

}  // namespace

bool base_name_in(const std::string& text, std::initializer_list<const char*> names) {
  const auto dot = text.rfind('.');
  const char* base = text.c_str() + (dot == std::string::npos ? 0 : dot + 1);
  for (const char* name : names) {
    if (std::strcmp(base, name) == 0) return true;
  }
  return false;
}

void clear_meta_cache() { meta_cache().clear(); }

MetaCacheStats& meta_cache_stats() {
  static MetaCacheStats stats;
  return stats;
}

ValuePtr Tracer::record_call(NodeKind kind, py::handle fn, const std::string& method,
                             std::vector<ValuePtr> args, KwValues kwargs,
                             const std::string& infix, const std::string& name_hint) {
  PyRefs& refs = PyRefs::get();
  const bool is_method = kind == NodeKind::kCallMethod;
  const std::string target_text = is_method ? method : refs.target_text(fn);
  // Numbers known only at run time: a float becomes a graph input; an int is pinned, since ints
  // passed to torch are often sizes or dims that decide the output's shape.
  std::function<ValuePtr(const ValuePtr&)> lower = [&](const ValuePtr& v) -> ValuePtr {
    if (v->kind == VKind::kSymNum) {
      // A bool decides the result's structure (keepdim=n > 2): it needs its value.
      if (v->is_size_expr() && !PyBool_Check(v->obj.ptr())) {  // a graph value: x.size(0), ...
        ValuePtr lowered = std::make_shared<Value>(*v);
        lowered->node = size_node(v);
        return lowered;
      }
      return PyFloat_CheckExact(v->obj.ptr()) ? scalar_input(v) : specialize(v);
    }
    if (v->kind == VKind::kDict) return concretize(v);
    ValuePtr copy = Value::map_items(v, lower);
    if (copy != v && copy->pytype.is(refs.size_type)) {  // a shape holding size nodes: a tuple
      copy->pytype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyTuple_Type));
    }
    return copy;
  };
  for (auto& arg : args) arg = lower(arg);
  for (auto& kw : kwargs) kw.second = lower(kw.second);

  // Device arguments become "meta" for the meta call; the real device is tracked beside it.
  py::object explicit_device;
  py::list meta_args;
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_method && method == "to" && i > 0) {
      py::object device = as_device(args[i]);
      if (device) {
        explicit_device = device;
        meta_args.append(refs.meta_device);
        continue;
      }
      if (args[i]->kind == VKind::kTensor) explicit_device = args[i]->device;
    }
    meta_args.append(meta_value(args[i]));
  }
  py::dict meta_kwargs;
  for (const auto& [key, value] : kwargs) {
    if (key == "device") {
      py::object device = as_device(value);
      if (device) {
        explicit_device = device;
        meta_kwargs[py::str(key)] = refs.meta_device;
        continue;
      }
    }
    meta_kwargs[py::str(key)] = meta_value(value);
  }
  bool any_tensor = false;
  for (const auto& arg : args) any_tensor = any_tensor || has_tensor(arg);
  for (const auto& kw : kwargs) any_tensor = any_tensor || has_tensor(kw.second);
  if (is_method && (method == "cuda" || method == "cpu")) {
    explicit_device = method == "cpu" ? refs.cpu_device
                                      : refs.device_type("cuda", args.size() > 1 && args[1]->is_const()
                                                                     ? args[1]->obj
                                                                     : py::object(py::none()));
    meta_args = py::list();
    meta_args.append(args[0]->obj);
    meta_args.append(refs.meta_device);
  }

  py::object result;
  const bool mutates = (is_method && !method.empty() && method.back() == '_') ||
                       is_inplace_operator(target_text) || returns_none_inplace(target_text) ||
                       (!is_method && !target_text.empty() && target_text.back() == '_') ||
                       method == "cuda" || method == "cpu";
  // Under torch.autocast the op's dtype is autocast's choice, which meta tensors do not see (its
  // kernels only cast tensors of the real device): the call runs on fake tensors instead.
  const GlobalTorchState global =
      any_tensor && !mutates ? current_global_torch_state() : GlobalTorchState();
  const bool autocast = any_tensor && !mutates && global.autocast();
  std::string cache_key;
  if (any_tensor && !mutates && !autocast) {
    cache_key = meta_key(is_method ? nullptr : fn.ptr(), method, meta_args, meta_kwargs, global);
    if (!cache_key.empty()) {
      auto hit = meta_cache().find(cache_key);
      if (hit != meta_cache().end()) result = replay_meta(hit->second);
    }
  }
  ++(result ? meta_cache_stats().hits : cache_key.empty() ? meta_cache_stats().uncacheable
                                                          : meta_cache_stats().misses);
  if (!result) try {
    if (autocast) {
      py::dict devices;  // id(meta tensor) -> its real device
      std::function<void(const ValuePtr&)> collect = [&](const ValuePtr& v) {
        if (v->kind == VKind::kTensor) {
          devices[py::int_(reinterpret_cast<uintptr_t>(v->obj.ptr()))] = v->device;
        }
        if (v->kind == VKind::kTuple || v->kind == VKind::kList || v->kind == VKind::kDict) {
          for (const auto& item : v->items) collect(item);
        }
      };
      for (const auto& arg : args) collect(arg);
      for (const auto& kw : kwargs) collect(kw.second);
      result = refs.support.attr("autocast_meta")(is_method ? py::none() : py::reinterpret_borrow<py::object>(fn),
                                                  py::str(method), meta_args, meta_kwargs, devices);
    } else if (is_method) {
      const std::string meta_method = (method == "cuda" || method == "cpu") ? "to" : method;
      py::object self = meta_args[0];
      py::list rest;
      for (size_t i = 1; i < py::len(meta_args); ++i) rest.append(meta_args[i]);
      result = self.attr(meta_method.c_str())(*py::tuple(rest), **meta_kwargs);
    } else if (!any_tensor && !meta_kwargs.contains("device")) {
      // A factory (torch.zeros, torch.tensor, ...): allocate on meta, run on the default device.
      py::dict factory_kwargs(meta_kwargs);
      factory_kwargs["device"] = refs.meta_device;
      try {
        result = fn(*py::tuple(meta_args), **factory_kwargs);
        explicit_device = refs.support.attr("default_device")();
      } catch (const py::error_already_set&) {
        result = fn(*py::tuple(meta_args), **meta_kwargs);
      }
    } else {
      result = fn(*py::tuple(meta_args), **meta_kwargs);
    }
  } catch (const py::error_already_set& error) {
    FJ_UNSUPPORTED(kMetaFailure, "{} failed on meta tensors: {}", target_text,
                   error_summary(error));
  }
  if (!cache_key.empty()) remember_meta(cache_key, fn, result, meta_args);

  // The real device: explicit, else that of the tensor arguments (non-CPU wins, as CPU scalars
  // combine with CUDA tensors), else the default device.
  py::object device = explicit_device;
  if (!device) {
    std::vector<py::object> devices;
    for (const auto& arg : args) collect_tensor_devices(arg, devices);
    for (const auto& kw : kwargs) collect_tensor_devices(kw.second, devices);
    for (const auto& d : devices) {
      if (!device || is_device_type(device_string(device), "cpu")) device = d;
    }
    if (!device) device = refs.support.attr("default_device")();
  }

  std::vector<Arg> node_args;
  for (const auto& arg : args) node_args.push_back(arg_of(arg));
  Kwargs node_kwargs;
  for (const auto& [key, value] : kwargs) node_kwargs.emplace_back(key, arg_of(value));

  const bool inplace = !args.empty() && args[0]->kind == VKind::kTensor &&
                       result.ptr() == args[0]->obj.ptr() &&
                       ((is_method && !method.empty() && method.back() == '_') ||
                        is_inplace_operator(target_text) ||
                        (!is_method && !target_text.empty() && target_text.back() == '_'));

  if (inplace && changes_shape_inplace(target_text)) {
    pin_sizes_of(args[0], target_text + " changed the shape sizes were read from");
  }
  for (const auto& [key, value] : kwargs) {
    if (key != "out") continue;
    // out= tensors are resized to the result: like an in-place shape change.
    std::vector<ValuePtr> outs = value->kind == VKind::kTensor ? std::vector<ValuePtr>{value}
                                                               : value->items;
    for (const auto& out : outs) {
      if (out->kind == VKind::kTensor) pin_sizes_of(out, target_text + "(out=) resized its output");
    }
  }
  if (is_tensor(result.ptr())) {
    Node* node = graph_.add_call(kind, is_method ? py::str(method) : py::reinterpret_borrow<py::object>(fn),
                                 target_text, infix, std::move(node_args), std::move(node_kwargs),
                                 result, {meta_of(result, device)}, false, instr().line, name_hint);
    locate(node);
    if (inplace) return args[0];
    return Value::tensor(node, result, device);
  }
  const bool is_list = PyList_Check(result.ptr());
  if ((PyTuple_Check(result.ptr()) || is_list) && tensors_or_none(result)) {
    std::vector<TensorMeta> metas;
    for (py::handle item : result) {
      metas.push_back(item.is_none() ? TensorMeta() : meta_of(item, device));
    }
    Node* node = graph_.add_call(kind, is_method ? py::str(method) : py::reinterpret_borrow<py::object>(fn),
                                 target_text, infix, std::move(node_args), std::move(node_kwargs),
                                 result, std::move(metas), true, instr().line, name_hint);
    locate(node);
    if (splits_by_size(target_text)) {
      // How many tensors split / chunk / unbind return depends on the sizes: the graph's
      // structure holds for these sizes only.
      const std::string what = target_text + "() (its number of results depends on the sizes)";
      if (symbolic_sizes_) {
        note_split_count(node, what);
      } else {
        note_size_read(what);
      }
    }
    std::vector<ValuePtr> items;
    py::object getitem = refs.operator_module.attr("getitem");
    for (size_t i = 0; i < py::len(result); ++i) {
      py::object element = result[py::int_(i)];
      if (element.is_none()) {
        items.push_back(Value::constant(element));
        continue;
      }
      Node* item = graph_.add_call(NodeKind::kCallFunction, getitem, "operator.getitem", "[]",
                                   {Arg::of(node), Arg::constant(py::int_(i))}, {}, element,
                                   {meta_of(element, device)}, false, instr().line, "getitem");
      locate(item);
      items.push_back(Value::tensor(item, element, device));
    }
    if (is_list) return Value::list(std::move(items));
    return Value::tuple(std::move(items),
                        py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(result.ptr()))));
  }
  if (result.is_none() && returns_none_inplace(target_text)) {
    locate(graph_.add_call(kind, is_method ? py::str(method) : py::reinterpret_borrow<py::object>(fn),
                           target_text, infix, std::move(node_args), std::move(node_kwargs),
                           py::none(), {}, false, instr().line, name_hint));
    return Value::constant(py::none());
  }
  FJ_UNSUPPORTED(kUnsupportedCall, "{} returned {} (not a tensor) on meta tensors", target_text,
                 Py_TYPE(result.ptr())->tp_name);
}

ValuePtr Tracer::tensor_rows(const ValuePtr& tensor) {
  if (py::len(tensor->obj.attr("shape")) == 0) {
    FJ_UNSUPPORTED(kUnsupportedValue, "iterating over a 0-d tensor");  // eager raises TypeError
  }
  ValuePtr rows = record_call(NodeKind::kCallMethod, py::none(), "unbind", {tensor}, {}, "", "unbind");
  FJ_CHECK(rows->kind == VKind::kTuple, "unbind gave {}", rows->describe());
  return rows;
}

void Tracer::locate(Node* node) {
  if (!inlined()) return;
  PyCodeObject* code = frame().code;
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  const char* name = PyUnicode_AsUTF8(code->co_qualname);
  if (!file || !name) {
    PyErr_Clear();
    return;
  }
  node->filename = file;
  node->function = name;
}

ValuePtr Tracer::record_operator(const char* fn_name, const char* infix,
                                 std::vector<ValuePtr> args) {
  py::object fn = PyRefs::get().operator_module.attr(fn_name);
  return record_call(NodeKind::kCallFunction, fn, "", std::move(args), {}, infix, fn_name);
}

ValuePtr Tracer::tensor_attr(const ValuePtr& tensor, const std::string& name) {
  PyRefs& refs = PyRefs::get();
  static const char* kMetaConstants[] = {"shape", "dtype", "ndim", "requires_grad", "layout",
                                         "is_sparse", "is_quantized", "is_mkldnn", "itemsize",
                                         "nbytes", "is_nested"};
  for (const char* constant : kMetaConstants) {
    if (name != constant) continue;
    if (name == "shape") return tensor_shape(tensor, "Tensor.shape");
    if (name == "nbytes") note_sizes_read(tensor, "Tensor." + name);
    return Value::constant(tensor->obj.attr(constant));
  }
  const std::string device = py::str(tensor->device).cast<std::string>();
  if (name == "device") return Value::constant(tensor->device);
  if (name == "is_cuda") return Value::constant(py::bool_(is_device_type(device, "cuda")));
  if (name == "is_cpu") return Value::constant(py::bool_(is_device_type(device, "cpu")));
  if (name == "is_meta") return Value::constant(py::bool_(is_device_type(device, "meta")));
  if (name == "T" || name == "mT" || name == "H" || name == "mH" || name == "real" ||
      name == "imag") {
    py::object getattr_fn = py::module_::import("builtins").attr("getattr");
    return record_call(NodeKind::kCallFunction, getattr_fn, "",
                       {tensor, Value::constant(py::str(name))}, {}, "", "getattr");
  }
  const TensorMethodKind kind = tensor_method_kind(name);
  if (kind == TensorMethodKind::kOp || kind == TensorMethodKind::kMetadata) {
    // x.reshape read as a value (x.reshape(-1, *shape) compiles to LOAD_ATTR + CALL_FUNCTION_EX):
    // a method bound to the traced tensor, Tensor.<name> if it outlives the region.
    ValuePtr method = Value::object(refs.tensor_type.attr(name.c_str()));
    method->role = ObjRole::kTypeMethod;
    method->method = name;
    method->bound_self = tensor;
    return method;
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "tensor attribute '{}' is not traced yet", name);
}

}  // namespace framejit
