// Opcode handlers: binary, unary, comparison, identity and membership operators. On tensors they
// record `operator.*` nodes; on constants they are folded at trace time.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "bytecode/version.h"
#include "common/check.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

struct OperatorInfo {
  const char* fn;     // name in the operator module
  const char* infix;  // printed form; empty for in-place forms, printed as calls
};

// BINARY_OP's argument, in CPython's NB_* order (the same in 3.11 and 3.12).
constexpr OperatorInfo kBinaryOps[] = {
    {"add", "+"},       {"and_", "&"},      {"floordiv", "//"}, {"lshift", "<<"},
    {"matmul", "@"},    {"mul", "*"},       {"mod", "%"},       {"or_", "|"},
    {"pow", "**"},      {"rshift", ">>"},   {"sub", "-"},       {"truediv", "/"},
    {"xor", "^"},       {"iadd", "+="},     {"iand", "&="},     {"ifloordiv", "//="},
    {"ilshift", "<<="}, {"imatmul", "@="},  {"imul", "*="},     {"imod", "%="},
    {"ior", "|="},      {"ipow", "**="},    {"irshift", ">>="}, {"isub", "-="},
    {"itruediv", "/="}, {"ixor", "^="},
};

// In CPython's rich-comparison order (Py_LT, Py_LE, Py_EQ, Py_NE, Py_GT, Py_GE).
constexpr OperatorInfo kCompareOps[] = {
    {"lt", "<"}, {"le", "<="}, {"eq", "=="}, {"ne", "!="}, {"gt", ">"}, {"ge", ">="},
};
static_assert(Py_LT == 0 && Py_LE == 1 && Py_EQ == 2 && Py_NE == 3 && Py_GT == 4 && Py_GE == 5,
              "kCompareOps follows the rich-comparison codes");

// The plain form of an in-place operator (`+` for `+=`): the entry with its infix less '='.
const OperatorInfo& plain_form(const OperatorInfo& op) {
  const std::string infix = op.infix;
  for (const OperatorInfo& candidate : kBinaryOps) {
    if (infix == std::string(candidate.infix) + "=") return candidate;
  }
  return op;
}

bool foldable(const ValuePtr& v) { return v->is_constant_tree(); }

// A folded result. A list the operator made (`[None] * n`, `[1] + [2]`) is a list value of the
// trace, so later item stores and appends change it as Python's would (a list nested in it
// too, each list one value however often it is repeated); anything else is a constant.
ValuePtr folded_value(const py::object& result, std::unordered_map<PyObject*, ValuePtr>& made) {
  if (!PyList_CheckExact(result.ptr())) return Value::constant(result);
  auto found = made.find(result.ptr());
  if (found != made.end()) return found->second;
  ValuePtr list = Value::list({});
  made.emplace(result.ptr(), list);
  for (py::handle item : result) {
    list->items.push_back(folded_value(py::reinterpret_borrow<py::object>(item), made));
  }
  return list;
}

ValuePtr fold(const char* fn_name, const std::vector<ValuePtr>& args) {
  py::object fn = PyRefs::get().operator_module.attr(fn_name);
  py::list py_args;
  for (const auto& a : args) py_args.append(a->as_python());
  try {
    py::object result = fn(*py::tuple(py_args));
    std::unordered_map<PyObject*, ValuePtr> made;
    return folded_value(result, made);
  } catch (const py::error_already_set& e) {
    FJ_PROGRAM_RAISED(kUnsupportedValue, "operator.{} raised at trace time: {}", fn_name, e.what());
  }
}

// The items of a tuple or list operand: a modelled one, or a constant.
bool sequence_operand(const ValuePtr& v, VKind kind, std::vector<ValuePtr>& out) {
  if (v->kind == kind) {
    out = v->items;
    return true;
  }
  const bool constant = v->is_const() && (kind == VKind::kTuple ? PyTuple_Check(v->obj.ptr())
                                                                : PyList_CheckExact(v->obj.ptr()));
  if (!constant) return false;
  for (py::handle item : v->obj) out.push_back(Value::constant(py::reinterpret_borrow<py::object>(item)));
  return true;
}

// Whether a tuple operand is a torch.Size (`(1,) + x.shape` is one: Size.__radd__).
bool size_typed(const ValuePtr& v) {
  PyObject* size = PyRefs::get().size_type.ptr();
  return (v->kind == VKind::kTuple && v->pytype.ptr() == size) ||
         (v->is_const() && reinterpret_cast<PyObject*>(Py_TYPE(v->obj.ptr())) == size);
}

// `a + b` / `a += b` on tuples or lists holding traced values (tensors): the joined sequence.
// `l += [x]` extends the list in place (one that existed before becomes the trace's, written
// back at the exit). nullptr when the operands are not such.
ValuePtr join_sequences(Tracer& t, const OperatorInfo& op, const std::vector<ValuePtr>& args) {
  const std::string fn = op.fn;
  if ((fn != "add" && fn != "iadd") || args.size() != 2) return nullptr;
  const ValuePtr& lhs = args[0];
  std::vector<ValuePtr> left;
  std::vector<ValuePtr> right;
  const VKind kind = lhs->is_const() && PyTuple_CheckExact(lhs->obj.ptr()) ? VKind::kTuple
                     : lhs->is_const() && PyList_CheckExact(lhs->obj.ptr()) ? VKind::kList
                                                                            : lhs->kind;
  if (kind != VKind::kTuple && kind != VKind::kList) return nullptr;
  if (!sequence_operand(lhs, kind, left) || !sequence_operand(args[1], kind, right)) return nullptr;
  if (kind == VKind::kTuple) {
    // A torch.Size on either side makes a torch.Size (x.shape[:-1] + (2, -1), (1,) + x.shape);
    // a namedtuple or structseq on the left is left to the fold (its `+` gives a plain tuple).
    const bool size = size_typed(lhs) || size_typed(args[1]);
    if (lhs->kind == VKind::kTuple && lhs->pytype && !size &&
        lhs->pytype.ptr() != reinterpret_cast<PyObject*>(&PyTuple_Type)) {
      return nullptr;
    }
    left.insert(left.end(), right.begin(), right.end());
    return Value::tuple(std::move(left), size ? PyRefs::get().size_type : py::object());
  }
  if (lhs->kind != VKind::kList) {  // a constant list: a new list either way
    left.insert(left.end(), right.begin(), right.end());
    return Value::list(std::move(left));
  }
  if (fn == "iadd") {
    t.make_writable(lhs);
    lhs->items.insert(lhs->items.end(), right.begin(), right.end());
    return lhs;
  }
  std::vector<ValuePtr> items = lhs->items;
  items.insert(items.end(), right.begin(), right.end());
  return Value::list(std::move(items));
}

// `seq * n` / `n * seq` / `seq *= n` on a tuple or list holding traced values: its items n
// times over (the same values, as Python repeats references). `l *= n` changes the list in
// place (one that existed before becomes the trace's). nullptr when the operands are not such.
ValuePtr repeat_sequence(Tracer& t, const OperatorInfo& op, const std::vector<ValuePtr>& args) {
  const std::string fn = op.fn;
  if ((fn != "mul" && fn != "imul") || args.size() != 2) return nullptr;
  const bool left = args[0]->is_sequence();
  if (!left && !(fn == "mul" && args[1]->is_sequence())) return nullptr;
  const ValuePtr& seq = left ? args[0] : args[1];
  const ValuePtr count = t.sizes().concretize(left ? args[1] : args[0]);
  if (!count->is_const() || !PyLong_Check(count->obj.ptr())) return nullptr;
  const long long times = std::max(0LL, PyLong_AsLongLong(count->obj.ptr()));
  if (PyErr_Occurred()) throw py::error_already_set();
  if (times > 0 && seq->items.size() * static_cast<size_t>(times) > (size_t{1} << 16)) {
    FJ_UNSUPPORTED(kUnsupportedValue, "a sequence repeated to more than 65,536 items");
  }
  std::vector<ValuePtr> items;
  for (long long i = 0; i < times; ++i) items.insert(items.end(), seq->items.begin(), seq->items.end());
  if (seq->kind == VKind::kTuple) {
    const bool size = seq->pytype.ptr() == PyRefs::get().size_type.ptr();
    return Value::tuple(std::move(items), size ? PyRefs::get().size_type : py::object());
  }
  if (fn == "imul") {
    t.make_writable(seq);
    seq->items = std::move(items);
    return seq;
  }
  return Value::list(std::move(items));
}

// `a | b` / `a |= b` of dicts (a dict of the trace, one read by source, a constant one): a new
// dict of a's entries updated by b's; `|=` updates a in place. nullptr when the operands are
// not such.
ValuePtr merge_dicts(Tracer& t, const OperatorInfo& op, const std::vector<ValuePtr>& args) {
  const std::string fn = op.fn;
  if ((fn != "or_" && fn != "ior") || args.size() != 2) return nullptr;
  auto is_dict = [](const ValuePtr& v) {
    return (v->kind == VKind::kDict && !v->pytype) ||
           (v->kind == VKind::kObject && v->role == ObjRole::kPlain && !v->bound_self &&
            v->source >= 0 && PyDict_CheckExact(v->obj.ptr())) ||
           (v->is_const() && PyDict_CheckExact(v->obj.ptr()));
  };
  if (!is_dict(args[0]) || !is_dict(args[1])) return nullptr;
  std::vector<std::pair<py::object, ValuePtr>> right;
  if (!t.mapping_entries(args[1], right)) return nullptr;
  if (fn == "ior" && !args[0]->is_const()) {
    t.make_writable(args[0]);
    for (auto& [key, value] : right) args[0]->set_key(key, value);
    return args[0];
  }
  std::vector<std::pair<py::object, ValuePtr>> left;
  if (!t.mapping_entries(args[0], left)) return nullptr;
  ValuePtr out = Value::dict({}, {});
  for (auto& [key, value] : left) out->set_key(key, value);
  for (auto& [key, value] : right) out->set_key(key, value);
  return out;
}

// Two tuples (torch.Size among them), or two lists, of ints and size expressions only (a list
// and a tuple are never equal: not compared here).
bool sized_tuples(const std::vector<ValuePtr>& args) {
  if (args.size() != 2 || args[0]->kind != args[1]->kind) return false;
  for (const ValuePtr& tuple : args) {
    if (tuple->kind != VKind::kTuple && tuple->kind != VKind::kList) return false;
    for (const ValuePtr& item : tuple->items) {
      const bool number = item->kind == VKind::kSymNum ? item->is_size_expr()
                                                       : item->is_const() && PyLong_Check(item->obj.ptr());
      if (!number) return false;
    }
  }
  return true;
}

ValuePtr apply(Tracer& t, const OperatorInfo& op, std::vector<ValuePtr> args);

int comparison_code(const OperatorInfo& op) {
  for (int code = 0; code < 6; ++code) {
    if (std::strcmp(op.fn, kCompareOps[code].fn) == 0) return code;
  }
  return -1;
}

// `a < b` (any comparison) of two tuples or two lists that hold traced values, as Python
// compares sequences: the first pair of items that are not the same value and not equal
// decides (`(k1, t1) < (k2, t2)` with k1 != k2 never looks at the tensors); if there is none,
// the lengths do. nullptr when the operands are not such.
ValuePtr compare_sequences(Tracer& t, const OperatorInfo& op, const std::vector<ValuePtr>& args) {
  const int code = comparison_code(op);
  if (code < 0 || args.size() != 2) return nullptr;
  const VKind kind = args[0]->kind == VKind::kList || (args[0]->is_const() && PyList_CheckExact(args[0]->obj.ptr()))
                         ? VKind::kList : VKind::kTuple;
  for (const ValuePtr& side : args) {  // (a tuple subclass comparing in its own way: not here)
    if (side->kind == VKind::kTuple && side->pytype &&
        reinterpret_cast<PyTypeObject*>(side->pytype.ptr())->tp_richcompare != PyTuple_Type.tp_richcompare) {
      return nullptr;
    }
  }
  std::vector<ValuePtr> left;
  std::vector<ValuePtr> right;
  if (!sequence_operand(args[0], kind, left) || !sequence_operand(args[1], kind, right)) return nullptr;
  const size_t common = std::min(left.size(), right.size());
  size_t i = 0;
  for (; i < common; ++i) {
    if (left[i] == right[i]) continue;  // the same object: equal (identity first, as Python)
    if (left[i]->holds_tensor() || right[i]->holds_tensor()) {
      FJ_UNSUPPORTED(kDataDependent, "comparing {} with {} inside sequences needs their data",
                     left[i]->describe(), right[i]->describe());
    }
    ValuePtr same = apply(t, kCompareOps[Py_EQ], {left[i], right[i]});
    if (same->kind == VKind::kSymNum) same = t.sizes().decide(same);
    if (!same->is_const()) {
      FJ_UNSUPPORTED(kDataDependent, "comparing {} with {} inside sequences", left[i]->describe(),
                     right[i]->describe());
    }
    const int truth = PyObject_IsTrue(same->obj.ptr());
    if (truth < 0) throw py::error_already_set();
    if (!truth) break;
  }
  if (i == common) {
    PyObject* result = PyObject_RichCompare(py::int_(left.size()).ptr(), py::int_(right.size()).ptr(), code);
    if (result == nullptr) throw py::error_already_set();
    return Value::constant(py::reinterpret_steal<py::object>(result));
  }
  if (code == Py_EQ) return Value::constant(py::bool_(false));
  if (code == Py_NE) return Value::constant(py::bool_(true));
  ValuePtr result = apply(t, op, {left[i], right[i]});
  if (result->kind == VKind::kSymNum) result = t.sizes().decide(result);
  return result;
}

ValuePtr apply(Tracer& t, const OperatorInfo& op, std::vector<ValuePtr> args) {
  for (const auto& a : args) {
    // (a deque's own +, *, == and < are not the list's: left to Python)
    if (a->is_deque()) FJ_UNSUPPORTED(kUnsupportedValue, "operator.{} on a deque", op.fn);
  }
  bool tensor = false;
  for (const auto& a : args) tensor = tensor || a->is_tensor();
  if (tensor) {
    bool arrays = false;
    for (const auto& a : args) arrays = arrays || (a->is_tensor() && a->ndarray);
    if (arrays) {
      // NumPy arrays of the trace: NumPy's operator (`n += a` computes `n = n + a`).
      const bool augmented = !args[0]->is_tensor() && op.fn[0] == 'i' && &plain_form(op) != &op;
      return t.ndarray_operator(augmented ? plain_form(op).fn : op.fn, args);
    }
    // In-place operators print as calls (`operator.iadd(x, 1)`): `x += 1` is not an expression.
    const std::string infix = op.infix;
    const bool inplace = !infix.empty() && infix.back() == '=' && infix != "==" &&
                         infix != "<=" && infix != ">=" && infix != "!=";
    if (inplace && !args[0]->is_tensor()) {
      // `n = 0; n += t`: a number has no in-place form, so Python computes `n = n + t`. Recorded
      // as the plain operator (the graph's code would otherwise read `0 += t`).
      const OperatorInfo& plain = plain_form(op);
      return t.record_call(NodeKind::kCallFunction, PyRefs::get().operator_module.attr(plain.fn),
                           "", std::move(args), {}, plain.infix, plain.fn);
    }
    return t.record_call(NodeKind::kCallFunction, PyRefs::get().operator_module.attr(op.fn), "",
                         std::move(args), {}, inplace ? "" : op.infix, op.fn);
  }
  if (ValuePtr merged = merge_dicts(t, op, args)) return merged;
  if (!args.empty() && args[0]->kind == VKind::kList && op.fn[0] == 'i') {
    // In place on a list value: `l += [x]` must change that list (others may alias it), never
    // fold into a new one.
    if (ValuePtr joined = join_sequences(t, op, args)) return joined;
    if (ValuePtr repeated = repeat_sequence(t, op, args)) return repeated;
    FJ_UNSUPPORTED(kSideEffect, "operator.{} on {}", op.fn, args[0]->describe());
  }
  // `+` joining tuples and lists that hold traced values: tensors, and size expressions, which
  // stay symbolic in a tuple (x.shape[:-1] + (2, -1)). Anything else on sizes needs the numbers.
  const bool constant = args.size() == 2 && args[0]->is_constant_tree() && args[1]->is_constant_tree();
  if (!constant && !(args[0]->kind == VKind::kList && args[0]->holds_size_expr())) {
    if (ValuePtr joined = join_sequences(t, op, args)) return joined;
  }
  if (!constant) {
    if (ValuePtr repeated = repeat_sequence(t, op, args)) return repeated;
  }
  bool sizes = false;
  for (const auto& a : args) sizes = sizes || (a->is_sequence() && a->holds_size_expr());
  if (sizes && (std::string(op.fn) == "eq" || std::string(op.fn) == "ne") &&
      sized_tuples(args)) {
    // `x.size() != (bsz * heads, T, S)`, `list(x.size()) == [b, t, h]`: item by item as Python
    // compares tuples and lists, each pair decided (and guarded) on its own, up to the first
    // that differs.
    const std::vector<ValuePtr>& a = args[0]->items;
    const std::vector<ValuePtr>& b = args[1]->items;
    bool equal = a.size() == b.size();
    for (size_t i = 0; equal && i < a.size(); ++i) {
      ValuePtr same = apply(t, kCompareOps[Py_EQ], {a[i], b[i]});
      if (same->kind == VKind::kSymNum) same = t.sizes().decide(same);
      equal = PyObject_IsTrue(same->obj.ptr()) == 1;
    }
    return Value::constant(py::bool_(std::string(op.fn) == "eq" ? equal : !equal));
  }
  if (!constant && args.size() == 2 &&
      (args[0]->is_sequence() || args[1]->is_sequence())) {
    if (ValuePtr compared = compare_sequences(t, op, args)) return compared;
  }
  if (sizes) {
    for (auto& a : args) a = t.sizes().concretize(a);
  }
  bool symbolic = false;
  for (const auto& a : args) {
    if (a->kind == VKind::kSymNum) {
      symbolic = true;
      continue;
    }
    if (!foldable(a)) {
      FJ_UNSUPPORTED(kUnsupportedValue, "operator.{} on {}", op.fn, a->describe());
    }
  }
  if (symbolic) {
    // Arithmetic on numbers known only at run time: recorded, computed again at each exit.
    for (const auto& a : args) {
      if (a->kind != VKind::kSymNum && !PyNumber_Check(a->obj.ptr())) {
        FJ_UNSUPPORTED(kUnsupportedValue, "operator.{} on {}", op.fn, a->describe());
      }
    }
    py::object fn = PyRefs::get().operator_module.attr(op.fn);
    py::list values;
    for (const auto& a : args) values.append(a->obj);
    try {
      ValuePtr number = Value::sym_num(fn, args, fn(*py::tuple(values)));
      t.note_runtime_number(number);
      return number;
    } catch (const py::error_already_set& e) {
      FJ_PROGRAM_RAISED(kUnsupportedValue, "operator.{} raised at trace time: {}", op.fn, e.what());
    }
  }
  return fold(op.fn, args);
}

// `a <op> b` through the operands' Python classes (their `__add__` / `__radd__` / `__iadd__`):
// true when inlined (see Tracer::inline_operator).
bool python_class_operator(Tracer& t, const OperatorInfo& op, const ValuePtr& lhs, const ValuePtr& rhs) {
  if (lhs->kind != VKind::kObject && rhs->kind != VKind::kObject) return false;
  const OperatorInfo& plain = plain_form(op);
  std::string base = plain.fn;
  if (base.back() == '_') base.pop_back();  // and_, or_
  const std::string name = "__" + base + "__";
  const std::string reflected = "__r" + base + "__";
  const std::string inplace = "__i" + base + "__";
  const bool is_inplace = &plain != &op;
  return t.inline_operator(lhs, rhs, {name.c_str(), reflected.c_str(), is_inplace ? inplace.c_str() : nullptr,
                                      op.infix, /*comparison=*/false});
}

void op_binary(Tracer& t, const Instr& i) {
  FJ_CHECK(i.arg >= 0 && i.arg < static_cast<int>(std::size(kBinaryOps)), "BINARY_OP {}", i.arg);
  ValuePtr rhs = t.pop();
  ValuePtr lhs = t.pop();
  if (python_class_operator(t, kBinaryOps[i.arg], lhs, rhs)) return;
  t.push(apply(t, kBinaryOps[i.arg], {lhs, rhs}));
}

bool same_object_guarded(Tracer& t, const ValuePtr& lhs, const ValuePtr& rhs);

// An object whose class compares as object does (Enum members, plain instances): `==` is `is`.
bool compares_by_identity(const ValuePtr& v) {
  return v->is(ObjRole::kPlain) && !v->bound_self &&
         Py_TYPE(v->obj.ptr())->tp_richcompare == PyBaseObject_Type.tp_richcompare;
}

// An instance of a subclass of str / int / float that compares as its base does (a `str, Enum`
// member, an IntEnum): immutable, so a comparison is decided by its value, which a source guards.
bool compares_as_builtin_value(const ValuePtr& v) {
  if (v->is_const()) return true;
  if (!v->is(ObjRole::kPlain) || v->bound_self) return false;
  PyObject* obj = v->obj.ptr();
  richcmpfunc cmp = Py_TYPE(obj)->tp_richcompare;
  if ((PyUnicode_Check(obj) && cmp == PyUnicode_Type.tp_richcompare) ||
      (PyLong_Check(obj) && cmp == PyLong_Type.tp_richcompare) ||
      (PyFloat_Check(obj) && cmp == PyFloat_Type.tp_richcompare)) {
    return true;
  }
  // sys.version_info (a structseq of numbers and a string), torch.__version__ (a TorchVersion:
  // a str whose comparisons parse versions, pure functions of its text): compared at trace
  // time, the object guarded equal to what it is now.
  if (PyTuple_Check(obj) && cmp == PyTuple_Type.tp_richcompare) {
    for (py::handle item : py::reinterpret_borrow<py::tuple>(obj)) {
      if (!PyLong_CheckExact(item.ptr()) && !PyUnicode_CheckExact(item.ptr())) return false;
    }
    return true;
  }
  return PyUnicode_Check(obj) && std::strcmp(Py_TYPE(obj)->tp_name, "TorchVersion") == 0 &&
         PyObject_IsInstance(obj, PyRefs::get().torch.attr("torch_version").attr("TorchVersion").ptr()) == 1;
}

bool op_compare_value(Tracer& t, const Instr& i);
bool same_identity(Tracer& t, const ValuePtr& lhs, const ValuePtr& rhs);

void op_compare(Tracer& t, const Instr& i) {
  const bool inlined = op_compare_value(t, i);
  if (!pyver::compare_to_bool(i.arg)) return;
  if (inlined) {
    t.frame().result_truth = 1;  // the answer's truth, on its return
    return;
  }
  t.push(t.as_bool_for_jump(t.pop(), i));
}

// Pushes the comparison's result; true instead when it inlined a class's method (its frame
// pushed, the result coming with its return).
bool op_compare_value(Tracer& t, const Instr& i) {
  const int index = pyver::compare_op(i.arg);
  FJ_CHECK(index >= 0 && index < 6, "COMPARE_OP {}", i.arg);
  ValuePtr rhs = t.pop();
  ValuePtr lhs = t.pop();
  if (lhs->is(ObjRole::kIdentity) && rhs->is(ObjRole::kIdentity) && (index == Py_EQ || index == Py_NE)) {
    // id(a) == id(b): `a is b`.
    const bool same = same_identity(t, lhs->bound_self, rhs->bound_self);
    t.push(Value::constant(py::bool_(index == Py_EQ ? same : !same)));
    return false;
  }
  const std::string fn = kCompareOps[index].fn;
  if ((!lhs->is_const() || !rhs->is_const()) && compares_as_builtin_value(lhs) &&
      compares_as_builtin_value(rhs)) {
    for (const ValuePtr& side : {lhs, rhs}) {
      if (!side->is_const() && side->source >= 0) t.entry().guard_const(side->source, side->obj.ptr());
    }
    // kCompareOps is in rich-comparison order: its index is the Py_LT .. Py_GE code.
    PyObject* result = PyObject_RichCompare(lhs->obj.ptr(), rhs->obj.ptr(), index);  // New
    if (result == nullptr) {
      PyErr_Clear();
      FJ_UNSUPPORTED(kUnsupportedValue, "operator.{} on {} and {}", fn, lhs->describe(), rhs->describe());
    }
    t.push(Value::constant(py::reinterpret_steal<py::object>(result)));
    return false;
  }
  if ((fn == "eq" || fn == "ne") && compares_by_identity(lhs) && compares_by_identity(rhs)) {
    const bool same = same_object_guarded(t, lhs, rhs);
    t.push(Value::constant(py::bool_(fn == "eq" ? same : !same)));
    return false;
  }
  if (lhs->kind == VKind::kObject || rhs->kind == VKind::kObject) {
    // The reflected comparison of kCompareOps[index]: < and >, <= and >= swap; == and != stay.
    static constexpr int kSwapped[] = {4, 5, 2, 3, 0, 1};
    const std::string name = "__" + fn + "__";
    const std::string reflected = std::string("__") + kCompareOps[kSwapped[index]].fn + "__";
    if (t.inline_operator(lhs, rhs, {name.c_str(), reflected.c_str(), nullptr, kCompareOps[index].infix,
                                     /*comparison=*/true})) {
      return true;
    }
  }
  t.push(apply(t, kCompareOps[index], {lhs, rhs}));
  return false;
}

void unary(Tracer& t, const char* fn, const char* infix) {
  ValuePtr v = t.pop();
  if (v->kind == VKind::kObject && t.inline_unary_operator(v, (std::string("__") + fn + "__").c_str())) return;
  t.push(apply(t, OperatorInfo{fn, infix}, {v}));
}

void op_negative(Tracer& t, const Instr&) { unary(t, "neg", "-"); }
void op_positive(Tracer& t, const Instr&) { unary(t, "pos", "+"); }

void op_invert(Tracer& t, const Instr&) { unary(t, "invert", "~"); }

void op_not(Tracer& t, const Instr&) {
  ValuePtr v = t.pop();
  if (t.inline_truth(v)) {  // its class's __bool__ / __len__, inlined: negated on its return
    t.frame().result_truth = 2;
    return;
  }
  t.push(Value::constant(py::bool_(!t.truthy(v))));
}

// A kObject whose `obj` is not the object itself but what it was made from (its class, code,
// function): see ObjRole.
bool made_in_trace(const ValuePtr& v) {
  return v->kind == VKind::kObject && (v->is_special_object() || v->bound_self);
}

// `a is b`: decided at trace time when both sides are known or of different kinds.
// `a is b` for two objects of the entry state, decided now and guarded: two sources found to be
// one object (or two) must be so on every call. Objects guarded by identity (modules, classes,
// functions) and constants need nothing more.
bool same_object_guarded(Tracer& t, const ValuePtr& lhs, const ValuePtr& rhs) {
  const bool same = lhs->obj.ptr() == rhs->obj.ptr();
  auto guarded_alone = [](const ValuePtr& v) {
    // (class data is read as it is now: its identity too)
    return v->kind == VKind::kConst || is_identity_object(v->obj.ptr()) || v->is_special_object() ||
           v->bound_self || (v->kind == VKind::kObject && v->frozen);
  };
  if (guarded_alone(lhs) || guarded_alone(rhs)) return same;
  if (lhs->source >= 0 && rhs->source >= 0) {
    if (lhs->source == rhs->source) return true;
    if (same) {
      t.entry().guard_same(lhs->source, rhs->source);
    } else {
      t.entry().guard_distinct(lhs->source, rhs->source);
    }
    return same;
  }
  const ValuePtr& sourced = lhs->source >= 0 ? lhs : rhs;
  if (sourced->source >= 0) {
    // The other is a fixed object (read through unguarded constants): the same one only if
    // this source gives it again.
    if (same) {
      t.entry().guard_id(sourced->source, sourced->obj.ptr());
      return true;
    }
    FJ_UNSUPPORTED(kUnsupportedValue, "'is' between {} and an object read without a guard",
                   sourced->describe());
  }
  return same;
}

bool is_singleton(PyObject* obj) {
  return obj == Py_None || PyBool_Check(obj) || obj == Py_Ellipsis || obj == Py_NotImplemented;
}

bool is_container(const ValuePtr& v) {
  return v->kind == VKind::kTuple || v->kind == VKind::kList || v->kind == VKind::kDict ||
         v->kind == VKind::kIter;
}

bool holds_items(const ValuePtr& v) {
  return v->kind == VKind::kTuple || v->kind == VKind::kList || v->kind == VKind::kDict;
}

// `container is other` for a tuple, list or dict value of the trace. Only an object of its type
// can be it; two read by source are as the guards keep them; a list or dict the trace made is a
// new object. A tuple the trace made may be one read by source (tuple(t) is t): not decided.
bool container_identity(Tracer& t, const ValuePtr& container, const ValuePtr& other) {
  auto of_its_type = [&](PyObject* obj) {
    return container->kind == VKind::kTuple ? PyTuple_Check(obj)
                                            : container->kind == VKind::kList ? PyList_Check(obj) : PyDict_Check(obj);
  };
  if (other->kind == VKind::kIter) {
    FJ_UNSUPPORTED(kUnsupportedValue, "'is' between {} and {}", container->describe(), other->describe());
  }
  if (other->is_tensor()) return false;
  if (holds_items(other) ? other->kind != container->kind : !of_its_type(other->obj.ptr())) return false;
  if (container->source >= 0 && other->source >= 0) {
    const bool same = t.entry().live_value(container->source) == t.entry().live_value(other->source);
    if (same) {
      t.entry().guard_same(container->source, other->source);
    } else {
      t.entry().guard_distinct(container->source, other->source);
    }
    return same;
  }
  // A list or dict the trace made is a new object (a frozen one is a copy of class data or of
  // a __dict__, whose object may be the other).
  auto new_object = [](const ValuePtr& v) {
    return holds_items(v) && v->source < 0 && v->kind != VKind::kTuple && !v->frozen;
  };
  if (new_object(container) || new_object(other)) return false;
  FJ_UNSUPPORTED(kUnsupportedValue, "'is' between {} and {}", container->describe(), other->describe());
}

// A constant, or an object that is no tensor (a singleton such as NotImplemented, a module).
bool not_a_tensor(const ValuePtr& v) {
  if (v->is_const()) return true;
  return v->kind == VKind::kObject && !v->is_special_object() && !v->bound_self &&
         !PyObject_TypeCheck(v->obj.ptr(), reinterpret_cast<PyTypeObject*>(PyRefs::get().tensor_type.ptr()));
}

// `lhs is rhs`, decided at trace time and guarded where it depends on the entry state.
bool same_identity(Tracer& t, const ValuePtr& lhs, const ValuePtr& rhs) {
  bool same;
  if (lhs == rhs) {
    same = true;
  } else if (made_in_trace(lhs) || made_in_trace(rhs)) {
    // An object the trace made (MyCls(), super(), a bound method, a lambda) is itself only:
    // two such values are two objects, and none is an object from before the region.
    same = false;
  } else if ((lhs->kind == VKind::kConst || lhs->kind == VKind::kObject) &&
             (rhs->kind == VKind::kConst || rhs->kind == VKind::kObject)) {
    same = same_object_guarded(t, lhs, rhs);
  } else if ((lhs->is_tensor() && not_a_tensor(rhs)) || (not_a_tensor(lhs) && rhs->is_tensor())) {
    same = false;  // a tensor is never a constant such as None, or NotImplemented, or a module
  } else if (lhs->is_tensor() && rhs->is_tensor() &&
             (lhs->node->kind != NodeKind::kPlaceholder || rhs->node->kind != NodeKind::kPlaceholder)) {
    // Two tensor values, one made by an op of the trace: a new object, never another value
    // (an in-place op gives back the very value it changed).
    same = false;
  } else if (lhs->is_tensor() && rhs->is_tensor() && lhs->source >= 0 && rhs->source >= 0) {
    // Two inputs: one object read twice is one value, so these are two objects, as long as
    // the guard keeps them apart.
    same = t.entry().live_value(lhs->source) == t.entry().live_value(rhs->source);
    if (same) {
      t.entry().guard_same(lhs->source, rhs->source);
    } else {
      t.entry().guard_distinct(lhs->source, rhs->source);
    }
  } else if ((lhs->is_const() && is_singleton(lhs->obj.ptr()) && is_container(rhs)) ||
             (rhs->is_const() && is_singleton(rhs->obj.ptr()) && is_container(lhs))) {
    same = false;  // `hidden_states is None` of a tuple: a tuple, list or dict is no None
  } else if ((lhs->is_const() && lhs->obj.ptr() != Py_True && lhs->obj.ptr() != Py_False &&
              is_singleton(lhs->obj.ptr()) && rhs->kind == VKind::kSymNum) ||
             (rhs->is_const() && rhs->obj.ptr() != Py_True && rhs->obj.ptr() != Py_False &&
              is_singleton(rhs->obj.ptr()) && lhs->kind == VKind::kSymNum)) {
    same = false;  // `scale is not None` of a number computed in the trace: no number is None
  } else if (holds_items(lhs) || holds_items(rhs)) {
    same = container_identity(t, holds_items(lhs) ? lhs : rhs, holds_items(lhs) ? rhs : lhs);
  } else {
    FJ_UNSUPPORTED(kUnsupportedValue, "'is' between {} and {}", lhs->describe(), rhs->describe());
  }
  return same;
}

void op_is(Tracer& t, const Instr& i) {
  ValuePtr rhs = t.pop();
  ValuePtr lhs = t.pop();
  const bool same = same_identity(t, lhs, rhs);
  t.push(Value::constant(py::bool_(i.arg ? !same : same)));
}

// The Python value of a constant tree, or of a value-like object (compares_as_builtin_value,
// guarded by value where read by source); false for anything else.
bool value_of(Tracer& t, const ValuePtr& v, py::object& out) {
  if (v->is_constant_tree()) {
    out = v->as_python();
    return true;
  }
  if (v->kind == VKind::kObject && compares_as_builtin_value(v)) {
    if (v->source >= 0) t.entry().guard_const(v->source, v->obj.ptr());
    out = v->obj;
    return true;
  }
  return false;
}

void op_contains(Tracer& t, const Instr& i) {
  ValuePtr container = t.pop();
  ValuePtr needle = t.pop();
  if (ValuePtr found = t.environ_lookup(container, needle, nullptr, true)) {  // key in os.environ
    t.push(Value::constant(py::bool_(found->obj.ptr() == Py_True ? !i.arg : i.arg)));
    return;
  }
  // A class with __contains__ in Python (a Mapping subclass: collections.abc's mixin): traced.
  static PyObject* const kContains = PyUnicode_InternFromString("__contains__");
  if (t.inline_special_method(container, kContains, {needle})) {
    t.frame().result_truth = i.arg ? 2 : 1;
    return;
  }
  if (container->is(ObjRole::kNewObject) && container->mapping) container = container->mapping;
  if (compares_by_identity(needle) && container->is_sequence()) {
    // `action in (Action.A, Action.B)` of objects that compare as object does: `is`, guarded.
    bool found = false;
    for (const ValuePtr& item : container->items) {
      if (item->kind != VKind::kObject && item->kind != VKind::kConst) {
        FJ_UNSUPPORTED(kUnsupportedValue, "'in' with {} on {}", needle->describe(), item->describe());
      }
      found = same_object_guarded(t, needle, item);
      if (found) break;
    }
    t.push(Value::constant(py::bool_(i.arg ? !found : found)));
    return;
  }
  py::object key;
  if (!value_of(t, needle, key) && !needle->as_key(key)) {  // (a class: `type(x) in registry`)
    FJ_UNSUPPORTED(kUnsupportedValue, "'in' with {}", needle->describe());
  }
  if (container->is_sequence() && !container->is_constant_tree()) {
    // `mode in (Mode.A, Mode.B)`: a tuple of value-like objects.
    py::list values;
    bool all = true;
    for (const ValuePtr& item : container->items) {
      py::object value;
      all = all && value_of(t, item, value);
      if (all) values.append(value);
    }
    if (all) container = Value::constant(py::tuple(values));
  }
  bool found = false;
  if (container->is(ObjRole::kDictView) && container->method == "keys") {
    container = container->over;  // `k in d.keys()` is `k in d`
  } else if (container->is(ObjRole::kDictView)) {
    container = Value::list(dict_view_items(*container));
  }
  if (container->kind == VKind::kDict) {
    for (const auto& k : container->keys) found = found || k.equal(key);
  } else if (container->is_constant_tree()) {
    found = PySequence_Contains(container->as_python().ptr(), key.ptr()) == 1;
  } else if (t.reads_as_dict(container, "__contains__")) {
    t.check_items_unchanged(container);
    found = PyDict_Contains(container->obj.ptr(), key.ptr()) == 1;
    t.entry().guard_dict_contains(container->source, key.ptr(), found);
  } else if (container->is(ObjRole::kPlain) && container->source >= 0 &&
             (PySet_CheckExact(container->obj.ptr()) || PyFrozenSet_CheckExact(container->obj.ptr())) &&
             PySet_GET_SIZE(container->obj.ptr()) <= 64) {
    // A set read by source (a module's or class's table of names): guarded equal to a copy of
    // what it holds now (the set itself would always equal itself), then asked.
    PyObject* set = container->obj.ptr();
    py::object now = PySet_CheckExact(set) ? py::reinterpret_steal<py::object>(PySet_New(set))
                                           : py::reinterpret_borrow<py::object>(set);
    if (!now) throw py::error_already_set();
    t.entry().guard_const(container->source, now.ptr());
    const int has = PySet_Contains(container->obj.ptr(), key.ptr());
    if (has < 0) {
      PyErr_Clear();
      FJ_UNSUPPORTED(kUnsupportedValue, "'in' on {} with {}", container->describe(), needle->describe());
    }
    found = has == 1;
  } else {
    FJ_UNSUPPORTED(kUnsupportedValue, "'in' on {}", container->describe());
  }
  t.push(Value::constant(py::bool_(i.arg ? !found : found)));
}

}  // namespace

void register_arith_ops(HandlerTable& table) {
  auto set = [&](Op op, OpHandler handler) { table[static_cast<size_t>(op)] = handler; };
  set(Op::BINARY_OP, op_binary);
  set(Op::COMPARE_OP, op_compare);
  set(Op::UNARY_NEGATIVE, op_negative);
  set(Op::UNARY_POSITIVE, op_positive);
  set(Op::UNARY_INVERT, op_invert);
  set(Op::UNARY_NOT, op_not);
  set(Op::IS_OP, op_is);
  set(Op::CONTAINS_OP, op_contains);
}

}  // namespace framejit
