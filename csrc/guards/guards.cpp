// Guard construction at trace time, evaluation on every call, and readable descriptions.
#include "guards/guards.h"

#include <algorithm>

#include <fmt/format.h>

#include "bytecode/version.h"
#include "common/check.h"

namespace framejit {

namespace {

// Whether iterating `iterable` gives the items of `expected` (a tuple), in its order, each the
// same object or an equal constant: a set's or an OrderedDict's order as the trace read it.
bool iterates_as(PyObject* iterable, PyObject* expected) {
  Ref items = Ref::steal(PySequence_Tuple(iterable));
  if (!items) {
    PyErr_Clear();
    return false;
  }
  if (PyTuple_GET_SIZE(items.get()) != PyTuple_GET_SIZE(expected)) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(expected); ++i) {
    PyObject* item = PyTuple_GET_ITEM(items.get(), i);
    PyObject* want = PyTuple_GET_ITEM(expected, i);
    if (item != want && !same_constant(item, want)) return false;
  }
  return true;
}

// An object as a guard's text shows it: a tensor (a parameter keying an optimizer's state) by its
// type, shape and address rather than its values; anything else by its repr.
std::string object_text(PyObject* obj) {
  PyObject* shape = is_tensor(obj) ? PyObject_GetAttrString(obj, "shape") : nullptr;
  if (shape == nullptr) {
    PyErr_Clear();
    return safe_repr(obj);
  }
  std::string text = fmt::format("<{} {} at {}>", Py_TYPE(obj)->tp_name, safe_repr(shape),
                                 static_cast<const void*>(obj));
  Py_DECREF(shape);
  return text;
}

// Whether two guards check the same thing (a trace asks the same question many times: a
// config's __dict__ for each attribute read through its __getattribute__).
bool same_guard(const Guard& a, const Guard& b) {
  if (a.kind != b.kind || a.slot != b.slot || a.n != b.n || a.spec != b.spec || a.dim != b.dim ||
      a.other_dim != b.other_dim || a.rel != b.rel || !(a.terms == b.terms) ||
      a.modulus != b.modulus || a.remainder != b.remainder) {
    return false;
  }
  PyObject* x = a.expected.ptr();
  PyObject* y = b.expected.ptr();
  if (x == y) return true;
  if (x == nullptr || y == nullptr) return false;
  if (PyUnicode_CheckExact(x) && PyUnicode_CheckExact(y)) return PyUnicode_Compare(x, y) == 0;
  if (PyTuple_CheckExact(x) && PyTuple_CheckExact(y) && PyTuple_GET_SIZE(x) == PyTuple_GET_SIZE(y)) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(x); ++i) {  // a type-version guard's parts
      PyObject* u = PyTuple_GET_ITEM(x, i);
      PyObject* v = PyTuple_GET_ITEM(y, i);
      if (u != v && !(PyUnicode_CheckExact(u) && PyUnicode_CheckExact(v) && PyUnicode_Compare(u, v) == 0)) {
        return false;
      }
    }
    return true;
  }
  return false;
}

}  // namespace

void GuardSet::push(Guard guard) {
  for (const Guard& known : guards_) {
    if (same_guard(known, guard)) return;
  }
  guards_.push_back(std::move(guard));
}

void GuardSet::add_type(int slot, PyObject* type) {
  push({GuardKind::kType, slot, py::reinterpret_borrow<py::object>(type)});
  sorted_ = false;
}

void GuardSet::add_id(int slot, PyObject* obj) {
  push({GuardKind::kId, slot, py::reinterpret_borrow<py::object>(obj)});
  sorted_ = false;
}

void GuardSet::add_const(int slot, PyObject* value) {
  push({GuardKind::kConstEq, slot, py::reinterpret_borrow<py::object>(value)});
  sorted_ = false;
}

void GuardSet::add_tensor(int slot, PyObject* tensor) {
  tensor_specs_.push_back(tensor_spec_of(tensor));
  Guard guard{GuardKind::kTensor, slot, py::none()};
  guard.spec = static_cast<int>(tensor_specs_.size()) - 1;
  push(guard);
  sorted_ = false;
}

void GuardSet::allow_any_sizes(const std::map<int, std::set<int>>& fixed) {
  for (const Guard& guard : guards_) {
    if (guard.kind != GuardKind::kTensor) continue;
    TensorSpec& spec = tensor_specs_[guard.spec];
    spec.any_sizes = true;
    auto dims = fixed.find(guard.slot);
    if (dims != fixed.end()) spec.fixed_dims.assign(dims->second.begin(), dims->second.end());
  }
}

void GuardSet::allow_symbolic_dims(const std::map<int, std::set<int>>& symbolic) {
  for (const Guard& guard : guards_) {
    if (guard.kind != GuardKind::kTensor) continue;
    auto dims = symbolic.find(guard.slot);
    if (dims == symbolic.end()) continue;
    TensorSpec& spec = tensor_specs_[guard.spec];
    std::vector<int32_t> order = dense_stride_order(spec.sizes, spec.strides);
    if (order.empty() && !spec.sizes.empty()) continue;  // not dense: stays exact
    spec.any_sizes = true;
    spec.dense_layout = true;
    spec.stride_order = std::move(order);
    spec.fixed_dims.clear();
    for (int32_t dim = 0; dim < static_cast<int32_t>(spec.sizes.size()); ++dim) {
      if (!dims->second.count(dim)) spec.fixed_dims.push_back(dim);
    }
  }
}

void GuardSet::bound_dims(const std::map<int, std::vector<TensorSpec::DimRange>>& ranges) {
  for (const Guard& guard : guards_) {
    if (guard.kind != GuardKind::kTensor) continue;
    auto dims = ranges.find(guard.slot);
    TensorSpec& spec = tensor_specs_[guard.spec];
    if (dims == ranges.end() || !spec.any_sizes) continue;
    for (const TensorSpec::DimRange& range : dims->second) {
      const bool fixed = std::find(spec.fixed_dims.begin(), spec.fixed_dims.end(), range.dim) !=
                         spec.fixed_dims.end();
      if (range.dim < static_cast<int>(spec.sizes.size()) && !fixed) spec.ranges.push_back(range);
    }
  }
}

void GuardSet::add_shape_guards(py::object check, py::object explain, std::vector<int> slots,
                                std::vector<std::string> texts) {
  shape_ = ShapeGuards{std::move(check), std::move(explain), std::move(slots), std::move(texts)};
}

bool GuardSet::check_shapes(PyObject* const* slots) const {
  if (!shape_.check) return true;
  constexpr size_t kInline = 8;
  PyObject* inline_args[kInline];
  std::vector<PyObject*> heap_args;
  PyObject** args = inline_args;
  if (shape_.slots.size() > kInline) {
    heap_args.resize(shape_.slots.size());
    args = heap_args.data();
  }
  for (size_t i = 0; i < shape_.slots.size(); ++i) args[i] = slots[shape_.slots[i]];
  PyObject* result = PyObject_Vectorcall(shape_.check.ptr(), args, shape_.slots.size(), nullptr);
  if (result == nullptr) {  // a guard that cannot be evaluated on these values does not hold
    PyErr_Clear();
    return false;
  }
  const bool holds = result == Py_True;
  Py_DECREF(result);
  return holds;
}

void GuardSet::add_len(int slot, int64_t n) {
  Guard guard{GuardKind::kLen, slot, py::none()};
  guard.n = n;
  push(guard);
  sorted_ = false;
}

void GuardSet::add_dict_contains(int slot, PyObject* key, bool present) {
  Guard guard{GuardKind::kDictContains, slot, py::reinterpret_borrow<py::object>(key)};
  guard.n = present ? 1 : 0;
  push(guard);
  sorted_ = false;
}

void GuardSet::add_dict_keys(int slot, PyObject* keys) {
  push(Guard{GuardKind::kDictKeys, slot, py::reinterpret_borrow<py::object>(keys)});
  sorted_ = false;
}

void GuardSet::add_type_version(int slot, PyTypeObject* type, PyObject* name, bool present,
                                PyObject* found) {
  py::tuple expected = py::make_tuple(py::handle(reinterpret_cast<PyObject*>(type)), py::handle(name),
                                      py::bool_(present), py::handle(found ? found : Py_None));
  Guard guard{GuardKind::kTypeVersion, slot, expected};
  guard.n = pyver::type_version_valid(type) ? type->tp_version_tag : 0;  // 0: by lookup
  push(guard);
  sorted_ = false;
}

void GuardSet::add_size_relation(int slot, int dim, SizeRelation rel, int other, int other_dim) {
  if (other > slot) {  // checked when the later of the two is read: turn the relation around
    std::swap(slot, other);
    std::swap(dim, other_dim);
    rel = flipped(rel);
  }
  Guard guard{GuardKind::kSizeRelation, slot, py::none()};
  guard.n = other;
  guard.dim = dim;
  guard.other_dim = other_dim;
  guard.rel = static_cast<uint8_t>(rel);
  push(guard);
  sorted_ = false;
}

void GuardSet::add_int_relation(int slot, SizeRelation rel, int64_t bound) {
  Guard guard{GuardKind::kIntRelation, slot, py::none()};
  guard.n = bound;
  guard.rel = static_cast<uint8_t>(rel);
  push(guard);
  sorted_ = false;
}

std::string linear_relation_text(const std::vector<Guard::Term>& terms, int64_t constant,
                                 SizeRelation rel, const SourceTable& sources, int64_t modulus,
                                 int64_t remainder) {
  std::string sum;
  for (const Guard::Term& term : terms) {
    const int64_t size = term.factor < 0 ? -term.factor : term.factor;
    sum += sum.empty() ? (term.factor < 0 ? "-" : "") : (term.factor < 0 ? " - " : " + ");
    if (size != 1) sum += fmt::format("{} * ", size);
    sum += sources.at(term.slot).text;
    if (term.dim >= 0) sum += fmt::format(".size({})", term.dim);
  }
  if (modulus > 0) {
    if (constant != 0) sum += fmt::format(" {} {}", constant < 0 ? "-" : "+", constant < 0 ? -constant : constant);
    return fmt::format("({}) % {} {} {}", sum, modulus, relation_text(rel), remainder);
  }
  return fmt::format("{} {} {}", sum, relation_text(rel), -constant);
}

void GuardSet::add_linear_relation(std::vector<Guard::Term> terms, int64_t constant, SizeRelation rel,
                                   int64_t modulus, int64_t remainder) {
  int last = 0;  // checked when the last of its slots is read
  for (const Guard::Term& term : terms) last = std::max(last, term.slot);
  Guard guard{GuardKind::kLinearRelation, last, py::none()};
  guard.n = constant;
  guard.rel = static_cast<uint8_t>(rel);
  guard.terms = std::move(terms);
  guard.modulus = modulus;
  guard.remainder = remainder;
  push(guard);
  sorted_ = false;
}

void GuardSet::add_pair(GuardKind kind, int slot, int other) {
  if (other > slot) std::swap(slot, other);  // checked when the later of the two is read
  Guard guard{kind, slot, py::none()};
  guard.n = other;
  push(guard);
  sorted_ = false;
}

void GuardSet::add_distinct(int slot, int other) { add_pair(GuardKind::kDistinct, slot, other); }

void GuardSet::add_same(int slot, int other) { add_pair(GuardKind::kSame, slot, other); }

void GuardSet::sort() const {
  by_slot_ = guards_;
  std::stable_sort(by_slot_.begin(), by_slot_.end(),
                   [](const Guard& a, const Guard& b) { return a.slot < b.slot; });
  sorted_ = true;
}

bool GuardSet::check_one(const Guard& guard, PyObject* value, PyObject* const* slots) const {
  PyObject* expected = guard.expected.ptr();
  switch (guard.kind) {
    case GuardKind::kType:
      return reinterpret_cast<PyObject*>(Py_TYPE(value)) == expected;
    case GuardKind::kDistinct:
      return value != slots[guard.n];
    case GuardKind::kSame:
      return value == slots[guard.n];
    case GuardKind::kId:
      return value == expected;
    case GuardKind::kConstEq:
      return same_constant(value, expected);
    case GuardKind::kTensor:
      return tensor_matches(tensor_specs_[guard.spec], value);
    case GuardKind::kSizeRelation: {
      int64_t a = 0, b = 0;
      if (!tensor_size(value, guard.dim, a) || !tensor_size(slots[guard.n], guard.other_dim, b)) {
        return false;
      }
      return relation_holds(static_cast<SizeRelation>(guard.rel), a, b);
    }
    case GuardKind::kIntRelation: {
      if (!PyLong_Check(value)) return false;
      int overflow = 0;  // (an int past int64 fails the guard: the trace saw one within it)
      const int64_t a = PyLong_AsLongLongAndOverflow(value, &overflow);
      return overflow == 0 && relation_holds(static_cast<SizeRelation>(guard.rel), a, guard.n);
    }
    case GuardKind::kLinearRelation: {
      int64_t total = guard.n;
      for (const Guard::Term& term : guard.terms) {
        PyObject* of = slots[term.slot];
        int64_t x = 0;
        if (term.dim < 0) {
          if (!PyLong_Check(of)) return false;
          int overflow = 0;
          x = PyLong_AsLongLongAndOverflow(of, &overflow);
          if (overflow != 0) return false;
        } else if (!tensor_size(of, term.dim, x)) {
          return false;
        }
        int64_t scaled = 0;
        if (__builtin_mul_overflow(x, term.factor, &scaled) || __builtin_add_overflow(total, scaled, &total)) {
          return false;  // (past int64: the trace saw a sum within it)
        }
      }
      if (guard.modulus > 0) {  // Python's %: the divisor's sign
        const int64_t mod = ((total % guard.modulus) + guard.modulus) % guard.modulus;
        return relation_holds(static_cast<SizeRelation>(guard.rel), mod, guard.remainder);
      }
      return relation_holds(static_cast<SizeRelation>(guard.rel), total, 0);
    }
    case GuardKind::kLen:
      if (PyDict_Check(value)) return PyDict_GET_SIZE(value) == guard.n;
      // (a namedtuple too: the guard before this one pinned its exact class)
      return (PyTuple_Check(value) || PyList_CheckExact(value)) &&
             PySequence_Fast_GET_SIZE(value) == guard.n;
    case GuardKind::kDictContains: {  // a dict's own contents (of a subclass too)
      if (!PyDict_Check(value)) return false;
      const int has = PyDict_Contains(value, expected);
      if (has < 0) PyErr_Clear();
      return has == guard.n;
    }
    case GuardKind::kTypeVersion: {
      if (value != PyTuple_GET_ITEM(expected, 0)) return false;
      auto* type = reinterpret_cast<PyTypeObject*>(value);
      if (pyver::type_version_valid(type) && type->tp_version_tag == static_cast<uint64_t>(guard.n)) {
        return true;
      }
      // Changed since (or patched and restored): look the name up again. The lookup also
      // assigns a fresh tag, which the fast path compares from now on.
      PyObject* found = pyver::type_lookup_tagging(type, PyTuple_GET_ITEM(expected, 1));  // Borrowed
      if ((found != nullptr) != (PyTuple_GET_ITEM(expected, 2) == Py_True)) return false;
      // The very object the trace bound (a method replaced on the class is another one).
      PyObject* want = PyTuple_GET_ITEM(expected, 3);
      if (want != Py_None && found != want) return false;
      if (pyver::type_version_valid(type)) guard.n = type->tp_version_tag;
      return true;
    }
    case GuardKind::kDictKeys: {
      if (PyAnySet_CheckExact(value)) {  // a set: its items in the order it iterates them now
        return PySet_GET_SIZE(value) == PyTuple_GET_SIZE(expected) && iterates_as(value, expected);
      }
      // (A dict subclass is guarded where its class leaves dict's iteration as it is.)
      if (!PyDict_Check(value) || PyDict_GET_SIZE(value) != PyTuple_GET_SIZE(expected)) {
        return false;
      }
      if (PyODict_Check(value)) {  // its own order: iterated, as the trace read it
        // (a subclass through OrderedDict.keys, past an __iter__ of its own)
        Ref view = PyODict_CheckExact(value)
                       ? Ref::borrow(value)
                       : Ref::steal(PyObject_CallMethod(reinterpret_cast<PyObject*>(&PyODict_Type),
                                                        "keys", "O", value));
        if (!view) PyErr_Clear();
        return view && iterates_as(view.get(), expected);
      }
      Py_ssize_t pos = 0;
      Py_ssize_t i = 0;
      PyObject* key;  // Borrowed
      while (PyDict_Next(value, &pos, &key, nullptr)) {
        PyObject* want = PyTuple_GET_ITEM(expected, i++);  // Borrowed
        if (key == want) continue;
        if (Py_TYPE(key) != Py_TYPE(want)) return false;  // True == 1, but {True: v} is not {1: v}
        const int eq = PyObject_RichCompareBool(key, want, Py_EQ);
        if (eq != 1) {
          if (eq < 0) PyErr_Clear();
          return false;
        }
      }
      return true;
    }
  }
  return false;
}

bool GuardSet::check(const SourceTable& sources, const FrameState& frame,
                     SlotValues& slots) const {
  if (!(current_global_torch_state() == global_)) return false;
  if (!sorted_) sort();
  const int n = sources.size();
  slots.reset(static_cast<size_t>(n));
  size_t g = 0;
  for (int slot = 0; slot < n; ++slot) {
    PyObject* value = sources.read(slot, frame, slots.data());  // New or NULL
    if (value == nullptr) return false;
    slots.set(slot, value);
    for (; g < by_slot_.size() && by_slot_[g].slot == slot; ++g) {
      if (!check_one(by_slot_[g], value, slots.data())) return false;
    }
  }
  return check_shapes(slots.data());
}

std::string GuardSet::describe(const Guard& guard, const SourceTable& sources) const {
  const std::string& src = sources.at(guard.slot).text;
  switch (guard.kind) {
    case GuardKind::kType:
      return fmt::format("TYPE_MATCH {} is {}", src,
                         reinterpret_cast<PyTypeObject*>(guard.expected.ptr())->tp_name);
    case GuardKind::kDistinct:
      return fmt::format("NOT_SAME {} is not {}", src, sources.at(static_cast<int>(guard.n)).text);
    case GuardKind::kSame:
      return fmt::format("SAME {} is {}", src, sources.at(static_cast<int>(guard.n)).text);
    case GuardKind::kId:
      return fmt::format("ID_MATCH {} is {}", src, object_text(guard.expected.ptr()));
    case GuardKind::kConstEq:
      return fmt::format("CONSTANT_MATCH {} == {}", src, safe_repr(guard.expected));
    case GuardKind::kTensor:
      return fmt::format("TENSOR_MATCH {} {}", src, tensor_spec_text(tensor_specs_[guard.spec]));
    case GuardKind::kLen:
      return fmt::format("LENGTH_CHECK len({}) == {}", src, guard.n);
    case GuardKind::kSizeRelation:
      return fmt::format("SIZE_RELATION {}.size({}) {} {}.size({})", src, guard.dim,
                         relation_text(static_cast<SizeRelation>(guard.rel)),
                         sources.at(static_cast<int>(guard.n)).text, guard.other_dim);
    case GuardKind::kIntRelation:
      return fmt::format("INT_RELATION {} {} {}", src, relation_text(static_cast<SizeRelation>(guard.rel)),
                         guard.n);
    case GuardKind::kLinearRelation:
      return "LINEAR_RELATION " +
             linear_relation_text(guard.terms, guard.n, static_cast<SizeRelation>(guard.rel), sources,
                                  guard.modulus, guard.remainder);
    case GuardKind::kDictContains:
      return fmt::format("DICT_CONTAINS {} in {} is {}", object_text(guard.expected.ptr()), src,
                         guard.n ? "True" : "False");
    case GuardKind::kDictKeys:
      return fmt::format("DICT_KEYS list({}) == {}", src, safe_repr(guard.expected));
    case GuardKind::kTypeVersion:
      if (!guard.expected[py::int_(3)].is_none()) {
        return fmt::format("CLASS_ATTRIBUTE {} is {} and {} is {} on it", src,
                           safe_repr(guard.expected[py::int_(0)]),
                           safe_repr(guard.expected[py::int_(1)]),
                           safe_repr(guard.expected[py::int_(3)]));
      }
      return fmt::format("CLASS_ATTRIBUTE {} is {} and {} {} found on it", src,
                         safe_repr(guard.expected[py::int_(0)]), safe_repr(guard.expected[py::int_(1)]),
                         guard.expected[py::int_(2)].ptr() == Py_True ? "is" : "is not");
  }
  return "?";
}

std::string GuardSet::first_failure(const SourceTable& sources, const FrameState& frame) const {
  const GlobalTorchState now = current_global_torch_state();
  if (now.grad_enabled != global_.grad_enabled) return "GLOBAL_STATE grad mode changed";
  if (now.default_dtype != global_.default_dtype) return "GLOBAL_STATE default dtype changed";
  if (now.autocast_cpu != global_.autocast_cpu || now.autocast_cuda != global_.autocast_cuda ||
      now.autocast_default_cpu != global_.autocast_default_cpu ||
      now.autocast_default_cuda != global_.autocast_default_cuda) {
    return "GLOBAL_STATE autocast changed";
  }
  if (!sorted_) sort();
  SlotValues slots;
  slots.reset(static_cast<size_t>(sources.size()));
  size_t g = 0;
  for (int slot = 0; slot < sources.size(); ++slot) {
    PyObject* value = sources.read(slot, frame, slots.data());
    if (value == nullptr) return fmt::format("{} could not be read", sources.at(slot).text);
    slots.set(slot, value);
    for (; g < by_slot_.size() && by_slot_[g].slot == slot; ++g) {
      const Guard& guard = by_slot_[g];
      if (check_one(guard, value, slots.data())) continue;
      std::string text = describe(guard, sources);
      if (guard.kind == GuardKind::kTensor) {
        text += ": " + tensor_mismatch(tensor_specs_[guard.spec], value);
      } else {
        text += fmt::format(" (got {})", short_repr(value));
      }
      return text;
    }
  }
  if (!check_shapes(slots.data())) {
    py::tuple args(shape_.slots.size());
    for (size_t i = 0; i < shape_.slots.size(); ++i) {
      args[i] = py::reinterpret_borrow<py::object>(slots[shape_.slots[i]]);
    }
    try {
      return "SHAPE_GUARD " + py::str(shape_.explain(*args)).cast<std::string>();
    } catch (py::error_already_set&) {
      return "SHAPE_GUARD (the symbolic-shape guards could not be evaluated)";
    }
  }
  return {};
}

std::string GuardSet::to_string(const SourceTable& sources) const {
  if (!sorted_) sort();
  std::string out = fmt::format("GLOBAL_STATE grad_enabled={} default_dtype={}{}\n",
                                global_.grad_enabled ? "True" : "False",
                                static_cast<int>(global_.default_dtype),
                                global_.autocast()
                                    ? fmt::format(" autocast_cpu={} autocast_cuda={}",
                                                  static_cast<int>(global_.autocast_cpu),
                                                  static_cast<int>(global_.autocast_cuda))
                                    : std::string());
  for (const Guard& guard : by_slot_) out += describe(guard, sources) + "\n";
  return out + shape_guards_text();
}

std::string GuardSet::shape_guards_text() const {
  std::string out;
  for (const std::string& text : shape_.texts) out += "SHAPE_GUARD " + text + "\n";
  return out;
}

}  // namespace framejit
