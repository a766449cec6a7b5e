// Calls met while tracing: torch functions and Tensor methods become graph nodes; pure builtins
// and methods of constants are evaluated at trace time; everything else is not traced (yet).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <unordered_map>

#include "common/check.h"
#include <exception>

#include "trace/modes.h"
#include "trace/pyrefs.h"
#include "trace/trace_state.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

// Queries whose answer depends on a tensor's sizes or strides (not on its rank or dtype).
bool is_size_query(const std::string& name) {
  return base_name_in(name, {"size", "stride", "numel", "nelement", "is_contiguous",
                             "storage_offset"});
}

bool any_tensor(const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  for (const auto& a : args) {
    if (a->holds_tensor()) return true;
  }
  for (const auto& kw : kwargs) {
    if (kw.second->holds_tensor()) return true;
  }
  return false;
}

// Objects whose identity the guards pin (modules, functions, classes): safe to hand to a pure
// builtin at trace time. Other objects (iterators, user instances) may be consumed or changed.
bool is_pinned_object(const ValuePtr& v) {
  PyObject* obj = v->obj.ptr();
  // (class data, read as it is now: a typing annotation of a dataclass field)
  // (only a plain object stands for its obj: an object the trace made holds its class there,
  // a bound method its function)
  return v->is(ObjRole::kPlain) && !v->bound_self &&
         (PyModule_Check(obj) || PyFunction_Check(obj) || PyCFunction_Check(obj) ||
          PyType_Check(obj) || v->frozen);
}

bool all_constant(const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  for (const auto& a : args) {
    if (!a->is_constant_tree() && !is_pinned_object(a)) return false;
  }
  for (const auto& kw : kwargs) {
    if (!kw.second->is_constant_tree() && !is_pinned_object(kw.second)) return false;
  }
  return true;
}

// The Python call of fn on the trace-time values of constant arguments.
py::object call_python(py::handle fn, const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  py::list py_args;
  for (const auto& a : args) py_args.append(a->as_python());
  py::dict py_kwargs;
  for (const auto& [key, value] : kwargs) py_kwargs[py::str(key)] = value->as_python();
  try {
    return fn(*py::tuple(py_args), **py_kwargs);
  } catch (py::error_already_set& error) {
    if (error.matches(PyExc_KeyboardInterrupt)) throw;
    // The program's own error ('abc'.startswith on bytes, int('x')): the region ends before
    // the call, and CPython raises it there.
    FJ_UNSUPPORTED(kUnsupportedCall, "{} raises {}", safe_repr(fn), error.what());
  }
}

std::string callable_name(py::handle fn) {
  py::object name = py::getattr(fn, "__qualname__", py::getattr(fn, "__name__", py::none()));
  return name.is_none() ? safe_repr(fn) : py::str(name).cast<std::string>();
}

bool is_python_constant(py::handle value) {
  PyObject* obj = value.ptr();
  const PyRefs& refs = PyRefs::get();
  if (obj == Py_None || PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) || PyBool_Check(obj) ||
      PyUnicode_CheckExact(obj) || PyBytes_CheckExact(obj) || PyComplex_CheckExact(obj) ||
      PySlice_Check(obj) || Py_TYPE(obj) == &PyRange_Type || PyType_Check(obj)) {
    return true;
  }
  if (Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(refs.dtype_type.ptr()) ||
      Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(refs.device_type.ptr()) ||
      Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(refs.size_type.ptr()) ||
      Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(refs.finfo_type.ptr()) ||
      Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(refs.iinfo_type.ptr())) {
    return true;
  }
  if (PyTuple_CheckExact(obj)) {
    for (py::handle item : value) {
      if (!is_python_constant(item)) return false;
    }
    return true;
  }
  return false;
}

// Whether a value computed at trace time is or holds (in tuples, lists, dicts) a real tensor.
bool holds_real_tensor(py::handle value, int depth = 0) {
  PyObject* obj = value.ptr();
  if (PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(PyRefs::get().tensor_type.ptr()))) return true;
  if (depth > 8) return false;
  if (PyTuple_Check(obj) || PyList_Check(obj)) {
    for (py::handle item : value) {
      if (holds_real_tensor(item, depth + 1)) return true;
    }
  } else if (PyDict_Check(obj)) {
    for (auto item : py::reinterpret_borrow<py::dict>(value)) {
      if (holds_real_tensor(item.second, depth + 1)) return true;
    }
  }
  return false;
}

ValuePtr constant_result(py::object result, const std::string& what) {
  if (PyFloat_Check(result.ptr()) && !PyFloat_CheckExact(result.ptr()) &&
      std::string(Py_TYPE(result.ptr())->tp_name) == "numpy.float64") {
    // np.sqrt(d_model): numpy's double, a float subclass, as the float of the same value.
    result = py::float_(PyFloat_AsDouble(result.ptr()));
  }
  if (PyTuple_CheckExact(result.ptr()) || PyList_CheckExact(result.ptr())) {
    std::vector<ValuePtr> items;
    for (py::handle item : result) {
      if (!is_python_constant(item)) break;
      items.push_back(Value::constant(py::reinterpret_borrow<py::object>(item)));
    }
    if (items.size() == py::len(result)) {
      return PyList_CheckExact(result.ptr()) ? Value::list(std::move(items))
                                             : Value::tuple(std::move(items));
    }
  }
  // (a NumPy scalar: a constant as it is, its type kept, the number it holds where it reaches a
  // torch call: arg_of)
  if (!is_python_constant(result) && !is_numpy_scalar(result.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedCall, "{} returned {}, which is not traced yet", what,
                   Py_TYPE(result.ptr())->tp_name);
  }
  return Value::constant(std::move(result));
}


}  // namespace

bool ordered_set(const ValuePtr& v) {
  return v->is_const() && v->source < 0 && PyAnySet_Check(v->obj.ptr());
}

bool iterable_items(const ValuePtr& v, std::vector<ValuePtr>& out) {
  if (v->kind == VKind::kTuple || v->kind == VKind::kList) {
    out = v->items;
    return true;
  }
  // Items made one by one as values: a range of more is not unrolled (its values would take
  // hundreds of megabytes before the trace ran out of steps anyway).
  constexpr size_t kMaxItems = size_t{1} << 16;
  if (v->kind == VKind::kIter) return v->rest(kMaxItems, out);
  if (v->is(ObjRole::kDictView)) {
    out = dict_view_items(*v);
    return true;
  }
  if (v->is_const() && PyRange_Check(v->obj.ptr()) &&
      static_cast<size_t>(PyObject_Size(v->obj.ptr())) > kMaxItems) {
    return false;
  }
  // (a mapping proxy answered at trace time, inspect.signature(f).parameters: its keys)
  const bool proxy = v->is_const() && v->source < 0 && Py_IS_TYPE(v->obj.ptr(), &PyDictProxy_Type);
  if (v->is_const() && (PyTuple_Check(v->obj.ptr()) || PyRange_Check(v->obj.ptr()) ||
                         PyList_CheckExact(v->obj.ptr()) || ordered_set(v) || proxy)) {
    for (py::handle item : v->obj) {
      out.push_back(Value::constant(py::reinterpret_borrow<py::object>(item)));
    }
    return true;
  }
  return false;
}

TensorMethodKind tensor_method_kind(const std::string& name) {
  auto& cache = trace_state().tensor_method_kinds;
  auto it = cache.find(name);
  if (it == cache.end()) {
    auto kind = PyRefs::get().support.attr("tensor_method_kind")(name).cast<TensorMethodKind>();
    it = cache.emplace(name, kind).first;
  }
  return it->second;
}

py::object type_of(const ValuePtr& value) {
  auto borrow = [](PyTypeObject* type) {
    return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(type));
  };
  switch (value->kind) {
    case VKind::kTensor:
      if (value->ndarray) return ndarray_type();
      return value->pytype ? value->pytype : PyRefs::get().tensor_type;
    case VKind::kObject:
      if (value->is(ObjRole::kNewObject) || value->is(ObjRole::kPartial)) return value->obj;
      if (value->is(ObjRole::kContextToken)) return borrow(&PyContextToken_Type);
      return borrow(Py_TYPE(value->obj.ptr()));
    case VKind::kConst:
    case VKind::kSymNum:
      return borrow(Py_TYPE(value->obj.ptr()));
    case VKind::kTuple:
      return value->pytype;
    case VKind::kCell:
      return borrow(&PyCell_Type);
    case VKind::kIter:
      if (value->pytype) return value->pytype;  // a generator's
      FJ_UNSUPPORTED(kUnsupportedValue, "type of an iterator is not traced yet");
    case VKind::kList:
      return value->is_deque() ? value->pytype : borrow(&PyList_Type);
    case VKind::kDict:
      return value->pytype ? value->pytype : borrow(&PyDict_Type);
    case VKind::kNull:
      break;
  }
  throw InternalError("type of NULL");
}

ValuePtr defaultdict_factory_made(py::handle factory) {
  PyObject* f = factory.ptr();
  if (f == Py_None) return nullptr;  // no factory: a missing key raises, as for a dict
  if (f == reinterpret_cast<PyObject*>(&PyList_Type)) return Value::list({});
  if (f == reinterpret_cast<PyObject*>(&PyDict_Type)) return Value::dict({}, {});
  if (f == reinterpret_cast<PyObject*>(&PyTuple_Type)) return Value::tuple({});
  if (f == reinterpret_cast<PyObject*>(&PyLong_Type)) return Value::constant(py::int_(0));
  if (f == reinterpret_cast<PyObject*>(&PyFloat_Type)) return Value::constant(py::float_(0.0));
  if (f == reinterpret_cast<PyObject*>(&PyBool_Type)) return Value::constant(py::bool_(false));
  if (f == reinterpret_cast<PyObject*>(&PyUnicode_Type)) return Value::constant(py::str(""));
  return nullptr;
}

bool is_module(py::handle obj) {
  return PyObject_IsInstance(obj.ptr(), PyRefs::get().module_type.ptr()) == 1;
}

// Python functions the tracer goes into: code the frame hook would trace too (not torch, the
// standard library, site-packages or framejit), plus torch.nn module forwards (is_module).
// An argument of a metadata query: tensors (also inside tuples and lists) as their meta tensors.
py::object query_arg(const ValuePtr& value) {
  if (value->is_tensor()) return value->obj;
  if (value->kind == VKind::kTuple || value->kind == VKind::kList) {
    py::list items;
    for (const ValuePtr& item : value->items) items.append(query_arg(item));
    if (value->kind == VKind::kList) return std::move(items);
    return py::tuple(items);
  }
  return value->as_python();
}

// Iterators a builtin call reads: marked exhausted when the call was traced, untouched when it
// ends the region (the exit state must hold them unread).
class IteratorsConsumed {
 public:
  IteratorsConsumed() : exceptions_(std::uncaught_exceptions()) {}
  ~IteratorsConsumed() {
    if (std::uncaught_exceptions() != exceptions_) return;
    for (const ValuePtr& it : iterators_) it->exhaust();
  }
  void push_back(ValuePtr it) { iterators_.push_back(std::move(it)); }

 private:
  int exceptions_;
  std::vector<ValuePtr> iterators_;
};

// Whether builtin `name` iterates its argument `arg`, a tensor, row by row (enumerate(x),
// zip(x, y), list(x), sum(x)). Not len() (a size), reversed() (Tensor.__reversed__ flips),
// or the ones that compare rows (min, max, sorted, set, dict keys).
bool iterates_rows(const std::string& name, const ValuePtr& arg, const std::vector<ValuePtr>& args) {
  if (name == "zip") return true;
  // enumerate(x, start), sum(x, start), list(x), tuple(x): the first argument only
  return (name == "enumerate" || name == "list" || name == "tuple" || name == "sum") &&
         arg.get() == args[0].get();
}

// Whether `method` called on `self` (an object read by source) reads its dict as a plain dict
// does: a dict, or a dict subclass reached through dict's (or OrderedDict's) own method
// (super().get in a registry class, super().__contains__ in ModelOutput). Its items are then
// read as stored (a source's item of a dict subclass is its own storage's).
bool raw_dict_read(const ValuePtr& method, const ValuePtr& self) {
  PyObject* obj = self->obj.ptr();
  if (PyDict_CheckExact(obj)) return true;
  if (!PyDict_Check(obj) || !method->is(ObjRole::kTypeMethod)) return false;
  py::str name(method->method);
  return method->obj.ptr() == _PyType_Lookup(&PyDict_Type, name.ptr()) ||
         (PyODict_Check(obj) && method->obj.ptr() == _PyType_Lookup(&PyODict_Type, name.ptr()));
}

// Builtins that iterate their arguments (and nothing else about them).
bool consumes_iterables(const std::string& name) {
  static const char* kNames[] = {"enumerate", "zip", "reversed", "len", "list", "tuple", "sum",
                                 "any", "all", "min", "max", "sorted", "dict", "set"};
  for (const char* known : kNames) {
    if (name == known) return true;
  }
  return false;
}

// The second argument of isinstance when it is a class or a (nested) tuple of classes known at
// trace time, else an empty object.
py::object class_info(const ValuePtr& value) {
  if ((value->kind == VKind::kObject || value->kind == VKind::kConst) && PyType_Check(value->obj.ptr())) {
    return value->obj;
  }
  if (value->kind == VKind::kObject && value->role == ObjRole::kPlain &&
      std::strcmp(Py_TYPE(value->obj.ptr())->tp_name, "_SpecialGenericAlias") == 0) {
    // typing.Mapping, typing.Sequence, typing.List (unsubscripted): isinstance checks their
    // origin class (collections.abc.Mapping, list).
    py::object origin = py::getattr(value->obj, "__origin__", py::none());
    if (PyType_Check(origin.ptr())) return origin;
  }
  if (value->kind != VKind::kTuple) return py::object();
  py::tuple out(value->items.size());
  for (size_t i = 0; i < value->items.size(); ++i) {
    py::object item = class_info(value->items[i]);
    if (!item) return py::object();
    out[i] = item;
  }
  return out;
}

bool is_user_function(TraceHost& host, py::handle fn) {
  if (host.traces_into(reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn.ptr())))) {
    return true;
  }
  // Helpers of torch.nn's own modules (Conv2d._conv_forward, _BatchNorm checks) are traced
  // like their forward methods.
  // So are torch.nn.functional's private helpers (F._canonical_mask, F._none_or_dtype) and
  // torch.nn.init's functions that fill no tensor (_calculate_fan_in_and_fan_out,
  // calculate_gain), and torch._assert, as _support._is_traced_torch_helper says.
  py::object module = py::getattr(fn, "__module__", py::none());
  if (module.is_none()) return false;
  const std::string name = py::str(module).cast<std::string>();
  if (name == "torch") {
    return py::str(py::getattr(fn, "__name__", py::str(""))).cast<std::string>() == "_assert";
  }
  if (name == "torch.nn.functional" || name == "torch.nn.init") {
    const std::string fn_name = py::str(py::getattr(fn, "__name__", py::str(""))).cast<std::string>();
    const bool is_private = fn_name.rfind('_', 0) == 0;
    return is_private || (name == "torch.nn.init" && !fn_name.empty() && fn_name.back() != '_');
  }
  return name.rfind("torch.nn.modules.", 0) == 0;
}


// enumerate / zip / reversed: iterators that read their arguments when they step, as Python's
// do (a loop over enumerate(lst) sees what the body appends to lst).
ValuePtr Tracer::iterator_builtin(const std::string& name, const std::vector<ValuePtr>& args,
                                  const KwValues& kwargs) {
  try {
    if (name == "enumerate" && (args.size() == 1 || args.size() == 2)) {
      ValuePtr start = args.size() == 2 ? args[1] : nullptr;
      if (kwargs.size() == 1 && kwargs[0].first == "start" && !start) {
        start = kwargs[0].second;
      } else if (!kwargs.empty()) {
        return nullptr;
      }
      if (start && !(start->is_const() && PyLong_CheckExact(start->obj.ptr()))) return nullptr;
      ValuePtr it = Value::iter({iterator_of(args[0])});
      it->iter_form = IterForm::kEnumerate;
      it->count = start ? start->obj.cast<int64_t>() : 0;
      return it;
    }
    if (name == "zip" && kwargs.empty()) {  // zip(..., strict=True) is Python's to run
      std::vector<ValuePtr> inners;
      for (const ValuePtr& arg : args) inners.push_back(iterator_of(arg));
      ValuePtr it = Value::iter(std::move(inners));
      it->iter_form = IterForm::kZip;
      return it;
    }
    if (name == "reversed" && args.size() == 1 && kwargs.empty()) {
      const ValuePtr& seq = args[0];
      if (seq->kind == VKind::kList) {
        ValuePtr it = Value::iter({});
        it->iter_form = IterForm::kReversed;
        it->over = seq;
        it->count = static_cast<int64_t>(seq->items.size()) - 1;
        return it;
      }
      if (seq->is_const() && PyRange_Check(seq->obj.ptr())) {
        ValuePtr it = Value::iter({});
        it->iter_form = IterForm::kRange;
        it->lazy_range = seq->obj[py::slice(py::none(), py::none(), py::int_(-1))];
        return it;
      }
      std::vector<ValuePtr> items;
      if (seq->kind == VKind::kObject && seq->source >= 0 && !seq->bound_self &&
          PyObject_IsInstance(seq->obj.ptr(), PyRefs::get().torch.attr("nn").attr("ModuleDict").ptr()) == 0 &&
          module_children(seq, items)) {
        // reversed(self.layers) of a ModuleList / Sequential: its children (read by source, their
        // number guarded), last first, as its __len__ and __getitem__ give them.
        std::reverse(items.begin(), items.end());
        return Value::iter(std::move(items));
      }
      if (seq->kind == VKind::kTuple || seq->kind == VKind::kDict ||
          (seq->is_const() && PyTuple_Check(seq->obj.ptr()))) {
        ValuePtr forward = iterator_of(seq);
        if (!forward->rest(size_t{1} << 16, items)) return nullptr;
        std::reverse(items.begin(), items.end());
        return Value::iter(std::move(items));
      }
    }
  } catch (const Unsupported&) {
  }
  return nullptr;
}

ValuePtr Tracer::environ_lookup(const ValuePtr& env, const ValuePtr& key_in, const ValuePtr& fallback,
                                bool contains) {
  if (!env->is(ObjRole::kPlain) || env->bound_self || env->source < 0 ||
      env->obj.ptr() != PyRefs::get().environ.ptr()) {
    return nullptr;
  }
  const ValuePtr key = sizes_.concretize(key_in);
  if (!key->is_const() || !PyUnicode_CheckExact(key->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedValue, "os.environ with the key {}", key->describe());
  }
  // Its items live encoded in os.environ._data (a dict): read and guarded there.
  ValuePtr data = entry_.load(entry_.sources().attr(env->source, "_data"));
  if (!data || data->source < 0 || !PyDict_CheckExact(data->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedValue, "os.environ without its data dict");
  }
  py::object encoded = env->obj.attr("encodekey")(key->obj);
  const bool present = PyDict_Contains(data->obj.ptr(), encoded.ptr()) == 1;
  entry_.guard_dict_contains(data->source, encoded.ptr(), present);
  if (contains) return Value::constant(py::bool_(present));
  if (!present) {
    if (fallback) return fallback;
    FJ_UNSUPPORTED(kUnsupportedValue, "os.environ[{}] is missing (KeyError at run time)", safe_repr(key->obj));
  }
  ValuePtr raw = entry_.load(entry_.sources().item(data->source, encoded));
  FJ_CHECK(raw != nullptr && raw->source >= 0, "os.environ item unreadable");
  entry_.guard_const(raw->source, raw->obj.ptr());
  return Value::constant(env->obj.attr("decodevalue")(raw->obj));
}

ValuePtr Tracer::dict_call(const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  // dict(), dict(mapping), dict(pairs), dict(**kw): a new dict of the trace.
  ValuePtr out = Value::dict({}, {});
  if (args.size() > 1) FJ_UNSUPPORTED(kUnsupportedCall, "dict() with {} positional arguments", args.size());
  if (args.size() == 1) {
    std::vector<std::pair<py::object, ValuePtr>> entries;
    if (!mapping_entries(args[0], entries)) {
      FJ_UNSUPPORTED(kUnsupportedCall, "dict() of {}", args[0]->describe());
    }
    for (auto& [key, value] : entries) out->set_key(std::move(key), std::move(value));
  }
  for (const auto& [key, value] : kwargs) out->set_key(py::str(key), value);
  return out;
}

bool Tracer::mapping_entries(const ValuePtr& from, std::vector<std::pair<py::object, ValuePtr>>& out) {
  if (from->kind == VKind::kDict) {
    for (size_t i = 0; i < from->keys.size(); ++i) out.emplace_back(from->keys[i], from->items[i]);
    return true;
  }
  if (from->is(ObjRole::kNewObject) && from->mapping) return mapping_entries(from->mapping, out);
  if (from->is_const() && PyDict_CheckExact(from->obj.ptr())) {
    for (auto [key, value] : py::reinterpret_borrow<py::dict>(from->obj)) {
      out.emplace_back(py::reinterpret_borrow<py::object>(key),
                       Value::constant(py::reinterpret_borrow<py::object>(value)));
    }
    return true;
  }
  if (from->kind == VKind::kObject && dict_by_source(from, out)) return true;
  std::vector<ValuePtr> pairs;
  const bool iterator = from->kind == VKind::kIter;
  if (!(from->is_sequence() || iterator || from->is(ObjRole::kDictView) ||
        (from->is_const() && !PyUnicode_Check(from->obj.ptr()))) ||
      !iterable_items(from, pairs)) {
    return false;
  }
  std::vector<std::pair<py::object, ValuePtr>> entries;
  for (const ValuePtr& pair_in : pairs) {
    const ValuePtr pair = sizes_.concretize(pair_in);
    std::vector<ValuePtr> kv;
    if (!(pair->is_sequence() || pair->is_const()) || !iterable_items(pair, kv) || kv.size() != 2) {
      return false;
    }
    const ValuePtr key = sizes_.concretize(kv[0]);
    if (!key->is_constant_tree()) return false;
    entries.emplace_back(key->as_python(), kv[1]);
  }
  if (iterator) from->exhaust();
  for (auto& entry : entries) out.push_back(std::move(entry));
  return true;
}

ValuePtr Tracer::autograd_function_call(std::vector<ValuePtr> args, KwValues kwargs) {
  // MyFunction.apply(*args): one node of the graph that calls it, so autograd records the
  // function's own backward (a straight-through estimator's gradient is not its forward's).
  // Its forward runs on the meta values for the output's metadata; the class's forward and
  // backward are guarded as they are now.
  const ValuePtr cls = args[0];
  args.erase(args.begin());
  const std::string name = py::str(cls->obj.attr("__qualname__")).cast<std::string>() + ".apply";
  if (!any_tensor(args, kwargs)) FJ_UNSUPPORTED(kUnsupportedCall, "{} of no tensor", name);
  if (cls->source >= 0) {
    for (const char* method : {"forward", "backward", "setup_context", "vjp", "jvp"}) {
      guard_class_attribute(cls, method, true, /*same_object=*/true);
    }
  }
  py::object target = PyRefs::get().support.attr("AutogradFunctionApply").attr("of")(cls->obj);
  return record_call(NodeKind::kCallFunction, target, "", std::move(args), std::move(kwargs), "",
                     py::str(target.attr("__name__")).cast<std::string>());
}

bool Tracer::checkpoint_call(std::vector<ValuePtr>& args, KwValues& kwargs, ValuePtr& result) {
  if (args.empty()) return false;
  if (no_inline_ != nullptr && no_inline_->count(call_site_here())) return false;  // its body broke
  // checkpoint's own keywords; the rest are the function's.
  static const std::set<std::string> kOwn = {"use_reentrant", "preserve_rng_state", "context_fn",
                                             "determinism_check", "debug", "early_stop"};
  py::dict own;
  KwValues rest;
  for (auto& kw : kwargs) {
    if (!kOwn.count(kw.first)) {
      rest.push_back(kw);
      continue;
    }
    if (!kw.second->is_const()) return false;
    own[py::str(kw.first)] = kw.second->obj;
  }
  // The non-reentrant form only: the reentrant one differentiates through its tensor arguments
  // alone (not the parameters its function reads), which a body with its reads as inputs would
  // not reproduce; a context_fn (selective checkpointing) decides per op. Both stay Python's.
  if (!own.contains("use_reentrant") || !py::object(own["use_reentrant"]).is(py::bool_(false)) ||
      own.contains("context_fn")) {
    return false;
  }
  std::vector<ValuePtr> fn_args(args.begin() + 1, args.end());
  if (recorder_.in_checkpoint()) {  // nested: part of the enclosing body, recomputed with it
    result = call(args[0], std::move(fn_args), std::move(rest));
    return true;
  }
  recorder_.open_checkpoint(std::move(own));
  const size_t depth = frames_.size();
  try {
    result = call(args[0], std::move(fn_args), std::move(rest));
  } catch (...) {
    recorder_.close_checkpoint();
    throw;
  }
  if (!result && frames_.size() == depth + 1) {
    frames_.back()->checkpoint_body = true;  // closed when that frame returns
  } else {
    end_checkpoint_body();  // answered at once (a torch op): the body is what it recorded
  }
  return true;
}

void Tracer::end_checkpoint_body() {
  Graph& graph = recorder_.graph();
  const std::vector<std::string> writes = graph.scope_writes_outside(graph.current_scope());
  recorder_.close_checkpoint();
  if (!writes.empty()) {
    // (recomputed for the backward pass, the body would write them a second time)
    FJ_UNSUPPORTED(kSideEffect, "a checkpointed function writes into a tensor from outside it ({})", writes[0]);
  }
}

ValuePtr Tracer::call(const ValuePtr& fn, std::vector<ValuePtr> args, KwValues kwargs) {
  PyRefs& refs = PyRefs::get();
  // `@functools.wraps(fn)` on a function defined in the trace (x-transformers' `maybe(fn)`): the
  // decorator is _support.wraps_applied bound to what it wraps; applied, the made function
  // remembers it, and functools.update_wrapper runs where that function is rebuilt.
  static PyObject* const kWraps = py::object(py::module_::import("functools").attr("wraps")).release().ptr();
  static PyObject* const kWrapsApplied = py::object(refs.support.attr("wraps_applied")).release().ptr();
  if (fn->obj.ptr() == kWraps && !fn->bound_self && !fn->is_special_object() && args.size() == 1 &&
      kwargs.empty()) {
    ValuePtr decorator = Value::object(py::reinterpret_borrow<py::object>(kWrapsApplied));
    decorator->bound_self = args[0];
    return decorator;
  }
  if (fn->obj.ptr() == kWrapsApplied && fn->bound_self && args.size() == 1 && kwargs.empty() &&
      args[0]->is(ObjRole::kMadeFunction) && !args[0]->wrapped) {
    ValuePtr decorated = std::make_shared<Value>(*args[0]);  // values are shared: change a copy
    decorated->wrapped = fn->bound_self;
    return decorated;
  }
  if (fn->is(ObjRole::kMadeFunction)) {  // a lambda, nested def or comprehension of this trace
    inline_call(fn, py::none(), std::move(args), std::move(kwargs), /*may_make_generator=*/true);
    return nullptr;
  }
  static PyObject* const kCheckpoint =
      py::object(py::module_::import("torch.utils.checkpoint").attr("checkpoint")).release().ptr();
  if (fn->obj.ptr() == kCheckpoint && fn->is(ObjRole::kPlain) && !fn->bound_self) {
    ValuePtr result;
    if (checkpoint_call(args, kwargs, result)) return result;
  }
  // A method loaded by LOAD_METHOD: args[0] is self. A tensor method read by LOAD_ATTR carries
  // its tensor as bound_self instead.
  if (fn->is_special_object() && fn->bound_self &&
      (fn->bound_self->kind == VKind::kTensor || fn->is(ObjRole::kTypeMethod))) {
    // (and a builtin base's method bound by super() or read off a new object: dict.get)
    args.insert(args.begin(), fn->bound_self);
  }
  if (fn->is(ObjRole::kWithExit)) {  // type(manager).__exit__(manager, *args), inlined
    args.insert(args.begin(), fn->bound_self);
    inline_call(Value::object(fn->obj), fn->obj, std::move(args), std::move(kwargs));
    return nullptr;
  }
  if (fn->is(ObjRole::kGradExit) || fn->is(ObjRole::kInferenceExit) ||
      fn->is(ObjRole::kAutocastExit) || fn->is(ObjRole::kNullExit)) {
    return exit_with(*this, fn, args);
  }
  if (fn->is(ObjRole::kNewObject)) {
    return call(new_object_attr(fn, "__call__"), std::move(args), std::move(kwargs));
  }
  if (fn->is(ObjRole::kPlain) && !fn->bound_self && fn->source >= 0 && args.empty() &&
      kwargs.empty() && PyWeakref_CheckRefExact(fn->obj.ptr())) {
    // r() of a weakref.ref read by source: what it refers to now (None once dead), read by a
    // source of its own, so guarded like any value read (a dead or changed referent compiles
    // again).
    if (ValuePtr target = entry_.load(entry_.sources().weak_target(fn->source))) return target;
  }
  if (fn->is(ObjRole::kPartial)) {
    ValuePtr out = partial_call(fn, fn->obj, args, kwargs);
    return out->kind == VKind::kNull ? nullptr : out;
  }
  if (fn->is(ObjRole::kGradManager) || fn->is(ObjRole::kGradSet) ||
      fn->is(ObjRole::kInferenceManager) || fn->is(ObjRole::kAutocastManager) ||
      fn->is(ObjRole::kNullManager)) {
    FJ_UNSUPPORTED(kUnsupportedCall, "call of a grad-mode manager (as a decorator)");
  }
  if (fn->is(ObjRole::kGenericGetattr)) {  // super().__getattribute__(name)
    const ValuePtr name = args.size() == 1 && kwargs.empty() ? sizes_.concretize(args[0]) : nullptr;
    if (!name || !name->is_const() || !PyUnicode_CheckExact(name->obj.ptr())) {
      FJ_UNSUPPORTED(kUnsupportedCall, "object.__getattribute__ with a name not known at trace time");
    }
    const std::string attribute = name->obj.cast<std::string>();
    if (fn->bound_self->is(ObjRole::kNewObject) && !new_object_has(fn->bound_self, attribute)) {
      raise_missing_attribute(fn->bound_self, attribute);
      return nullptr;
    }
    if (fn->bound_self->is(ObjRole::kPlain) && !fn->bound_self->bound_self &&
        !attribute_present(fn->bound_self, attribute, /*generic=*/true)) {
      raise_missing_attribute(fn->bound_self, attribute);  // guarded absent by attribute_present
      return nullptr;
    }
    return read_attribute(fn->bound_self, attribute, AttrLookup::kGeneric);
  }
  if (fn->is_special_object()) {
    const std::string& name = fn->method;
    const ValuePtr self = args.at(0);
    if (fn->is(ObjRole::kTypeMethod) && self->is(ObjRole::kNewObject)) {
      return new_object_method(name, args, kwargs);
    }
    if (fn->is(ObjRole::kTypeMethod) && name == "__get__" && PyFunction_Check(self->obj.ptr()) &&
        self->is(ObjRole::kPlain) && !self->bound_self && (args.size() == 2 || args.size() == 3) &&
        kwargs.empty()) {
      // func.__get__(obj[, type]): func bound to obj (itself for None)
      if (args[1]->is_const() && args[1]->obj.is_none()) return self;
      return bind_class_attribute(AttrKind::kFunction, self->obj, args[1]);
    }
    static PyObject* const kSetattr = PyUnicode_InternFromString("__setattr__");
    if (fn->is(ObjRole::kTypeMethod) && name == "__setattr__" && args.size() == 3 && kwargs.empty() &&
        self->is(ObjRole::kPlain) && self->source >= 0 &&
        fn->obj.ptr() == _PyType_Lookup(&PyBaseObject_Type, kSetattr)) {
      // super().__setattr__(name, value) in a class's own __setattr__: the store itself.
      const ValuePtr attribute = sizes_.concretize(args[1]);
      if (attribute->is_const() && PyUnicode_CheckExact(attribute->obj.ptr())) {
        record_store(self, attribute->obj.cast<std::string>(), args[2], /*generic=*/true);
        return Value::constant(py::none());
      }
    }
    if (self->kind == VKind::kTensor && self->ndarray) return ndarray_method(name, args, kwargs);
    if (self->kind == VKind::kTensor) {
      if (name == "numpy") return tensor_to_numpy(self, args, kwargs);
      for (size_t k = 1; k < args.size(); ++k) {
        if (holds_ndarray(args[k])) FJ_UNSUPPORTED(kUnsupportedCall, "Tensor.{}() of a NumPy array", name);
      }
      for (const auto& kw : kwargs) {
        if (holds_ndarray(kw.second)) FJ_UNSUPPORTED(kUnsupportedCall, "Tensor.{}() of a NumPy array", name);
      }
    }
    // (a dtype or class read as an object: a default argument, `acc_dtype=torch.float32`)
    const bool fixed_target = args.size() == 2 && (args[1]->is_const() || args[1]->is(ObjRole::kPlain));
    if (self->kind == VKind::kTensor && name == "type" && fixed_target && kwargs.empty() &&
        Py_TYPE(args[1]->obj.ptr()) == reinterpret_cast<PyTypeObject*>(refs.dtype_type.ptr())) {
      // x.type(torch.float16) is x.to(torch.float16) (itself where the dtype is x's already).
      return record_call(NodeKind::kCallMethod, py::none(), "to", std::move(args), {}, "", "to");
    }
    if (self->kind == VKind::kTensor && name == "type" && fixed_target && kwargs.empty() &&
        !args[1]->bound_self) {
      // x.type("torch.DoubleTensor") / x.type(torch.cuda.HalfTensor): x.to(device, dtype) of
      // that legacy type's device and dtype.
      py::object target = refs.support.attr("legacy_tensor_type")(args[1]->obj);
      if (!target.is_none()) {
        KwValues to_kwargs = {{"device", Value::constant(target[py::int_(0)])},
                              {"dtype", Value::constant(target[py::int_(1)])}};
        return record_call(NodeKind::kCallMethod, py::none(), "to", {self}, std::move(to_kwargs), "", "to");
      }
    }
    if (self->kind == VKind::kTensor && name == "type" && args.size() == 1 && kwargs.empty()) {
      // x.type(): its dtype's and device's name (both guarded with the tensor).
      return Value::constant(refs.support.attr("tensor_type_name")(self->obj.attr("dtype"), self->device));
    }
    if (self->kind == VKind::kTensor) {
      const TensorMethodKind kind = tensor_method_kind(name);
      if (kind == TensorMethodKind::kOp) {
        return record_call(NodeKind::kCallMethod, py::none(), name, std::move(args),
                           std::move(kwargs), "", name);
      }
      if (kind == TensorMethodKind::kMetadata) {
        if (name == "size" && kwargs.empty() && args.size() <= 2) {
          if (args.size() == 1) return sizes_.tensor_shape(self, "Tensor.size()");
          const ValuePtr dim = sizes_.concretize(args[1]);
          if (dim->is_const() && PyLong_CheckExact(dim->obj.ptr())) {
            return sizes_.tensor_size(self, dim->obj.cast<int64_t>(), "Tensor.size()");
          }
        }
        if (base_name_in(name, {"numel", "nelement"}) && args.size() == 1 && kwargs.empty()) {
          return sizes_.tensor_numel(self);
        }
        if (base_name_in(name, {"numel", "nelement"})) {
          sizes_.note_sizes_read(self, "Tensor." + name + "()");
        } else if (is_size_query(name)) {
          sizes_.note_size_read("Tensor." + name + "()");
        }
        sizes_.make_constant_args(args, kwargs);
        try {
          py::list rest;
          for (size_t i = 1; i < args.size(); ++i) rest.append(args[i]->as_python());
          py::dict py_kwargs;
          for (const auto& [key, value] : kwargs) py_kwargs[py::str(key)] = value->as_python();
          return constant_result(self->obj.attr(name.c_str())(*py::tuple(rest), **py_kwargs),
                                 "Tensor." + name);
        } catch (const py::error_already_set& e) {
          FJ_UNSUPPORTED(kMetaFailure, "Tensor.{} failed on meta tensors: {}", name, e.what());
        }
      }
      if (name == "get_device") {
        py::object index = self->device.attr("index");
        return Value::constant(index.is_none() ? py::int_(-1) : index);
      }
      if (args.size() == 1 && kwargs.empty() &&
          (name == "item" || name == "tolist" || name == "__int__" || name == "__float__" ||
           name == "__bool__" || name == "__index__")) {
        // a value the trace computed from numbers (Value::known): a constant
        if (py::object known = known_value(self)) {
          return constant_result(known.attr(name.c_str())(), "Tensor." + name);
        }
      }
      if (name == "backward") {  // (torch.compile breaks here too, without compiled autograd)
        FJ_UNSUPPORTED(kUnsupportedCall, "Tensor.backward() runs autograd outside the graph");
      }
      FJ_UNSUPPORTED(kDataDependent, "Tensor.{}() needs the tensor's data", name);
    }
    if (self->kind == VKind::kTuple && self->holds_size_expr()) {
      // x.shape.numel(), x.size().index(n): methods of torch.Size need the numbers.
      for (auto& a : args) a = sizes_.concretize(a);
      for (auto& kw : kwargs) kw.second = sizes_.concretize(kw.second);
      return call(fn, std::move(args), std::move(kwargs));
    }
    if (self->kind == VKind::kConst && is_python_constant(self->obj) &&
        all_constant({args.begin() + 1, args.end()}, kwargs)) {
      py::object bound = self->obj.attr(name.c_str());
      return constant_result(call_python(bound, {args.begin() + 1, args.end()}, kwargs),
                             callable_name(bound));
    }
    if (self->is_const() && self->source < 0 && Py_IS_TYPE(self->obj.ptr(), &PyDictProxy_Type) &&
        args.size() == 1 && kwargs.empty() && (name == "keys" || name == "values" || name == "items")) {
      // inspect.signature(f).parameters.keys() (diffusers' Attention asks its processor's):
      // the proxy is a constant of the trace, its entries too (a tuple of them stands for the view).
      return Value::constant_tree(py::tuple(self->obj.attr(name.c_str())()));
    }
    if (ValuePtr out = container_method(name, args, kwargs)) return out;
    if (ValuePtr out = set_method(self, name, args, kwargs)) return out;
    if (self->kind == VKind::kList && !self->is_deque() && kwargs.empty() && (name == "append" || name == "extend")) {
      make_writable(self);
      if (name == "append" && args.size() == 2) {
        self->items.push_back(args[1]);
        return Value::constant(py::none());
      }
      if (name == "extend" && args.size() == 2 && args[1]->is_sequence()) {
        for (const auto& item : args[1]->items) self->items.push_back(item);
        return Value::constant(py::none());
      }
      std::vector<ValuePtr> rest;
      if (name == "extend" && args.size() == 2 && args[1]->kind == VKind::kIter &&
          args[1]->rest(size_t{1} << 16, rest)) {  // from an iterator: what it has left
        args[1]->exhaust();
        for (auto& item : rest) self->items.push_back(std::move(item));
        return Value::constant(py::none());
      }
    }
    py::object key;  // a dict method's key argument, where one is known at trace time
    const bool known_key = args.size() >= 2 && args[1]->as_key(key);
    if (self->kind == VKind::kDict && name == "get" && kwargs.empty() &&
        (args.size() == 2 || args.size() == 3) && known_key) {
      const long at = self->find_key(key);
      if (at >= 0) return self->items[at];
      return args.size() == 3 ? args[2] : Value::constant(py::none());
    }
    if (self->kind == VKind::kObject && self->source >= 0 && raw_dict_read(fn, self) &&
        name == "get" && kwargs.empty() &&
        (args.size() == 2 || args.size() == 3) && known_key) {
      check_items_unchanged(self);
      const bool present = PyDict_Contains(self->obj.ptr(), key.ptr()) == 1;
      entry_.guard_dict_contains(self->source, key.ptr(), present);
      if (present) return stored_item(self, key);
      return args.size() == 3 ? args[2] : Value::constant(py::none());
    }
    if (self->kind == VKind::kObject && self->source >= 0 && raw_dict_read(fn, self) &&
        (name == "__contains__" || name == "__getitem__") && kwargs.empty() && args.size() == 2 &&
        known_key) {
      // super().__contains__(key) / super().__getitem__(key) in a dict subclass's own method.
      check_items_unchanged(self);
      const bool present = PyDict_Contains(self->obj.ptr(), key.ptr()) == 1;
      entry_.guard_dict_contains(self->source, key.ptr(), present);
      if (name == "__contains__") return Value::constant(py::bool_(present));
      if (!present) raise_missing_key(self, key);
      return stored_item(self, key);
    }
    if (self->kind == VKind::kTuple && self->pytype &&
        self->pytype.ptr() != reinterpret_cast<PyObject*>(&PyTuple_Type) &&
        self->pytype.ptr() != refs.size_type.ptr()) {
      // p._replace(a=x), p._asdict(), a NamedTuple's own method: traced with p as self.
      py::object method = refs.support.attr("tuple_method")(self->pytype, name);
      if (!method.is_none()) {
        inline_call(Value::object(method), method, std::move(args), std::move(kwargs),
                    /*may_make_generator=*/true);
        return nullptr;
      }
    }
    FJ_UNSUPPORTED(kUnsupportedCall, "method {}.{}() is not traced yet", self->describe(), name);
  }

  if (fn->kind != VKind::kObject && fn->kind != VKind::kConst) {
    FJ_UNSUPPORTED(kUnsupportedCall, "call of {}", fn->describe());
  }
  py::object callable = fn->obj;
  if (callable.ptr() == refs.mapping_get.ptr() && kwargs.empty()) {  // os.environ.get(key[, default])
    const auto [self, self_at] = method_receiver(fn, args);
    if (self && (args.size() == self_at + 1 || args.size() == self_at + 2)) {
      const ValuePtr fallback = args.size() == self_at + 2 ? args[self_at + 1] : Value::constant(py::none());
      if (ValuePtr found = environ_lookup(self, args[self_at], fallback, false)) return found;
    }
  }
  if (ValuePtr answered = stdlib_call(fn, args, kwargs)) return answered;
  if (fn->bound_self) {  // a method of a user object or module: self goes first
    args.insert(args.begin(), fn->bound_self);
  }
  if (is_module(callable)) return inline_module_call(fn, std::move(args), std::move(kwargs));
  if (callable.ptr() == refs.function_apply.ptr() && !args.empty() &&
      PyType_Check(args[0]->obj.ptr()) && args[0]->kind == VKind::kObject &&
      PyObject_IsSubclass(args[0]->obj.ptr(), refs.autograd_function.ptr()) == 1) {
    return autograd_function_call(std::move(args), std::move(kwargs));
  }
  if (callable.ptr() == refs.signature.ptr() && args.size() == 1 && kwargs.empty()) {
    // inspect.signature(f) of a function the guards pin (by identity, its code too): a constant.
    const ValuePtr& of = args[0];
    PyObject* target = of->obj.ptr();
    if (of->kind == VKind::kObject && (of->role == ObjRole::kPlain) &&
        (PyFunction_Check(target) || PyMethod_Check(target))) {
      if (of->source >= 0) entry_.guard_id(of->source, target);
      py::object sig = callable(of->obj);
      if (of->bound_self && PyFunction_Check(target)) {  // a method bound in the trace: no self
        py::list all(sig.attr("parameters").attr("values")());
        py::list rest;
        for (size_t i = 1; i < py::len(all); ++i) rest.append(all[i]);
        sig = sig.attr("replace")(py::arg("parameters") = rest);
      }
      return Value::constant(sig);
    }
  }
  // One cached classification per callable object decides the rest.
  const CallableKind kind = refs.classify(callable);
  if (kind == CallableKind::kInGraph) {
    // framejit.allow_in_graph / torch.compiler.allow_in_graph: one node that calls it (on the
    // meta values now, for its outputs' metadata), its body not traced.
    if (!any_tensor(args, kwargs)) {
      FJ_UNSUPPORTED(kUnsupportedCall, "{} (allowed in the graph) called with no tensor",
                     callable_name(callable));
    }
    return record_call(NodeKind::kCallFunction, callable, "", std::move(args), std::move(kwargs), "",
                       callable_name(callable));
  }
  if (kind == CallableKind::kBuiltin) {
    for (auto& a : args) a = enum_as_constant(a);
  }
  {
    // NumPy: a call with an array of the trace among its arguments, or one of NumPy's array
    // makers called with constants (numpy_calls.cpp).
    bool arrays = false;
    for (const auto& a : args) arrays = arrays || holds_ndarray(a);
    for (const auto& kw : kwargs) arrays = arrays || holds_ndarray(kw.second);
    const bool may_make_arrays = kind == CallableKind::kNotTraced && !PyType_Check(callable.ptr()) &&
                                 !PyFunction_Check(callable.ptr()) && !PyMethod_Check(callable.ptr());
    if (arrays || may_make_arrays) {
      const bool numpy_callable =
          py::str(py::getattr(callable, "__module__", py::str(""))).cast<std::string>().rfind("numpy", 0) == 0;
      if (arrays && kind == CallableKind::kBuiltin && !numpy_callable) {
        const std::string name = callable_name(callable);
        if (name != "len" && name != "isinstance" && name != "type" && name != "callable") {
          FJ_UNSUPPORTED(kUnsupportedCall, "{}() of a NumPy array", name);
        }
      }
      if (numpy_callable || (arrays && kind == CallableKind::kTorchOp)) {
        if (ValuePtr out = numpy_function_call(callable, args, kwargs, arrays)) return out;
      }
    }
  }
  if (refs.is_enum_class(callable.ptr()) && args.size() == 1 && kwargs.empty()) {
    // Mode("train"): the member of that value, when the class has one (no _missing_ runs).
    const ValuePtr value = sizes_.concretize(enum_as_constant(args[0]));
    if (value->is_constant_tree()) {
      const py::object key = value->as_python();
      if (PyObject_IsInstance(key.ptr(), callable.ptr()) == 1) return Value::object(key);
      py::dict members = callable.attr("_value2member_map_");
      if (PyObject_Hash(key.ptr()) != -1 && members.contains(key)) return Value::object(members[key]);
      PyErr_Clear();
    }
  }
  if (kind == CallableKind::kGradModeManager && args.empty() && kwargs.empty()) {
    return make_grad_mode_manager(callable);
  }
  if (kind == CallableKind::kModuleListing) return module_listing(callable, args, kwargs);
  if (kind == CallableKind::kAttributeBuiltin) return attribute_builtin(callable, args, kwargs);
  if (kind == CallableKind::kNextBuiltin && kwargs.empty() && (args.size() == 1 || args.size() == 2) &&
      args[0]->kind == VKind::kIter) {
    if (args[0]->generator_waits()) {
      // One item of a generator: its frame runs to its next yield, as for a loop's step.
      resume_generator(*args[0], TraceFrame::GenMode::kNext, -1, args[0]);
      frame().next_default = args.size() == 2 ? args[1] : nullptr;
      return nullptr;
    }
    // next(it[, default]) of an iterator the trace unrolls (next(self.parameters())); an
    // exhausted one raises StopIteration, which a try block in the trace may catch.
    if (ValuePtr item = args[0]->next()) return item;
    if (args.size() == 2) return args[1];
    throw TracedRaise{simple_exception(py::handle(PyExc_StopIteration), py::tuple(), py::dict())};
  }
  if (kind == CallableKind::kCompilingFlag && args.empty() && kwargs.empty()) {
    // True: the library takes its compile-friendly path (False where that path raised: see
    // CompilingFlagRetrace).
    compiling_asked_ = compiling_asked_ || compiling_answer_;
    return Value::constant(py::bool_(compiling_answer_));
  }
  if (PyCFunction_Check(callable.ptr()) || PyFunction_Check(callable.ptr())) {
    // torch._check(cond, message) and its kin on a condition the trace decides (a constant, a
    // comparison of sizes: guarded as a branch on it would be): nothing when it holds, the
    // program's error where it does not (CPython raises it there).
    static const std::vector<PyObject*> kChecks = [] {
      std::vector<PyObject*> checks;
      py::object torch = PyRefs::get().torch;
      for (const char* name : {"_check", "_check_index", "_check_value", "_check_type", "_check_not_implemented"}) {
        if (py::hasattr(torch, name)) checks.push_back(py::object(torch.attr(name)).release().ptr());
      }
      return checks;
    }();
    if (!args.empty() && std::find(kChecks.begin(), kChecks.end(), callable.ptr()) != kChecks.end()) {
      ValuePtr cond = args[0];
      if (cond->kind == VKind::kSymNum && cond->is_size_expr()) cond = sizes_.decide(cond);
      if (cond->is_const() && PyBool_Check(cond->obj.ptr())) {
        if (cond->obj.ptr() == Py_True) return Value::constant(py::none());
        FJ_PROGRAM_RAISED(kUnsupportedCall, "{}() of a condition that does not hold", callable_name(callable));
      }
    }
  }
  if (kind == CallableKind::kExportingFlag && args.empty() && kwargs.empty()) {
    return Value::constant(py::bool_(false));  // a compile, not an export
  }
  if (kind == CallableKind::kInferenceMode) return inference_mode_call(args, kwargs);
  if (kind == CallableKind::kAutocast) return autocast_call(args, kwargs);
  if (kind == CallableKind::kNullContext) return null_context_call(callable, args, kwargs);
  if (kind == CallableKind::kSetGradEnabled && kwargs.empty()) return set_grad_enabled_call(*this, args);
  if (kind == CallableKind::kGradModeClone && args.empty() && kwargs.empty()) {
    // ctx_factory() in a @torch.no_grad() / @torch.inference_mode() wrapper: a fresh manager
    // of the same class (and mode).
    py::object owner = callable.attr("__self__");
    if (py::type::handle_of(owner).is(refs.torch.attr("inference_mode"))) {
      return inference_mode_call({Value::constant(owner.attr("mode"))}, {});
    }
    return make_grad_mode_manager(py::type::handle_of(owner));
  }
  if (kind == CallableKind::kGradModeWrapper) {
    // A @torch.no_grad() / @torch.enable_grad() function: its wrapper (`with ctx_factory():
    // return func(*args, **kwargs)`) is traced like user code.
    inline_call(fn, callable, std::move(args), std::move(kwargs));
    return nullptr;
  }
  if (callable.ptr() == reinterpret_cast<PyObject*>(&PySuper_Type) && args.empty() && kwargs.empty()) {
    return zero_arg_super();
  }
  if (ValuePtr made = set_call(callable, args, kwargs)) return made;
  if (kind != CallableKind::kTorchOp &&
      (kind == CallableKind::kBuiltin || PyType_Check(callable.ptr()) || PyCFunction_Check(callable.ptr()) ||
       (PyFunction_Check(callable.ptr()) && !is_user_function(host_, callable)))) {
    // map, filter, functools.reduce, itertools' chain / product / combinations / ...,
    // sorted / min / max with a key function, and the standard library's Python functions the
    // tracer models (typing.cast): their Python forms (_python_forms.py), traced in their place.
    const bool keyed = std::any_of(kwargs.begin(), kwargs.end(), [](const auto& kw) {
      return kw.first == "key" || kw.first == "strict";
    });
    py::object form = refs.support.attr("python_form")(callable, keyed);
    if (!form.is_none()) {
      inline_call(Value::object(form), form, std::move(args), std::move(kwargs),
                  /*may_make_generator=*/true);
      return nullptr;
    }
  }
  {
    // operator.itemgetter / attrgetter: made from constants, then applied in the trace.
    static PyObject* const kItemGetter = py::object(refs.operator_module.attr("itemgetter")).release().ptr();
    static PyObject* const kAttrGetter = py::object(refs.operator_module.attr("attrgetter")).release().ptr();
    if ((callable.ptr() == kItemGetter || callable.ptr() == kAttrGetter) && kwargs.empty() &&
        all_constant(args, kwargs)) {
      py::list py_args;
      for (const auto& a : args) py_args.append(a->as_python());
      return Value::object(callable(*py::tuple(py_args)));
    }
    const bool items = Py_TYPE(callable.ptr()) == reinterpret_cast<PyTypeObject*>(kItemGetter);
    const bool attrs = Py_TYPE(callable.ptr()) == reinterpret_cast<PyTypeObject*>(kAttrGetter);
    if ((items || attrs) && args.size() == 1 && kwargs.empty()) {
      py::tuple keys = callable.attr("__reduce__")()[py::int_(1)];
      std::vector<ValuePtr> got;
      for (py::handle key : keys) {
        if (items) {
          got.push_back(item(args[0], Value::constant(py::reinterpret_borrow<py::object>(key))));
          continue;
        }
        ValuePtr value = args[0];
        for (py::handle part : py::str(key).attr("split")(".")) {
          value = attr(value, part.cast<std::string>());
          if (value->is_special_object() && !value->is(ObjRole::kNewObject)) {
            FJ_UNSUPPORTED(kUnsupportedCall, "attrgetter({}) reaching {}", safe_repr(key), value->describe());
          }
        }
        got.push_back(std::move(value));
      }
      return got.size() == 1 ? got[0] : Value::tuple(std::move(got));
    }
  }
  if (PyCFunction_Check(callable.ptr()) && kwargs.empty() && args.size() == 1) {
    static PyObject* const kIter = PyDict_GetItemString(PyEval_GetBuiltins(), "iter");  // Borrowed
    if (callable.ptr() == kIter) return iterator_of(args[0]);
  }
  if (callable.ptr() == reinterpret_cast<PyObject*>(&PySuper_Type) && args.size() == 2 &&
      kwargs.empty() && (args[0]->kind == VKind::kObject || args[0]->kind == VKind::kConst) &&
      PyType_Check(args[0]->obj.ptr()) && args[1]->kind == VKind::kObject) {
    ValuePtr out = Value::object(args[0]->obj);  // super(C, self): as super() in C's methods
    out->role = ObjRole::kSuper;
    out->bound_self = args[1];
    return out;
  }
  if (ValuePtr partial = partial_call(fn, callable, args, kwargs)) {
    return partial->kind == VKind::kNull ? nullptr : partial;
  }
  if (PyType_Check(callable.ptr()) && PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(callable.ptr()),
                                                       &PyTuple_Type)) {
    // A namedtuple (collections or typing) made in the trace: a tuple value of its type, its
    // fields bound as namedtuple's __new__ binds them.
    py::list names;
    for (const auto& kw : kwargs) names.append(py::str(kw.first));
    py::object plan = refs.support.attr("namedtuple_fields")(callable, args.size(), py::tuple(names));
    if (!plan.is_none()) {
      std::vector<ValuePtr> items;
      for (py::handle step : plan) {
        const std::string how = py::str(step[py::int_(0)]).cast<std::string>();
        py::object what = step[py::int_(1)];
        if (how == "arg") {
          items.push_back(args.at(what.cast<size_t>()));
        } else if (how == "kw") {
          const std::string field = what.cast<std::string>();
          for (const auto& kw : kwargs) {
            if (kw.first == field) items.push_back(kw.second);
          }
        } else {
          ValuePtr fallback = wrap_unsourced(what);
          if (!fallback->is_const()) {
            FJ_UNSUPPORTED(kUnsupportedCall, "{} with a default that is not a constant",
                           callable_name(callable));
          }
          items.push_back(std::move(fallback));
        }
      }
      return Value::tuple(std::move(items), py::reinterpret_borrow<py::object>(callable));
    }
  }
  if (PyType_Check(callable.ptr()) && all_constant(args, kwargs)) {
    py::list py_args;
    for (const auto& a : args) py_args.append(a->as_python());
    py::dict py_kwargs;
    for (const auto& [key, value] : kwargs) py_kwargs[py::str(key)] = value->as_python();
    // An exception to raise (IndexError("...")): made now, a fresh one where an exit needs it.
    if (PyExceptionClass_Check(callable.ptr())) {
      if (ValuePtr exc = simple_exception(callable, py::tuple(py_args), py_kwargs)) return exc;
    }
    // A stateless torch.nn module made in the forward (loss_fct = CrossEntropyLoss()): made
    // now, its attributes read as they are (nothing else holds it), a fresh one at an exit.
    py::object made = refs.support.attr("stateless_module")(callable, py::tuple(py_args), py_kwargs);
    if (!made.is_none()) {
      ValuePtr module = Value::object(made);
      module->frozen = true;
      module->remake = py::make_tuple(callable, py::tuple(py_args), py_kwargs);
      return module;
    }
  }
  static PyObject* const kObjectNew =
      py::object(py::handle(reinterpret_cast<PyObject*>(&PyBaseObject_Type)).attr("__new__")).release().ptr();
  if (callable.ptr() == kObjectNew && args.size() == 1 && kwargs.empty() &&
      (args[0]->kind == VKind::kObject || args[0]->kind == VKind::kConst) &&
      PyType_Check(args[0]->obj.ptr()) && !args[0]->is_special_object() &&
      !refs.support.attr("plain_class_init")(args[0]->obj).is_none() &&
      refs.support.attr("mapping_base")(args[0]->obj).is_none()) {
    // object.__new__(cls) of a plain class (copy.deepcopy's form): an instance with no
    // attributes, its __init__ not run.
    return blank_object(args[0], args[0]->obj);
  }
  if ((Py_IS_TYPE(callable.ptr(), &PyWrapperDescr_Type) || Py_IS_TYPE(callable.ptr(), &PyMethodDescr_Type)) &&
      !args.empty() && args[0]->is(ObjRole::kNewObject) &&
      PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(args[0]->obj.ptr()),
                       PyDescr_TYPE(reinterpret_cast<PyDescrObject*>(callable.ptr())))) {
    // A builtin base's method called unbound on an object the trace made
    // (object.__setattr__(obj, name, value), dict.__setitem__(obj, key, value)).
    return new_object_method(py::str(callable.attr("__name__")).cast<std::string>(), args, kwargs);
  }
  if (PyType_Check(callable.ptr())) {
    py::object init = refs.support.attr("plain_class_init")(callable);
    if (!init.is_none()) {
      new_object(fn, callable, init, std::move(args), std::move(kwargs));
      return nullptr;
    }
  }
  if (kind == CallableKind::kNotTraced && PyMethod_Check(callable.ptr()) && fn->source >= 0 &&
      !fn->bound_self) {
    // A bound method made before the region (forward_fn = self.feed_forward_chunk, passed in):
    // its function and its self, read by source. (Also a `with` block's __exit__, left on the
    // stack where a region started inside the block: whoever entered it, its code runs here.)
    ValuePtr function = entry_.load(entry_.sources().attr(fn->source, "__func__"));
    ValuePtr self = entry_.load(entry_.sources().attr(fn->source, "__self__"));
    if (function && self && PyFunction_Check(function->obj.ptr())) {
      args.insert(args.begin(), self);
      return call(function, std::move(args), std::move(kwargs));
    }
  }
  if (kind == CallableKind::kNotTraced && PyFunction_Check(callable.ptr()) && is_user_function(host_, callable)) {
    inline_call(fn, callable, std::move(args), std::move(kwargs), /*may_make_generator=*/true);
    return nullptr;
  }
  if (kind == CallableKind::kNotTraced && PyFunction_Check(callable.ptr())) {
    // torch's own disable wrapper around an optimizer's method (zero_grad, _init_group): the
    // method, traced (the wrapper keeps Dynamo out, not framejit).
    py::object inner = refs.support.attr("traced_past_disable")(callable);
    if (!inner.is_none()) {
      if (fn->source >= 0) entry_.guard_id(fn->source, callable.ptr());
      inline_call(Value::object(inner), inner, std::move(args), std::move(kwargs));
      return nullptr;
    }
  }
  if (kind == CallableKind::kTorchOp) {
    return record_call(NodeKind::kCallFunction, callable, "", std::move(args), std::move(kwargs),
                       "", py::str(py::getattr(callable, "__name__", py::str("call"))));
  }
  if (kind == CallableKind::kBuiltin) {
    const std::string name = callable_name(callable);
    if (name == "enumerate" || name == "zip" || name == "reversed") {
      if (ValuePtr it = iterator_builtin(name, args, kwargs)) return it;
    }
  }
  IteratorsConsumed consumed;
  if (kind == CallableKind::kBuiltin && consumes_iterables(callable_name(callable))) {
    // What these builtins iterate: an iterator unrolled at trace time (a generator expression's
    // yields) is consumed whole; a ModuleList / Sequential / ModuleDict gives its children (or
    // keys), read by source.
    for (ValuePtr& arg : args) {
      std::vector<ValuePtr> items;
      if (arg->kind == VKind::kIter && callable_name(callable) == "len") {
        // An iterator has no length: TypeError, as Python raises it (a try in the trace may
        // catch it).
        // (the type CPython's iterator of that form has; kItems: a generator expression's, or a
        // map's or a tuple's iterator, named as the first)
        const char* type = "generator";
        switch (arg->iter_form) {
          case IterForm::kEnumerate: type = "enumerate"; break;
          case IterForm::kZip: type = "zip"; break;
          case IterForm::kReversed: type = "list_reverseiterator"; break;
          case IterForm::kRange: type = "range_iterator"; break;
          case IterForm::kOver:
            type = arg->over && arg->over->kind == VKind::kDict ? "dict_keyiterator" : "list_iterator";
            break;
          default: break;
        }
        ValuePtr exc = simple_exception(py::handle(PyExc_TypeError),
                                        py::make_tuple(std::string("object of type '") + type + "' has no len()"),
                                        py::dict());
        FJ_CHECK(exc != nullptr, "TypeError not constructible");
        throw TracedRaise{std::move(exc)};
      }
      if (arg->kind == VKind::kIter) {
        // Consumed only if the call is traced: a break here leaves the iterator as it was, and
        // the runtime calls the builtin on it.
        if (!iterable_items(arg, items)) {
          FJ_UNSUPPORTED(kUnsupportedCall, "{}() of an iterator too long to unroll",
                         callable_name(callable));
        }
        consumed.push_back(arg);
        arg = Value::list(std::move(items));
      } else if (arg->is(ObjRole::kDictView)) {
        arg = Value::list(dict_view_items(*arg));
      } else if (arg->kind == VKind::kDict && callable_name(callable) != "dict" &&
                 callable_name(callable) != "len") {
        // list(d), sorted(d), zip(d, ...) of a dict of the trace: its keys, in order.
        std::vector<ValuePtr> keys;
        for (const py::object& key : arg->keys) keys.push_back(Value::constant(key));
        arg = Value::list(std::move(keys));
      } else if (callable_name(callable) != "dict" && callable_name(callable) != "len" &&
                 reads_as_dict(arg, "__iter__")) {
        arg = stored_view(arg, "keys");  // list(d), sorted(d), zip(d, ...): its keys, guarded
      } else if (arg->kind == VKind::kObject && arg->source >= 0 && module_children(arg, items)) {
        arg = Value::list(std::move(items));
      } else if (arg->kind == VKind::kTensor && iterates_rows(callable_name(callable), arg, args)) {
        arg = tensor_rows(arg);
      }
    }
  }
  if (kind == CallableKind::kBuiltin && callable.ptr() == reinterpret_cast<PyObject*>(&PyDict_Type)) {
    return dict_call(args, kwargs);
  }
  if (callable.ptr() == refs.ordered_dict_type.ptr()) {
    // OrderedDict(...): a dict of the trace (it keeps its keys in order, as every dict does),
    // rebuilt as an OrderedDict where it leaves the region; move_to_end / popitem(last=).
    ValuePtr out = dict_call(args, kwargs);
    out->pytype = callable;
    return out;
  }
  if (PyCFunction_Check(callable.ptr()) &&
      (PyCFunction_GET_SELF(callable.ptr()) == reinterpret_cast<PyObject*>(&PyDict_Type) ||
       PyCFunction_GET_SELF(callable.ptr()) == refs.ordered_dict_type.ptr()) &&
      std::string(reinterpret_cast<PyCFunctionObject*>(callable.ptr())->m_ml->ml_name) == "fromkeys" &&
      kwargs.empty() && (args.size() == 1 || args.size() == 2)) {
    // dict.fromkeys(keys, value=None): a new dict of the trace, each key to the one value
    // (OrderedDict.fromkeys: an OrderedDict).
    std::vector<ValuePtr> keys;
    if (!iterable_items(sizes_.concretize(args[0]), keys)) {
      FJ_UNSUPPORTED(kUnsupportedCall, "dict.fromkeys() of {}", args[0]->describe());
    }
    const ValuePtr value = args.size() == 2 ? args[1] : Value::constant(py::none());
    ValuePtr out = Value::dict({}, {});
    for (const ValuePtr& key_in : keys) {
      const ValuePtr key = sizes_.concretize(key_in);
      if (!key->is_constant_tree()) FJ_UNSUPPORTED(kUnsupportedCall, "dict.fromkeys() key {}", key->describe());
      out->set_key(key->as_python(), value);
    }
    if (PyCFunction_GET_SELF(callable.ptr()) != reinterpret_cast<PyObject*>(&PyDict_Type)) {
      out->pytype = refs.ordered_dict_type;
    }
    return out;
  }
  if (callable.ptr() == refs.defaultdict_type.ptr()) {
    // defaultdict(list), defaultdict(int, pairs), defaultdict(lambda: 0): a dict of the trace
    // that makes its missing keys' values (builtin factories in Tracer::item, others by a
    // traced call: Tracer::missing_key), rebuilt as a defaultdict where it leaves the
    // region.
    const ValuePtr factory = args.empty() ? Value::constant(py::none()) : args[0];
    const bool callable_value =
        factory->kind == VKind::kObject ||
        (factory->kind == VKind::kConst && (factory->obj.is_none() || PyCallable_Check(factory->obj.ptr())));
    if (!callable_value) {
      FJ_UNSUPPORTED(kUnsupportedCall, "defaultdict() with the factory {}", factory->describe());
    }
    ValuePtr out = dict_call(args.empty() ? args : std::vector<ValuePtr>(args.begin() + 1, args.end()), kwargs);
    out->pytype = callable;
    out->factory = factory;
    return out;
  }
  if (callable.ptr() == refs.deque_type.ptr()) return deque_call(args, kwargs);
  if (kind == CallableKind::kBuiltin) {
    // collections.namedtuple(...) of constants: the class made now (torch.compile makes it
    // at trace time too). Its __module__ is the calling code's, which namedtuple would read
    // off the caller's frame: the traced frame does not run yet, so the trace passes it.
    static PyObject* const kNamedtuple =
        py::object(py::module_::import("collections").attr("namedtuple")).release().ptr();
    const bool has_module = std::any_of(kwargs.begin(), kwargs.end(),
                                        [](const auto& kw) { return kw.first == "module"; });
    if (callable.ptr() == kNamedtuple && !has_module) {
      py::object globals = frame_globals();
      py::object name = py::reinterpret_borrow<py::dict>(globals).attr("get")("__name__", "__main__");
      kwargs.emplace_back("module", Value::constant(std::move(name)));
    }
  }
  if (kind == CallableKind::kBuiltin && kwargs.empty()) {
    // Answered from what the guards pin: types, lengths and tensor metadata.
    const std::string name = callable_name(callable);
    if (name == "isinstance" && args.size() == 2) {
      if (py::object classes = class_info(args[1])) {
        if (args[0]->kind == VKind::kIter && !args[0]->pytype) {
          // An iterator of the trace (a list's, a generator, map's, zip's): the answer every
          // kind of iterator gives (isinstance(leaves, (list, tuple)) is False for each, Iterator
          // True), where they agree.
          py::object agreed = PyRefs::get().support.attr("iterator_isinstance")(classes);
          if (agreed.is_none()) FJ_UNSUPPORTED(kUnsupportedValue, "isinstance of an iterator against these classes");
          return Value::constant(agreed);
        }
        const int result = PyObject_IsSubclass(type_of(args[0]).ptr(), classes.ptr());
        if (result < 0) throw py::error_already_set();
        return Value::constant(py::bool_(result == 1));
      }
    }
    if (name == "id" && args.size() == 1) {
      const ValuePtr& v = args[0];
      if (v->is_tensor() && v->source >= 0 && v->node->kind == NodeKind::kPlaceholder) {
        // A tensor input: a new object each call, so its id stands only for its identity.
        ValuePtr identity = Value::object(py::int_(reinterpret_cast<uintptr_t>(v->obj.ptr())));
        identity->role = ObjRole::kIdentity;
        identity->bound_self = v;
        return identity;
      }
      if (v->is(ObjRole::kPlain) && !v->bound_self && v->source >= 0 && !v->is_tensor()) {
        // An object read by source (a module, a config): its id, the object guarded by identity.
        entry_.guard_id(v->source, v->obj.ptr());
        return Value::constant(py::int_(reinterpret_cast<uintptr_t>(v->obj.ptr())));
      }
      if (v->is_const() || is_pinned_object(v)) {  // the object itself (None, a class, a function)
        return Value::constant(py::int_(reinterpret_cast<uintptr_t>(v->obj.ptr())));
      }
      // A container of the trace is rebuilt at the exit (a new object), a tensor it made has
      // no object yet: their ids are Python's to give.
      FJ_UNSUPPORTED(kUnsupportedCall, "id() of {}", v->describe());
    }
    if (name == "issubclass" && args.size() == 2 && is_pinned_object(args[0]) &&
        PyType_Check(args[0]->obj.ptr())) {
      // (a class held as a value: its identity is what the trace pins it by)
      if (py::object classes = class_info(args[1])) {
        const int result = PyObject_IsSubclass(args[0]->obj.ptr(), classes.ptr());
        if (result < 0) throw py::error_already_set();
        return Value::constant(py::bool_(result == 1));
      }
    }
    if ((name == "tuple" || name == "list") && args.size() == 1 && args[0]->is_sequence()) {
      // A new container of the same items (tensors included).
      if (name == "tuple") return Value::tuple(args[0]->items);
      return Value::list(args[0]->items);
    }
    if (name == "sum" && !args.empty() && args.size() <= 2 &&
        (args[0]->kind == VKind::kList || args[0]->kind == VKind::kTuple) && any_tensor(args, kwargs)) {
      // sum() of a known list: start + items[0] + items[1] ..., each addition as Python does it.
      ValuePtr total = args.size() == 2 ? args[1] : Value::constant(py::int_(0));
      for (const ValuePtr& item : args[0]->items) total = record_operator("add", "+", {total, item});
      return total;
    }
    if (name == "type" && args.size() == 1) {
      // The class of an object read by source, or made from a class read by source, is read
      // by source too: its attributes are guarded where read (type(self).scale).
      const ValuePtr& v = args[0];
      if (v->is(ObjRole::kNewObject) && v->origin) return v->origin;
      if (v->is(ObjRole::kPlain) && v->kind == VKind::kObject && v->source >= 0 && !v->bound_self &&
          !PyType_Check(v->obj.ptr()) && !PyModule_Check(v->obj.ptr())) {
        ValuePtr cls = entry_.load(entry_.sources().generic_attr(v->source, "__class__"));
        if (cls && cls->obj.ptr() == reinterpret_cast<PyObject*>(Py_TYPE(v->obj.ptr()))) return cls;
      }
      // (the class of a value the trace made, fixed where that value's class was guarded: a
      // namedtuple's, whose _fields pytree reads; its attributes are class data, read as they are)
      ValuePtr cls = Value::object(type_of(v));
      cls->frozen = true;
      return cls;
    }
    if (name == "callable" && args.size() == 1) {
      // What callable() asks is its type's (a lambda holding a tensor in its closure is callable,
      // a tensor is not): answered from the value's kind.
      static PyObject* const kCall = PyUnicode_InternFromString("__call__");
      const ValuePtr& v = args[0];
      bool result = false;
      if (v->is(ObjRole::kMadeFunction) || v->is(ObjRole::kTypeMethod) || v->bound_self) {
        result = true;
      } else if (v->is(ObjRole::kNewObject)) {
        result = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(v->obj.ptr()), kCall) != nullptr;
      } else if (v->kind == VKind::kObject || v->kind == VKind::kConst) {
        if (v->is_special_object()) FJ_UNSUPPORTED(kUnsupportedCall, "callable() of {}", v->describe());
        result = PyCallable_Check(v->obj.ptr()) == 1;
      } else {
        result = false;  // a tensor, a number, a container, an iterator of the trace
        if (v->kind == VKind::kTensor && v->pytype &&
            _PyType_Lookup(reinterpret_cast<PyTypeObject*>(v->pytype.ptr()), kCall) != nullptr) {
          FJ_UNSUPPORTED(kUnsupportedCall, "callable() of a tensor subclass with __call__");
        }
      }
      return Value::constant(py::bool_(result));
    }
    if (name == "bool" && args.size() == 1 && args[0]->kind == VKind::kObject) {
      // bool(obj): its class's __bool__ / __len__ run in the trace (as `if obj:` does), or the
      // truth the trace knows (object's default, a container's items).
      if (inline_truth(args[0])) {
        frame().result_truth = 1;
        return nullptr;
      }
      return Value::constant(py::bool_(truthy(args[0])));
    }
    if (name == "len" && args.size() == 1) {
      const ValuePtr& v = args[0];
      if (v->is_tensor()) {
        if (py::len(v->obj.attr("shape")) == 0) {
          FJ_UNSUPPORTED(kUnsupportedValue, "len() of a 0-d tensor");
        }
        return sizes_.tensor_size(v, 0, "len() of a tensor");
      }
      if (v->kind == VKind::kTuple || v->kind == VKind::kList || v->kind == VKind::kDict) {
        return Value::constant(py::int_(v->items.size()));
      }
      if (reads_as_dict(v, "__len__")) {  // (a dict subclass's own __len__ is traced below)
        check_items_unchanged(v);
        const Py_ssize_t n = PyDict_Size(v->obj.ptr());
        entry_.guard_len(v->source, n);
        return Value::constant(py::int_(n));
      }
      // A class with __len__ in Python: traced (len() checks what it returns).
      static PyObject* const kLen = PyUnicode_InternFromString("__len__");
      if (inline_special_method(v, kLen, {})) {
        frame().result_truth = 3;
        return nullptr;
      }
      if (v->is(ObjRole::kNewObject) && v->mapping) return Value::constant(py::int_(v->mapping->items.size()));
    }
  }
  static PyObject* const kReprBuiltin =
      py::object(py::module_::import("builtins").attr("repr")).release().ptr();
  static PyObject* const kStr = PyUnicode_InternFromString("__str__");
  static PyObject* const kRepr = PyUnicode_InternFromString("__repr__");
  if ((callable.ptr() == reinterpret_cast<PyObject*>(&PyUnicode_Type) || callable.ptr() == kReprBuiltin) &&
      args.size() == 1 && kwargs.empty() && args[0]->is(ObjRole::kNewObject)) {
    // str(key) / repr(key) of an object the trace made whose class writes its __str__ or
    // __repr__ in traced Python (pytree's key entries): that method, inlined (object.__str__
    // calls __repr__).
    auto* type = reinterpret_cast<PyTypeObject*>(args[0]->obj.ptr());
    PyObject* name = callable.ptr() == kReprBuiltin ? kRepr : kStr;
    if (name == kStr && _PyType_Lookup(type, kStr) == _PyType_Lookup(&PyBaseObject_Type, kStr)) name = kRepr;
    PyObject* method = _PyType_Lookup(type, name);  // Borrowed
    if (method != nullptr && PyFunction_Check(method) && is_user_function(host_, method) &&
        inline_special_method(args[0], name, {})) {
      return nullptr;
    }
  }
  if ((callable.ptr() == reinterpret_cast<PyObject*>(&PyUnicode_Type) || callable.ptr() == kReprBuiltin) &&
      args.size() == 1 && kwargs.empty() && args[0]->kind == VKind::kObject && args[0]->remake &&
      args[0]->source < 0 && PyExceptionInstance_Check(args[0]->obj.ptr())) {
    // str(e) / repr(e) of an exception the trace made from constants, whose class keeps the
    // builtin __str__ / __repr__: its text now.
    const bool as_str = callable.ptr() == reinterpret_cast<PyObject*>(&PyUnicode_Type);
    PyObject* method = _PyType_Lookup(Py_TYPE(args[0]->obj.ptr()), as_str ? kStr : kRepr);  // Borrowed
    if (method != nullptr && !PyFunction_Check(method)) {
      py::object text = as_str ? py::object(py::str(args[0]->obj)) : py::object(py::repr(args[0]->obj));
      return Value::constant(std::move(text));
    }
  }
  const bool lru_cached = PyObject_TypeCheck(callable.ptr(),
                                             reinterpret_cast<PyTypeObject*>(refs.lru_cache_type.ptr()));
  // The function an lru_cache wraps, traced in the cache's place (as torch.compile traces through
  // the cache); false where it wraps no Python function.
  auto trace_through_cache = [&]() {
    py::object wrapped = py::getattr(callable, "__wrapped__", py::none());
    if (!PyFunction_Check(wrapped.ptr())) return false;
    inline_call(Value::object(wrapped), wrapped, std::move(args), std::move(kwargs));
    return true;
  };
  if (kind == CallableKind::kBuiltin && !any_tensor(args, kwargs)) {
    bool symbolic = false;
    bool sizes = false;
    for (const auto& a : args) {
      symbolic = symbolic || a->kind == VKind::kSymNum;
      sizes = sizes || a->holds_size_expr();
    }
    for (const auto& kw : kwargs) sizes = sizes || kw.second->holds_size_expr();
    if (lru_cached && (symbolic || sizes)) {
      // @functools.lru_cache of numbers known only at run time (einops' shape helpers get the
      // tensor's sizes): the function it wraps is traced, so the sizes stay the graph's, as
      // torch.compile traces through the cache. (Only then: a body traced on every call would
      // repeat side effects the cache runs once, a "warn once" helper's.)
      if (trace_through_cache()) return nullptr;
    }
    if (symbolic && kwargs.empty()) {
      // A pure builtin of numbers known only at run time (float(s), round(s, 2), max(s, 0)).
      py::list values;
      bool numbers = true;
      for (const auto& a : args) {
        if (a->kind != VKind::kSymNum && !a->is_const()) {
          if (!sizes) {
            FJ_UNSUPPORTED(kUnsupportedCall, "{}() of {}", callable_name(callable), a->describe());
          }
          numbers = false;
          break;
        }
        values.append(a->obj);
      }
      if (numbers) {
        py::object result;
        try {
          result = callable(*py::tuple(values));
        } catch (const py::error_already_set& e) {
          FJ_PROGRAM_RAISED(kUnsupportedCall, "{}() raised at trace time: {}",
                            callable_name(callable), e.what());
        }
        // A number stays symbolic through builtins that give a number (max(n, 1),
        // math.sqrt(d)); range(n), str(n), ... need its value: pinned where it can be
        // (concretize), else a run-time value of its own.
        const bool number_result = PyLong_CheckExact(result.ptr()) || PyFloat_CheckExact(result.ptr());
        if (!number_result) {
          for (auto& a : args) a = sizes_.concretize(a);
        }
        if (number_result || !all_constant(args, kwargs)) {
          ValuePtr number = Value::sym_num(callable, std::move(args), result);
          note_runtime_number(number);
          return number;
        }
      }
    }
    if (sizes) {
      for (auto& a : args) a = sizes_.concretize(a);
      for (auto& kw : kwargs) kw.second = sizes_.concretize(kw.second);
    }
  }
  if (kind == CallableKind::kQuery || (kind == CallableKind::kBuiltin && !any_tensor(args, kwargs))) {
    if (kind == CallableKind::kQuery && args.size() == 1 && kwargs.empty() &&
        callable_name(callable) == "is_tensor") {
      // No tensor whatever its value: a number, a container of the trace, an object whose
      // class the guards fix (a module: x-transformers' `next(a for a in args if is_tensor(a))`).
      const ValuePtr& a = args[0];
      const bool container = a->kind == VKind::kTuple || a->kind == VKind::kList ||
                             a->kind == VKind::kDict || a->kind == VKind::kIter;
      const bool plain_object =
          a->kind == VKind::kObject && a->is(ObjRole::kPlain) &&
          !PyObject_TypeCheck(a->obj.ptr(), reinterpret_cast<PyTypeObject*>(refs.tensor_type.ptr()));
      if (a->kind == VKind::kSymNum || container || plain_object) return Value::constant(py::bool_(false));
    }
    if (kind == CallableKind::kQuery) sizes_.make_constant_args(args, kwargs);
    if (!all_constant(args, kwargs) && !any_tensor(args, kwargs)) {
      FJ_UNSUPPORTED(kUnsupportedCall, "{}() on values not known at trace time",
                     callable_name(callable));
    }
    try {
      if (kind == CallableKind::kQuery) {
        if (is_size_query(callable_name(callable)) && any_tensor(args, kwargs)) {
          sizes_.note_size_read(callable_name(callable) + "()");
        }
        py::list py_args;
        for (const auto& a : args) py_args.append(query_arg(a));
        py::dict py_kwargs;
        for (const auto& [key, value] : kwargs) py_kwargs[py::str(key)] = query_arg(value);
        return constant_result(callable(*py::tuple(py_args), **py_kwargs), callable_name(callable));
      }
      py::object result = call_python(callable, args, kwargs);
      if (lru_cached && holds_real_tensor(result)) {
        // A cached tensor (a rotary table, a mask): the function it wraps is traced instead; a
        // real tensor is no constant of the trace.
        if (trace_through_cache()) return nullptr;
        FJ_UNSUPPORTED(kUnsupportedCall, "{}() returns a tensor from its cache", callable_name(callable));
      }
      if (lru_cached && !is_python_constant(result)) {
        // Of constants, the object the cache holds, which every later call answers (einops'
        // parsed recipe): a constant of the trace, its attributes read at trace time.
        return Value::constant_tree(std::move(result));
      }
      return constant_result(std::move(result), callable_name(callable));
    } catch (const py::error_already_set& e) {
      FJ_PROGRAM_RAISED(kUnsupportedCall, "{}() raised at trace time: {}", callable_name(callable),
                        e.what());
    }
  }
  if (kind == CallableKind::kBuiltin) {
    // A builtin applied to tensors: the few that are tensor ops, or answered from metadata.
    const std::string name = callable_name(callable);
    const std::string module = py::str(py::getattr(callable, "__module__", py::str(""))).cast<std::string>();
    if (name == "abs" || name == "pow" || module == "_operator") {
      return record_call(NodeKind::kCallFunction, callable, "", std::move(args), std::move(kwargs),
                         "", name);
    }
    if ((name == "sorted" || name == "min" || name == "max") && any_tensor(args, kwargs)) {
      // sorted(d.items()), min(pairs): tensors inside the items compared, if at all, only where
      // the items before them tie, which the Python form finds (compare_sequences). Bare
      // tensors compared with each other need their data.
      const std::vector<ValuePtr>& pool = args.size() == 1 && args[0]->is_sequence() ? args[0]->items : args;
      const bool bare = std::any_of(pool.begin(), pool.end(), [](const ValuePtr& v) { return v->is_tensor(); });
      py::object form = bare ? py::object(py::none()) : refs.support.attr("python_form")(callable, true);
      if (!form.is_none()) {
        inline_call(Value::object(form), form, std::move(args), std::move(kwargs), /*may_make_generator=*/true);
        return nullptr;
      }
    }
    if ((name == "int" || name == "float" || name == "bool") && args.size() == 1 && kwargs.empty()) {
      if (py::object known = known_value(args[0])) {  // of a tensor the trace computed
        return constant_result(callable(known), name);
      }
    }
    if (any_tensor(args, kwargs)) FJ_UNSUPPORTED(kDataDependent, "{}() of a tensor needs its data", name);
    FJ_UNSUPPORTED(kUnsupportedCall, "{}() of values not known at trace time", name);
  }
  if (callable.ptr() == reinterpret_cast<PyObject*>(&PySlice_Type) && kwargs.empty() &&
      !args.empty() && args.size() <= 3) {
    // slice(-n, None): a constant slice (a size as a bound is specialised, as in x[:, :n]).
    for (auto& a : args) a = sizes_.concretize(a);
    if (all_constant(args, kwargs)) return constant_result(call_python(callable, args, kwargs), "slice");
  }
  if (fn->kind == VKind::kObject && PyType_Check(callable.ptr()) &&
      (callable.ptr() == refs.size_type.ptr() || callable.ptr() == refs.device_type.ptr())) {
    // torch.Size((2, 3)), torch.device("cpu"): immutable values, constants of the trace.
    for (auto& a : args) a = sizes_.concretize(a);
    for (auto& kw : kwargs) kw.second = sizes_.concretize(kw.second);
    if (all_constant(args, kwargs)) {
      try {
        return constant_result(call_python(callable, args, kwargs), callable_name(callable));
      } catch (const py::error_already_set& e) {
        FJ_PROGRAM_RAISED(kUnsupportedCall, "{}() raised at trace time: {}", callable_name(callable), e.what());
      }
    }
  }
  if (fn->kind == VKind::kObject && fn->source >= 0 && !PyType_Check(callable.ptr()) &&
      refs.support.attr("resolve_attribute")(callable, "__call__")[py::int_(0)].cast<AttrKind>() ==
          AttrKind::kFunction) {
    // An instance of a user class with __call__: its method, bound to it.
    return call(attr(fn, "__call__"), std::move(args), std::move(kwargs));
  }
  if (fn->kind == VKind::kObject && fn->source >= 0 && PyCFunction_Check(callable.ptr()) &&
      !fn->bound_self) {
    PyObject* owner = PyCFunction_GET_SELF(callable.ptr());  // Borrowed
    if (owner != nullptr && (PyDict_CheckExact(owner) || PyList_CheckExact(owner))) {
      // d.get bound before a region began (on the stack where the previous one ended): the
      // method of the container, read by source from the bound method.
      ValuePtr self = entry_.load(entry_.sources().attr(fn->source, "__self__"));
      const std::string name = py::str(callable.attr("__name__")).cast<std::string>();
      py::object function = py::getattr(type_of(self), name.c_str(), py::none());
      if (self && !function.is_none()) {
        ValuePtr method = Value::object(function);
        method->role = ObjRole::kTypeMethod;
        method->method = name;
        args.insert(args.begin(), self);
        return call(method, std::move(args), std::move(kwargs));
      }
    }
  }
  if (callable_name(callable) == "graph_break" &&
      py::str(py::getattr(callable, "__module__", py::str(""))).cast<std::string>() ==
          "torch._dynamo.decorators") {
    FJ_UNSUPPORTED(kUnsupportedCall, "torch._dynamo.graph_break(): the code asks for a break here");
  }
  FJ_UNSUPPORTED(kUnsupportedCall, "call to {} is not traced yet", callable_name(callable));
}

}  // namespace framejit
