// The size dependency walk (see size_deps.h). Each rule below states how one family of ops
// computes the size of an output dimension from its arguments, and is used only when the
// trace-time sizes agree with it; anything else takes every size of every argument. Rules
// must never name fewer sizes than the op depends on: a missed one leaves a size unguarded
// that the trace assumed.
#include "trace/size_deps.h"

#include <algorithm>
#include <optional>
#include <vector>

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

class Walk {
 public:
  Walk(const std::unordered_set<Node*>& reshaped, RankMemo& ranks, SizeDeps& out)
      : reshaped_(reshaped), ranks_(ranks), out_(out) {}

  void push(Node* node, int dim) {
    if (seen_.insert({node, dim}).second) todo_.emplace_back(node, dim);
  }

  // Every size of every node argument (the rule for ops without one of their own).
  void push_arguments(const Node* node) {
    auto each = [this](Node* arg) { push(arg, -1); };
    for (const Arg& arg : node->args) arg.for_each_node(each);
    for (const auto& kw : node->kwargs) kw.second.for_each_node(each);
  }

  // Whether the number of tensors a split returns depends on sizes `push`ed.
  void push_split_count(const Node* split) {
    Node* input = split->args.empty() ? nullptr : tensor_arg(&split->args[0]);
    const bool unbind = base_name_in(split->target_text, {"unbind"});
    std::optional<int> dim;
    if (input != nullptr && (unbind || splits(split->target_text))) {
      dim = dim_arg(arg_at(split, unbind ? 1 : 2, "dim"), rank_of(input), 0);
    }
    if (!dim) return push_arguments(split);
    push(input, *dim);
    if (unbind) return;
    auto each = [this](Node* arg) { push(arg, -1); };  // split sizes, chunks, indices
    for (size_t i = 1; i < split->args.size(); ++i) split->args[i].for_each_node(each);
    for (const auto& [key, arg] : split->kwargs) {
      if (key != "dim") arg.for_each_node(each);
    }
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
    if (reshaped_.count(node)) {
      out_.all = true;
      return;
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
      return push_arguments(node);  // a number computed from sizes, or a tuple result
    }
    if (!is_tensor_node(node) || dim >= rank_of(node)) {
      out_.all = true;  // not a size framejit asks for; be safe
      return;
    }
    // The rules map dimensions by position, which holds only if no rank on the way depends on
    // a size; otherwise every size of the arguments counts.
    if (!rank_is_fixed(node) || !shape_rule(node, dim)) push_arguments(node);
  }

  // Pushes what size `dim` of `node` depends on by the rule of its op; false if no rule holds.
  bool shape_rule(Node* node, int dim) {
    const std::string& text = node->target_text;
    const int rank = rank_of(node);
    if (node->infix == "[]" && !node->args.empty() && node->args[0].kind == Arg::Kind::kNode) {
      Node* base = node->args[0].node;
      if (base->tuple_result) return split_item(node, base, dim);
      if (is_tensor_node(base)) return index_rule(node, base, dim);
      return false;
    }
    if (broadcasts(text)) return broadcast_rule(node, dim);
    if (base_name_in(text, {"linear"})) {
      Node* input = tensor_arg(arg_at(node, 0, "input"));
      Node* weight = tensor_arg(arg_at(node, 1, "weight"));
      if (!input || !weight || rank_of(input) != rank || rank_of(weight) != 2) return false;
      if (dim < rank - 1) return push(input, dim), true;
      if (size_at(weight, 0) != size_at(node, dim)) return false;
      return push(weight, 0), true;
    }
    if (base_name_in(text, {"matmul", "mm", "bmm"})) return matmul_rule(node, dim);
    if (base_name_in(text, {"sum", "mean", "nansum", "nanmean", "amax", "amin", "logsumexp", "all",
                            "any", "prod"})) {
      return reduction_rule(node, dim);
    }
    if (base_name_in(text, {"transpose", "swapaxes", "swapdims", "t"})) {
      Node* input = tensor_arg(arg_at(node, 0, "input"));
      if (!input || rank_of(input) != rank) return false;
      if (base_name_in(text, {"t"})) return push(input, rank == 2 ? 1 - dim : dim), true;
      std::optional<int> a = dim_arg(arg_at(node, 1, "dim0"), rank, -1);
      std::optional<int> b = dim_arg(arg_at(node, 2, "dim1"), rank, -1);
      if (!a || !b || *a < 0 || *b < 0) return false;
      return push(input, dim == *a ? *b : dim == *b ? *a : dim), true;
    }
    if (base_name_in(text, {"permute"})) {
      Node* input = tensor_arg(arg_at(node, 0, "input"));
      const std::vector<Arg> order = shape_args(node);
      if (!input || rank_of(input) != rank || static_cast<int>(order.size()) != rank) {
        return false;
      }
      std::optional<int> from = dim_arg(&order[dim], rank, -1);
      if (!from || *from < 0) return false;
      return push(input, *from), true;
    }
    if (base_name_in(text, {"view", "reshape", "expand"})) return shape_rule_of_args(node, dim);
    if (base_name_in(text, {"view_as", "reshape_as", "expand_as"})) {
      Node* other = tensor_arg(arg_at(node, 1, "other"));
      if (!other || rank_of(other) != rank) return false;
      return push(other, dim), true;
    }
    if (base_name_in(text, {"unsqueeze"})) {
      Node* input = tensor_arg(arg_at(node, 0, "input"));
      std::optional<int> at = dim_arg(arg_at(node, 1, "dim"), rank, -1);
      if (!input || rank_of(input) != rank - 1 || !at || *at < 0) return false;
      if (dim != *at) push(input, dim < *at ? dim : dim - 1);
      return true;
    }
    if (base_name_in(text, {"cat", "concat", "concatenate", "stack"})) {
      const Arg* list = arg_at(node, 0, "tensors");
      std::vector<Arg> items;
      if (!list || !sequence_items(*list, items) || items.empty()) return false;
      const bool stack = base_name_in(text, {"stack"});
      std::optional<int> at = stack ? dim_arg(arg_at(node, 1, "dim"), rank, 0) : 0;
      if (!at) return false;
      for (const Arg& item : items) {
        Node* tensor = tensor_arg(&item);
        if (!tensor || rank_of(tensor) != rank - (stack ? 1 : 0)) return false;
      }
      if (stack && dim == *at) return true;  // the number of tensors
      for (const Arg& item : items) push(item.node, stack && dim > *at ? dim - 1 : dim);
      return true;
    }
    if (base_name_in(text, {"scaled_dot_product_attention"})) {
      // (..., L, E) queries, (..., S, Ev) values: the result is (..., L, Ev).
      Node* q = tensor_arg(arg_at(node, 0, "query"));
      Node* k = tensor_arg(arg_at(node, 1, "key"));
      Node* v = tensor_arg(arg_at(node, 2, "value"));
      if (!q || !k || !v || rank_of(q) != rank || rank < 2) return false;
      if (dim == rank - 1) return push(v, rank_of(v) - 1), true;
      if (dim == rank - 2) return push(q, dim), true;
      for (Node* t : {q, k, v}) {
        const int aligned = dim - (rank - rank_of(t));
        if (aligned >= 0) push(t, aligned);
      }
      return true;
    }
    if (text == "torch.nn.functional.embedding") {
      Node* indices = tensor_arg(arg_at(node, 0, "input"));
      Node* weight = tensor_arg(arg_at(node, 1, "weight"));
      if (!indices || !weight || rank_of(indices) != rank - 1 || rank_of(weight) != 2) {
        return false;
      }
      return push(dim < rank - 1 ? indices : weight, dim < rank - 1 ? dim : 1), true;
    }
    return false;
  }

  // Right-aligned broadcasting: each tensor argument's dimension at the same place from the
  // end, where it has one.
  bool broadcast_rule(Node* node, int dim) {
    const int rank = rank_of(node);
    std::vector<std::pair<Node*, int>> found;
    auto consider = [&](const Arg& arg) {
      Node* tensor = tensor_arg(&arg);
      if (!tensor) return true;
      if (rank_of(tensor) > rank) return false;
      const int aligned = dim - (rank - rank_of(tensor));
      if (aligned < 0) return true;
      const int64_t size = size_at(tensor, aligned);
      if (size != size_at(node, dim) && size != 1) return false;
      found.emplace_back(tensor, aligned);
      return true;
    };
    for (const Arg& arg : node->args) {
      if (!consider(arg)) return false;
    }
    for (const auto& kw : node->kwargs) {
      if (!consider(kw.second)) return false;
    }
    if (found.empty()) return false;
    for (const auto& [tensor, aligned] : found) push(tensor, aligned);
    return true;
  }

  // A reduction over constant dims (`x.mean(-1, keepdim=True)`): the kept dimensions are the
  // input's; a reduced one kept as size 1 depends on nothing.
  bool reduction_rule(Node* node, int dim) {
    Node* input = tensor_arg(arg_at(node, 0, "input"));
    const Arg* dims = arg_at(node, 1, "dim");
    if (!input || !dims) return false;
    const int input_rank = rank_of(input);
    std::vector<Arg> listed;
    if (!sequence_items(*dims, listed)) listed = {*dims};
    std::set<int> reduced;
    for (const Arg& d : listed) {
      std::optional<int> at = dim_arg(&d, input_rank, -1);
      if (!at || *at < 0) return false;
      reduced.insert(*at);
    }
    const Arg* keep = arg_at(node, 2, "keepdim");
    if (keep && (keep->kind != Arg::Kind::kConst || !PyBool_Check(keep->value.ptr()))) return false;
    const bool keepdim = keep && keep->value.ptr() == Py_True;
    if (keepdim) {
      if (rank_of(node) != input_rank) return false;
      if (!reduced.count(dim)) push(input, dim);
      return true;
    }
    if (rank_of(node) != input_rank - static_cast<int>(reduced.size())) return false;
    for (int d = 0, kept = 0; d < input_rank; ++d) {
      if (reduced.count(d)) continue;
      if (kept++ == dim) return push(input, d), true;
    }
    return false;
  }

  bool matmul_rule(Node* node, int dim) {
    Node* a = tensor_arg(arg_at(node, 0, "input"));
    Node* b = tensor_arg(arg_at(node, 1, "other"));
    const int rank = rank_of(node);
    if (!a || !b || rank_of(a) < 2 || rank_of(b) < 2) return false;
    if (rank != std::max(rank_of(a), rank_of(b))) return false;
    if (dim == rank - 1) return push(b, rank_of(b) - 1), true;
    if (dim == rank - 2) return push(a, rank_of(a) - 2), true;
    for (Node* t : {a, b}) {  // batch dimensions broadcast
      const int aligned = dim - (rank - rank_of(t));
      if (aligned >= 0) push(t, aligned);
    }
    return true;
  }

  // view / reshape / expand: size `dim` is its shape argument (a constant, or a size
  // expression); -1 there means "the rest" (view, reshape: every size of the input and the
  // other shape arguments) or "the input's" (expand).
  bool shape_rule_of_args(Node* node, int dim) {
    Node* input = tensor_arg(arg_at(node, 0, "input"));
    const std::vector<Arg> shape = shape_args(node);
    const int rank = rank_of(node);
    if (!input || static_cast<int>(shape.size()) != rank) return false;
    const Arg& arg = shape[dim];
    if (arg.kind == Arg::Kind::kNode) return push(arg.node, -1), true;
    std::optional<int64_t> size = const_int(&arg);
    if (!size || *size < -1) return false;
    if (*size >= 0) return true;
    if (base_name_in(node->target_text, {"expand"})) {
      const int aligned = dim - (rank - rank_of(input));
      if (aligned < 0) return false;
      return push(input, aligned), true;
    }
    push(input, -1);
    for (const Arg& other : shape) other.for_each_node([this](Node* n) { push(n, -1); });
    return true;
  }

  // An element of a split / chunk / unbind result: the input's sizes, but along the split
  // dimension the piece's size, which depends on the input's size there and the split sizes.
  bool split_item(Node* item, Node* split, int dim) {
    Node* input = split->args.empty() ? nullptr : tensor_arg(&split->args[0]);
    if (!input) return false;
    const int rank = rank_of(item);
    if (base_name_in(split->target_text, {"unbind"})) {
      std::optional<int> at = dim_arg(arg_at(split, 1, "dim"), rank_of(input), 0);
      if (!at || rank_of(input) != rank + 1) return false;
      return push(input, dim < *at ? dim : dim + 1), true;
    }
    if (!splits(split->target_text) || rank_of(input) != rank) return false;
    std::optional<int> at = dim_arg(arg_at(split, 2, "dim"), rank, 0);
    if (!at) return false;
    if (dim == *at) push_split_count(split);
    else push(input, dim);
    return true;
  }

  // Basic indexing with constants (ints, slices, None, Ellipsis): a sliced dimension's size
  // depends on the input's size there, an int removes one, None adds a 1.
  bool index_rule(Node* node, Node* input, int dim) {
    if (node->args.size() != 2) return false;
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
      if (entry.kind != Arg::Kind::kConst) return false;
      PyObject* value = entry.value.ptr();
      if (PyLong_CheckExact(value) || PySlice_Check(value)) {
        ++consumed;
      } else if (value == Py_Ellipsis) {
        ++ellipses;
      } else if (value != Py_None) {
        return false;
      }
    }
    const int input_rank = rank_of(input);
    if (ellipses > 1 || consumed > input_rank) return false;
    int in = 0;
    int out = 0;
    int found = -2;  // -2: not reached, -1: a new dimension, else the input's
    auto advance = [&](PyObject* value) {
      if (value == Py_None) {
        if (out++ == dim) found = -1;
      } else if (PyLong_CheckExact(value)) {
        ++in;
      } else {  // a slice, or a whole dimension
        if (out++ == dim) found = in;
        ++in;
      }
    };
    for (const Arg& entry : key) {
      if (entry.value.ptr() == Py_Ellipsis) {
        for (int i = 0; i < input_rank - consumed; ++i) advance(Py_Ellipsis);
      } else {
        advance(entry.value.ptr());
      }
    }
    while (in < input_rank) advance(Py_Ellipsis);
    if (out != rank_of(node) || found == -2) return false;
    if (found >= 0) push(input, found);
    return true;
  }

  // Whether node's rank is the same for any sizes of the inputs: no squeeze() and no tensor
  // reshaped in place among the nodes it is computed from. Memoised across walks; iterative,
  // as chains can be thousands of nodes long.
  bool rank_is_fixed(Node* node) {
    std::vector<Node*> stack{node};
    while (!stack.empty()) {
      Node* top = stack.back();
      if (ranks_.count(top)) {
        stack.pop_back();
        continue;
      }
      if (top->kind == NodeKind::kPlaceholder ||
          base_name_in(top->target_text, {"squeeze", "squeeze_", "squeeze_copy"})) {
        ranks_[top] = top->kind == NodeKind::kPlaceholder;
        stack.pop_back();
        continue;
      }
      bool fixed = true;
      std::vector<Node*> pending;
      auto check = [&](Node* arg) {
        if (reshaped_.count(arg)) {
          fixed = false;
        } else if (auto found = ranks_.find(arg); found != ranks_.end()) {
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
      ranks_[top] = fixed;
      stack.pop_back();
    }
    return !reshaped_.count(node) && ranks_[node];
  }

  const std::unordered_set<Node*>& reshaped_;
  RankMemo& ranks_;
  SizeDeps& out_;
  std::set<std::pair<Node*, int>> seen_;
  std::vector<std::pair<Node*, int>> todo_;
};

}  // namespace

void add_size_deps(Node* node, int dim, const std::unordered_set<Node*>& reshaped,
                   RankMemo& ranks, SizeDeps& out) {
  Walk walk(reshaped, ranks, out);
  walk.push(node, dim);
  walk.run();
}

void add_split_count_deps(Node* split, const std::unordered_set<Node*>& reshaped,
                          RankMemo& ranks, SizeDeps& out) {
  Walk walk(reshaped, ranks, out);
  walk.push_split_count(split);
  walk.run();
}

}  // namespace framejit
