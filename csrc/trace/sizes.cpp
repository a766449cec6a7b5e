// Symbolic sizes: a tensor size read by traced code (x.shape, x.size(d), len(x)) is a number
// the trace knows (its value now) that stays a graph value while it only flows into torch calls,
// directly or through arithmetic: `x.view(x.size(0), -1)` records `size = x.size(0)` and passes
// the node, so a new batch size runs the same graph. The moment Python needs the number itself
// (a branch, range(), a slice bound, an f-string, a container index), SizeTracker::specialize pins it
// and the input sizes it is computed from are guarded as they are (note_dim_read, size_deps.h).
//
// Only regions whose backend runs any size get symbolic sizes (CompileContext::any_sizes): for
// the others every size is guarded anyway, and constants make the simpler graph.
#include "trace/sizes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>

#include "common/check.h"
#include "trace/pyrefs.h"

namespace framejit {

namespace {

// Graph text for operator functions on sizes: `size // 4` rather than operator.floordiv(...).
// In-place forms (`n *= 2` on an int) are recorded as the plain operator: ints are immutable.
struct SizeOperator {
  const char* name;
  const char* infix;
};
constexpr SizeOperator kSizeOperators[] = {
    {"add", "+"}, {"sub", "-"},  {"mul", "*"}, {"floordiv", "//"}, {"truediv", "/"},
    {"mod", "%"}, {"pow", "**"}, {"neg", "-"}, {"pos", "+"},
};

const SizeOperator* size_operator(py::handle fn) {
  py::object module = py::getattr(fn, "__module__", py::none());
  if (module.is_none() || module.cast<std::string>() != "_operator") return nullptr;
  std::string name = py::getattr(fn, "__name__").cast<std::string>();
  for (const SizeOperator& op : kSizeOperators) {
    if (name == op.name || (name.size() > 1 && name[0] == 'i' && name.substr(1) == op.name)) {
      return &op;
    }
  }
  return nullptr;
}

TensorMeta number_meta(py::handle value) {
  TensorMeta meta;
  meta.scalar = true;
  meta.dtype = PyBool_Check(value.ptr())    ? "b8"
               : PyFloat_Check(value.ptr()) ? "f64"
               : PySlice_Check(value.ptr()) ? "slice"
                                            : "i64";
  return meta;
}

// The run-time leaves of a number: size leaves and numbers read from the entry state.
void collect_leaves(const ValuePtr& value, std::vector<ValuePtr>& out) {
  if (value->kind != VKind::kSymNum) return;
  if (!value->fn) {
    out.push_back(value);
    return;
  }
  for (const auto& item : value->items) collect_leaves(item, out);
}

// Binary search from `good`, where `holds` is true, towards `bad`, where it is false or which is
// out of range: the last value from good towards bad where it still holds. `holds` must change
// once between them (a monotone condition), so the answer is the edge of its range there.
template <typename Holds>
int64_t last_holding(int64_t good, int64_t bad, const Holds& holds) {
  while (good - bad > 1 || bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    (holds(mid) ? good : bad) = mid;
  }
  return good;
}

}  // namespace

SizeTracker::SizeTracker(EntryState& entry, GraphRecorder& recorder)
    : entry_(entry), recorder_(recorder) {}

ValuePtr SizeTracker::tensor_size(const ValuePtr& tensor, int64_t dim, const std::string& how) {
  py::object sizes = tensor->obj.attr("shape");
  const int64_t rank = static_cast<int64_t>(py::len(sizes));
  if (dim < 0) dim += rank;
  if (dim < 0 || dim >= rank) {
    FJ_UNSUPPORTED(kUnsupportedValue, "{}: dimension {} out of range for a tensor of rank {}",
                   how, dim, rank);
  }
  py::object value = sizes[py::int_(dim)];
  if (!symbolic_) {
    note_size_read(how);
    return Value::constant(value);
  }
  return size_leaf(tensor, dim, value);
}

ValuePtr SizeTracker::tensor_numel(const ValuePtr& tensor) {
  const int64_t rank = static_cast<int64_t>(py::len(tensor->obj.attr("shape")));
  if (!symbolic_) {
    note_sizes_read(tensor, "Tensor.numel()");
    return Value::constant(tensor->obj.attr("numel")());
  }
  py::object mul = PyRefs::get().operator_module.attr("mul");
  ValuePtr total = Value::constant(py::int_(1));
  for (int64_t d = 0; d < rank; ++d) {
    ValuePtr size = tensor_size(tensor, d, "Tensor.numel()");
    total = d == 0 ? size : Value::sym_num(mul, {total, size}, mul(total->obj, size->obj));
  }
  return total;
}

ValuePtr SizeTracker::size_leaf(const ValuePtr& tensor, int64_t dim, py::handle value) {
  auto key = std::make_pair(tensor->node, dim);
  auto found = size_leaves_.find(key);
  if (found != size_leaves_.end()) return found->second;
  ValuePtr leaf = Value::sym_num(py::object(), {}, py::reinterpret_borrow<py::object>(value));
  leaf->size_of = tensor;
  leaf->size_dim = static_cast<int>(dim);
  size_leaves_.emplace(key, leaf);
  return leaf;
}

ValuePtr SizeTracker::tensor_shape(const ValuePtr& tensor, const std::string& how) {
  py::object sizes = tensor->obj.attr("shape");
  if (!symbolic_) {
    note_size_read(how);
    return Value::constant(sizes);
  }
  const int64_t rank = static_cast<int64_t>(py::len(sizes));
  std::vector<ValuePtr> items;
  for (int64_t d = 0; d < rank; ++d) items.push_back(size_leaf(tensor, d, sizes[py::int_(d)]));
  return Value::tuple(std::move(items), PyRefs::get().size_type);
}

Node* SizeTracker::size_node(const ValuePtr& value) {
  FJ_CHECK(value->is_size_expr(), "size_node of {}", value->describe());
  auto found = size_nodes_.find(value.get());
  if (found != size_nodes_.end()) return found->second.second;
  PyRefs& refs = PyRefs::get();
  Node* node = nullptr;
  if (value->int_input) {
    node = scalar_input(value)->node;
  } else if (value->size_of) {
    NodeSpec spec;
    spec.kind = NodeKind::kCallMethod;
    spec.target = py::str("size");
    spec.target_text = "size";
    spec.args = {Arg::of(value->size_of->node), Arg::constant(py::int_(value->size_dim))};
    spec.fake = value->obj;
    spec.metas = {number_meta(value->obj)};
    spec.name_hint = "size";
    node = recorder_.add(std::move(spec));
  } else {
    std::vector<Arg> args;
    for (const auto& item : value->items) {
      args.push_back(item->kind == VKind::kSymNum ? Arg::of(size_node(item))
                                                  : Arg::constant(item->obj));
    }
    py::object target = value->fn;
    std::string infix;
    std::string hint;
    if (const SizeOperator* op = size_operator(value->fn)) {
      target = refs.operator_module.attr(op->name);
      infix = op->infix;
      hint = op->name;
    } else {
      hint = py::getattr(value->fn, "__name__", py::str("sym")).cast<std::string>();
    }
    NodeSpec spec;
    spec.target = target;
    spec.target_text = refs.target_text(target);
    spec.infix = infix;
    spec.args = std::move(args);
    spec.fake = value->obj;
    spec.metas = {number_meta(value->obj)};
    spec.name_hint = hint;
    node = recorder_.add(std::move(spec));
  }
  size_nodes_.emplace(value.get(), std::make_pair(value, node));
  return node;
}

ValuePtr SizeTracker::pin_steady_number(const ValuePtr& value) {
  if (pinned_numbers_ == nullptr) return nullptr;
  std::vector<ValuePtr> leaves;
  collect_leaves(value, leaves);
  std::vector<std::pair<std::string, py::object>> entry_numbers;
  for (const auto& leaf : leaves) {
    if (leaf->size_of) continue;  // pinned through its input's dims (specialize)
    // A float stays a run-time number: in the middle of a frame it is most often data (the
    // .item() a break stopped at), which would compile again on every call.
    if (leaf->source < 0 || !PyLong_CheckExact(leaf->obj.ptr())) return nullptr;
    const std::string& text = entry_.sources().at(leaf->source).text;
    if (pinned_numbers_->varying.count(text)) return nullptr;
    auto first = pinned_numbers_->first.find(text);
    if (first != pinned_numbers_->first.end()) {
      PyObject* before = first->second.ptr();
      const int same = Py_TYPE(before) == Py_TYPE(leaf->obj.ptr())
                           ? PyObject_RichCompareBool(before, leaf->obj.ptr(), Py_EQ)
                           : 0;
      if (same < 0) throw py::error_already_set();
      if (same == 0) {
        // Pinned by an earlier compile here to another value: the guard failed, and pinning
        // it again would compile once per value (a loop counter).
        pinned_numbers_->varying.insert(text);
        return nullptr;
      }
    }
    entry_numbers.emplace_back(text, leaf->obj);
  }
  for (auto& [text, number] : entry_numbers) pinned_numbers_->first.emplace(text, std::move(number));
  return specialize(value);
}

bool SizeTracker::holds_frame_int(const ValuePtr& value) const {
  if (value->kind != VKind::kSymNum) return false;
  std::vector<ValuePtr> leaves;
  collect_leaves(value, leaves);
  return std::any_of(leaves.begin(), leaves.end(), [this](const ValuePtr& leaf) {
    return leaf->int_input && leaf->source >= 0 && entry_.is_mid_frame_number(leaf->source);
  });
}

ValuePtr SizeTracker::concretize(const ValuePtr& value) {
  if (value->kind == VKind::kSymNum) {
    if (!value->is_size_expr() || holds_frame_int(value)) {
      ValuePtr pinned = pin_steady_number(value);
      return pinned ? pinned : value;
    }
    // A comparison's result used as a value (`a == b or ...` left on the stack): its truth,
    // guarded as decide() guards a branch on it.
    return PyBool_Check(value->obj.ptr()) ? decide(value) : specialize(value);
  }
  if (!value->holds_sym_num()) return value;
  ValuePtr copy = Value::map_items(value, [this](const ValuePtr& item) { return concretize(item); });
  if (copy->kind == VKind::kTuple && copy->is_constant_tree()) {
    return Value::constant(copy->as_python());  // torch.Size(...) again for a shape
  }
  return copy;
}

bool SizeTracker::is_symbolic_slice(const ValuePtr& value) {
  return value->kind == VKind::kSymNum && PySlice_Check(value->obj.ptr()) && value->is_size_expr();
}

ValuePtr SizeTracker::slice_of(std::vector<ValuePtr> parts) {
  bool symbolic = false;
  for (auto& part : parts) {
    if (symbolic_ && part->kind == VKind::kSymNum && part->is_size_expr() &&
        PyLong_CheckExact(part->obj.ptr())) {
      symbolic = true;
      continue;
    }
    part = concretize(part);
    // A number of the entry state (a local when a region starts mid-frame: `slen` after a
    // break): pinned to its value, as where a torch call takes it.
    if (part->kind == VKind::kSymNum && (PyLong_CheckExact(part->obj.ptr()) || part->obj.is_none())) {
      part = specialize(part);
    }
    if (!part->is_const()) {
      FJ_UNSUPPORTED(kUnsupportedValue, "slice bound {} not known at trace time", part->describe());
    }
  }
  py::object slice = py::reinterpret_steal<py::object>(PySlice_New(
      parts[0]->obj.ptr(), parts[1]->obj.ptr(), parts.size() == 3 ? parts[2]->obj.ptr() : nullptr));
  if (!slice) throw py::error_already_set();
  if (!symbolic) return Value::constant(slice);
  static PyObject* const kSlice = reinterpret_cast<PyObject*>(&PySlice_Type);
  return Value::sym_num(py::reinterpret_borrow<py::object>(kSlice), std::move(parts), slice);
}

void SizeTracker::note_slice_lengths(const ValuePtr& result, const ValuePtr& base, const ValuePtr& key) {
  if (!symbolic_ || result->kind != VKind::kTensor || base->kind != VKind::kTensor) return;
  const std::vector<ValuePtr> parts = key->kind == VKind::kTuple ? key->items : std::vector<ValuePtr>{key};
  if (std::none_of(parts.begin(), parts.end(), is_symbolic_slice)) return;
  py::object le = PyRefs::get().operator_module.attr("le");
  for (FixedSlice& fixed : fixed_length_slices(result->node)) {
    ValuePtr slice;
    for (const ValuePtr& part : parts) {
      if (is_symbolic_slice(part) && size_node(part) == fixed.slice) slice = part;
    }
    FJ_CHECK(slice != nullptr, "no slice of the key makes node {}", fixed.slice->name);
    SliceBounds bounds{slice->items[0], slice->items[1],
                       tensor_size(base, fixed.in_dim, "the size a slice is taken from")};
    // A start that wrapped around from the end, bounds crossed, a stop past the end: no length
    // is assumed.
    bool hold = true;
    for (const auto& [lhs, rhs] : bounds.conditions()) hold = hold && le(lhs->obj, rhs->obj).cast<bool>();
    if (!hold) continue;
    const std::pair<Node*, int> at{result->node, fixed.out_dim};
    facts_.lengths[at] = std::move(fixed.length);
    unguarded_lengths_[at] = std::move(bounds);
    exact_.erase(at);
  }
}

std::vector<std::pair<ValuePtr, ValuePtr>> SizeTracker::SliceBounds::conditions() const {
  const ValuePtr zero = Value::constant(py::int_(0));
  std::vector<std::pair<ValuePtr, ValuePtr>> out;  // lhs <= rhs
  if (start->obj.is_none()) {
    out.emplace_back(zero, stop);  // [:stop]: a negative stop counts from the end
  } else {
    out.emplace_back(zero, start);
    out.emplace_back(start, stop);  // crossed bounds give nothing, not a negative length
  }
  out.emplace_back(stop, size);
  return out;
}

void SizeTracker::guard_used_lengths() {
  for (bool again = true; again;) {
    again = false;
    for (const auto& at : facts_.used) {
      auto found = unguarded_lengths_.find(at);
      if (found == unguarded_lengths_.end()) continue;
      SliceBounds bounds = std::move(found->second);
      unguarded_lengths_.erase(found);  // first: guarding it walks again
      // A position into a table (`freqs[pos : pos + T]`): the table's size pinned, so the bound
      // is a range of the position (`pos <= 127`), or with a size beside it a linear relation
      // (`pos + T <= 128`) that pins neither.
      std::vector<ValuePtr> leaves;
      collect_leaves(bounds.start, leaves);
      collect_leaves(bounds.stop, leaves);
      if (std::any_of(leaves.begin(), leaves.end(), [](const ValuePtr& leaf) { return leaf->int_input; })) {
        bounds.size = specialize(bounds.size);
      }
      // 0 <= start <= stop <= size, true now: guarded as decide() guards a branch.
      py::object le = PyRefs::get().operator_module.attr("le");
      for (const auto& [lhs, rhs] : bounds.conditions()) {
        if (lhs->kind == VKind::kSymNum || rhs->kind == VKind::kSymNum) {
          decide(Value::sym_num(le, {lhs, rhs}, py::bool_(true)));
        }
      }
      again = true;
      break;  // facts_.used may have grown
    }
  }
}

void SizeTracker::note_dim_read(const ValuePtr& tensor, int dim, const std::string& what) {
  SizeDeps deps;
  add_size_deps(tensor->node, dim, facts_, ranks_, deps);
  note_size_deps(deps, what);
  guard_used_lengths();
}

void SizeTracker::note_split_count(Node* split, const std::string& what) {
  SizeDeps deps;
  std::set<std::pair<Node*, int>> not_one;
  add_split_count_deps(split, facts_, ranks_, exact_, module_state_, deps, not_one);
  guard_used_lengths();
  for (const auto& [node, dim] : not_one) {
    const int slot = entry_.slot_of_placeholder(node);
    if (slot < 0) {
      deps.all = true;  // a condition no guard can check: every size pinned
      continue;
    }
    guard_range({slot, dim}, SizeRelation::kNe, 1, what);
  }
  note_size_deps(deps, what);
}

void SizeTracker::note_size_deps(SizeDeps& deps, const std::string& what) {
  // A run-time float in a shape (F.interpolate(x, scale_factor=s)): its value is pinned too.
  for (Node* number : deps.numbers) {
    bool found = false;
    for (const auto& [key, entry] : scalar_inputs_) {
      if (entry.second->node != number) continue;
      specialize(entry.first);
      found = true;
      break;
    }
    if (!found) deps.all = true;
  }
  for (const auto& [node, dim] : deps.dims) {
    const int slot = entry_.slot_of_placeholder(node);
    if (slot < 0) {
      deps.all = true;
      break;
    }
    if (pinned_dims_[slot].insert(dim).second) {
      dim_reads_.push_back(fmt::format("{}.size({}): {} at {}", entry_.sources().at(slot).text,
                                       dim, what, recorder_.site().here()));
    }
  }
  if (deps.all) note_size_read(what + " at " + recorder_.site().here());
}

void SizeTracker::pin_sizes_of(const ValuePtr& tensor, const std::string& why) {
  for (auto it = size_leaves_.begin(); it != size_leaves_.end();) {
    if (it->first.first != tensor->node) {
      ++it;
      continue;
    }
    // Every expression holding the leaf sees it turn into its trace-time constant.
    Value& leaf = *it->second;
    note_dim_read(tensor, leaf.size_dim, why);
    leaf.kind = VKind::kConst;
    leaf.size_of.reset();
    leaf.size_dim = -1;
    it = size_leaves_.erase(it);
  }
  // Sizes read from it from now on are not those of the node that made it.
  facts_.reshaped.insert(tensor->node);
  exact_.clear();
}

void SizeTracker::make_constant_args(std::vector<ValuePtr>& args, KwValues& kwargs) {
  std::function<ValuePtr(const ValuePtr&)> pin = [&](const ValuePtr& v) -> ValuePtr {
    return v->kind == VKind::kSymNum ? specialize(v) : Value::map_items(v, pin);
  };
  for (auto& a : args) a = pin(a);
  for (auto& kw : kwargs) kw.second = pin(kw.second);
}

void SizeTracker::note_sizes_read(const ValuePtr& tensor, const std::string& what) {
  if (symbolic_) {
    note_dim_read(tensor, -1, what);
  } else {
    note_size_read(what);
  }
}

ValuePtr SizeTracker::specialize(const ValuePtr& value) {
  if (value->kind != VKind::kSymNum) return value;
  std::vector<ValuePtr> leaves;
  collect_leaves(value, leaves);
  for (const auto& leaf : leaves) {
    if (leaf->size_of) {
      note_dim_read(leaf->size_of, leaf->size_dim, "a size used as a Python value");
    } else {
      entry_.guard_const(leaf->source, leaf->obj.ptr());
      pinned_sources_.insert(leaf->source);
    }
  }
  return Value::constant(value->obj);
}

ValuePtr SizeTracker::pinned_already(const ValuePtr& value) {
  std::vector<ValuePtr> leaves;
  collect_leaves(value, leaves);
  for (const auto& leaf : leaves) {
    if (leaf->size_of || !pinned_sources_.count(leaf->source)) return nullptr;
  }
  return Value::constant(value->obj);
}

std::optional<LinearSize> SizeTracker::exact_size_of(const ValuePtr& value, SizeAtoms* atoms) {
  Node* node = value->size_of ? value->size_of->node : nullptr;
  if (node == nullptr) return std::nullopt;
  ExactMemo own;  // atom mode's results differ: a memo of their own
  std::optional<LinearSize> exact = exact_size(node, value->size_dim, facts_, ranks_,
                                               atoms ? own : exact_, module_state_, atoms);
  guard_used_lengths();
  return exact;
}

bool SizeTracker::is_module_state(Node* node) const {
  const int slot = entry_.slot_of_placeholder(node);
  if (slot < 0 || facts_.reshaped.count(node)) return false;
  static PyObject* const kParameter =
      py::object(py::module_::import("torch.nn").attr("Parameter")).release().ptr();  // kept
  PyObject* live = entry_.live_value(slot);
  if (live != nullptr && PyObject_TypeCheck(live, reinterpret_cast<PyTypeObject*>(kParameter))) {
    return true;
  }
  // module._buffers[name]
  const Source& source = entry_.sources().at(slot);
  if (source.kind != SourceKind::kItem || source.base < 0) return false;
  const Source& dict = entry_.sources().at(source.base);
  return dict.kind == SourceKind::kAttr && dict.key && PyUnicode_Check(dict.key.ptr()) &&
         PyUnicode_CompareWithASCIIString(dict.key.ptr(), "_buffers") == 0;
}

std::pair<int, int> SizeTracker::input_size_of(const ValuePtr& value) const {
  if (value->kind != VKind::kSymNum || !value->size_of) return {-1, -1};
  Node* node = value->size_of->node;
  const int slot = node ? entry_.slot_of_placeholder(node) : -1;
  if (slot < 0 || facts_.reshaped.count(node)) return {-1, -1};
  return {slot, value->size_dim};
}

namespace {

// total += scale * n; false on overflow.
bool scaled_add(int64_t& total, int64_t scale, int64_t n) {
  int64_t product = 0;
  return !__builtin_mul_overflow(scale, n, &product) && !__builtin_add_overflow(total, product, &total);
}

}  // namespace

bool SizeTracker::linear_form(const ValuePtr& v, int64_t scale, SizeForm& form, SizeAtoms* atoms) {
  auto add_term = [&form](const void* key, int dim, int64_t factor, int slot) {
    FormTerm& term = form.terms[{key, dim}];
    term.factor += factor;
    term.slot = slot;
    term.dim = dim;
  };
  if (v->is_const() && PyLong_CheckExact(v->obj.ptr())) {
    int overflow = 0;
    const int64_t n = PyLong_AsLongLongAndOverflow(v->obj.ptr(), &overflow);
    if (overflow != 0 || n > (int64_t{1} << 40) || n < -(int64_t{1} << 40)) return false;
    return scaled_add(form.offset, scale, n);
  }
  if (v->kind != VKind::kSymNum) return false;
  if (v->size_of) {  // size d of a tensor (an input's, or one the graph makes)
    std::optional<LinearSize> exact = exact_size_of(v, atoms);
    if (!exact) {
      add_term(v->size_of.get(), v->size_dim, scale, -1);
      return true;
    }
    for (const auto& [key, factor] : exact->terms) {
      int64_t scaled = 0;
      if (__builtin_mul_overflow(scale, factor, &scaled)) return false;
      add_term(key.first, key.second, scaled, entry_.slot_of_placeholder(key.first));
    }
    for (const auto& key : exact->not_one) form.not_one.insert(key);
    form.pinned.dims.insert(exact->pinned.begin(), exact->pinned.end());
    return scaled_add(form.offset, scale, exact->offset);
  }
  if (v->int_input) {
    FormTerm& term = form.terms[{v.get(), -1}];
    term.factor += scale;
    term.slot = v->source;
    term.int_input = true;
    return true;
  }
  if (!v->fn) return false;
  const std::string op = py::str(v->fn.attr("__name__")).cast<std::string>();
  if ((op == "add" || op == "sub") && v->items.size() == 2) {
    return linear_form(v->items[0], scale, form, atoms) &&
           linear_form(v->items[1], op == "add" ? scale : -scale, form, atoms);
  }
  if (op == "mul" && v->items.size() == 2) {  // bsz * num_heads: a size times an int
    for (int side = 0; side < 2; ++side) {
      const ValuePtr& factor = v->items[side];
      if (!factor->is_const() || !PyLong_CheckExact(factor->obj.ptr())) continue;
      int overflow = 0;
      const int64_t n = PyLong_AsLongLongAndOverflow(factor->obj.ptr(), &overflow);
      int64_t scaled = 0;
      if (overflow != 0 || __builtin_mul_overflow(scale, n, &scaled) || scaled > (int64_t{1} << 40) ||
          scaled < -(int64_t{1} << 40)) {
        return false;
      }
      return linear_form(v->items[1 - side], scaled, form, atoms);
    }
    return false;
  }
  if (op == "neg" && v->items.size() == 1) return linear_form(v->items[0], -scale, form, atoms);
  if (op == "pos" && v->items.size() == 1) return linear_form(v->items[0], scale, form, atoms);
  return false;
}

ValuePtr SizeTracker::decide(const ValuePtr& value) {
  if (value->kind != VKind::kSymNum || !value->fn || value->items.size() != 2 ||
      !PyBool_Check(value->obj.ptr())) {
    return specialize(value);
  }
  static const std::vector<std::string> kOps = {"lt", "le", "gt", "ge", "eq", "ne"};
  const std::string name = py::str(value->fn.attr("__name__")).cast<std::string>();
  auto op_at = std::find(kOps.begin(), kOps.end(), name);
  if (op_at == kOps.end()) return specialize(value);
  // The relation that holds: the operator, or its negation where the answer was False.
  auto rel = static_cast<SizeRelation>(op_at - kOps.begin());
  if (value->obj.ptr() != Py_True) rel = negated(rel);
  if (ValuePtr decided = decide_empty(value, rel)) return decided;
  // Both sides as sums of inputs' sizes times ints plus an int (`kv_length == q_length` with
  // kv_length = q_length + past): their difference decides what to guard (linear_form).
  SizeForm form;
  auto& terms = form.terms;
  auto& not_one = form.not_one;
  auto& pinned = form.pinned;
  auto& offset = form.offset;
  using Term = FormTerm;
  const bool linear = linear_form(value->items[0], 1, form, nullptr) &&
                      linear_form(value->items[1], -1, form, nullptr);
  // A size no exact sum gives (slot -1, not an int input): perhaps one of SizeAtoms.
  const bool opaque = std::any_of(terms.begin(), terms.end(), [](const auto& entry) {
    return entry.second.factor != 0 && entry.second.slot < 0 && !entry.second.int_input;
  });
  if (linear) {
    // A module's parameter or buffer size against an input's (`max_pos > self.weights.size(0)`):
    // the module's is pinned, the input's gets a range.
    std::vector<std::pair<Node*, Term*>> state;  // (placeholder, term) of module state
    bool others = false;
    for (auto& [key, term] : terms) {
      if (term.factor == 0) continue;
      Node* node = static_cast<Node*>(const_cast<void*>(key.first));  // a node where slot >= 0
      if (term.slot >= 0 && !term.int_input && is_module_state(node)) {
        state.emplace_back(node, &term);
      } else {
        others = true;
      }
    }
    for (const auto& [node, term] : others ? state : decltype(state)()) {
      offset += term->factor * node->metas[0].sizes[term->dim];
      pinned.dims.emplace(node, term->dim);
      term->factor = 0;
    }
    if (!pinned.dims.empty()) note_size_deps(pinned, "a module's parameter or buffer size in a sum or product of sizes");
    // An input size pinned already is the constant its guard keeps.
    for (auto& [key, term] : terms) {
      if (term.factor == 0 || term.slot < 0 || term.int_input) continue;
      auto pinned_here = pinned_dims_.find(term.slot);
      if (pinned_here == pinned_dims_.end() || !pinned_here->second.count(term.dim)) continue;
      const Node* node = static_cast<const Node*>(key.first);
      offset += term.factor * node->metas[0].sizes[term.dim];
      term.factor = 0;
    }
    std::vector<std::pair<std::pair<int, int>, int64_t>> left;  // (input slot, dim), factor
    bool inputs = true;
    int int_inputs = 0;
    for (const auto& [key, term] : terms) {
      if (term.factor == 0) continue;
      left.emplace_back(std::make_pair(term.slot, term.dim), term.factor);
      inputs = inputs && term.slot >= 0;
      int_inputs += term.int_input ? 1 : 0;
    }
    // The exact sizes used hold while these input sizes are not 1: guarded wherever the answer
    // below relies on them; one that cannot be guarded leaves the comparison to the end.
    bool conditions = true;
    for (const auto& [node, dim] : not_one) conditions = conditions && entry_.slot_of_placeholder(node) >= 0;
    auto guard_conditions = [&] {
      for (const auto& [node, dim] : not_one) {
        size_range(value, {entry_.slot_of_placeholder(node), dim}, SizeRelation::kNe, 1);
      }
    };
    // Several int inputs and input sizes with any factors (`cumulative_length + q_length >=
    // window`): guarded as that linear relation.
    auto linear_relation = [&] {
      guard_conditions();
      std::vector<Guard::Term> sum;
      for (const auto& [size, factor] : left) sum.push_back(Guard::Term{size.first, size.second, factor});
      guard_linear(std::move(sum), offset, rel, 0, 0);
      return Value::constant(value->obj);
    };
    if (int_inputs > 0) {
      // An int input against a constant (`step < warmup`, `n - 1 > 0`): guarded as that range
      // of it; with sizes or other int inputs, as a linear relation.
      if (left.size() == 1 && (left[0].second == 1 || left[0].second == -1) && not_one.empty()) {
        const SizeRelation r = left[0].second == 1 ? rel : flipped(rel);
        const int64_t c = left[0].second == 1 ? -offset : offset;
        const int slot = left[0].first.first;
        if (r == SizeRelation::kEq) return specialize(value);
        if (int_ranges_.insert({slot, static_cast<int>(r), c}).second) {
          entry_.guard_int_relation(slot, r, c);
          dim_reads_.push_back(fmt::format("{} {} {}: a comparison at {}", entry_.sources().at(slot).text,
                                           relation_text(r), c, recorder_.site().here()));
        }
        return Value::constant(value->obj);
      }
      if (left.size() >= 2 && inputs && conditions) return linear_relation();
      return specialize(value);
    }
    // The same sizes on both sides cancel: true or false whatever the sizes (`q + 0 == q`).
    if (conditions && left.empty()) {
      guard_conditions();
      return Value::constant(value->obj);
    }
    if (!inputs || !conditions) left.clear();
    if (left.size() == 2 && offset == 0 && left[0].second + left[1].second == 0 &&
        (left[0].second == 1 || left[0].second == -1)) {
      auto lhs = left[0].first, rhs = left[1].first;
      if (left[0].second == -1) std::swap(lhs, rhs);
      guard_conditions();
      entry_.guard_size_relation(lhs.first, lhs.second, rel, rhs.first, rhs.second);
      dim_reads_.push_back(fmt::format("{}.size({}) {} {}.size({}): a comparison at {}",
                                       entry_.sources().at(lhs.first).text, lhs.second,
                                       relation_text(rel), entry_.sources().at(rhs.first).text,
                                       rhs.second, recorder_.site().here()));
      return Value::constant(value->obj);
    }
    if (left.size() == 1 && (left[0].second == 1 || left[0].second == -1) && rel != SizeRelation::kEq) {
      // s + offset REL 0, or -s + offset REL 0 (offset REL s): a range of s.
      const auto size = left[0].first;
      const SizeRelation r = left[0].second == 1 ? rel : flipped(rel);
      const int64_t c = left[0].second == 1 ? -offset : offset;
      guard_conditions();
      return size_range(value, size, r, c);
    }
    if (left.size() >= 2) return linear_relation();  // (inputs' sizes only: see above)
  }
  if (!linear) {
    if (ValuePtr decided = decide_modulo(value, rel)) return decided;
  }
  if ((linear && opaque) || !linear) {
    if (ValuePtr decided = decide_by_atoms(value, rel)) return decided;
  }
  // (Two inputs' sizes compared are a linear form above: guarded there as their relation.)
  const auto lhs = input_size_of(value->items[0]);
  const auto rhs = input_size_of(value->items[1]);
  // An input's size against a constant int (turned around to `size REL c`).
  auto size = lhs;
  ValuePtr bound = value->items[1];
  if (size.first < 0) {
    size = rhs;
    bound = value->items[0];
    rel = flipped(rel);
  }
  if (size.first < 0 || !bound->is_const() || !PyLong_CheckExact(bound->obj.ptr())) {
    return specialize(value);
  }
  int overflow = 0;
  const int64_t c = PyLong_AsLongLongAndOverflow(bound->obj.ptr(), &overflow);
  if (overflow != 0 || c <= INT64_MIN + 1 || c >= INT64_MAX - 1) return specialize(value);
  if (rel == SizeRelation::kEq) return specialize(value);  // one size: pinned
  return size_range(value, size, rel, c);
}

ValuePtr SizeTracker::decide_modulo(const ValuePtr& value, SizeRelation rel) {
  auto as_int = [](const ValuePtr& v, int64_t& out) {
    if (!v->is_const() || !PyLong_CheckExact(v->obj.ptr())) return false;
    int overflow = 0;
    out = PyLong_AsLongLongAndOverflow(v->obj.ptr(), &overflow);
    return overflow == 0 && out < (int64_t{1} << 40) && out > -(int64_t{1} << 40);
  };
  int side = -1;
  int64_t modulus = 0, remainder = 0;
  for (int i = 0; i < 2 && side < 0; ++i) {
    const ValuePtr& v = value->items[i];
    if (v->kind != VKind::kSymNum || !v->fn || v->items.size() != 2 ||
        py::str(v->fn.attr("__name__")).cast<std::string>() != "mod") {
      continue;
    }
    if (as_int(v->items[1], modulus) && modulus > 0 && as_int(value->items[1 - i], remainder)) side = i;
  }
  if (side < 0) return nullptr;
  SizeForm form;
  if (!linear_form(value->items[side]->items[0], 1, form, nullptr)) return nullptr;
  std::vector<Guard::Term> sum;
  // The guard adds factor * value to the offset term by term and fails on an int64 overflow:
  // it must not overflow at the values traced (a huge int input), or it fails where it was made.
  int64_t total = form.offset;
  for (const auto& [key, term] : form.terms) {
    if (term.factor == 0) continue;
    if (term.slot < 0) return nullptr;  // a size no sum of input sizes gives
    int64_t now = 0;
    if (term.int_input) {
      int overflow = 0;
      now = PyLong_AsLongLongAndOverflow(static_cast<const Value*>(key.first)->obj.ptr(), &overflow);
      if (overflow != 0 || PyErr_Occurred()) {
        PyErr_Clear();
        return nullptr;
      }
    } else {
      now = static_cast<const Node*>(key.first)->metas[0].sizes[term.dim];
    }
    int64_t scaled = 0;
    if (__builtin_mul_overflow(now, term.factor, &scaled) || __builtin_add_overflow(total, scaled, &total) ||
        total > (int64_t{1} << 62) || total < -(int64_t{1} << 62)) {
      return nullptr;  // (the order differs from the guard's: a margin for it)
    }
    sum.push_back(Guard::Term{term.slot, term.dim, term.factor});
  }
  for (const auto& [node, dim] : form.not_one) {
    if (entry_.slot_of_placeholder(node) < 0) return nullptr;
  }
  if (sum.empty()) return nullptr;
  for (const auto& [node, dim] : form.not_one) {
    size_range(value, {entry_.slot_of_placeholder(node), dim}, SizeRelation::kNe, 1);
  }
  if (!form.pinned.dims.empty()) {
    note_size_deps(form.pinned, "a module's parameter or buffer size in a sum or product of sizes");
  }
  // (sum % modulus) REL remainder, the sum on the left
  guard_linear(std::move(sum), form.offset, side == 0 ? rel : flipped(rel), modulus, remainder);
  return Value::constant(value->obj);
}

void SizeTracker::guard_linear(std::vector<Guard::Term> sum, int64_t offset, SizeRelation rel,
                               int64_t modulus, int64_t remainder) {
  std::sort(sum.begin(), sum.end(), [](const Guard::Term& a, const Guard::Term& b) {
    return std::make_pair(a.slot, a.dim) < std::make_pair(b.slot, b.dim);  // (one order: one text)
  });
  dim_reads_.push_back(fmt::format("{}: a comparison at {}",
                                   linear_relation_text(sum, offset, rel, entry_.sources(), modulus, remainder),
                                   recorder_.site().here()));
  entry_.guard_linear_relation(std::move(sum), offset, rel, modulus, remainder);
}

ValuePtr SizeTracker::decide_by_atoms(const ValuePtr& value, SizeRelation rel) {
  SizeAtoms atoms;
  SizeForm form;
  const bool linear = linear_form(value->items[0], 1, form, &atoms) &&
                      linear_form(value->items[1], -1, form, &atoms);
  if (linear && atoms.empty()) return nullptr;
  using Key = std::pair<Node*, int>;
  // A size as factor * f(v) + offset, f a chain of atoms over one input size v (none: a
  // constant): stage i's atom takes a times the next stage's size (v for the last) plus b.
  struct Stage {
    const SizeAtom* atom;
    int64_t a, b;
  };
  struct Chain {
    std::vector<Stage> stages;
    int64_t factor = 0, offset = 0;
    Key variable{nullptr, -1};
    __int128 at(__int128 v) const {
      for (auto stage = stages.rbegin(); stage != stages.rend(); ++stage) {
        v = stage->atom->at(v * stage->a + stage->b);
      }
      return stages.empty() && variable.first == nullptr ? __int128{offset} : v * factor + offset;
    }
  };
  std::set<Key> conditions(form.not_one.begin(), form.not_one.end());  // sizes that must not be 1
  SizeDeps pinned = form.pinned;
  bool any_atom = false;
  // One term of a sum left, with module state and input sizes pinned already as constants
  // (into offset): false where more are left, or one that is no atom or input size.
  auto reduce = [&](const std::map<Key, int64_t>& terms, int64_t& offset, Key& key, int64_t& factor) {
    key = {nullptr, -1};
    factor = 0;
    for (const auto& [at, times] : terms) {
      const int slot = entry_.slot_of_placeholder(at.first);
      const bool state = slot >= 0 && is_module_state(at.first);
      if (state || (slot >= 0 && pinned_dims_.count(slot) && pinned_dims_.at(slot).count(at.second))) {
        int64_t term = 0;
        if (__builtin_mul_overflow(times, at.first->metas[0].sizes[at.second], &term) ||
            __builtin_add_overflow(offset, term, &offset)) {
          return false;
        }
        if (state) pinned.dims.insert(at);
        continue;
      }
      if ((slot < 0 && !atoms.count(at)) || key.first != nullptr) return false;
      key = at;
      factor = times;
    }
    return true;
  };
  auto chain_of = [&](const std::map<Key, int64_t>& terms, int64_t offset) -> std::optional<Chain> {
    Chain chain;
    Key key;
    int64_t factor = 0;
    if (!reduce(terms, offset, key, factor)) return std::nullopt;
    chain.factor = factor;
    chain.offset = offset;
    while (key.first != nullptr && entry_.slot_of_placeholder(key.first) < 0) {
      auto found = atoms.find(key);
      if (found == atoms.end() || chain.stages.size() > 64) return std::nullopt;
      const SizeAtom& atom = found->second;
      any_atom = true;
      conditions.insert(atom.in.not_one.begin(), atom.in.not_one.end());
      pinned.dims.insert(atom.in.pinned.begin(), atom.in.pinned.end());
      int64_t in_offset = atom.in.offset;
      if (!reduce(atom.in.terms, in_offset, key, factor)) return std::nullopt;
      chain.stages.push_back(Stage{&atom, factor, in_offset});
    }
    chain.variable = key;
    return chain;
  };
  if (!linear) {
    // A product of sizes (`x.numel() * 2 > 2 ** 31`, each size an input's, a sum of them or
    // a chain of atoms, none decreasing as its input size grows) against an int: the answer
    // holds on a box of input sizes, grown from these in proportion while it does.
    conditions.clear();
    pinned = SizeDeps();
    int64_t coeff = 1;
    std::vector<ValuePtr> factors;
    std::function<bool(const ValuePtr&)> collect = [&](const ValuePtr& v) {
      if (v->is_const() && PyLong_CheckExact(v->obj.ptr())) {
        int overflow = 0;
        const int64_t n = PyLong_AsLongLongAndOverflow(v->obj.ptr(), &overflow);
        return overflow == 0 && n > 0 && !__builtin_mul_overflow(coeff, n, &coeff) && coeff < (int64_t{1} << 40);
      }
      if (v->kind != VKind::kSymNum) return false;
      if (v->size_of) {
        factors.push_back(v);
        return true;
      }
      if (!v->fn || v->items.size() != 2 || py::str(v->fn.attr("__name__")).cast<std::string>() != "mul") {
        return false;
      }
      return collect(v->items[0]) && collect(v->items[1]);
    };
    int side = 0;
    if (!collect(value->items[0]) || factors.empty()) {  // (`12 <= a * b`: the product is right)
      side = 1;
      coeff = 1;
      factors.clear();
      if (!collect(value->items[1])) return nullptr;
    }
    const ValuePtr& other = value->items[1 - side];
    if (factors.size() < 2 || !other->is_const() || !PyLong_CheckExact(other->obj.ptr())) return nullptr;
    int overflow = 0;
    const int64_t bound = PyLong_AsLongLongAndOverflow(other->obj.ptr(), &overflow);
    if (overflow != 0 || PyErr_Occurred()) {
      PyErr_Clear();
      return nullptr;
    }
    const SizeRelation r = side == 0 ? rel : flipped(rel);  // product REL bound
    const bool upper = r == SizeRelation::kLt || r == SizeRelation::kLe;
    if (!upper && r != SizeRelation::kGt && r != SizeRelation::kGe) return nullptr;
    std::vector<Chain> chains;
    std::vector<Key> variables;
    std::vector<int> variable_of;  // per chain: its index in variables, -1 for a constant
    for (const ValuePtr& factor : factors) {
      std::optional<LinearSize> exact = exact_size_of(factor, &atoms);
      if (!exact) return nullptr;
      conditions.insert(exact->not_one.begin(), exact->not_one.end());
      pinned.dims.insert(exact->pinned.begin(), exact->pinned.end());
      std::optional<Chain> chain = chain_of(exact->terms, exact->offset);
      if (!chain) return nullptr;
      if (chain->variable.first != nullptr) {
        bool growing = chain->factor > 0;  // (each atom grows with its input)
        for (const Stage& stage : chain->stages) growing = growing == (stage.a > 0);
        if (!growing) return nullptr;
      }
      int index = -1;
      if (chain->variable.first != nullptr) {
        auto at = std::find(variables.begin(), variables.end(), chain->variable);
        index = static_cast<int>(at - variables.begin());
        if (at == variables.end()) variables.push_back(chain->variable);
      }
      variable_of.push_back(index);
      chains.push_back(std::move(*chain));
    }
    // Atoms that must not be 1 (a broadcast's): each keeps the sign of its size less 1 on a
    // range of its input size, guarded with the box.
    std::vector<std::pair<Key, std::pair<int64_t, int64_t>>> kept;
    std::set<Key> todo = conditions, done;  // (chain_of adds the conditions of what it reads)
    while (!todo.empty()) {
      const Key key = *todo.begin();
      todo.erase(todo.begin());
      if (!done.insert(key).second || entry_.slot_of_placeholder(key.first) >= 0) continue;
      const std::set<Key> before = conditions;
      std::optional<Chain> chain = chain_of({{key, 1}}, -1);
      for (const Key& added : conditions) {
        if (!before.count(added)) todo.insert(added);
      }
      if (!chain || chain->variable.first == nullptr) return nullptr;
      const Chain& c = *chain;
      const int64_t v = c.variable.first->metas[0].sizes[c.variable.second];
      auto sign_of = [&c](int64_t at) {
        const __int128 g = c.at(at);
        return g < 0 ? -1 : (g > 0 ? 1 : 0);
      };
      const int sign = sign_of(v);
      if (sign == 0) return nullptr;
      auto keeps_sign = [&](int64_t at) { return sign_of(at) == sign; };
      kept.push_back({c.variable, {last_holding(v, -1, keeps_sign),
                                   last_holding(v, (int64_t{1} << 40) + 1, keeps_sign)}});
    }
    if (variables.empty()) return nullptr;
    constexpr __int128 kHuge = __int128{1} << 100;
    // The product at sizes `at` of the variables, nullopt where a factor is negative there
    // (no tensor has such sizes: what such a box would admit is not known).
    auto product = [&](const std::vector<int64_t>& at) -> std::optional<__int128> {
      __int128 total = coeff;
      for (size_t i = 0; i < chains.size(); ++i) {
        const __int128 size = chains[i].at(variable_of[i] < 0 ? 0 : at[static_cast<size_t>(variable_of[i])]);
        if (size < 0) return std::nullopt;
        total = size != 0 && total > kHuge / size ? kHuge : total * size;
      }
      return total;
    };
    auto holds = [r, bound](__int128 p) {
      switch (r) {
        case SizeRelation::kLt: return p < bound;
        case SizeRelation::kLe: return p <= bound;
        case SizeRelation::kGt: return p > bound;
        default: return p >= bound;
      }
    };
    constexpr int64_t kLargest = int64_t{1} << 40;  // sizes searched: 0 .. kLargest
    std::vector<int64_t> now;
    for (const Key& key : variables) {
      now.push_back(key.first->metas[0].sizes[key.second]);
      if (now.back() > kLargest) return nullptr;
    }
    const int64_t traced = PyLong_AsLongLongAndOverflow(value->items[side]->obj.ptr(), &overflow);
    std::optional<__int128> at_now = product(now);
    if (overflow != 0 || !at_now || *at_now != traced || !holds(*at_now)) {
      PyErr_Clear();
      return nullptr;
    }
    // Box t: each size grown (or shrunk) by t plus t/8 of itself.
    auto box = [&](int64_t t) {
      std::vector<int64_t> at;
      for (int64_t v : now) {
        const __int128 step = __int128{t} + __int128{v} * t / 8;
        const __int128 edge = upper ? v + step : v - step;
        at.push_back(static_cast<int64_t>(edge > kLargest ? kLargest : (edge < 0 ? 0 : edge)));
      }
      return at;
    };
    auto fits = [&](int64_t t) {
      std::optional<__int128> p = product(box(t));
      return p && holds(*p);
    };
    if (!fits(0)) return nullptr;
    const std::vector<int64_t> edges = box(last_holding(0, kLargest + 1, fits));
    for (const Key& key : conditions) {
      if (entry_.slot_of_placeholder(key.first) < 0) continue;
      size_range(value, {entry_.slot_of_placeholder(key.first), key.second}, SizeRelation::kNe, 1);
    }
    if (!pinned.dims.empty()) note_size_deps(pinned, "a kernel's or module's size in a size Python compares");
    const std::string what = "a product of sizes compared (a box of them that keeps the answer)";
    for (const auto& [key, range] : kept) {
      const std::pair<int, int> size{entry_.slot_of_placeholder(key.first), key.second};
      if (range.first > 0) guard_range(size, SizeRelation::kGe, range.first, "a broadcast size that must not be 1");
      guard_range(size, SizeRelation::kLe, range.second, "a broadcast size that must not be 1");
    }
    for (size_t i = 0; i < variables.size(); ++i) {
      const std::pair<int, int> size{entry_.slot_of_placeholder(variables[i].first), variables[i].second};
      if (upper) {
        guard_range(size, SizeRelation::kLe, edges[i], what);
      } else if (edges[i] > 0) {
        guard_range(size, SizeRelation::kGe, edges[i], what);
      }
    }
    return Value::constant(value->obj);
  }
  std::map<Key, int64_t> difference;
  for (const auto& [at, term] : form.terms) {
    if (term.factor == 0) continue;
    if (term.int_input) return nullptr;
    difference[{static_cast<Node*>(const_cast<void*>(at.first)), at.second}] = term.factor;
  }
  std::optional<Chain> main = chain_of(difference, form.offset);
  if (!main || !any_atom) return nullptr;  // no atom in it: decide() said what it could
  // Each must keep the sign it has now: the difference, and each atom that must not be 1
  // (less 1: a stronger condition, but one whose sign is monotone too).
  std::vector<Chain> keep{*main};
  std::set<Key> done;
  while (!conditions.empty()) {
    const Key key = *conditions.begin();
    conditions.erase(conditions.begin());
    if (!done.insert(key).second) continue;
    const int slot = entry_.slot_of_placeholder(key.first);
    if (slot >= 0) {
      guard_range({slot, key.second}, SizeRelation::kNe, 1, "a size that broadcasts only while it is not 1");
      continue;
    }
    std::optional<Chain> chain = chain_of({{key, 1}}, -1);
    if (!chain) return nullptr;
    keep.push_back(*chain);
  }
  Key variable{nullptr, -1};
  for (const Chain& chain : keep) {
    if (chain.variable.first == nullptr) continue;
    if (variable.first != nullptr && variable != chain.variable) return nullptr;  // two sizes
    variable = chain.variable;
  }
  const int64_t now = variable.first != nullptr ? variable.first->metas[0].sizes[variable.second] : 0;
  // The answer must be the trace's (a rule misread gives up).
  int overflow_lhs = 0, overflow_rhs = 0;
  const int64_t lhs = PyLong_AsLongLongAndOverflow(value->items[0]->obj.ptr(), &overflow_lhs);
  const int64_t rhs = PyLong_AsLongLongAndOverflow(value->items[1]->obj.ptr(), &overflow_rhs);
  if (overflow_lhs != 0 || overflow_rhs != 0 || PyErr_Occurred()) {
    PyErr_Clear();
    return nullptr;
  }
  constexpr int64_t kLargest = int64_t{1} << 40;  // sizes searched: 0 .. kLargest
  if (now > kLargest || main->at(now) != __int128{lhs} - rhs) return nullptr;
  if (!pinned.dims.empty()) note_size_deps(pinned, "a kernel's or module's size in a size Python compares");
  if (variable.first == nullptr) return Value::constant(value->obj);  // the same for any input size
  // Each chain is monotone in v (every atom is, and a sum of one term). The difference keeps
  // its relation to 0 on one range of v (for !=, the range where it keeps its sign); each
  // condition keeps its sign; on the range where all do, the answer is the same.
  auto sign = [](__int128 g) { return g < 0 ? -1 : (g > 0 ? 1 : 0); };
  std::vector<int> signs;
  for (const Chain& chain : keep) signs.push_back(sign(chain.at(now)));
  auto holds = [rel](__int128 g) {
    switch (rel) {
      case SizeRelation::kLt: return g < 0;
      case SizeRelation::kLe: return g <= 0;
      case SizeRelation::kGt: return g > 0;
      case SizeRelation::kGe: return g >= 0;
      case SizeRelation::kEq: return g == 0;
      default: return false;  // kNe: by sign below
    }
  };
  auto same = [&](int64_t v) {
    for (size_t i = 0; i < keep.size(); ++i) {
      const __int128 g = keep[i].at(v);
      const bool kept = i == 0 && rel != SizeRelation::kNe ? holds(g) : sign(g) == signs[i];
      if (!kept) return false;
    }
    return true;
  };
  const int64_t low = last_holding(now, -1, same), high = last_holding(now, kLargest + 1, same);
  const std::pair<int, int> size{entry_.slot_of_placeholder(variable.first), variable.second};
  const std::string what = "a comparison of a size a convolution, pooling or slice made from it";
  if (low > 0) guard_range(size, SizeRelation::kGe, low, what);
  guard_range(size, SizeRelation::kLe, high, what);  // (kLargest too: nothing was searched above)
  return Value::constant(value->obj);
}

ValuePtr SizeTracker::decide_empty(const ValuePtr& value, SizeRelation rel) {
  // A product of sizes against 0, from either side: `x.numel() == 0` (DynamicLayer's
  // get_seq_length), `x.numel() > 0`.
  auto is_zero = [](const ValuePtr& v) {
    return v->is_const() && PyLong_CheckExact(v->obj.ptr()) && PyLong_AsLong(v->obj.ptr()) == 0;
  };
  ValuePtr product = value->items[0];
  if (is_zero(product)) {
    product = value->items[1];
    rel = flipped(rel);
  } else if (!is_zero(value->items[1])) {
    return nullptr;
  }
  std::vector<ValuePtr> factors;
  std::function<bool(const ValuePtr&)> collect = [&](const ValuePtr& v) {
    if (v->kind != VKind::kSymNum) return false;
    if (v->size_of) {
      factors.push_back(v);
      return true;
    }
    if (!v->fn || v->items.size() != 2) return false;
    if (py::str(v->fn.attr("__name__")).cast<std::string>() != "mul") return false;
    return collect(v->items[0]) && collect(v->items[1]);
  };
  if (!collect(product) || factors.size() < 2) return nullptr;  // one size: a range below
  // Not empty (product != 0, > 0): every size at least 1, each a range; empty: pinned.
  if (rel != SizeRelation::kNe && rel != SizeRelation::kGt) return nullptr;
  // A factor that is not an input's size but exactly a sum of them (a cache's keys: the cat of
  // the new keys onto an empty tensor) is at least 1 where its constant is, or else where each
  // size in it is (sizes never negative; factors all positive).
  std::vector<std::pair<int, int>> at_least_one;
  std::set<std::pair<int, int>> not_one;
  SizeDeps pinned;
  for (const ValuePtr& factor : factors) {
    if (const auto input = input_size_of(factor); input.first >= 0) {
      at_least_one.push_back(input);
      continue;
    }
    std::optional<LinearSize> exact = exact_size_of(factor);
    if (!exact) return nullptr;
    std::vector<std::pair<int, int>> sizes;
    for (const auto& [key, coefficient] : exact->terms) {
      const int slot = entry_.slot_of_placeholder(key.first);
      if (coefficient < 0 || slot < 0) return nullptr;
      sizes.emplace_back(slot, key.second);
    }
    for (const auto& [node, dim] : exact->not_one) {
      const int slot = entry_.slot_of_placeholder(node);
      if (slot < 0) return nullptr;
      not_one.emplace(slot, dim);
    }
    pinned.dims.insert(exact->pinned.begin(), exact->pinned.end());
    if (exact->offset >= 1) continue;
    if (exact->offset < 0 || sizes.empty()) return nullptr;
    at_least_one.insert(at_least_one.end(), sizes.begin(), sizes.end());
  }
  if (!pinned.dims.empty()) note_size_deps(pinned, "a module's parameter or buffer size in a product of sizes");
  for (const auto& size : not_one) guard_range(size, SizeRelation::kNe, 1, "a comparison");
  for (const auto& size : at_least_one) size_range(value, size, SizeRelation::kGe, 1);
  return Value::constant(value->obj);
}

ValuePtr SizeTracker::size_range(const ValuePtr& value, std::pair<int, int> size, SizeRelation rel,
                                 int64_t c) {
  guard_range(size, rel, c, "a comparison");
  return Value::constant(value->obj);
}

void SizeTracker::guard_range(std::pair<int, int> size, SizeRelation rel, int64_t c,
                              const std::string& what) {
  TensorSpec::DimRange range{size.second, INT64_MIN, INT64_MAX};
  switch (rel) {
    case SizeRelation::kLt: range.hi = c - 1; break;
    case SizeRelation::kLe: range.hi = c; break;
    case SizeRelation::kGt: range.lo = c + 1; break;
    case SizeRelation::kGe: range.lo = c; break;
    default:  // kNe: any size but c
      range.lo = range.hi = c;
      range.outside = true;
  }
  std::vector<TensorSpec::DimRange>& ranges = dim_ranges_[size.first];
  for (const TensorSpec::DimRange& known : ranges) {
    if (known.dim == range.dim && known.lo == range.lo && known.hi == range.hi &&
        known.outside == range.outside) {
      return;  // guarded already (each layer asks again)
    }
  }
  ranges.push_back(range);
  dim_reads_.push_back(fmt::format("{}.size({}) {} {}: {} at {}", entry_.sources().at(size.first).text,
                                   size.second, relation_text(rel), c, what, recorder_.site().here()));
}

ValuePtr SizeTracker::scalar_input(const ValuePtr& value) {
  auto found = scalar_inputs_.find(value.get());
  if (found != scalar_inputs_.end()) return found->second.second;
  // How to compute the number from the entry state, evaluated before each run of the graph.
  std::function<Rebuild(const ValuePtr&)> expr = [&](const ValuePtr& v) -> Rebuild {
    if (v->kind != VKind::kSymNum) return Rebuild::constant(v->obj);
    if (v->size_of) {  // a size mixed with run-time numbers: pinned
      note_dim_read(v->size_of, v->size_dim,
                    "a size in arithmetic with a number known only at run time");
      return Rebuild::constant(v->obj);
    }
    if (!v->fn) return Rebuild::slot(v->source);
    std::vector<Rebuild> args;
    for (const auto& item : v->items) args.push_back(expr(item));
    return Rebuild::call(v->fn, std::move(args));
  };
  TensorMeta meta;
  meta.scalar = true;
  meta.dtype = PyFloat_CheckExact(value->obj.ptr()) ? "f64" : "i64";
  const std::string hint = value->source >= 0 ? entry_.sources().at(value->source).name_hint : "scalar";
  Node* node = recorder_.placeholder(hint, value->obj, meta);
  entry_.add_input(expr(value));
  auto input = std::make_shared<Value>(*value);
  input->node = node;
  scalar_inputs_[value.get()] = std::make_pair(value, input);
  return input;
}

}  // namespace framejit
