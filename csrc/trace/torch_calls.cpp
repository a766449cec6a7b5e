// Recording torch calls: arguments turned into meta values, the call run on meta tensors for the
// output metadata, the real device inferred beside it, and one graph node per call.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <unordered_map>

#include "common/check.h"
#include "guards/tensor_check.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

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

// Deterministic ops the trace computes for real where every input is a number or a tensor whose
// value it knows (Value::known), and the result has at most one element: arithmetic on sizes
// that libraries write with torch (Longformer's torch.div(seq_len, 2 * w, rounding_mode="trunc"),
// then a view by it), casts, and torch.tensor of numbers.
bool computes_known(const std::string& target_text) {
  if (target_text.empty() || target_text.back() == '_') return false;  // (in place)
  const auto dot = target_text.rfind('.');
  if (dot != std::string::npos && target_text.compare(0, dot, "torch") != 0 &&
      target_text.compare(0, dot, "operator") != 0) {
    return false;
  }
  return base_name_in(target_text, {"tensor", "as_tensor", "scalar_tensor", "div", "true_divide",
                                    "truediv", "floor_divide", "floordiv", "remainder", "mod",
                                    "fmod", "add", "sub", "mul", "pow", "neg", "abs", "sqrt", "rsqrt",
                                    "exp", "log", "log2", "log10", "ceil", "floor", "round", "trunc",
                                    "clamp", "clamp_min", "clamp_max", "maximum", "minimum", "to",
                                    "float", "double", "int", "long", "half", "bool", "gt", "lt",
                                    "ge", "le", "eq", "ne"});
}

// Ops whose results have a rank and a count that no int argument's value changes (a size, a
// dim, an offset, a fill value): an int input (Value::int_input) stays a graph value in their
// arguments. Any other op takes it pinned: flatten(start_dim) and squeeze(dim) change the rank
// with its value, and the trace reads the rank of a result as a constant.
bool rank_independent_of_ints(const std::string& target_text) {
  return base_name_in(target_text, {
      "zeros", "ones", "full", "empty", "rand", "randn", "randint", "arange", "tensor", "eye",
      "linspace", "logspace", "new_zeros", "new_ones", "new_full", "new_empty", "full_like",
      "view", "reshape", "expand", "repeat", "narrow", "roll", "topk", "kthvalue", "select",
      "unsqueeze", "transpose", "swapaxes", "swapdims", "movedim", "permute", "softmax",
      "log_softmax", "cumsum", "cumprod", "sum", "mean", "amax", "amin", "argmax", "argmin",
      "tril", "triu", "diagonal", "index_select", "gather", "flip", "pad", "interpolate",
      "fill_", "masked_fill", "masked_fill_", "clamp", "clamp_min", "clamp_max", "add", "sub",
      "mul", "div", "pow", "remainder", "fmod", "where", "cat", "stack", "hstack", "vstack",
      "getitem", "setitem"});
}

bool holds_int_input(const ValuePtr& v) {
  if (v->kind == VKind::kSymNum && !v->fn) return v->int_input;
  for (const auto& item : v->items) {
    if (holds_int_input(item)) return true;
  }
  return false;
}

// Whether the trace knows this tensor's value now (Value::known, and no in-place op since).
bool known_now(const Value& v) {
  return v.kind == VKind::kTensor && v.known && v.known_version >= 0 &&
         tensor_version(v.obj.ptr()) == v.known_version;
}

// The real value of an argument for computes_known: a number, a known tensor, a device or dtype,
// or tuples of those; nullptr-object where there is none. Run-time numbers go into `from`.
py::object known_argument(const ValuePtr& v, std::vector<ValuePtr>& from) {
  switch (v->kind) {
    case VKind::kTensor:
      if (!known_now(*v)) return py::object();
      from.insert(from.end(), v->known_from.begin(), v->known_from.end());
      return v->known;
    case VKind::kConst:
      if (v->obj && !is_tensor(v->obj.ptr())) return v->obj;
      return py::object();
    case VKind::kSymNum:
      if (!PyLong_CheckExact(v->obj.ptr()) && !PyFloat_CheckExact(v->obj.ptr())) return py::object();
      from.push_back(v);
      return v->obj;
    case VKind::kTuple:
    case VKind::kList: {
      py::list items;
      for (const ValuePtr& item : v->items) {
        py::object real = known_argument(item, from);
        if (!real) return py::object();
        items.append(real);
      }
      if (v->kind == VKind::kList) return std::move(items);
      return py::tuple(items);
    }
    default:
      return py::object();
  }
}

// The value a call computes_known makes, or an empty object.
py::object compute_known(bool is_method, py::handle fn, const std::string& method,
                         const std::vector<ValuePtr>& args, const KwValues& kwargs,
                         std::vector<ValuePtr>& from) {
  py::list real_args;
  for (const ValuePtr& arg : args) {
    py::object real = known_argument(arg, from);
    if (!real) return py::object();
    real_args.append(real);
  }
  py::dict real_kwargs;
  for (const auto& [key, value] : kwargs) {
    if (key == "out") return py::object();
    py::object real = known_argument(value, from);
    if (!real) return py::object();
    if (key == "device" && py::str(real).cast<std::string>().rfind("cpu", 0) != 0) return py::object();
    real_kwargs[py::str(key)] = real;
  }
  try {
    py::object result;
    if (is_method) {
      if (real_args.empty()) return py::object();
      py::list rest;
      for (size_t i = 1; i < py::len(real_args); ++i) rest.append(real_args[i]);
      result = real_args[0].attr(method.c_str())(*py::tuple(rest), **real_kwargs);
    } else {
      result = py::reinterpret_borrow<py::object>(fn)(*py::tuple(real_args), **real_kwargs);
    }
    if (!is_tensor(result.ptr()) || result.attr("numel")().cast<int64_t>() > 1 ||
        !py::str(result.attr("device").attr("type")).equal(py::str("cpu"))) {
      return py::object();
    }
    return result;
  } catch (const py::error_already_set& error) {
    if (error.matches(PyExc_KeyboardInterrupt)) throw;
    return py::object();  // (the graph's op raises at run time, or the meta call said so)
  }
}

// Arguments with the tensors whose value the trace knows (Value::known) replaced by that value as
// a number, for an op that needs it (a view by a size computed with torch.div): false if none.
bool known_tensors_as_numbers(Tracer& t, std::vector<ValuePtr>& args, KwValues& kwargs) {
  bool replaced = false;
  std::function<ValuePtr(const ValuePtr&)> swap = [&](const ValuePtr& v) -> ValuePtr {
    if (v->kind == VKind::kTensor) {
      if (!known_now(*v) || py::len(v->known.attr("shape")) != 0) return v;
      replaced = true;
      return Value::constant(t.known_value(v).attr("item")());
    }
    return Value::map_items(v, swap);
  };
  for (auto& arg : args) arg = swap(arg);
  for (auto& kw : kwargs) kw.second = swap(kw.second);
  return replaced;
}

// A function the trace made (a combine_fn defined in the frame and handed to a higher-order op
// such as associative_scan) as a real function, when everything it holds is known at trace
// time (its defaults and its cells' contents constants): the graph calls the op with it.
// An empty object otherwise.
py::object made_function_object(const ValuePtr& fn) {
  if (!fn->is(ObjRole::kMadeFunction) || fn->items.size() != 3) return py::object();
  py::object parts[3];
  for (int i = 0; i < 2; ++i) {
    const ValuePtr& part = fn->items[i];
    if (part->kind == VKind::kNull) {
      parts[i] = py::none();
    } else if (part->is_constant_tree()) {
      parts[i] = part->as_python();
    } else {
      return py::object();
    }
  }
  const ValuePtr& closure = fn->items[2];
  if (closure->kind == VKind::kNull) {
    parts[2] = py::none();
  } else {
    if (closure->kind != VKind::kTuple) return py::object();
    py::list cells;
    py::object cell_type = py::module_::import("types").attr("CellType");
    for (const ValuePtr& cell : closure->items) {
      if (cell->kind != VKind::kCell || cell->items.size() != 1 || !cell->items[0]->is_constant_tree()) {
        return py::object();
      }
      cells.append(cell_type(cell->items[0]->as_python()));
    }
    parts[2] = py::tuple(cells);
  }
  return PyRefs::get().support.attr("make_function")(fn->obj, fn->globals, parts[0], parts[1], parts[2]);
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
      PyObject* made = make_tuple_of_type(py::tuple(items).release().ptr(), value->pytype.ptr());  // New
      if (made == nullptr) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(made);
    }
    case VKind::kNull:
    case VKind::kIter:
    case VKind::kCell:
      break;
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "{} passed to a torch call", value->describe());
}

// A NumPy scalar (np.float32(2.0)) as the Python number it holds: the graph's code would name
// `np`, which its globals lack; torch treats both as the same scalar. A NumPy array is left to
// the runtime. Other objects: unchanged.
py::object numpy_free(py::object value) {
  PyObject* obj = value.ptr();
  if (obj == Py_None || PyBool_Check(obj) || PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) ||
      PyUnicode_CheckExact(obj)) {
    return value;  // (most constants: no NumPy lookup)
  }
  if (is_numpy_instance(obj, "generic")) return value.attr("item")();
  if (is_numpy_instance(obj, "ndarray")) {
    FJ_UNSUPPORTED(kUnsupportedValue, "a NumPy array passed to a torch call");
  }
  return value;
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
      if (value->is(ObjRole::kMadeFunction)) {  // (bound into the target: record_call)
        FJ_UNSUPPORTED(kUnsupportedValue, "a function made in the trace inside a torch call's arguments");
      }
      return Arg::constant(numpy_free(value->obj));
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


// The first argument value of a call (positional, then keyword; inside tuples, lists and dicts)
// for which `found` is true, or nullptr.
template <typename Found>
const Value* find_argument(const std::vector<ValuePtr>& args, const KwValues& kwargs, const Found& found) {
  std::function<const Value*(const ValuePtr&)> visit = [&](const ValuePtr& v) -> const Value* {
    if (found(*v)) return v.get();
    if (v->kind == VKind::kTuple || v->kind == VKind::kList || v->kind == VKind::kDict) {
      for (const auto& item : v->items) {
        if (const Value* hit = visit(item)) return hit;
      }
    }
    return nullptr;
  };
  for (const auto& arg : args) {
    if (const Value* hit = visit(arg)) return hit;
  }
  for (const auto& kw : kwargs) {
    if (const Value* hit = visit(kw.second)) return hit;
  }
  return nullptr;
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

ValuePtr Tracer::addc_with_tensor_value(const std::string& method, const std::vector<ValuePtr>& args,
                                        const KwValues& kwargs) {
  ValuePtr value;
  if (args.size() == 4 && kwargs.empty()) value = args[3];
  if (args.size() == 3 && kwargs.size() == 1 && kwargs[0].first == "value") value = kwargs[0].second;
  if (!value || value->kind != VKind::kTensor || args[0]->kind != VKind::kTensor ||
      args[1]->kind != VKind::kTensor || args[2]->kind != VKind::kTensor) {
    return nullptr;
  }
  // x.addcdiv_(t1, t2, value=v) with v a tensor (an optimizer's step size under a compiler):
  // eager reads v's number (.item()), which a graph cannot. x + v * t1 / t2 in the kernel's
  // order of operations, so the result has eager's roundings.
  const bool divides = method.rfind("addcdiv", 0) == 0;
  ValuePtr scaled = record_operator("mul", "*", {value, args[1]});
  ValuePtr combined = divides ? record_operator("truediv", "/", {scaled, args[2]})
                              : record_operator("mul", "*", {scaled, args[2]});
  const bool inplace = method.back() == '_';
  return record_call(NodeKind::kCallMethod, py::none(), inplace ? "add_" : "add",
                     {args[0], combined}, {}, "", inplace ? "add_" : "add");
}

ValuePtr Tracer::record_call(NodeKind kind, py::handle fn_in, const std::string& method,
                             std::vector<ValuePtr> args, KwValues kwargs,
                             const std::string& infix, const std::string& name_hint) {
  PyRefs& refs = PyRefs::get();
  const bool is_method = kind == NodeKind::kCallMethod;
  // A torch.library.custom_op function (a CustomOpDef): its operator is the graph's target, as
  // FX and the backends know operators (torch.ops.<namespace>.<op>.default).
  py::object custom_op;
  if (!is_method && std::strcmp(Py_TYPE(fn_in.ptr())->tp_name, "CustomOpDef") == 0) {
    custom_op = py::getattr(fn_in, "_opoverload", py::none());
  }
  // torch's Python called on an instance of a Python class (a torch.distributions object's
  // sample(), log_prob()): the graph would hold that object as a constant, which it cannot print
  // (a GraphModule's code), and the call would run for real here for its metadata. It ends the
  // region instead, and runs in Python.
  if (!is_method && PyFunction_Check(fn_in.ptr())) {
    const Value* instance = find_argument(args, kwargs, [&](const Value& v) {
      if (v.kind != VKind::kObject || v.role != ObjRole::kPlain || v.bound_self) return false;
      PyTypeObject* type = Py_TYPE(v.obj.ptr());
      return PyType_HasFeature(type, Py_TPFLAGS_HEAPTYPE) && type->tp_dictoffset != 0 &&
             !is_identity_object(v.obj.ptr()) &&
             PyObject_IsInstance(v.obj.ptr(), refs.module_type.ptr()) == 0 &&
             !is_numpy_instance(v.obj.ptr(), "ndarray");
    });
    if (instance != nullptr) {
      FJ_UNSUPPORTED(kUnsupportedCall, "{} called with {}, an object the graph cannot hold",
                     safe_repr(fn_in), instance->describe());
    }
  }
  py::object fn_bound;  // fn with the functions the trace made bound in (see below)
  const bool made_functions = !is_method && std::any_of(args.begin(), args.end(), [](const ValuePtr& a) {
    return a->is(ObjRole::kMadeFunction);
  });
  if (made_functions) {
    // A function the trace made among the positional arguments (associative_scan's combine_fn,
    // defined in the frame): bound into the node's target (_support.FunctionArguments), since a
    // graph's arguments are values FX can print. Only one whose defaults and cells are
    // constants can be made a real function.
    py::list positions;
    py::list functions;
    std::vector<ValuePtr> rest;
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i]->is(ObjRole::kMadeFunction)) {
        rest.push_back(args[i]);
        continue;
      }
      py::object made = made_function_object(args[i]);
      if (!made) FJ_UNSUPPORTED(kUnsupportedValue, "a function holding traced values passed to a torch call");
      positions.append(py::int_(i));
      functions.append(made);
    }
    fn_bound = refs.support.attr("FunctionArguments")(fn_in, py::tuple(positions), py::tuple(functions));
    args = std::move(rest);
  }
  py::handle fn = custom_op && !custom_op.is_none() ? py::handle(custom_op) : fn_bound ? py::handle(fn_bound) : fn_in;
  const std::string hint = custom_op && !custom_op.is_none()
                               ? py::str(custom_op.attr("_opname")).cast<std::string>()
                               : name_hint;
  if (is_method && (method == "addcdiv_" || method == "addcdiv" || method == "addcmul_" ||
                    method == "addcmul")) {
    if (ValuePtr rewritten = addc_with_tensor_value(method, args, kwargs)) return rewritten;
  }
  const std::string target_text = is_method ? method : refs.target_text(fn);
  // Numbers known only at run time: a float becomes a graph input (where the backend runs the
  // graph as it is); an int is pinned, since ints passed to torch are often sizes or dims that
  // decide the output's shape, except an operator's operand seen to vary.
  SizeTracker& numbers = sizes();
  const bool int_inputs = !infix.empty() || rank_independent_of_ints(target_text);
  std::function<ValuePtr(const ValuePtr&)> lower = [&](const ValuePtr& v) -> ValuePtr {
    if (v->kind == VKind::kSymNum) {
      if (!int_inputs && holds_int_input(v)) return numbers.specialize(v);
      // A bool decides the result's structure (keepdim=n > 2, is_causal=T > 1): it needs its
      // value, guarded as a branch on it would be.
      if (v->is_size_expr() && PyBool_Check(v->obj.ptr())) return numbers.decide(v);
      if (v->is_size_expr()) {  // a graph value: x.size(0), ...
        ValuePtr lowered = std::make_shared<Value>(*v);
        lowered->node = numbers.size_node(v);
        return lowered;
      }
      if (PyLong_CheckExact(v->obj.ptr()) && !infix.empty() && numbers.number_inputs()) {
        // An int operand of an operator (`x * 0.5 + i`) decides no shape: pinned while this
        // place has seen one value, a graph input once it varies (a loop counter).
        if (ValuePtr pinned = numbers.pin_steady_number(v)) return pinned;
        return numbers.scalar_input(v);
      }
      return PyFloat_CheckExact(v->obj.ptr()) && numbers.number_inputs() ? numbers.scalar_input(v)
                                                                          : numbers.specialize(v);
    }
    if (v->kind == VKind::kDict) return numbers.concretize(v);
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
  for (const auto& arg : args) any_tensor = any_tensor || arg->holds_tensor();
  for (const auto& kw : kwargs) any_tensor = any_tensor || kw.second->holds_tensor();
  if (is_method && (method == "cuda" || method == "cpu")) {
    explicit_device = method == "cpu" ? refs.cpu_device
                                      : refs.device_type("cuda", args.size() > 1 && args[1]->is_const()
                                                                     ? args[1]->obj
                                                                     : py::object(py::none()));
    meta_args = py::list();
    meta_args.append(args[0]->obj);
    meta_args.append(refs.meta_device);
  }

  MetaCall call;
  call.fn = fn;
  call.method = is_method ? method : std::string();
  call.target_text = target_text;
  call.args = std::move(meta_args);
  call.kwargs = std::move(meta_kwargs);
  call.any_tensor = any_tensor;
  call.mutates = (is_method && !method.empty() && method.back() == '_') ||
                 is_inplace_operator(target_text) || returns_none_inplace(target_text) ||
                 (!is_method && !target_text.empty() && target_text.back() == '_') ||
                 method == "cuda" || method == "cpu";
  call.real_devices = [&]() {
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
    return devices;
  };
  GraphRecorder& rec = recorder();
  py::object result;
  try {
    result = rec.run_meta(call, explicit_device);
  } catch (const Unsupported& failed) {
    // An op that reads a 0-d tensor's value (view by torch.div(n, 2)) fails on meta tensors: with
    // the values the trace knows as numbers, the node takes those numbers.
    if (failed.kind() != BreakKind::kMetaFailure || made_functions ||
        !known_tensors_as_numbers(*this, args, kwargs)) {
      throw;
    }
    return record_call(kind, fn_in, method, std::move(args), std::move(kwargs), infix, name_hint);
  }
  py::object device = GraphRecorder::infer_device(explicit_device, args, kwargs);

  // A generator passed in is often made anew by each call (diffusers' `generator=
  // torch.Generator().manual_seed(s)`): guarded by identity, each call would compile again. The
  // call runs in Python with it instead.
  py::object generator_type = refs.torch.attr("Generator");
  if (find_argument(args, kwargs, [&](const Value& v) {
        return v.kind == VKind::kObject && v.source >= 0 &&
               PyObject_IsInstance(v.obj.ptr(), generator_type.ptr()) == 1;
      })) {
    FJ_UNSUPPORTED(kUnsupportedCall, "{} with a torch.Generator passed in", target_text);
  }
  // A NumPy scalar in a call that infers a dtype from its values (torch.tensor([s]),
  // torch.full(shape, s)): the graph gets the Python number it holds (numpy_free), whose dtype
  // torch infers otherwise (np.float64 data makes a float64 tensor; a float a float32 one).
  static const char* const kInfersDtype[] = {"torch.tensor", "torch.as_tensor", "torch.asarray",
                                             "torch.full", "torch.full_like", "torch.scalar_tensor",
                                             "new_tensor", "new_full", "fill_", "fill"};
  for (const char* name : kInfersDtype) {
    if (target_text != name && !(is_method && method == name)) continue;
    if (find_argument(args, kwargs, [](const Value& v) { return v.is_const() && is_numpy_scalar(v.obj.ptr()); })) {
      FJ_UNSUPPORTED(kUnsupportedCall, "{} of a NumPy scalar (its dtype is inferred from it)", target_text);
    }
  }
  // An object the graph holds as a constant (an ndarray given to torch.from_numpy, a bound
  // method given to an allow_in_graph function): the graph would use this one on every call, so
  // the one read at the entry must be this one (by type alone, a new one ran the old one).
  find_argument(args, kwargs, [&](const Value& v) {
    if (v.kind == VKind::kObject && v.source >= 0) entry_.guard_id(v.source, v.obj.ptr());
    return false;  // (every one)
  });
  std::vector<Arg> node_args;
  for (const auto& arg : args) node_args.push_back(arg_of(arg));
  Kwargs node_kwargs;
  for (const auto& [key, value] : kwargs) node_kwargs.emplace_back(key, arg_of(value));

  const bool inplace = !args.empty() && args[0]->kind == VKind::kTensor &&
                       result.ptr() == args[0]->obj.ptr() &&
                       ((is_method && !method.empty() && method.back() == '_') ||
                        is_inplace_operator(target_text) ||
                        (!is_method && !target_text.empty() && target_text.back() == '_'));

  SizeTracker& size_tracker = numbers;
  if (inplace && changes_shape_inplace(target_text)) {
    size_tracker.pin_sizes_of(args[0], target_text + " changed the shape sizes were read from");
  }
  for (const auto& [key, value] : kwargs) {
    if (key != "out") continue;
    // out= tensors are resized to the result: like an in-place shape change.
    std::vector<ValuePtr> outs = value->kind == VKind::kTensor ? std::vector<ValuePtr>{value}
                                                               : value->items;
    for (const auto& out : outs) {
      if (out->kind == VKind::kTensor) {
        size_tracker.pin_sizes_of(out, target_text + "(out=) resized its output");
      }
    }
  }
  // The call's node (one branch below makes it, so the arguments move into it).
  auto call_node = [&](std::vector<TensorMeta> metas, bool tuple_result) {
    NodeSpec spec;
    spec.kind = kind;
    spec.target = is_method ? py::str(method) : py::reinterpret_borrow<py::object>(fn);
    spec.target_text = target_text;
    spec.infix = infix;
    spec.args = std::move(node_args);
    spec.kwargs = std::move(node_kwargs);
    spec.fake = result;
    spec.metas = std::move(metas);
    spec.tuple_result = tuple_result;
    spec.name_hint = hint;
    return rec.add(std::move(spec));
  };
  if (is_tensor(result.ptr())) {
    const bool writes = call.mutates || std::any_of(kwargs.begin(), kwargs.end(), [](const auto& kw) {
      return kw.first == "out";  // torch.maximum(a, b, out=a): its effect is the write
    });
    const bool pure = !inplace && !writes && computes_known(target_text);
    TensorMeta meta = GraphRecorder::meta_of(result, device);
    // (before the node takes the arguments)
    py::object known;
    std::vector<ValuePtr> known_from;
    int64_t elements = 1;  // (capped at 2: whether there is more than one)
    for (int64_t n : meta.sizes) elements = std::min<int64_t>(elements * n, 2);
    if (pure && elements <= 1) known = compute_known(is_method, fn, method, args, kwargs, known_from);
    Node* node = call_node({std::move(meta)}, false);
    node->pure = pure;  // (deterministic, no effect: dropped where its value became a constant)
    if (inplace) return args[0];
    ValuePtr out = Value::tensor(node, result, device);
    if (known) {
      out->known = std::move(known);
      out->known_from = std::move(known_from);
      out->known_version = tensor_version(result.ptr());
    }
    return out;
  }
  const bool is_list = PyList_Check(result.ptr());
  if ((PyTuple_Check(result.ptr()) || is_list) && tensors_or_none(result)) {
    std::vector<TensorMeta> metas;
    for (py::handle item : result) {
      metas.push_back(item.is_none() ? TensorMeta() : GraphRecorder::meta_of(item, device));
    }
    Node* node = call_node(std::move(metas), true);
    if (splits_by_size(target_text)) {
      // How many tensors split / chunk / unbind return depends on the sizes: the graph's
      // structure holds for these sizes only.
      const std::string what = target_text + "() (its number of results depends on the sizes)";
      if (size_tracker.symbolic()) {
        size_tracker.note_split_count(node, what);
      } else {
        size_tracker.note_size_read(what);
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
      NodeSpec spec;
      spec.target = getitem;
      spec.target_text = "operator.getitem";
      spec.infix = "[]";
      spec.args = {Arg::of(node), Arg::constant(py::int_(i))};
      spec.fake = element;
      spec.metas = {GraphRecorder::meta_of(element, device)};
      spec.name_hint = "getitem";
      Node* item = rec.add(std::move(spec));
      items.push_back(Value::tensor(item, element, device));
    }
    if (is_list) return Value::list(std::move(items));
    return Value::tuple(std::move(items),
                        py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(result.ptr()))));
  }
  if (result.is_none() && returns_none_inplace(target_text)) {
    call_node({}, false);
    return Value::constant(py::none());
  }
  FJ_UNSUPPORTED(kUnsupportedCall, "{} returned {} (not a tensor) on meta tensors", target_text,
                 Py_TYPE(result.ptr())->tp_name);
}

py::object Tracer::known_value(const ValuePtr& tensor) {
  if (!known_now(*tensor)) return py::object();
  for (const ValuePtr& number : tensor->known_from) sizes().specialize(number);
  return tensor->known;
}

ValuePtr Tracer::tensor_rows(const ValuePtr& tensor) {
  if (py::len(tensor->obj.attr("shape")) == 0) {
    FJ_UNSUPPORTED(kUnsupportedValue, "iterating over a 0-d tensor");  // eager raises TypeError
  }
  // (an array's rows are arrays: its items 0-d arrays, as under torch.compile)
  ValuePtr rows = record_call(NodeKind::kCallMethod, py::none(), "unbind", {Value::plain_tensor(tensor)},
                              {}, "", "unbind");
  FJ_CHECK(rows->kind == VKind::kTuple, "unbind gave {}", rows->describe());
  for (const ValuePtr& row : rows->items) row->ndarray = tensor->ndarray;
  return rows;
}

ValuePtr Tracer::record_operator(const char* fn_name, const char* infix,
                                 std::vector<ValuePtr> args) {
  py::object fn = PyRefs::get().operator_module.attr(fn_name);
  return record_call(NodeKind::kCallFunction, fn, "", std::move(args), {}, infix, fn_name);
}

ValuePtr Tracer::tensor_attr(const ValuePtr& tensor, const std::string& name) {
  if (tensor->ndarray) return ndarray_attr(tensor, name);
  PyRefs& refs = PyRefs::get();
  static const char* kMetaConstants[] = {"shape", "dtype", "ndim", "requires_grad", "layout",
                                         "is_sparse", "is_quantized", "is_mkldnn", "itemsize",
                                         "nbytes", "is_nested", "is_sparse_csr"};
  for (const char* constant : kMetaConstants) {
    if (name != constant) continue;
    if (name == "shape") return sizes().tensor_shape(tensor, "Tensor.shape");
    if (name == "nbytes") sizes().note_sizes_read(tensor, "Tensor." + name);
    return Value::constant(tensor->obj.attr(constant));
  }
  // Its type: torch.Tensor, Parameter or a subclass, exactly as guarded (not the metaclass).
  if (name == "__class__") return Value::object(type_of(tensor));
  if (name == "grad") {
    // An input's gradient: None or a tensor, read by source (guarded like any input), or what
    // this region stored there (optimizers' zero_grad sets None).
    if (const ValuePtr* stored = effects_.pending(tensor, name)) return *stored;
    if (tensor->source >= 0) {
      if (ValuePtr grad = entry_.load(entry_.sources().attr(tensor->source, name))) return grad;
    }
    FJ_UNSUPPORTED(kUnsupportedValue, "the .grad of a tensor made in this region");
  }
  const std::string device = py::str(tensor->device).cast<std::string>();
  if (name == "device") return Value::constant(tensor->device);
  // Device flags (dcgan checks `input.is_cuda`, `is_xpu`): from the traced device.
  static const std::pair<const char*, const char*> kDeviceFlags[] = {
      {"is_cuda", "cuda"}, {"is_cpu", "cpu"}, {"is_meta", "meta"},
      {"is_xpu", "xpu"}, {"is_mps", "mps"}, {"is_ipu", "ipu"}, {"is_xla", "xla"},
      {"is_mtia", "mtia"}, {"is_maia", "maia"}, {"is_vulkan", "vulkan"}};
  for (const auto& [flag, type] : kDeviceFlags) {
    if (name == flag) return Value::constant(py::bool_(is_device_type(device, type)));
  }
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
