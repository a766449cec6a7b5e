// The graph recorder: nodes placed at the traced instruction, meta results of torch calls (run
// on meta tensors, memoised), and the real device of each result.
#include "trace/recorder.h"

#include <fmt/format.h>

#include <cstring>
#include <unordered_map>

#include "common/check.h"
#include "graph/graph_runner.h"
#include "graph/printer.h"
#include "guards/tensor_check.h"
#include "trace/pyrefs.h"
#include "trace/trace_state.h"

namespace framejit {

namespace {

// A graph target whose Python body runs on the meta tensors: a callable object (an
// autograd.Function's apply) or a function from outside torch (allowed in the graph). torch's
// own functions and ops make their tensors where their arguments are.
bool runs_python_body(py::handle fn) {
  PyObject* f = fn.ptr();
  if (PyCFunction_Check(f) || PyType_Check(f)) return false;
  const char* type = Py_TYPE(f)->tp_name;
  if (std::strcmp(type, "OpOverload") == 0 || std::strcmp(type, "OpOverloadPacket") == 0) return false;
  if (!PyFunction_Check(f)) return true;
  static PyObject* const kTorch = PyUnicode_InternFromString("torch");
  PyObject* module = reinterpret_cast<PyFunctionObject*>(f)->func_module;  // Borrowed
  return module == nullptr || !PyUnicode_Check(module) ||
         PyUnicode_Tailmatch(module, kTorch, 0, 5, -1) != 1;
}

// The first line of the pending Python error's message, for Unsupported reasons.
std::string error_summary(const py::error_already_set& error) {
  std::string text = error.what();
  const auto newline = text.find('\n');
  if (newline != std::string::npos) text = text.substr(0, newline);
  if (text.size() > 200) text = text.substr(0, 200) + "...";
  return text;
}

void collect_tensor_devices(const ValuePtr& value, std::vector<py::object>& out) {
  if (value->kind == VKind::kTensor) {
    out.push_back(value->device);
    return;
  }
  for (const auto& item : value->items) collect_tensor_devices(item, out);
}

// ---- The meta-result memo (MetaMemo in recorder.h) ----

std::unordered_map<std::string, CachedMeta>& meta_cache() { return trace_state().meta.results; }

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
    const MetaShape& shape = entry.outputs.back();
    if (shape.storage_offset != 0) return;
    // A non-leaf result is replayed as a clone, which keeps only dense strides.
    if (shape.requires_grad && !shape.is_leaf && !shape.dense) return;
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

bool is_device_type(const std::string& device, const char* type) {
  return device.rfind(type, 0) == 0;
}

std::string device_string(py::handle device) {
  std::string text = device_text(device.ptr());  // a torch.device, read without Python
  return text.empty() ? py::str(device).cast<std::string>() : text;
}

void clear_meta_cache() { meta_cache().clear(); }

MetaCacheStats& meta_cache_stats() { return trace_state().meta.stats; }

GraphRecorder::GraphRecorder(PyCodeObject* code, const TraceSite& site)
    : site_(site),
      graph_(str_text(code->co_filename), str_text(code->co_qualname),
             code->co_firstlineno) {}

Node* GraphRecorder::placeholder(const std::string& hint, py::object fake,
                                 const TensorMeta& meta) {
  return graph_.add_placeholder(hint, std::move(fake), meta);
}

Node* GraphRecorder::add(NodeSpec spec) {
  Node* node = graph_.add_call(spec.kind, std::move(spec.target), std::move(spec.target_text),
                               std::move(spec.infix), std::move(spec.args),
                               std::move(spec.kwargs), std::move(spec.fake),
                               std::move(spec.metas), spec.tuple_result, site_.line(),
                               spec.name_hint);
  site_.locate(node);
  return node;
}

void GraphRecorder::finish(std::vector<Arg> outputs) {
  graph_.set_output(std::move(outputs));
  graph_.remove_unused();
  for (size_t scope = 0; scope < checkpoint_kwargs_.size(); ++scope) {
    const std::string name = fmt::format("checkpoint_body_{}", scope);
    const py::dict& kwargs = checkpoint_kwargs_[scope];
    graph_.outline_scope(static_cast<int>(scope), [&](std::unique_ptr<Graph> body) {
      std::string text = print_graph(*body, linecache_source(body->filename()));
      std::string how;
      for (auto [key, value] : kwargs) {
        how += fmt::format(", {}={}", py::str(key).cast<std::string>(), py::repr(value).cast<std::string>());
      }
      graph_.outlined_texts().emplace_back(
          fmt::format("{} (run by torch.utils.checkpoint.checkpoint(self.{}, ...{}))", name, name, how),
          std::move(text));
      py::object runner = py::reinterpret_steal<py::object>(new_graph_runner(std::move(body)));
      if (!runner) throw py::error_already_set();
      PyRefs& refs = PyRefs::get();
      py::object gm = refs.support.attr("FramejitGraphModule")(runner, name);
      return refs.support.attr("CheckpointedBody")(gm, name, kwargs);
    }, "self." + name, checkpoint_sites_[scope]);
  }
}

void GraphRecorder::open_checkpoint(py::dict checkpoint_kwargs) {
  const int scope = graph_.open_scope();
  FJ_CHECK(static_cast<size_t>(scope) == checkpoint_kwargs_.size(), "checkpoint scopes out of order");
  checkpoint_kwargs_.push_back(std::move(checkpoint_kwargs));
  Node& site = checkpoint_sites_.emplace_back();
  site.line = site_.line();
  site_.locate(&site);
}

TensorMeta GraphRecorder::meta_of(py::handle meta, py::handle device) {
  PyRefs& refs = PyRefs::get();
  TensorMeta out;
  if (!is_tensor(meta.ptr())) {
    out.dtype = refs.short_dtype(meta.attr("dtype"));
    for (py::handle size : meta.attr("shape")) out.sizes.push_back(size.cast<int64_t>());
  } else {
    // Read from the tensor itself: three Python attribute reads and str(device) per node were
    // a fifth of the tracing time of a long chain.
    int8_t code = 0;
    tensor_sizes_and_dtype(meta.ptr(), out.sizes, code);
    out.dtype = refs.short_dtype_of(code, meta);
  }
  out.device = device_string(device);
  return out;
}

py::object GraphRecorder::run_meta(const MetaCall& call, py::object& explicit_device) {
  PyRefs& refs = PyRefs::get();
  const bool is_method = !call.method.empty();
  const py::list& meta_args = call.args;
  const py::dict& meta_kwargs = call.kwargs;
  py::object result;
  // Under torch.autocast the op's dtype is autocast's choice, which meta tensors do not see (its
  // kernels only cast tensors of the real device): the call runs on fake tensors instead.
  const GlobalTorchState global =
      call.any_tensor && !call.mutates ? current_global_torch_state() : GlobalTorchState();
  const bool autocast = call.any_tensor && !call.mutates && global.autocast();
  std::string cache_key;
  if (call.any_tensor && !call.mutates && !autocast) {
    cache_key = meta_key(is_method ? nullptr : call.fn.ptr(), call.method, meta_args, meta_kwargs,
                         global);
    if (!cache_key.empty()) {
      auto hit = meta_cache().find(cache_key);
      if (hit != meta_cache().end()) result = replay_meta(hit->second);
    }
  }
  ++(result ? meta_cache_stats().hits : cache_key.empty() ? meta_cache_stats().uncacheable
                                                          : meta_cache_stats().misses);
  // An op that writes into an argument without saying so by its name (F.batch_norm's running
  // statistics in training) bumps that meta tensor's version counter: it must run on meta
  // tensors every time (never replayed from the memo), so the placeholders' counters tell
  // which inputs a graph writes into (see compile_region).
  std::vector<int64_t> versions_before;
  if (!result && !cache_key.empty()) {
    for (py::handle arg : meta_args) versions_before.push_back(tensor_version(arg.ptr()));
  }
  if (!result) try {
    if (autocast) {
      result = refs.support.attr("autocast_meta")(
          is_method ? py::none() : py::reinterpret_borrow<py::object>(call.fn),
          py::str(call.method), meta_args, meta_kwargs, call.real_devices());
    } else if (is_method) {
      const std::string meta_method =
          (call.method == "cuda" || call.method == "cpu") ? "to" : call.method;
      py::object self = meta_args[0];
      py::list rest;
      for (size_t i = 1; i < py::len(meta_args); ++i) rest.append(meta_args[i]);
      result = self.attr(meta_method.c_str())(*py::tuple(rest), **meta_kwargs);
    } else if (!call.any_tensor && !meta_kwargs.contains("device")) {
      // A factory (torch.zeros, torch.tensor, ...): allocate on meta, run on the default device.
      // (a copy: py::dict of a dict is the same dict, and the fallback below calls without it)
      py::dict factory_kwargs = py::reinterpret_steal<py::dict>(PyDict_Copy(meta_kwargs.ptr()));
      if (!factory_kwargs) throw py::error_already_set();
      factory_kwargs["device"] = refs.meta_device;
      try {
        result = call.fn(*py::tuple(meta_args), **factory_kwargs);
        explicit_device = refs.support.attr("default_device")();
      } catch (const py::error_already_set& error) {
        if (error.matches(PyExc_KeyboardInterrupt)) throw;
        // A factory meta tensors cannot make (one reading a Python buffer): made for real
        // (it has no tensor inputs), its metadata and device traced from what it made. The graph
        // runs it again: random numbers it draws here are given back (a distribution's sample).
        result = refs.support.attr("call_keeping_rng")(call.fn, py::tuple(meta_args), meta_kwargs);
        if (is_tensor(result.ptr())) {
          explicit_device = result.attr("device");
          PyObject* meta = meta_like(result.ptr());  // New
          if (meta == nullptr) {
            FJ_UNSUPPORTED(kMetaFailure, "{} made a tensor of a layout meta tensors lack",
                           call.target_text);
          }
          result = py::reinterpret_steal<py::object>(meta);
        }
      }
    } else if (runs_python_body(call.fn)) {
      // An autograd.Function's apply, a function allowed in the graph: its body runs with meta
      // the default device (_support.call_python_on_meta).
      result = refs.support.attr("call_python_on_meta")(call.fn, meta_args, meta_kwargs);
    } else {
      result = call.fn(*py::tuple(meta_args), **meta_kwargs);
    }
  } catch (py::error_already_set& error) {
    if (error.matches(PyExc_KeyboardInterrupt)) throw;  // the user's Ctrl-C, not a break
    if (error.matches(refs.support.attr("InternalFault"))) {
      throw InternalError(std::string("device inference: ") + error_summary(error));
    }
    Unsupported failed(BreakKind::kMetaFailure, fmt::format("{} failed on meta tensors: {}",
                                                            call.target_text, error_summary(error)));
    failed.compile_path_only = call.target_text.rfind("torch._higher_order_ops.", 0) == 0;
    throw failed;
  }
  bool wrote_an_argument = false;
  for (size_t i = 0; i < versions_before.size() && !wrote_an_argument; ++i) {
    wrote_an_argument = versions_before[i] != tensor_version(meta_args[i].ptr());
  }
  if (!cache_key.empty() && !wrote_an_argument) remember_meta(cache_key, call.fn, result, meta_args);
  return result;
}

py::object GraphRecorder::infer_device(py::object explicit_device,
                                       const std::vector<ValuePtr>& args,
                                       const KwValues& kwargs) {
  if (explicit_device) return explicit_device;
  py::object device;
  std::vector<py::object> devices;
  for (const auto& arg : args) collect_tensor_devices(arg, devices);
  for (const auto& kw : kwargs) collect_tensor_devices(kw.second, devices);
  for (const auto& d : devices) {
    if (!device || is_device_type(device_string(device), "cpu")) device = d;
  }
  if (!device) device = PyRefs::get().support.attr("default_device")();
  return device;
}

}  // namespace framejit
