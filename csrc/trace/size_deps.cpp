// The size dependency walk (see size_deps.h). Each rule below states how one family of ops
// computes the size of an output dimension from its arguments, and is used only when the
// trace-time sizes agree with it; anything else takes every size of every argument. Rules
// must never name fewer sizes than the op depends on: a missed one leaves a size unguarded
// that the trace assumed.
#include "trace/size_deps.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

bool is_tensor_node(const Node* node) {
  return node != nullptr && !node->tuple_result && node->metas.size() == 1 &&
         !node->metas[0].scalar;
}

int rank_of(const Node* node) { return static_cast<int>(node->metas[0].sizes.size()); }

int64_t size_at(const Node* node, int dim) { return node->metas[0].sizes[dim]; }

// The tensor node an argument is, or nullptr.
Node* tensor_arg(const Arg* arg) {
  return arg != nullptr && arg->kind == Arg::Kind::kNode && is_tensor_node(arg->node) ? arg->node
                                                                                      : nullptr;
}

// Positional argument `index`, else keyword `keyword`; nullptr if neither was passed.
const Arg* arg_at(const Node* node, size_t index, const char* keyword) {
  if (index < node->args.size()) return &node->args[index];
  for (const auto& [key, arg] : node->kwargs) {
    if (key == keyword) return &arg;
  }
  return nullptr;
}

std::optional<int64_t> const_int(const Arg* arg) {
  if (arg == nullptr || arg->kind != Arg::Kind::kConst) return std::nullopt;
  PyObject* value = arg->value.ptr();
  if (!PyLong_CheckExact(value)) return std::nullopt;
  const long long result = PyLong_AsLongLong(value);
  if (result == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return std::nullopt;
  }
  return result;
}

// A dimension argument normalised for a tensor of `rank` dims; `fallback` when not passed.
std::optional<int> dim_arg(const Arg* arg, int rank, int fallback) {
  if (arg == nullptr) return fallback;
  std::optional<int64_t> dim = const_int(arg);
  if (!dim) return std::nullopt;
  const int64_t normalised = *dim < 0 ? *dim + rank : *dim;
  if (normalised < 0 || normalised >= rank) return std::nullopt;
  return static_cast<int>(normalised);
}

// The elements of a sequence argument: an Arg tuple or list, or a constant tuple, list or
// torch.Size (its items as constant Args). False for anything else.
bool sequence_items(const Arg& arg, std::vector<Arg>& out) {
  if (arg.kind == Arg::Kind::kTuple || arg.kind == Arg::Kind::kList) {
    out = arg.items;
    return true;
  }
  if (arg.kind == Arg::Kind::kConst &&
      (PyTuple_Check(arg.value.ptr()) || PyList_Check(arg.value.ptr()))) {
    for (py::handle item : arg.value) {
      out.push_back(Arg::constant(py::reinterpret_borrow<py::object>(item)));
    }
    return true;
  }
  return false;
}

// The shape a view / reshape / expand / permute takes: one sequence argument after self, or
// the arguments after self themselves.
std::vector<Arg> shape_args(const Node* node) {
  std::vector<Arg> items;
  if (node->args.size() == 2 && sequence_items(node->args[1], items)) return items;
  items.assign(node->args.begin() + (node->args.empty() ? 0 : 1), node->args.end());
  return items;
}

// Ops whose result has the broadcast shape of their tensor arguments (most have one tensor
// argument and keep its shape): element-wise math, comparisons, casts, activations, dropout,
// normalisations and the *_like factories.
bool broadcasts(const std::string& text) {
  return base_name_in(
      text,
      {"add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "truediv",
       "floordiv", "floor_divide", "remainder", "mod", "fmod", "pow", "float_power", "neg",
       "negative", "pos", "positive", "abs", "absolute", "invert", "and_", "or_", "xor", "exp",
       "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "square", "sin", "cos",
       "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
       "sigmoid", "logit", "relu", "relu6", "gelu", "silu", "mish", "elu", "selu", "celu",
       "leaky_relu", "hardtanh", "hardswish", "hardsigmoid", "softplus", "softsign",
       "tanhshrink", "threshold", "clamp", "clip", "clamp_min", "clamp_max", "where",
       "masked_fill", "eq", "ne", "lt", "le", "gt", "ge", "greater", "less",
       "not_equal", "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and",
       "bitwise_or", "bitwise_xor", "bitwise_not", "maximum", "minimum", "fmax", "fmin", "lerp",
       "addcmul", "addcdiv", "sign", "sgn", "reciprocal", "erf", "erfc", "erfinv", "floor",
       "ceil", "round", "trunc", "frac", "nan_to_num", "isnan", "isinf", "isfinite", "float",
       "half", "bfloat16", "double", "int", "long", "short", "bool", "byte", "to", "type_as",
       "contiguous", "clone", "detach", "dropout", "dropout1d", "dropout2d", "dropout3d",
       "alpha_dropout", "feature_alpha_dropout", "softmax", "log_softmax", "softmin",
       "layer_norm", "group_norm", "batch_norm", "instance_norm", "rms_norm", "normalize",
       "cumsum", "cumprod", "triu", "tril", "zeros_like", "ones_like", "empty_like",
       "full_like", "rand_like", "randn_like"});
}

bool splits(const std::string& text) {
  return base_name_in(text, {"split", "chunk", "tensor_split", "split_with_sizes",
                             "unsafe_split", "unsafe_chunk"});
}

// The input dimensions squeeze(input, dim) / squeeze(input, (d0, d1)) names; nullopt for a
// squeeze of every size-1 dimension (which ones those are depends on the sizes).
std::optional<std::vector<int>> squeezed_dims(const Node* node) {
  if (!base_name_in(node->target_text, {"squeeze", "squeeze_copy"}) || node->args.empty()) {
    return std::nullopt;
  }
  Node* input = tensor_arg(&node->args[0]);
  const Arg* dims = arg_at(node, 1, "dim");
  if (!input || !dims) return std::nullopt;
  std::vector<Arg> items;
  if (!sequence_items(*dims, items)) items = {*dims};
  std::vector<int> out;
  for (const Arg& item : items) {
    std::optional<int> d = dim_arg(&item, std::max(rank_of(input), 1), -1);
    if (!d || *d < 0) return std::nullopt;
    out.push_back(*d);
  }
  return out;
}

// Whether squeeze(input, dims) removes the same dimensions for any input sizes: each named
// size depends on no input size. Its arguments' ranks are known fixed.
bool squeeze_is_fixed(Node* node, const NodeFacts& facts, RankMemo& ranks) {
  std::optional<std::vector<int>> dims = squeezed_dims(node);
  if (!dims || rank_of(node->args[0].node) == 0) return false;
  for (int d : *dims) {
    SizeDeps deps;
    add_size_deps(node->args[0].node, d, facts, ranks, deps);
    if (deps.all || !deps.dims.empty() || !deps.numbers.empty()) return false;
  }
  return true;
}

// Whether node's rank is the same for any sizes of the inputs: no squeeze() of a dimension
// whose size may be 1 or not, and no tensor reshaped in place among the nodes it is computed
// from. Memoised across walks; iterative, as chains can be thousands of nodes long.
bool rank_is_fixed(Node* node, const NodeFacts& facts, RankMemo& ranks) {
  std::vector<Node*> stack{node};
  while (!stack.empty()) {
    Node* top = stack.back();
    if (ranks.count(top)) {
      stack.pop_back();
      continue;
    }
    if (top->kind == NodeKind::kPlaceholder || base_name_in(top->target_text, {"squeeze_"})) {
      ranks[top] = top->kind == NodeKind::kPlaceholder;
      stack.pop_back();
      continue;
    }
    bool fixed = true;
    std::vector<Node*> pending;
    auto check = [&](Node* arg) {
      if (facts.reshaped.count(arg)) {
        fixed = false;
      } else if (auto found = ranks.find(arg); found != ranks.end()) {
        fixed = fixed && found->second;
      } else {
        pending.push_back(arg);
      }
    };
    for (const Arg& arg : top->args) arg.for_each_node(check);
    for (const auto& kw : top->kwargs) kw.second.for_each_node(check);
    if (fixed && !pending.empty()) {  // its arguments first
      stack.insert(stack.end(), pending.begin(), pending.end());
      continue;
    }
    if (fixed && base_name_in(top->target_text, {"squeeze", "squeeze_copy"})) {
      fixed = squeeze_is_fixed(top, facts, ranks);
    }
    ranks[top] = fixed;
    stack.pop_back();
  }
  return !facts.reshaped.count(node) && ranks[node];
}

// How an op's rule computes size `dim` of its result from its arguments. The dependency walk
// takes every size listed; the exact walk combines them as `how` says.
struct DimRule {
  enum class How {
    kFixed,      // depends on no size (a constant in a view, an unsqueezed or kept dim)
    kEqual,      // equals each listed size: the op maps one, or requires them equal (cat)
    kBroadcast,  // the broadcast of the listed sizes (each is the result's or 1)
    kSum,        // their sum (cat along its dimension)
    kNumber,     // the value of the listed number node (a size expression in a view)
    kDepends,    // computed from them, not as one of the above (a view's -1, a split piece)
  };
  How how = How::kFixed;
  std::vector<std::pair<Node*, int>> from;  // (tensor node, dim), or (number node, -1)
  // Sizes the rule holds for only while they keep their values (those a custom op's fake
  // implementation compared: probed_rule); whoever relies on the size pins them.
  std::vector<std::pair<Node*, int>> pins;
  // A view's / reshape's -1: the number of elements of this input over the other entries
  // (the dependency walk cancels an entry that is one of the input's own sizes).
  Node* rest_of = nullptr;
};

DimRule rule_of(DimRule::How how, std::vector<std::pair<Node*, int>> from = {}) {
  DimRule rule;
  rule.how = how;
  rule.from = std::move(from);
  return rule;
}

// Every size of every node argument: what an op without a rule depends on.
void all_argument_sizes(const Node* node, std::vector<std::pair<Node*, int>>& out) {
  auto each = [&out](Node* arg) { out.emplace_back(arg, -1); };
  for (const Arg& arg : node->args) arg.for_each_node(each);
  for (const auto& kw : node->kwargs) kw.second.for_each_node(each);
}

// What the number of tensors a split / chunk / unbind returns depends on; false if unknown.
bool split_count_from(const Node* split, std::vector<std::pair<Node*, int>>& out) {
  Node* input = split->args.empty() ? nullptr : tensor_arg(&split->args[0]);
  const bool unbind = base_name_in(split->target_text, {"unbind"});
  std::optional<int> dim;
  if (input != nullptr && (unbind || splits(split->target_text))) {
    dim = dim_arg(arg_at(split, unbind ? 1 : 2, "dim"), rank_of(input), 0);
  }
  if (!dim) return false;
  out.emplace_back(input, *dim);
  if (unbind) return true;
  auto each = [&out](Node* arg) { out.emplace_back(arg, -1); };  // split sizes, chunks, indices
  for (size_t i = 1; i < split->args.size(); ++i) split->args[i].for_each_node(each);
  for (const auto& [key, arg] : split->kwargs) {
    if (key != "dim") arg.for_each_node(each);
  }
  return true;
}

// A graph node that makes a slice (`x[:, :T]` with T a size expression: SizeTracker::slice_of).
bool is_slice_node(const Node* node) {
  return node->metas.size() == 1 && node->metas[0].scalar && node->metas[0].dtype == "slice";
}

// Where output dimension `dim` of a basic index comes from.
struct IndexSource {
  int dim = -1;                 // the input dimension, -1 for a new one of size 1 (None)
  PyObject* entry = nullptr;    // the key entry: a slice, or Ellipsis for a dimension taken whole
  Node* slice_node = nullptr;   // or the node making the slice
};

// Basic indexing with constants (ints, slices, None, Ellipsis) and slices the graph makes:
// for output dimension `dim`, the input dimension it comes from and the entry that made it;
// nullopt if not such an index.
std::optional<IndexSource> index_source(const Node* node, const Node* input, int dim) {
  if (node->args.size() != 2) return std::nullopt;
  const Arg& index = node->args[1];
  std::vector<Arg> key;
  if (index.kind == Arg::Kind::kTuple ||
      (index.kind == Arg::Kind::kConst && PyTuple_Check(index.value.ptr()))) {
    sequence_items(index, key);
  } else {
    key = {index};  // one entry; a list is advanced indexing, which no rule here covers
  }
  int consumed = 0;
  int ellipses = 0;
  for (const Arg& entry : key) {
    if (entry.kind == Arg::Kind::kNode && is_slice_node(entry.node)) {
      ++consumed;
      continue;
    }
    if (entry.kind != Arg::Kind::kConst) return std::nullopt;
    PyObject* value = entry.value.ptr();
    if (PyLong_CheckExact(value) || PySlice_Check(value)) {
      ++consumed;
    } else if (value == Py_Ellipsis) {
      ++ellipses;
    } else if (value != Py_None) {
      return std::nullopt;
    }
  }
  const int input_rank = rank_of(input);
  if (ellipses > 1 || consumed > input_rank) return std::nullopt;
  int in = 0;
  int out = 0;
  std::optional<IndexSource> found;
  auto advance = [&](PyObject* value, Node* slice_node) {
    if (slice_node == nullptr && value == Py_None) {
      if (out++ == dim) found = IndexSource{-1, value, nullptr};
    } else if (slice_node == nullptr && PyLong_CheckExact(value)) {
      ++in;
    } else {  // a slice, or a whole dimension
      if (out++ == dim) found = IndexSource{in, value, slice_node};
      ++in;
    }
  };
  for (const Arg& entry : key) {
    if (entry.kind == Arg::Kind::kNode) {
      advance(nullptr, entry.node);
    } else if (entry.value.ptr() == Py_Ellipsis) {
      for (int i = 0; i < input_rank - consumed; ++i) advance(Py_Ellipsis, nullptr);
    } else {
      advance(entry.value.ptr(), nullptr);
    }
  }
  while (in < input_rank) advance(Py_Ellipsis, nullptr);
  if (out != rank_of(node)) return std::nullopt;
  return found;
}

// The dimensions of each tensor argument aligned with `dim` of a result of `rank` dims, right
// to left as broadcasting aligns them; false if one has more dims than the result or a size
// that is neither the result's nor 1.
bool aligned_dims(const Node* node, int dim, std::vector<std::pair<Node*, int>>& out) {
  const int rank = rank_of(node);
  auto consider = [&](const Arg& arg) {
    Node* tensor = tensor_arg(&arg);
    if (!tensor) return true;
    if (rank_of(tensor) > rank) return false;
    const int aligned = dim - (rank - rank_of(tensor));
    if (aligned < 0) return true;
    const int64_t size = size_at(tensor, aligned);
    if (size != size_at(node, dim) && size != 1) return false;
    out.emplace_back(tensor, aligned);
    return true;
  };
  for (const Arg& arg : node->args) {
    if (!consider(arg)) return false;
  }
  for (const auto& kw : node->kwargs) {
    if (!consider(kw.second)) return false;
  }
  return !out.empty();
}

// A reduction over constant dims (`x.mean(-1, keepdim=True)`): the kept dimensions are the
// input's; a reduced one kept as size 1 depends on nothing.
std::optional<DimRule> reduction_rule(Node* node, int dim) {
  using How = DimRule::How;
  Node* input = tensor_arg(arg_at(node, 0, "input"));
  const Arg* dims = arg_at(node, 1, "dim");
  if (!input || !dims) return std::nullopt;
  const int input_rank = rank_of(input);
  std::vector<Arg> listed;
  if (!sequence_items(*dims, listed)) listed = {*dims};
  std::set<int> reduced;
  for (const Arg& d : listed) {
    std::optional<int> at = dim_arg(&d, input_rank, -1);
    if (!at || *at < 0) return std::nullopt;
    reduced.insert(*at);
  }
  const Arg* keep = arg_at(node, 2, "keepdim");
  if (keep && (keep->kind != Arg::Kind::kConst || !PyBool_Check(keep->value.ptr()))) {
    return std::nullopt;
  }
  const bool keepdim = keep && keep->value.ptr() == Py_True;
  if (keepdim) {
    if (rank_of(node) != input_rank) return std::nullopt;
    return reduced.count(dim) ? rule_of(How::kFixed) : rule_of(How::kEqual, {{input, dim}});
  }
  if (rank_of(node) != input_rank - static_cast<int>(reduced.size())) return std::nullopt;
  for (int d = 0, kept = 0; d < input_rank; ++d) {
    if (reduced.count(d)) continue;
    if (kept++ == dim) return rule_of(How::kEqual, {{input, d}});
  }
  return std::nullopt;
}

std::optional<DimRule> matmul_rule(Node* node, int dim) {
  using How = DimRule::How;
  Node* a = tensor_arg(arg_at(node, 0, "input"));
  Node* b = tensor_arg(arg_at(node, 1, "other"));
  const int rank = rank_of(node);
  if (!a || !b || rank_of(a) < 2 || rank_of(b) < 2) return std::nullopt;
  if (rank != std::max(rank_of(a), rank_of(b))) return std::nullopt;
  if (dim == rank - 1) return rule_of(How::kEqual, {{b, rank_of(b) - 1}});
  if (dim == rank - 2) return rule_of(How::kEqual, {{a, rank_of(a) - 2}});
  DimRule rule = rule_of(How::kBroadcast);  // batch dimensions broadcast
  for (Node* t : {a, b}) {
    const int aligned = dim - (rank - rank_of(t));
    if (aligned >= 0) rule.from.emplace_back(t, aligned);
  }
  return rule;
}

// view / reshape / expand: size `dim` is its shape argument (a constant, or a size
// expression); -1 there means "the rest" (view, reshape: every size of the input and the
// other shape arguments) or "the input's" (expand).
std::optional<DimRule> shape_rule_of_args(Node* node, int dim) {
  using How = DimRule::How;
  Node* input = tensor_arg(arg_at(node, 0, "input"));
  const std::vector<Arg> shape = shape_args(node);
  const int rank = rank_of(node);
  if (!input || static_cast<int>(shape.size()) != rank) return std::nullopt;
  const Arg& arg = shape[dim];
  if (arg.kind == Arg::Kind::kNode) return rule_of(How::kNumber, {{arg.node, -1}});
  std::optional<int64_t> size = const_int(&arg);
  if (!size || *size < -1) return std::nullopt;
  if (*size >= 0) return rule_of(How::kFixed);
  if (base_name_in(node->target_text, {"expand"})) {
    const int aligned = dim - (rank - rank_of(input));
    if (aligned < 0) return std::nullopt;
    return rule_of(How::kEqual, {{input, aligned}});
  }
  DimRule rule = rule_of(How::kDepends, {{input, -1}});
  for (const Arg& other : shape) other.for_each_node([&rule](Node* n) { rule.from.emplace_back(n, -1); });
  rule.rest_of = input;
  return rule;
}

// An element of a split / chunk / unbind result: the input's sizes, but along the split
// dimension the piece's size, which depends on the input's size there and the split sizes.
std::optional<DimRule> split_item_rule(Node* item, Node* split, int dim) {
  using How = DimRule::How;
  Node* input = split->args.empty() ? nullptr : tensor_arg(&split->args[0]);
  if (!input) return std::nullopt;
  const int rank = rank_of(item);
  if (base_name_in(split->target_text, {"unbind"})) {
    std::optional<int> at = dim_arg(arg_at(split, 1, "dim"), rank_of(input), 0);
    if (!at || rank_of(input) != rank + 1) return std::nullopt;
    return rule_of(How::kEqual, {{input, dim < *at ? dim : dim + 1}});
  }
  if (!splits(split->target_text) || rank_of(input) != rank) return std::nullopt;
  std::optional<int> at = dim_arg(arg_at(split, 2, "dim"), rank, 0);
  if (!at) return std::nullopt;
  if (dim != *at) return rule_of(How::kEqual, {{input, dim}});
  DimRule rule = rule_of(How::kDepends);
  if (!split_count_from(split, rule.from)) all_argument_sizes(split, rule.from);
  return rule;
}

// cat / stack: along the joined dimension the sum of the pieces (stack: their number); every
// other dimension equal in all pieces. A 1-D empty piece is skipped by cat (legacy rule).
std::optional<DimRule> join_rule(Node* node, int dim) {
  using How = DimRule::How;
  const int rank = rank_of(node);
  const Arg* list = arg_at(node, 0, "tensors");
  std::vector<Arg> items;
  if (!list || !sequence_items(*list, items) || items.empty()) return std::nullopt;
  const bool stack = base_name_in(node->target_text, {"stack"});
  std::optional<int> at = dim_arg(arg_at(node, 1, "dim"), rank, 0);
  if (!at) return std::nullopt;
  if (stack && dim == *at) return rule_of(How::kFixed);  // the number of tensors
  DimRule rule = rule_of(!stack && dim == *at ? How::kSum : How::kEqual);
  std::vector<std::pair<Node*, int>> empties;
  for (const Arg& item : items) {
    Node* tensor = tensor_arg(&item);
    if (!tensor) return std::nullopt;
    const int expected = rank - (stack ? 1 : 0);
    if (rank_of(tensor) == expected) {
      rule.from.emplace_back(tensor, stack && dim > *at ? dim - 1 : dim);
    } else if (!stack && rank_of(tensor) == 1 && size_at(tensor, 0) == 0) {
      // Stays empty, or the trace does not hold; one made empty whatever the input sizes (a
      // cache's first torch.tensor([])) drops out.
      bool made_from_nothing = tensor->kind != NodeKind::kPlaceholder;
      auto any = [&made_from_nothing](Node*) { made_from_nothing = false; };
      for (const Arg& arg : tensor->args) arg.for_each_node(any);
      for (const auto& kw : tensor->kwargs) kw.second.for_each_node(any);
      if (!made_from_nothing) empties.emplace_back(tensor, 0);
    } else {
      return std::nullopt;
    }
  }
  if (rule.from.empty()) return std::nullopt;
  // An empty piece adds 0 to the sum; along the other dimensions it says nothing, so there
  // the size is only known to depend on the pieces (the empty one's size is guarded too).
  if (!empties.empty() && rule.how == How::kEqual) rule.how = How::kDepends;
  rule.from.insert(rule.from.end(), empties.begin(), empties.end());
  return rule;
}

// The size arguments of a factory: torch.ones / zeros / empty / rand / randn (sizes, or one
// sequence of them), torch.full (a sequence, then the value), x.new_ones / new_zeros /
// new_empty / new_full (the same, after self); a size= keyword. nullopt for anything else.
std::optional<std::vector<Arg>> factory_shape(const Node* node) {
  const bool method = node->kind == NodeKind::kCallMethod;
  const std::string& text = node->target_text;
  const bool varargs = method ? base_name_in(text, {"new_ones", "new_zeros", "new_empty"})
                              : base_name_in(text, {"ones", "zeros", "empty", "rand", "randn"});
  const bool full = method ? base_name_in(text, {"new_full"}) : base_name_in(text, {"full"});
  if (!varargs && !full) return std::nullopt;
  if (!method && text.rfind("torch.", 0) != 0) return std::nullopt;
  const size_t first = method ? 1 : 0;
  std::vector<Arg> items;
  for (const auto& [key, arg] : node->kwargs) {
    if (key == "size") {
      if (node->args.size() > first || !sequence_items(arg, items)) return std::nullopt;
      return items;
    }
  }
  if (node->args.size() <= first) return std::nullopt;
  if (sequence_items(node->args[first], items)) {
    if (node->args.size() > first + (full ? 2 : 1)) return std::nullopt;
    return items;
  }
  if (full) return std::nullopt;
  items.assign(node->args.begin() + first, node->args.end());
  return items;
}

// flatten(input, start_dim, end_dim): the input and the (normalised) range of its dims that
// merge into one; nullopt for anything else.
struct Flatten {
  Node* input = nullptr;
  int start = 0;
  int end = 0;
};

std::optional<Flatten> flatten_of(const Node* node) {
  if (!base_name_in(node->target_text, {"flatten"})) return std::nullopt;
  Node* input = tensor_arg(arg_at(node, 0, "input"));
  if (!input || rank_of(input) == 0) return std::nullopt;
  const int in_rank = rank_of(input);
  std::optional<int> start = dim_arg(arg_at(node, 1, "start_dim"), in_rank, 0);
  std::optional<int> end = dim_arg(arg_at(node, 2, "end_dim"), in_rank, in_rank - 1);
  if (!start || !end || *start > *end || rank_of(node) != in_rank - (*end - *start)) return std::nullopt;
  return Flatten{input, *start, *end};
}

// F.pad(input, pad) / torch.constant_pad_nd(input, pad): pad's pairs widen the last dims, the
// last one first ((left, right, top, bottom) pads dims -1 and -2); the other dims are the
// input's. `added` is a padded dim's two entries summed where both are constant ints.
struct Padding {
  Node* input = nullptr;
  bool padded = false;
  std::optional<int64_t> added;
  std::vector<Node*> entries;  // the pair's entries that are graph numbers
};

std::optional<Padding> padding_of(Node* node, int dim) {
  const std::string& text = node->target_text;
  // torch's own (another namespace's op named pad need not keep the sizes).
  static const std::set<std::string> kPads = {"torch.nn.functional.pad", "torch._C._nn.pad",
                                              "torch.constant_pad_nd", "torch.ops.aten.pad.default",
                                              "torch.ops.aten.constant_pad_nd.default"};
  if (node->kind != NodeKind::kCallFunction || !kPads.count(text) || node->tuple_result) return std::nullopt;
  Node* input = tensor_arg(arg_at(node, 0, "input"));
  const Arg* pad = arg_at(node, 1, "pad");
  std::vector<Arg> entries;
  const int rank = rank_of(node);
  if (!input || rank_of(input) != rank || dim >= rank || pad == nullptr || !sequence_items(*pad, entries) ||
      entries.size() % 2 != 0 || static_cast<int>(entries.size() / 2) > rank) {
    return std::nullopt;
  }
  Padding padding;
  padding.input = input;
  const int pair = rank - 1 - dim;  // which pair pads this dim
  if (pair >= static_cast<int>(entries.size() / 2)) return padding;
  padding.padded = true;
  int64_t added = 0;
  bool constant = true;
  for (int k = 0; k < 2; ++k) {
    const Arg& entry = entries[static_cast<size_t>(2 * pair + k)];
    entry.for_each_node([&padding](Node* n) { padding.entries.push_back(n); });
    std::optional<int64_t> value = const_int(&entry);
    if (!value || __builtin_add_overflow(added, *value, &added)) constant = false;
  }
  if (constant) padding.added = added;
  return padding;
}

// repeat_interleave(input, repeats, dim) / Tensor.repeat(*sizes): output dimension `dim` is
// input dimension `in_dim` (-1: a new leading one) times the repeat count `times`.
struct Repeat {
  Node* input = nullptr;
  int in_dim = -1;
  Arg times;
};

std::optional<Repeat> repeat_of(Node* node, int dim) {
  Repeat repeat;
  repeat.input = tensor_arg(arg_at(node, 0, "input"));
  if (!repeat.input) return std::nullopt;
  const int rank = rank_of(node);
  const int in_rank = rank_of(repeat.input);
  if (base_name_in(node->target_text, {"repeat_interleave"})) {
    const Arg* times = arg_at(node, 1, "repeats");
    std::optional<int> at = dim_arg(arg_at(node, 2, "dim"), rank, -1);
    if (!times || times->kind == Arg::Kind::kTuple || times->kind == Arg::Kind::kList ||
        (times->kind == Arg::Kind::kNode && is_tensor_node(times->node)) || !at || *at < 0 ||
        rank != in_rank) {
      return std::nullopt;  // per-element repeats, or flattened (no dim)
    }
    repeat.in_dim = dim;
    repeat.times = dim == *at ? *times : Arg::constant(py::int_(1));
    return repeat;
  }
  if (!base_name_in(node->target_text, {"repeat"}) || node->kind != NodeKind::kCallMethod) return std::nullopt;
  const std::vector<Arg> sizes = shape_args(node);
  if (static_cast<int>(sizes.size()) != rank || rank < in_rank) return std::nullopt;
  repeat.in_dim = dim - (rank - in_rank);
  repeat.times = sizes[dim];
  return repeat;
}

// A custom op's rule (torch.ops.<namespace>.<op> of a torch.library namespace other than
// aten's), read from its fake implementation on symbolic sizes (_support.probe_size_rule):
// where its arguments are tensors made by single-result nodes and constants.
std::optional<DimRule> probed_rule(Node* node, int dim) {
  using How = DimRule::How;
  if (node->kind != NodeKind::kCallFunction || node->target_text.rfind("torch.ops.", 0) != 0 ||
      node->target_text.rfind("torch.ops.aten.", 0) == 0) {
    return std::nullopt;
  }
  auto meta_of = [](const Arg& arg, py::object& out) {
    if (arg.kind == Arg::Kind::kConst) {
      out = arg.value;
      return true;
    }
    if (arg.kind != Arg::Kind::kNode || !is_tensor_node(arg.node) || arg.node->tuple_result) return false;
    out = arg.node->fake;
    return true;
  };
  py::list args;
  py::dict kwargs;
  for (const Arg& arg : node->args) {
    py::object value;
    if (!meta_of(arg, value)) return std::nullopt;
    args.append(value);
  }
  for (const auto& [key, arg] : node->kwargs) {
    py::object value;
    if (!meta_of(arg, value)) return std::nullopt;
    kwargs[py::str(key)] = value;
  }
  py::object probed = PyRefs::get().support.attr("probe_size_rule")(node->target, args, kwargs);
  if (probed.is_none()) return std::nullopt;
  py::list dims = probed.cast<py::tuple>()[0];
  if (dim >= static_cast<int>(py::len(dims))) return std::nullopt;
  auto located = [&](py::handle where) -> std::optional<std::pair<Node*, int>> {
    py::tuple pair = py::reinterpret_borrow<py::tuple>(where);
    const Arg* arg = nullptr;
    if (PyLong_Check(pair[0].ptr())) {
      const auto index = pair[0].cast<size_t>();
      if (index < node->args.size()) arg = &node->args[index];
    } else {
      const std::string key = pair[0].cast<std::string>();
      for (const auto& kw : node->kwargs) {
        if (kw.first == key) arg = &kw.second;
      }
    }
    if (arg == nullptr || arg->kind != Arg::Kind::kNode) return std::nullopt;
    return std::make_pair(arg->node, pair[1].cast<int>());
  };
  DimRule rule;
  py::handle entry = dims[static_cast<size_t>(dim)];
  if (entry.is_none()) return std::nullopt;
  if (PyUnicode_Check(entry.ptr())) {
    rule = rule_of(How::kFixed);
  } else {
    auto from = located(entry);
    if (!from) return std::nullopt;
    rule = rule_of(How::kEqual, {*from});
  }
  for (py::handle pin : probed.cast<py::tuple>()[1]) {
    auto at = located(pin);
    if (!at) return std::nullopt;
    rule.pins.push_back(*at);
  }
  return rule;
}

// Convolutions, pooling, interpolation and padding: a batch and a channel dimension (the batch
// missing for an unbatched input), then the spatial ones, each computed from the input's same
// dimension (and a convolution's kernel size, a weight size) with constant strides, paddings,
// dilations and output sizes. Any argument the graph computes (a size expression as an output
// size) and the rule is not used.
std::optional<DimRule> spatial_rule(const Node* node, const std::string& text, int dim) {
  const bool conv = base_name_in(text, {"conv1d", "conv2d", "conv3d"});
  const bool conv_t = base_name_in(text, {"conv_transpose1d", "conv_transpose2d", "conv_transpose3d"});
  const bool per_dim = base_name_in(
      text, {"max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
             "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
             "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "lp_pool1d",
             "lp_pool2d", "lp_pool3d", "interpolate", "upsample", "upsample_nearest",
             "upsample_bilinear", "upsample_nearest1d", "upsample_nearest2d",
             "upsample_nearest3d", "upsample_linear1d", "upsample_bilinear2d", "upsample_bicubic2d",
             "upsample_trilinear3d", "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
             "_upsample_nearest_exact3d", "pad"});
  if (!conv && !conv_t && !per_dim) return std::nullopt;
  if (node->tuple_result) return std::nullopt;  // (return_indices=True: a pair)
  Node* input = tensor_arg(arg_at(node, 0, "input"));
  if (!input || rank_of(input) != rank_of(node) || dim >= rank_of(node)) return std::nullopt;
  Node* weight = nullptr;
  size_t first_plain = 1;  // arguments from here on must be constants
  if (conv || conv_t) {
    weight = tensor_arg(arg_at(node, 1, "weight"));
    if (!weight || rank_of(weight) < 3) return std::nullopt;
    const Arg* bias = arg_at(node, 2, "bias");
    if (bias && bias->kind == Arg::Kind::kNode && !tensor_arg(bias)) return std::nullopt;
    first_plain = 3;
  }
  bool computed = false;  // an argument the graph computes, past the tensors
  auto found = [&computed](Node*) { computed = true; };
  for (size_t i = first_plain; i < node->args.size(); ++i) node->args[i].for_each_node(found);
  for (const auto& [key, arg] : node->kwargs) {
    if (key != "input" && key != "weight" && key != "bias") arg.for_each_node(found);
  }
  if (computed) return std::nullopt;
  const int rank = rank_of(node);
  if (base_name_in(text, {"pad"})) return rule_of(DimRule::How::kDepends, {{input, dim}});
  // Spatial dims: a convolution's from its kernel's rank, the others' from their name (or,
  // for interpolate, every dim after batch and channels).
  int spatial = rank - 2;
  if (weight) {
    spatial = rank_of(weight) - 2;
  } else if (text.size() >= 2 && text[text.size() - 1] == 'd' && std::isdigit(text[text.size() - 2])) {
    spatial = text[text.size() - 2] - '0';
  }
  const int leading = rank - spatial;  // 2 batched, 1 unbatched
  if (spatial < 1 || leading < 1 || leading > 2) return std::nullopt;
  if (dim >= leading) {
    DimRule rule = rule_of(DimRule::How::kDepends, {{input, dim}});
    if (weight) rule.from.emplace_back(weight, 2 + (dim - leading));
    return rule;
  }
  const bool channel = dim == leading - 1;
  if (!channel) return rule_of(DimRule::How::kEqual, {{input, dim}});  // the batch
  if (conv) return rule_of(DimRule::How::kEqual, {{weight, 0}});
  if (conv_t) return rule_of(DimRule::How::kDepends, {{weight, 1}});  // times the groups
  return rule_of(DimRule::How::kEqual, {{input, dim}});
}

// What makes size `dim` of `node` a SizeAtom: the atom (its `in` not filled), the input size it
// is a function of, and the sizes it takes as constants (a kernel's: its weight's).
struct AtomSource {
  SizeAtom atom;
  Node* input = nullptr;
  int in_dim = -1;
  std::vector<std::pair<Node*, int>> pins;
};

// A convolution's or pooling's parameter for spatial dimension `i` of `spatial`: an int for
// all, or one per dimension; `fallback` where not passed (or None).
std::optional<int64_t> window_param(const Node* node, size_t index, const char* keyword, int i,
                                    int spatial, int64_t fallback) {
  const Arg* arg = arg_at(node, index, keyword);
  if (arg == nullptr || (arg->kind == Arg::Kind::kConst && arg->value.is_none())) return fallback;
  if (std::optional<int64_t> all = const_int(arg)) return all;
  std::vector<Arg> items;
  if (!sequence_items(*arg, items)) return std::nullopt;
  if (items.empty()) return fallback;  // max_pool2d(x, 2, stride=[]): the kernel size
  if (items.size() != 1 && static_cast<int>(items.size()) != spatial) return std::nullopt;
  return const_int(&items[items.size() == 1 ? 0 : static_cast<size_t>(i)]);
}

std::optional<AtomSource> window_atom(Node* node, int dim) {
  const std::string& text = node->target_text;
  const bool conv = base_name_in(text, {"conv1d", "conv2d", "conv3d"});
  const bool max_pool = base_name_in(text, {"max_pool1d", "max_pool2d", "max_pool3d"});
  const bool avg_pool = base_name_in(text, {"avg_pool1d", "avg_pool2d", "avg_pool3d"});
  if ((!conv && !max_pool && !avg_pool) || node->tuple_result) return std::nullopt;
  // torch's own (a custom op of another namespace may share the name, not the formula).
  if (node->kind != NodeKind::kCallFunction || text.rfind("torch.", 0) != 0 ||
      (text.rfind("torch.ops.", 0) == 0 && text.rfind("torch.ops.aten.", 0) != 0)) {
    return std::nullopt;
  }
  Node* input = tensor_arg(arg_at(node, 0, "input"));
  if (!input || rank_of(input) != rank_of(node) || dim >= rank_of(node)) return std::nullopt;
  const int spatial = text[text.size() - 2] - '0';
  const int leading = rank_of(node) - spatial;  // 2 batched, 1 unbatched
  if (leading < 1 || leading > 2 || dim < leading) return std::nullopt;
  const int i = dim - leading;
  AtomSource source;
  source.input = input;
  source.in_dim = dim;
  std::optional<int64_t> kernel, stride, padding, dilation = 1;
  if (conv) {
    Node* weight = tensor_arg(arg_at(node, 1, "weight"));
    if (!weight || rank_of(weight) != spatial + 2) return std::nullopt;
    kernel = size_at(weight, 2 + i);
    source.pins.emplace_back(weight, 2 + i);
    stride = window_param(node, 3, "stride", i, spatial, 1);
    const Arg* pad = arg_at(node, 4, "padding");
    if (pad != nullptr && pad->kind == Arg::Kind::kConst && PyUnicode_Check(pad->value.ptr())) {
      const std::string how = py::str(pad->value).cast<std::string>();
      if (how == "same") {  // (stride 1 only): the input's size
        source.atom.add = 0;
        source.atom.divisor = 1;
        source.atom.plus = 0;
        return source;
      }
      if (how != "valid") return std::nullopt;
      padding = 0;
    } else {
      padding = window_param(node, 4, "padding", i, spatial, 0);
    }
    dilation = window_param(node, 5, "dilation", i, spatial, 1);
  } else {
    kernel = window_param(node, 1, "kernel_size", i, spatial, -1);
    if (!kernel || *kernel < 1) return std::nullopt;
    stride = window_param(node, 2, "stride", i, spatial, *kernel);
    padding = window_param(node, 3, "padding", i, spatial, 0);
    if (max_pool) dilation = window_param(node, 4, "dilation", i, spatial, 1);
    const Arg* ceil_mode = arg_at(node, max_pool ? 5 : 4, "ceil_mode");
    if (ceil_mode != nullptr &&
        (ceil_mode->kind != Arg::Kind::kConst || ceil_mode->value.ptr() != Py_False)) {
      return std::nullopt;  // ceil_mode=True: another formula, not modelled
    }
  }
  if (!kernel || !stride || !padding || !dilation || *kernel < 1 || *stride < 1 ||
      *padding < 0 || *dilation < 1 || *kernel > (int64_t{1} << 20) ||
      *dilation > (int64_t{1} << 20) || *padding > (int64_t{1} << 30)) {
    return std::nullopt;
  }
  source.atom.add = 2 * *padding - *dilation * (*kernel - 1) - 1;
  source.atom.divisor = *stride;
  source.atom.plus = 1;
  return source;
}

// F.interpolate(x, scale_factor=s) (no size, the scale not recomputed): a spatial size is
// floor(in * s), as aten's upsampling computes it.
std::optional<AtomSource> scale_atom(Node* node, int dim) {
  const std::string& text = node->target_text;
  if (node->kind != NodeKind::kCallFunction ||
      (text != "torch.nn.functional.interpolate" && text != "torch.nn.functional.upsample")) {
    return std::nullopt;
  }
  Node* input = tensor_arg(arg_at(node, 0, "input"));
  if (!input || rank_of(input) != rank_of(node) || rank_of(node) < 3 || dim < 2) return std::nullopt;
  const int spatial = rank_of(node) - 2;
  const Arg* size = arg_at(node, 1, "size");
  const Arg* factor = arg_at(node, 2, "scale_factor");
  const Arg* recompute = arg_at(node, 5, "recompute_scale_factor");
  if ((size != nullptr && !(size->kind == Arg::Kind::kConst && size->value.is_none())) || factor == nullptr ||
      (recompute != nullptr && !(recompute->kind == Arg::Kind::kConst &&
                                 (recompute->value.is_none() || recompute->value.ptr() == Py_False)))) {
    return std::nullopt;
  }
  std::vector<Arg> items;
  const Arg* chosen = factor;
  if (sequence_items(*factor, items)) {
    if (static_cast<int>(items.size()) != spatial) return std::nullopt;
    chosen = &items[static_cast<size_t>(dim - 2)];
  }
  if (chosen->kind != Arg::Kind::kConst) return std::nullopt;
  PyObject* value = chosen->value.ptr();
  if (!PyFloat_CheckExact(value) && !PyLong_CheckExact(value)) return std::nullopt;
  const double scale = PyFloat_Check(value) ? PyFloat_AsDouble(value) : PyLong_AsDouble(value);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return std::nullopt;
  }
  if (!(scale > 0) || scale > 1e6) return std::nullopt;
  AtomSource source;
  source.atom.kind = SizeAtom::Kind::kScale;
  source.atom.scale = scale;
  source.input = input;
  source.in_dim = dim;
  return source;
}

// x[start:stop:step] with constant ints (or None) along `dim` of a basic index.
std::optional<AtomSource> slice_atom(Node* node, int dim) {
  if (node->infix != "[]" || node->args.empty() || !tensor_arg(&node->args[0])) return std::nullopt;
  Node* base = node->args[0].node;
  std::optional<IndexSource> source = index_source(node, base, dim);
  if (!source || source->dim < 0 || source->slice_node != nullptr || !PySlice_Check(source->entry)) {
    return std::nullopt;
  }
  auto* slice = reinterpret_cast<PySliceObject*>(source->entry);
  auto bound = [](PyObject* value, std::optional<int64_t>& out) {
    if (value == Py_None) return true;
    if (!PyLong_CheckExact(value)) return false;
    int overflow = 0;
    const int64_t n = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0 || n > (int64_t{1} << 40) || n < -(int64_t{1} << 40)) return false;
    out = n;
    return true;
  };
  AtomSource out;
  out.atom.kind = SizeAtom::Kind::kSlice;
  std::optional<int64_t> step;
  if (!bound(slice->start, out.atom.start) || !bound(slice->stop, out.atom.stop) ||
      !bound(slice->step, step) || (step && (*step < 1 || *step > (int64_t{1} << 20)))) {
    return std::nullopt;
  }
  out.atom.step = step.value_or(1);
  // From the end to a place from the start (x[-5:7]): longer, then shorter, as the size grows.
  if (out.atom.start && *out.atom.start < 0 && out.atom.stop && *out.atom.stop >= 0) return std::nullopt;
  out.input = base;
  out.in_dim = source->dim;
  return out;
}

// The rule of the op that made `node` for its size `dim`; nullopt where framejit knows none
// (then the size depends on every size of every argument).
std::optional<DimRule> dim_rule(Node* node, int dim) {
  using How = DimRule::How;
  const std::string& text = node->target_text;
  const int rank = rank_of(node);
  if (node->infix == "[]" && !node->args.empty() && node->args[0].kind == Arg::Kind::kNode) {
    Node* base = node->args[0].node;
    if (base->tuple_result) return split_item_rule(node, base, dim);
    if (!is_tensor_node(base)) return std::nullopt;
    if (node->args.size() == 2 && node->args[1].kind == Arg::Kind::kNode &&
        is_tensor_node(node->args[1].node)) {
      // x[idx] with an integer tensor: idx's sizes, then x's past the first (a boolean mask
      // gives as many as are true: no rule).
      Node* index = node->args[1].node;
      const std::string& dtype = index->metas[0].dtype;
      if (dtype != "i64" && dtype != "i32" && dtype != "i16" && dtype != "i8") return std::nullopt;
      const int index_rank = rank_of(index);
      if (rank_of(base) == 0 || rank != index_rank + rank_of(base) - 1) return std::nullopt;
      if (dim < index_rank) return rule_of(How::kEqual, {{index, dim}});
      return rule_of(How::kEqual, {{base, dim - index_rank + 1}});
    }
    auto source = index_source(node, base, dim);
    if (!source) return std::nullopt;
    if (source->dim < 0) return rule_of(How::kFixed);  // None: a new dimension of size 1
    // A slice the graph makes: the input's size there and the slice's bounds.
    if (source->slice_node) return rule_of(How::kDepends, {{base, source->dim}, {source->slice_node, -1}});
    auto* slice = reinterpret_cast<PySliceObject*>(source->entry);
    const bool whole = source->entry == Py_Ellipsis ||
                       (PySlice_Check(source->entry) && slice->start == Py_None &&
                        slice->stop == Py_None && slice->step == Py_None);
    return rule_of(whole ? How::kEqual : How::kDepends, {{base, source->dim}});
  }
  if (base_name_in(text, {"group_norm", "batch_norm", "instance_norm"})) {
    // The input's shape: the per-channel weight, bias and statistics are along dim 1, where
    // broadcasting would align them with the last dim.
    Node* input = tensor_arg(arg_at(node, 0, "input"));
    if (input && rank_of(input) == rank) return rule_of(How::kEqual, {{input, dim}});
  }
  if (broadcasts(text)) {
    DimRule rule = rule_of(How::kBroadcast);
    if (!aligned_dims(node, dim, rule.from)) return std::nullopt;
    return rule;
  }
  if (base_name_in(text, {"histc"})) {  // as many counts as bins (a constant; 100 by default)
    const Arg* bins = arg_at(node, 1, "bins");
    if (rank != 1 || (bins != nullptr && !const_int(bins))) return std::nullopt;
    return rule_of(How::kFixed);
  }
  if (base_name_in(text, {"linear"})) {
    Node* input = tensor_arg(arg_at(node, 0, "input"));
    Node* weight = tensor_arg(arg_at(node, 1, "weight"));
    if (!input || !weight || rank_of(input) != rank || rank_of(weight) != 2) return std::nullopt;
    if (dim < rank - 1) return rule_of(How::kEqual, {{input, dim}});
    if (size_at(weight, 0) != size_at(node, dim)) return std::nullopt;
    return rule_of(How::kEqual, {{weight, 0}});
  }
  if (base_name_in(text, {"matmul", "mm", "bmm"})) return matmul_rule(node, dim);
  if (base_name_in(text, {"sum", "mean", "nansum", "nanmean", "amax", "amin", "logsumexp", "all",
                          "any", "prod"})) {
    return reduction_rule(node, dim);
  }
  if (base_name_in(text, {"transpose", "swapaxes", "swapdims", "t"})) {
    Node* input = tensor_arg(arg_at(node, 0, "input"));
    if (!input || rank_of(input) != rank) return std::nullopt;
    if (base_name_in(text, {"t"})) return rule_of(How::kEqual, {{input, rank == 2 ? 1 - dim : dim}});
    std::optional<int> a = dim_arg(arg_at(node, 1, "dim0"), rank, -1);
    std::optional<int> b = dim_arg(arg_at(node, 2, "dim1"), rank, -1);
    if (!a || !b || *a < 0 || *b < 0) return std::nullopt;
    return rule_of(How::kEqual, {{input, dim == *a ? *b : dim == *b ? *a : dim}});
  }
  if (base_name_in(text, {"permute"})) {
    Node* input = tensor_arg(arg_at(node, 0, "input"));
    const std::vector<Arg> order = shape_args(node);
    if (!input || rank_of(input) != rank || static_cast<int>(order.size()) != rank) {
      return std::nullopt;
    }
    std::optional<int> from = dim_arg(&order[dim], rank, -1);
    if (!from || *from < 0) return std::nullopt;
    return rule_of(How::kEqual, {{input, *from}});
  }
  if (base_name_in(text, {"view", "reshape", "expand"})) return shape_rule_of_args(node, dim);
  if (base_name_in(text, {"view_as", "reshape_as", "expand_as"})) {
    Node* other = tensor_arg(arg_at(node, 1, "other"));
    if (!other || rank_of(other) != rank) return std::nullopt;
    return rule_of(How::kEqual, {{other, dim}});
  }
  if (std::optional<std::vector<int>> squeezed = squeezed_dims(node)) {
    // The named dimensions that are 1 go (rank_is_fixed: the same ones for any sizes).
    Node* input = node->args[0].node;
    int out = -1;
    for (int d = 0; d < rank_of(input); ++d) {
      const bool named = std::find(squeezed->begin(), squeezed->end(), d) != squeezed->end();
      if (named && size_at(input, d) == 1) continue;
      if (++out == dim) return rule_of(How::kEqual, {{input, d}});
    }
    return std::nullopt;
  }
  if (base_name_in(text, {"unsqueeze"})) {
    Node* input = tensor_arg(arg_at(node, 0, "input"));
    std::optional<int> at = dim_arg(arg_at(node, 1, "dim"), rank, -1);
    if (!input || rank_of(input) != rank - 1 || !at || *at < 0) return std::nullopt;
    if (dim == *at) return rule_of(How::kFixed);
    return rule_of(How::kEqual, {{input, dim < *at ? dim : dim - 1}});
  }
  if (base_name_in(text, {"cat", "concat", "concatenate", "stack"})) return join_rule(node, dim);
  if (std::optional<Padding> padding = padding_of(node, dim)) {
    if (!padding->padded) return rule_of(How::kEqual, {{padding->input, dim}});
    DimRule rule = rule_of(How::kDepends, {{padding->input, dim}});  // (ExactSizes::padded)
    for (Node* n : padding->entries) rule.from.emplace_back(n, -1);
    return rule;
  }
  if (std::optional<std::vector<Arg>> shape = factory_shape(node)) {
    // torch.ones(B, T), x.new_zeros((B, T)): each size is its argument.
    if (static_cast<int>(shape->size()) != rank) return std::nullopt;
    const Arg& arg = (*shape)[dim];
    if (arg.kind == Arg::Kind::kNode) return rule_of(How::kNumber, {{arg.node, -1}});
    if (!const_int(&arg)) return std::nullopt;
    return rule_of(How::kFixed);
  }
  if (std::optional<Repeat> repeat = repeat_of(node, dim)) {
    std::optional<int64_t> times = const_int(&repeat->times);
    if (times && (*times == 1 || repeat->in_dim < 0)) {
      return repeat->in_dim < 0 ? rule_of(How::kFixed) : rule_of(How::kEqual, {{repeat->input, repeat->in_dim}});
    }
    DimRule rule = rule_of(How::kDepends);
    if (repeat->in_dim >= 0) rule.from.emplace_back(repeat->input, repeat->in_dim);
    repeat->times.for_each_node([&rule](Node* n) { rule.from.emplace_back(n, -1); });
    return rule;
  }
  if (std::optional<Flatten> flat = flatten_of(node)) {
    // The dims between start and end merge into one (their product); the others are the
    // input's, shifted down past the merged ones.
    if (dim < flat->start) return rule_of(How::kEqual, {{flat->input, dim}});
    if (dim > flat->start) return rule_of(How::kEqual, {{flat->input, dim + (flat->end - flat->start)}});
    if (flat->start == flat->end) return rule_of(How::kEqual, {{flat->input, dim}});
    DimRule rule = rule_of(How::kDepends);
    for (int d = flat->start; d <= flat->end; ++d) rule.from.emplace_back(flat->input, d);
    return rule;
  }
  if (base_name_in(text, {"scaled_dot_product_attention"})) {
    // (..., L, E) queries, (..., S, Ev) values: the result is (..., L, Ev).
    Node* q = tensor_arg(arg_at(node, 0, "query"));
    Node* k = tensor_arg(arg_at(node, 1, "key"));
    Node* v = tensor_arg(arg_at(node, 2, "value"));
    if (!q || !k || !v || rank_of(q) != rank || rank < 2) return std::nullopt;
    if (dim == rank - 1) return rule_of(How::kEqual, {{v, rank_of(v) - 1}});
    if (dim == rank - 2) return rule_of(How::kEqual, {{q, dim}});
    DimRule rule = rule_of(How::kBroadcast);
    for (Node* t : {q, k, v}) {
      const int aligned = dim - (rank - rank_of(t));
      if (aligned >= 0) rule.from.emplace_back(t, aligned);
    }
    return rule;
  }
  if (std::optional<DimRule> rule = spatial_rule(node, text, dim)) return rule;
  if (text == "torch.nn.functional.embedding") {
    Node* indices = tensor_arg(arg_at(node, 0, "input"));
    Node* weight = tensor_arg(arg_at(node, 1, "weight"));
    if (!indices || !weight || rank_of(indices) != rank - 1 || rank_of(weight) != 2) {
      return std::nullopt;
    }
    return rule_of(How::kEqual, {{dim < rank - 1 ? indices : weight, dim < rank - 1 ? dim : 1}});
  }
  return probed_rule(node, dim);
}

class Walk {
 public:
  Walk(const NodeFacts& facts, RankMemo& ranks, SizeDeps& out)
      : facts_(facts), ranks_(ranks), out_(out) {}

  void push(Node* node, int dim) {
    if (seen_.insert({node, dim}).second) todo_.emplace_back(node, dim);
  }
  void push_all(const std::vector<std::pair<Node*, int>>& dims) {
    for (const auto& [node, dim] : dims) push(node, dim);
  }

  void run() {
    while (!todo_.empty() && !out_.all) {
      auto [node, dim] = todo_.back();
      todo_.pop_back();
      visit(node, dim);
    }
  }

 private:
  void visit(Node* node, int dim) {
    if (facts_.reshaped.count(node)) {
      out_.all = true;
      return;
    }
    if (auto length = facts_.lengths.find({node, dim}); length != facts_.lengths.end()) {
      facts_.used.insert(length->first);
      for (const auto& [number, factor] : length->second.terms) push(number, -1);
      return;  // that sum, for any input the guards admit
    }
    if (node->kind == NodeKind::kPlaceholder) {
      if (!is_tensor_node(node)) {
        out_.numbers.insert(node);
      } else if (dim >= 0) {
        out_.dims.emplace(node, dim);
      } else {
        for (int d = 0; d < rank_of(node); ++d) out_.dims.emplace(node, d);
      }
      return;
    }
    std::vector<std::pair<Node*, int>> from;
    if (dim < 0) {
      if (node->kind == NodeKind::kCallMethod && node->target_text == "size" &&
          node->args.size() == 2 && tensor_arg(&node->args[0])) {
        Node* tensor = node->args[0].node;
        std::optional<int> d = dim_arg(&node->args[1], rank_of(tensor), 0);
        if (d) return push(tensor, *d);
      }
      if (is_tensor_node(node)) {
        for (int d = 0; d < rank_of(node); ++d) push(node, d);
        return;
      }
      all_argument_sizes(node, from);  // a number computed from sizes, or a tuple result
      return push_all(from);
    }
    if (!is_tensor_node(node) || dim >= rank_of(node)) {
      out_.all = true;  // not a size framejit asks for; be safe
      return;
    }
    // The rules map dimensions by position, which holds only if no rank on the way depends on
    // a size; otherwise every size of the arguments counts.
    std::optional<DimRule> rule;
    if (rank_is_fixed(node, facts_, ranks_)) rule = dim_rule(node, dim);
    if (rule && rule->rest_of) return push_rest(node, *rule);
    if (rule) {
      push_all(rule->pins);
      return push_all(rule->from);
    }
    all_argument_sizes(node, from);
    push_all(from);
  }

  // The size (node, dim) is, through ops that keep it (each a kEqual rule of one size), the
  // size returned: both ends of such a chain are equal for any input sizes.
  std::pair<Node*, int> kept_size(Node* node, int dim) {
    for (int steps = 0; steps < 256; ++steps) {
      if (!is_tensor_node(node) || dim < 0 || dim >= rank_of(node) ||
          !rank_is_fixed(node, facts_, ranks_)) {
        break;
      }
      // (a broadcast of one size, an element-wise op of one tensor with that dim, is that size)
      std::optional<DimRule> rule = dim_rule(node, dim);
      if (!rule || (rule->how != DimRule::How::kEqual && rule->how != DimRule::How::kBroadcast) ||
          rule->from.size() != 1 || !rule->pins.empty() || rule->from[0].second < 0) {
        break;
      }
      std::tie(node, dim) = rule->from[0];
    }
    return {node, dim};
  }

  // view(B, T, -1, d) of a (B, T, C) tensor, B and T its own sizes: -1 is C / d, whatever B
  // and T are. An entry that is one of the input's sizes (read by x.size(i) off a tensor whose
  // size i is that one, kept_size) cancels it; what is left is what -1 depends on.
  void push_rest(Node* view, const DimRule& rule) {
    Node* input = rule.rest_of;
    std::vector<std::pair<Node*, int>> dims;  // the input's sizes, as kept sizes
    for (int d = 0; d < rank_of(input); ++d) dims.push_back(kept_size(input, d));
    std::vector<bool> cancelled(dims.size(), false);
    for (const auto& [entry, unused] : rule.from) {
      if (entry == input) continue;
      bool matched = false;
      if (entry->kind == NodeKind::kCallMethod && entry->target_text == "size" &&
          entry->args.size() == 2 && tensor_arg(&entry->args[0])) {
        Node* tensor = entry->args[0].node;
        if (std::optional<int> d = dim_arg(&entry->args[1], rank_of(tensor), -1); d && *d >= 0) {
          const std::pair<Node*, int> size = kept_size(tensor, *d);
          for (size_t i = 0; i < dims.size() && !matched; ++i) {
            if (!cancelled[i] && dims[i] == size) cancelled[i] = matched = true;
          }
        }
      }
      if (!matched) push(entry, -1);
    }
    for (size_t i = 0; i < dims.size(); ++i) {
      if (!cancelled[i]) push(input, static_cast<int>(i));
    }
    (void)view;
  }

  const NodeFacts& facts_;
  RankMemo& ranks_;
  SizeDeps& out_;
  std::set<std::pair<Node*, int>> seen_;
  std::vector<std::pair<Node*, int>> todo_;
};

// Sums of input sizes times ints: the exact walk's arithmetic, nullopt on overflow.
constexpr int64_t kLargestOffset = int64_t{1} << 40;

bool add_scaled(LinearSize& into, const LinearSize& other, int64_t scale) {
  into.not_one.insert(other.not_one.begin(), other.not_one.end());
  into.pinned.insert(other.pinned.begin(), other.pinned.end());
  for (const auto& [key, factor] : other.terms) {
    int64_t& slot = into.terms[key];
    slot += scale * factor;
    if (slot == 0) into.terms.erase(key);
  }
  into.offset += scale * other.offset;
  return into.offset < kLargestOffset && into.offset > -kLargestOffset;
}

class Exact {
 public:
  Exact(const NodeFacts& facts, RankMemo& ranks, ExactMemo& memo,
        const std::function<bool(Node*)>& pinnable, SizeAtoms* atoms)
      : facts_(facts), ranks_(ranks), memo_(memo), pinnable_(pinnable), atoms_(atoms) {}

  std::optional<LinearSize> size(Node* node, int dim) {
    auto key = std::make_pair(node, dim);
    if (auto found = memo_.find(key); found != memo_.end()) return found->second;
    if (depth_ > kDeepest) return std::nullopt;  // not memoised: a shallower walk may know
    ++depth_;
    std::optional<LinearSize> result = compute(node, dim);
    --depth_;
    // The sum must give the size the trace sees (a rule applied wrongly gives up here).
    if (result && dim >= 0 && value_now(*result) != size_at(node, dim)) result.reset();
    memo_[key] = result;
    return result;
  }

 private:
  static constexpr int kDeepest = 2000;

  static int64_t value_now(const LinearSize& size) {
    int64_t total = size.offset;
    for (const auto& [key, factor] : size.terms) total += factor * size_at(key.first, key.second);
    return total;
  }

  std::optional<LinearSize> compute(Node* node, int dim) {
    if (facts_.reshaped.count(node)) return std::nullopt;
    if (auto length = facts_.lengths.find({node, dim}); length != facts_.lengths.end()) {
      facts_.used.insert(length->first);
      LinearSize sum;
      sum.offset = length->second.offset;
      for (const auto& [number, factor] : length->second.terms) {
        std::optional<LinearSize> part = size(number, -1);
        if (!part || !add_scaled(sum, *part, factor)) return std::nullopt;
      }
      return sum;
    }
    if (dim < 0) return number(node);
    if (!is_tensor_node(node) || dim >= rank_of(node)) return std::nullopt;
    if (node->kind == NodeKind::kPlaceholder) {
      LinearSize term;
      term.terms[{node, dim}] = 1;
      return term;
    }
    if (!rank_is_fixed(node, facts_, ranks_)) return std::nullopt;
    std::optional<LinearSize> result;
    if (std::optional<DimRule> rule = dim_rule(node, dim)) {
      result = combine(node, dim, *rule);
      if (result && !pin_all_of(rule->pins, *result)) result.reset();
    }
    if (!result && base_name_in(node->target_text, {"arange"})) result = arange(node, dim);
    if (!result && base_name_in(node->target_text, {"view", "reshape"})) result = view_rest(node, dim);
    if (!result) result = flattened(node, dim);
    if (!result) result = repeated(node, dim);
    if (!result) result = padded(node, dim);
    if (result) return result;
    // A size that depends on no input size is the constant it has now.
    SizeDeps deps;
    add_size_deps(node, dim, facts_, ranks_, deps);
    if (deps.all || !deps.dims.empty() || !deps.numbers.empty()) return atoms_ ? atom(node, dim) : std::nullopt;
    LinearSize fixed;
    fixed.offset = size_at(node, dim);
    return fixed;
  }

  // Atom mode: a convolution's, pooling's or constant slice's size as a term of its own, its
  // definition in atoms_ (its input's size exact too, the kernel's pinned).
  std::optional<LinearSize> atom(Node* node, int dim) {
    std::optional<AtomSource> source = window_atom(node, dim);
    if (!source) source = scale_atom(node, dim);
    if (!source) source = slice_atom(node, dim);
    if (!source) return std::nullopt;
    std::optional<LinearSize> in = size(source->input, source->in_dim);
    if (!in) return std::nullopt;
    source->atom.in = std::move(*in);
    // The kernel's size is the constant it is now: any input's (a weight passed in, not only
    // a parameter), pinned by whoever relies on the atom.
    for (const auto& [pin_node, pin_dim] : source->pins) {
      std::optional<LinearSize> part = size(pin_node, pin_dim);
      if (!part) return std::nullopt;
      for (const auto& [key, factor] : part->terms) {
        if (key.first->kind != NodeKind::kPlaceholder) return std::nullopt;
        source->atom.in.pinned.insert(key);
      }
      source->atom.in.pinned.insert(part->pinned.begin(), part->pinned.end());
    }
    const int64_t now = size_at(node, dim);
    if (source->atom.at(value_now(source->atom.in)) != now) return std::nullopt;  // a rule misread
    (*atoms_)[{node, dim}] = std::move(source->atom);
    LinearSize term;
    term.terms[{node, dim}] = 1;
    return term;
  }

  // A sum of pinnable sizes only becomes the constant it is now (its sizes listed as pinned);
  // false for any other sum.
  bool pin(LinearSize& sum) const {
    for (const auto& term : sum.terms) {
      if (!pinnable_(term.first.first)) return false;
    }
    for (const auto& term : sum.terms) sum.pinned.insert(term.first);
    sum.offset = value_now(sum);
    sum.terms.clear();
    return true;
  }

  // A product of sizes, exact where at most one factor is not a constant (64 * T, not B * T).
  // Where there are more, a factor made of sizes of pinnable inputs (a parameter's: hidden
  // size, heads) counts as the constant it is now, and the result lists them as pinned.
  // With `pin_all`, every such factor counts as its constant.
  std::optional<LinearSize> product(std::vector<LinearSize> factors, bool pin_all = false) {
    int variables = 0;
    for (const LinearSize& factor : factors) variables += factor.terms.empty() ? 0 : 1;
    LinearSize result;
    for (LinearSize& factor : factors) {
      if ((variables <= 1 && !pin_all) || variables == 0) break;
      if (!factor.terms.empty() && pin(factor)) --variables;
    }
    if (variables > 1) return std::nullopt;
    int64_t constant = 1;
    const LinearSize* variable = nullptr;
    for (const LinearSize& factor : factors) {
      if (!factor.terms.empty()) {
        variable = &factor;
        continue;
      }
      result.pinned.insert(factor.pinned.begin(), factor.pinned.end());
      result.not_one.insert(factor.not_one.begin(), factor.not_one.end());
      if (__builtin_mul_overflow(constant, factor.offset, &constant) || constant >= kLargestOffset) {
        return std::nullopt;
      }
    }
    if (!variable) {
      result.offset = constant;
      return result;
    }
    if (!add_scaled(result, *variable, constant)) return std::nullopt;
    return result;
  }

  // Sizes `d` of `node`, each exact, in `out`; false if one is not.
  bool sizes_of(Node* node, int from, int to, std::vector<LinearSize>& out) {
    for (int d = from; d < to; ++d) {
      std::optional<LinearSize> part = size(node, d);
      if (!part) return false;
      out.push_back(std::move(*part));
    }
    return true;
  }

  // repeat_interleave / repeat: the input's size times the count (an int, or an int node).
  std::optional<LinearSize> repeated(Node* node, int dim) {
    std::optional<Repeat> repeat = repeat_of(node, dim);
    if (!repeat) return std::nullopt;
    std::vector<LinearSize> factors;
    std::optional<LinearSize> times = argument(repeat->times);
    if (!times) return std::nullopt;
    factors.push_back(std::move(*times));
    if (repeat->in_dim >= 0 && !sizes_of(repeat->input, repeat->in_dim, repeat->in_dim + 1, factors)) {
      return std::nullopt;
    }
    return product(std::move(factors));
  }

  // F.pad by constant ints: along a padded dimension the input's size plus the pair.
  std::optional<LinearSize> padded(Node* node, int dim) {
    std::optional<Padding> padding = padding_of(node, dim);
    if (!padding || !padding->padded || !padding->added) return std::nullopt;
    std::optional<LinearSize> in = size(padding->input, dim);
    if (!in || __builtin_add_overflow(in->offset, *padding->added, &in->offset) ||
        in->offset >= kLargestOffset || in->offset <= -kLargestOffset) {
      return std::nullopt;
    }
    return in;
  }

  // flatten(start_dim, end_dim): along the merged dimension the product of the merged sizes.
  std::optional<LinearSize> flattened(Node* node, int dim) {
    std::optional<Flatten> flat = flatten_of(node);
    if (!flat || dim != flat->start) return std::nullopt;
    std::vector<LinearSize> merged;
    if (!sizes_of(flat->input, flat->start, flat->end + 1, merged)) return std::nullopt;
    return product(std::move(merged));
  }

  // A factor that is one size times an int > 1 (bsz * heads) becomes the size; the int is
  // returned, to multiply in where the factor was.
  static std::optional<LinearSize> split_scale(LinearSize& factor) {
    if (factor.terms.size() != 1 || factor.offset != 0 || factor.terms.begin()->second <= 1) {
      return std::nullopt;
    }
    LinearSize scale;
    scale.offset = factor.terms.begin()->second;
    factor.terms.begin()->second = 1;
    return scale;
  }

  // The -1 of a view / reshape: every size of the input over the other sizes asked for. Equal
  // factors cancel (view(B, -1, h, d) of a (B, T, h * d) tensor is T); what is left must be at
  // most one size times a constant, over a constant that divides it.
  std::optional<LinearSize> view_rest(Node* node, int dim) {
    Node* input = tensor_arg(arg_at(node, 0, "input"));
    const std::vector<Arg> shape = shape_args(node);
    if (!input || static_cast<int>(shape.size()) != rank_of(node)) return std::nullopt;
    std::optional<int64_t> rest = const_int(&shape[dim]);
    if (!rest || *rest != -1) return std::nullopt;
    std::vector<LinearSize> numerator;
    if (!sizes_of(input, 0, rank_of(input), numerator)) return std::nullopt;
    for (size_t i = 0, count = numerator.size(); i < count; ++i) {
      if (std::optional<LinearSize> scale = split_scale(numerator[i])) numerator.push_back(std::move(*scale));
    }
    // The conditions and pins of every size used, cancelled or not.
    std::set<std::pair<Node*, int>> not_one, pinned;
    for (const LinearSize& part : numerator) {
      not_one.insert(part.not_one.begin(), part.not_one.end());
      pinned.insert(part.pinned.begin(), part.pinned.end());
    }
    std::vector<LinearSize> denominator;
    for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
      if (i == dim) continue;
      std::optional<LinearSize> part;
      if (shape[i].kind == Arg::Kind::kNode) {
        part = size(shape[i].node, -1);
      } else if (std::optional<int64_t> value = const_int(&shape[i]); value && *value >= 0) {
        part = LinearSize();
        part->offset = *value;
      }
      if (!part) return std::nullopt;
      not_one.insert(part->not_one.begin(), part->not_one.end());
      pinned.insert(part->pinned.begin(), part->pinned.end());
      if (std::optional<LinearSize> scale = split_scale(*part)) denominator.push_back(std::move(*scale));
      if (part->terms.empty()) {
        denominator.push_back(std::move(*part));
        continue;
      }
      auto same = std::find(numerator.begin(), numerator.end(), *part);
      if (same == numerator.end()) return std::nullopt;  // a size that does not cancel
      numerator.erase(same);
    }
    std::optional<LinearSize> bottom = product(denominator);
    if (!bottom || bottom->offset <= 0) return std::nullopt;
    const int64_t divisor = bottom->offset;
    auto divides = [divisor](const std::optional<LinearSize>& top) {
      if (!top || top->offset % divisor != 0) return false;
      for (const auto& term : top->terms) {
        if (term.second % divisor != 0) return false;
      }
      return true;
    };
    std::optional<LinearSize> top = product(numerator);
    // hidden / heads: a parameter's size over an int divides only as the constant it is now.
    if (!divides(top)) top = product(numerator, true);
    if (!divides(top)) return std::nullopt;
    LinearSize result;
    result.not_one = std::move(not_one);
    result.not_one.insert(top->not_one.begin(), top->not_one.end());
    result.pinned = std::move(pinned);
    result.pinned.insert(top->pinned.begin(), top->pinned.end());
    result.offset = top->offset / divisor;
    for (const auto& [key, factor] : top->terms) result.terms[key] = factor / divisor;
    return result;
  }

  // The sizes a rule pins, taken as the constants they are now into `result`; false where one
  // is not known exactly or not pinnable.
  bool pin_all_of(const std::vector<std::pair<Node*, int>>& pins, LinearSize& result) {
    for (const auto& [node, dim] : pins) {
      std::optional<LinearSize> part = size(node, dim);
      if (!part || (!part->terms.empty() && !pin(*part))) return false;
      result.pinned.insert(part->pinned.begin(), part->pinned.end());
    }
    return true;
  }

  std::optional<LinearSize> combine(Node* node, int dim, const DimRule& rule) {
    using How = DimRule::How;
    switch (rule.how) {
      case How::kFixed: {
        LinearSize fixed;
        fixed.offset = size_at(node, dim);
        return fixed;
      }
      case How::kNumber:
        return size(rule.from[0].first, -1);
      case How::kSum: {
        LinearSize total;
        for (const auto& [from, d] : rule.from) {
          std::optional<LinearSize> part = size(from, d);
          if (!part || !add_scaled(total, *part, 1)) return std::nullopt;
        }
        return total;
      }
      case How::kEqual: {  // any one that is known (they are equal, or the op fails)
        for (const auto& [from, d] : rule.from) {
          if (std::optional<LinearSize> part = size(from, d)) return part;
        }
        return std::nullopt;
      }
      case How::kBroadcast: {
        // A constant other than 1 is the result (the others equal it, are 1, or the op
        // fails); constant 1s drop out; the rest must all be the same sum. Where some are not
        // known exactly, one input's size s is still the result while s is not 1 (the others
        // are s or 1, or the op fails): s, on that condition.
        // A parameter's or buffer's size counts as the constant it is (position_ids[:, :T] is
        // 1 by T however long the table).
        std::optional<LinearSize> chosen;
        bool unknown = false;
        std::set<std::pair<Node*, int>> pinned_ones;
        for (const auto& [from, d] : rule.from) {
          std::optional<LinearSize> part = size(from, d);
          if (!part) {
            unknown = true;
            continue;
          }
          if (!part->terms.empty()) pin(*part);
          if (part->terms.empty()) {
            if (part->offset != 1) {
              part->pinned.insert(pinned_ones.begin(), pinned_ones.end());
              return part;
            }
            pinned_ones.insert(part->pinned.begin(), part->pinned.end());
            continue;
          }
          if (chosen && !(*chosen == *part)) {
            // Atom mode: two sizes that differ as sums may be equal as functions (the slice
            // of a padded convolution's output and that convolution's input); the one chosen
            // is the result while it is not 1, as where the other is unknown.
            if (!atoms_) return std::nullopt;
            unknown = true;
            continue;
          }
          if (chosen) part->not_one.insert(chosen->not_one.begin(), chosen->not_one.end());
          chosen = part;
        }
        if (unknown) {
          if (!chosen || chosen->offset != 0 || chosen->terms.size() != 1 ||
              chosen->terms.begin()->second != 1 || size_at(node, dim) == 1) {
            return std::nullopt;
          }
          chosen->not_one.insert(chosen->terms.begin()->first);
        }
        LinearSize one;
        one.offset = 1;
        LinearSize& result = chosen ? *chosen : one;
        result.pinned.insert(pinned_ones.begin(), pinned_ones.end());
        return result;
      }
      case How::kDepends:
        return std::nullopt;
    }
    return std::nullopt;
  }

  // The value of a number node: a size, sums and differences of them, an int times one.
  std::optional<LinearSize> number(Node* node) {
    if (node->kind == NodeKind::kCallMethod && node->target_text == "size" &&
        node->args.size() == 2 && tensor_arg(&node->args[0])) {
      Node* tensor = node->args[0].node;
      std::optional<int> d = dim_arg(&node->args[1], rank_of(tensor), -1);
      if (!d || *d < 0) return std::nullopt;
      return size(tensor, *d);
    }
    if (node->kind == NodeKind::kPlaceholder || node->infix.empty()) return std::nullopt;
    LinearSize result;
    if (node->args.size() == 1 && (node->infix == "-" || node->infix == "+")) {
      std::optional<LinearSize> only = argument(node->args[0]);
      if (!only || !add_scaled(result, *only, node->infix == "-" ? -1 : 1)) return std::nullopt;
      return result;
    }
    if (node->args.size() != 2) return std::nullopt;
    std::optional<LinearSize> a = argument(node->args[0]);
    std::optional<LinearSize> b = argument(node->args[1]);
    if (!a || !b) return std::nullopt;
    if (node->infix == "+" || node->infix == "-") {
      result = *a;
      if (!add_scaled(result, *b, node->infix == "-" ? -1 : 1)) return std::nullopt;
      return result;
    }
    if (node->infix == "*" && (a->terms.empty() || b->terms.empty())) {
      const bool a_constant = a->terms.empty();
      const int64_t scale = a_constant ? a->offset : b->offset;
      if (scale >= kLargestOffset || scale <= -kLargestOffset) return std::nullopt;
      if (!add_scaled(result, a_constant ? *b : *a, scale)) return std::nullopt;
      return result;
    }
    if (node->infix == "//" && b->terms.empty() && b->offset > 0) {
      // (k * T + k * c) // k: exact where k divides every factor and the offset (ProphetNet's
      // ngram_sequence_length // (1 + ngram) of the streams cat along the length).
      const int64_t k = b->offset;
      bool exact = a->offset % k == 0;
      for (const auto& term : a->terms) exact = exact && term.second % k == 0;
      if (!exact) return std::nullopt;
      result = *a;
      result.offset /= k;
      for (auto& term : result.terms) term.second /= k;
      return result;
    }
    return std::nullopt;
  }

  std::optional<LinearSize> argument(const Arg& arg) {
    if (arg.kind == Arg::Kind::kNode) {
      const Node* n = arg.node;
      if (n->tuple_result || n->metas.size() != 1 || !n->metas[0].scalar ||
          n->metas[0].dtype != "i64") {
        return std::nullopt;  // a tensor, or a number that is not an int
      }
      return size(arg.node, -1);
    }
    std::optional<int64_t> value = const_int(&arg);
    if (!value || *value >= kLargestOffset || *value <= -kLargestOffset) return std::nullopt;
    LinearSize constant;
    constant.offset = *value;
    return constant;
  }

  // torch.arange(end), (start, end), (start, end, 1) with int bounds: end - start, when that
  // can never be negative (every factor and the constant at least 0).
  std::optional<LinearSize> arange(Node* node, int dim) {
    if (dim != 0 || rank_of(node) != 1) return std::nullopt;
    std::vector<const Arg*> bounds;
    for (const Arg& arg : node->args) bounds.push_back(&arg);
    for (const auto& [key, arg] : node->kwargs) {
      if (key == "start" || key == "end" || key == "step") return std::nullopt;
    }
    if (bounds.size() == 3) {
      std::optional<int64_t> step = const_int(bounds[2]);
      if (!step || *step != 1) return std::nullopt;
      bounds.pop_back();
    }
    if (bounds.empty() || bounds.size() > 2) return std::nullopt;
    std::optional<LinearSize> end = argument(*bounds.back());
    if (!end) return std::nullopt;
    LinearSize length = *end;
    if (bounds.size() == 2) {
      std::optional<LinearSize> start = argument(*bounds[0]);
      if (!start || !add_scaled(length, *start, -1)) return std::nullopt;
    }
    if (length.offset < 0) return std::nullopt;
    for (const auto& [key, factor] : length.terms) {
      if (factor < 0) return std::nullopt;
    }
    return length;
  }

  const NodeFacts& facts_;
  RankMemo& ranks_;
  ExactMemo& memo_;
  const std::function<bool(Node*)>& pinnable_;
  SizeAtoms* atoms_;
  int depth_ = 0;
};

// A slice bound as a sum of graph numbers times ints plus an int (`s + 1`, `T - 1`), added
// into terms / offset times `scale`: + - * by an int are followed, any other node is a term of
// its own (it cancels only against itself). False for a bound that is no int.
bool bound_form(const Arg& arg, int64_t scale, NumberSum& sum, int depth = 0) {
  std::map<Node*, int64_t>& terms = sum.terms;
  int64_t& offset = sum.offset;
  if (depth > 64 || scale >= kLargestOffset || scale <= -kLargestOffset) return false;
  if (arg.kind == Arg::Kind::kConst) {
    if (!PyLong_CheckExact(arg.value.ptr())) return false;
    int overflow = 0;
    const int64_t n = PyLong_AsLongLongAndOverflow(arg.value.ptr(), &overflow);
    int64_t scaled = 0;
    if (overflow != 0 || __builtin_mul_overflow(scale, n, &scaled) ||
        __builtin_add_overflow(offset, scaled, &offset)) {
      return false;
    }
    return offset < kLargestOffset && offset > -kLargestOffset;
  }
  if (arg.kind != Arg::Kind::kNode) return false;
  Node* node = arg.node;
  if (node->args.size() == 2 && (node->infix == "+" || node->infix == "-")) {
    return bound_form(node->args[0], scale, sum, depth + 1) &&
           bound_form(node->args[1], node->infix == "-" ? -scale : scale, sum, depth + 1);
  }
  if (node->args.size() == 1 && (node->infix == "-" || node->infix == "+")) {
    return bound_form(node->args[0], node->infix == "-" ? -scale : scale, sum, depth + 1);
  }
  if (node->args.size() == 2 && node->infix == "*") {
    for (int side = 0; side < 2; ++side) {
      std::optional<int64_t> factor = const_int(&node->args[side]);
      int64_t scaled = 0;
      if (factor && !__builtin_mul_overflow(scale, *factor, &scaled)) {
        return bound_form(node->args[1 - side], scaled, sum, depth + 1);
      }
    }
  }
  terms[node] += scale;
  return true;
}

}  // namespace

std::vector<FixedSlice> fixed_length_slices(const Node* node) {
  std::vector<FixedSlice> out;
  if (node->infix != "[]" || node->args.size() != 2 || node->args[0].kind != Arg::Kind::kNode ||
      !is_tensor_node(node)) {
    return out;
  }
  const Node* base = node->args[0].node;
  if (base->tuple_result || !is_tensor_node(base)) return out;
  for (int dim = 0; dim < rank_of(node); ++dim) {
    std::optional<IndexSource> source = index_source(node, base, dim);
    if (!source || source->slice_node == nullptr) continue;
    const Node* slice = source->slice_node;
    if (slice->args.size() < 2 || slice->args.size() > 3) continue;
    if (slice->args.size() == 3) {
      const Arg& step = slice->args[2];
      const bool unit = step.kind == Arg::Kind::kConst &&
                        (step.value.is_none() || const_int(&step) == std::optional<int64_t>(1));
      if (!unit) continue;
    }
    const Arg& start = slice->args[0];
    const Arg& stop = slice->args[1];
    if (stop.kind == Arg::Kind::kConst && stop.value.is_none()) continue;
    NumberSum length;
    const bool from_zero = start.kind == Arg::Kind::kConst && start.value.is_none();
    if (!(from_zero || bound_form(start, -1, length)) || !bound_form(stop, 1, length)) continue;
    // What is left: numbers the trace knows now (no int input: a length that moves with the
    // position is no fixed length), adding up to the result's size.
    int64_t now = length.offset;
    bool known = true;
    for (auto it = length.terms.begin(); it != length.terms.end();) {
      if (it->second == 0) {
        it = length.terms.erase(it);
        continue;
      }
      Node* number = it->first;
      known = known && number->kind != NodeKind::kPlaceholder && number->fake &&
              PyLong_CheckExact(number->fake.ptr());
      int overflow = 0;
      const int64_t value = known ? PyLong_AsLongLongAndOverflow(number->fake.ptr(), &overflow) : 0;
      int64_t term = 0;
      known = known && overflow == 0 && !__builtin_mul_overflow(it->second, value, &term) &&
              !__builtin_add_overflow(now, term, &now);
      ++it;
    }
    if (!known || now < 0 || size_at(node, dim) != now) continue;
    out.push_back(FixedSlice{dim, source->dim, source->slice_node, std::move(length)});
  }
  return out;
}

void add_size_deps(Node* node, int dim, const NodeFacts& facts,
                   RankMemo& ranks, SizeDeps& out) {
  Walk walk(facts, ranks, out);
  walk.push(node, dim);
  walk.run();
}

void add_split_count_deps(Node* split, const NodeFacts& facts, RankMemo& ranks,
                          ExactMemo& memo, const std::function<bool(Node*)>& pinnable,
                          SizeDeps& out, std::set<std::pair<Node*, int>>& not_one) {
  Walk walk(facts, ranks, out);
  std::vector<std::pair<Node*, int>> from;
  // split(x, [a, b], dim) / tensor_split(x, [i, j], dim): as many pieces as the list says (or
  // one more than its indices), whatever the sizes (sections that do not add up raise when
  // the graph runs, as in eager).
  const Arg* sections = split->args.size() >= 2 ? &split->args[1] : nullptr;
  for (const auto& [key, arg] : split->kwargs) {
    if (key == "split_size_or_sections" || key == "split_size" || key == "indices" ||
        key == "sections" || key == "split_sizes") {
      sections = &arg;
    }
  }
  std::vector<Arg> listed;
  if (sections && (sections->kind == Arg::Kind::kList || sections->kind == Arg::Kind::kTuple ||
                   (sections->kind == Arg::Kind::kConst &&
                    (PyList_Check(sections->value.ptr()) || PyTuple_Check(sections->value.ptr())))) &&
      base_name_in(split->target_text, {"split", "tensor_split", "split_with_sizes", "unsafe_split"}) &&
      sequence_items(*sections, listed)) {
    return;
  }
  if (!split_count_from(split, from)) {
    all_argument_sizes(split, from);
  } else {
    // from[0] is the split dimension; the rest, split sizes or counts given as sizes.
    Exact exact(facts, ranks, memo, pinnable, nullptr);
    std::optional<LinearSize> size = exact.size(from[0].first, from[0].second);
    if (size && from.size() == 1 && size->not_one.empty() && base_name_in(split->target_text, {"chunk"})) {
      // chunk(k) of k * (a sum of sizes): k pieces of that sum each, whatever the sizes (k empty
      // ones where it is 0). ProphetNet chunks its main and n predicted streams, cat along
      // the length, back into 1 + n.
      std::optional<int64_t> chunks = const_int(arg_at(split, 1, "chunks"));
      bool multiple = chunks && *chunks > 0 && size->offset % *chunks == 0;
      for (const auto& term : size->terms) multiple = multiple && term.second % *chunks == 0;
      if (multiple) {
        out.dims.insert(size->pinned.begin(), size->pinned.end());
        return;
      }
    }
    bool conditions = size.has_value();  // each on a placeholder, which the caller can guard
    for (const auto& [node, dim] : size ? size->not_one : std::set<std::pair<Node*, int>>()) {
      conditions = conditions && node->kind == NodeKind::kPlaceholder;
    }
    if (conditions) {
      not_one.insert(size->not_one.begin(), size->not_one.end());
      for (const auto& term : size->terms) out.dims.insert(term.first);
      out.dims.insert(size->pinned.begin(), size->pinned.end());
      from.erase(from.begin());
    }
  }
  walk.push_all(from);
  walk.run();
}

__int128 SizeAtom::at(__int128 value) const {
  if (kind == Kind::kScale) {
    if (value < 0) return 0;  // (no tensor: 0 keeps it monotone)
    if (value > (__int128{1} << 50)) value = __int128{1} << 50;  // (exact in a double)
    return static_cast<__int128>(std::floor(static_cast<double>(value) * scale));
  }
  if (kind == Kind::kWindow) {
    const __int128 top = value + add;
    __int128 quotient = top / divisor;
    if (top % divisor != 0 && top < 0) --quotient;  // floor, not truncation
    return quotient + plus;
  }
  const __int128 n = value < 0 ? 0 : value;  // (below 0 no tensor exists: 0 keeps it monotone)
  auto clamped = [n](const std::optional<int64_t>& bound, __int128 none) -> __int128 {
    if (!bound) return none;
    __int128 at = *bound < 0 ? n + *bound : __int128{*bound};
    return at < 0 ? 0 : (at > n ? n : at);
  };
  const __int128 first = clamped(start, 0);
  const __int128 last = clamped(stop, n);
  return last > first ? (last - first + step - 1) / step : 0;
}

bool LinearSize::operator==(const LinearSize& other) const {
  return offset == other.offset && terms == other.terms;
}

std::optional<LinearSize> exact_size(Node* node, int dim, const NodeFacts& facts,
                                     RankMemo& ranks, ExactMemo& memo,
                                     const std::function<bool(Node*)>& pinnable,
                                     SizeAtoms* atoms) {
  Exact exact(facts, ranks, memo, pinnable, atoms);
  return exact.size(node, dim);
}

}  // namespace framejit
