// Graph IR construction, dead getitem removal and the verifier.
#include "graph/graph.h"

#include <cstring>

#include <algorithm>
#include <cctype>
#include <unordered_set>

#include "common/check.h"

namespace framejit {

std::string TensorMeta::to_string() const {
  if (scalar) return "Sym(" + dtype + ")";
  if (dtype.empty()) return "None";  // a None among a tuple result's tensors
  std::string out = dtype + "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(sizes[i]);
  }
  out += "]";
  if (!device.empty() && device != "cpu") out += " " + device;
  return out;
}

const char* node_kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::kPlaceholder: return "placeholder";
    case NodeKind::kCallFunction: return "call_function";
    case NodeKind::kCallMethod: return "call_method";
    case NodeKind::kOutput: return "output";
  }
  return "?";
}

Arg Arg::of(Node* node) {
  Arg arg;
  arg.kind = Kind::kNode;
  arg.node = node;
  return arg;
}

Arg Arg::constant(py::object value) {
  Arg arg;
  arg.kind = Kind::kConst;
  arg.value = std::move(value);
  return arg;
}

Arg Arg::tuple(std::vector<Arg> items) {
  Arg arg;
  arg.kind = Kind::kTuple;
  arg.items = std::move(items);
  return arg;
}

Arg Arg::list(std::vector<Arg> items) {
  Arg arg;
  arg.kind = Kind::kList;
  arg.items = std::move(items);
  return arg;
}

Arg Arg::dict(std::vector<std::string> keys, std::vector<Arg> values) {
  Arg arg;
  arg.kind = Kind::kDict;
  arg.keys = std::move(keys);
  arg.items = std::move(values);
  return arg;
}

std::string Node::meta_text() const {
  if (!tuple_result) return metas.empty() ? std::string() : metas[0].to_string();
  std::string out = "(";
  for (size_t i = 0; i < metas.size(); ++i) {
    if (i) out += ", ";
    out += metas[i].to_string();
  }
  return out + ")";
}

std::string sanitize_name(const std::string& text) {
  std::string out;
  for (char c : text) {
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  }
  // Collapse runs of '_' produced by punctuation, keep a leading/trailing one as FX does.
  std::string collapsed;
  for (char c : out) {
    if (c == '_' && !collapsed.empty() && collapsed.back() == '_') continue;
    collapsed += c;
  }
  if (collapsed.empty() || std::isdigit(static_cast<unsigned char>(collapsed[0]))) {
    collapsed = "_" + collapsed;
  }
  return collapsed;
}

std::string Graph::unique_name(const std::string& hint) {
  static const std::unordered_set<std::string> kReserved = {
      "self", "torch", "operator", "None", "True", "False", "def", "return", "class",
      "lambda", "in", "is", "not", "and", "or", "if", "else", "for", "while", "import",
      "slice", "output"};  // (output: the output node's name)
  std::string base = sanitize_name(hint);
  if (kReserved.count(base)) base += "_1";
  std::string name = base;
  int& suffix = next_suffix_[base];  // add, add_1, add_2, ... in O(1) per node
  while (used_names_.count(name)) name = base + "_" + std::to_string(++suffix);
  used_names_.insert(name);
  return name;
}

Node* Graph::append(std::unique_ptr<Node> node) {
  Node* raw = node.get();
  auto link = [raw](Node* input) { input->users.push_back(raw); };
  for (const Arg& arg : raw->args) arg.for_each_node(link);
  for (const auto& kw : raw->kwargs) kw.second.for_each_node(link);
  nodes_.push_back(std::move(node));
  return raw;
}

Node* Graph::add_placeholder(const std::string& name_hint, py::object fake, TensorMeta meta) {
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::kPlaceholder;
  node->name = unique_name(name_hint);
  node->fake = std::move(fake);
  node->metas.push_back(std::move(meta));
  // Placeholders go before every call so the printed signature lists them in input order.
  auto it = std::find_if(nodes_.begin(), nodes_.end(),
                         [](const auto& n) { return n->kind != NodeKind::kPlaceholder; });
  Node* raw = node.get();
  nodes_.insert(it, std::move(node));
  return raw;
}

Node* Graph::add_call(NodeKind kind, py::object target, std::string target_text,
                      std::string infix, std::vector<Arg> args, Kwargs kwargs, py::object fake,
                      std::vector<TensorMeta> metas, bool tuple_result, int line,
                      const std::string& name_hint) {
  FJ_CHECK(kind == NodeKind::kCallFunction || kind == NodeKind::kCallMethod,
           "add_call with kind {}", node_kind_name(kind));
  FJ_CHECK(output() == nullptr, "node added after the output");
  auto node = std::make_unique<Node>();
  node->kind = kind;
  node->name = unique_name(name_hint);
  node->target = std::move(target);
  node->target_text = std::move(target_text);
  node->infix = std::move(infix);
  node->args = std::move(args);
  node->kwargs = std::move(kwargs);
  node->fake = std::move(fake);
  node->metas = std::move(metas);
  node->tuple_result = tuple_result;
  node->line = line;
  node->scope = open_scope_;
  return append(std::move(node));
}

int Graph::open_scope() {
  FJ_CHECK(open_scope_ < 0, "scopes do not nest");
  open_scope_ = scope_count_++;
  return open_scope_;
}

std::vector<std::string> Graph::scope_writes_outside(int scope) const {
  std::vector<std::string> out;
  for (const auto& node : nodes_) {
    if (node->scope != scope) continue;
    for (const Arg* written : written_arguments(*node)) {
      bool outside = false;
      written->for_each_node([&](Node* n) { outside = outside || n->scope != scope; });
      if (outside) {
        out.push_back(node->name);
        break;
      }
    }
  }
  return out;
}

namespace {

Arg remap_arg(const Arg& arg, const std::unordered_map<const Node*, Node*>& to) {
  if (arg.kind == Arg::Kind::kNode) {
    auto it = to.find(arg.node);
    FJ_CHECK(it != to.end(), "scope argument {} not mapped", arg.node->name);
    return Arg::of(it->second);
  }
  if (arg.kind == Arg::Kind::kConst) return arg;
  Arg out = arg;
  for (Arg& item : out.items) item = remap_arg(item, to);
  return out;
}

// Replaces references to `from` by `to` inside arg.
void redirect_arg(Arg& arg, const Node* from, Node* to) {
  if (arg.kind == Arg::Kind::kNode) {
    if (arg.node == from) arg.node = to;
    return;
  }
  for (Arg& item : arg.items) redirect_arg(item, from, to);
}

}  // namespace

void Graph::outline_scope(int scope, const MakeTarget& make_target, const std::string& target_text,
                          const Node& where) {
  // The body, its inputs from outside (first read first) and its values read after it.
  std::vector<Node*> body;
  std::vector<Node*> inputs;
  std::unordered_set<const Node*> in_body;
  std::unordered_set<const Node*> is_input;
  size_t first = nodes_.size();
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node* node = nodes_[i].get();
    if (node->scope != scope || node->kind == NodeKind::kPlaceholder || node->kind == NodeKind::kOutput) continue;
    first = std::min(first, i);
    body.push_back(node);
    in_body.insert(node);
  }
  if (body.empty()) return;
  for (Node* node : body) {
    auto note = [&](Node* input) {
      if (!in_body.count(input) && is_input.insert(input).second) inputs.push_back(input);
    };
    for (const Arg& arg : node->args) arg.for_each_node(note);
    for (const auto& kw : node->kwargs) kw.second.for_each_node(note);
  }
  std::vector<Node*> outputs;
  for (Node* node : body) {
    for (Node* user : node->users) {
      if (!in_body.count(user)) {
        outputs.push_back(node);
        break;
      }
    }
  }
  if (outputs.empty()) return;  // (nothing reads it: the calls stay, as dead code would)

  // The body's own graph.
  auto sub = std::make_unique<Graph>(filename_, function_name_, first_line_);
  std::unordered_map<const Node*, Node*> to;
  for (Node* input : inputs) {
    auto ph = std::make_unique<Node>();
    ph->kind = NodeKind::kPlaceholder;
    ph->name = sub->unique_name(input->name);
    ph->fake = input->fake;
    ph->metas = input->metas;
    ph->tuple_result = input->tuple_result;
    to[input] = sub->append(std::move(ph));
  }
  for (Node* node : body) {
    std::vector<Arg> args;
    for (const Arg& arg : node->args) args.push_back(remap_arg(arg, to));
    Kwargs kwargs;
    for (const auto& [key, value] : node->kwargs) kwargs.emplace_back(key, remap_arg(value, to));
    auto copy = std::make_unique<Node>();
    copy->kind = node->kind;
    copy->name = sub->unique_name(node->name);
    copy->target = node->target;
    copy->target_text = node->target_text;
    copy->infix = node->infix;
    copy->args = std::move(args);
    copy->kwargs = std::move(kwargs);
    copy->fake = node->fake;
    copy->metas = node->metas;
    copy->tuple_result = node->tuple_result;
    copy->line = node->line;
    copy->filename = node->filename;
    copy->function = node->function;
    copy->pure = node->pure;
    to[node] = sub->append(std::move(copy));
  }
  std::vector<Arg> out_args;
  py::list out_fakes;
  std::vector<TensorMeta> out_metas;
  for (Node* node : outputs) {
    out_args.push_back(Arg::of(to.at(node)));
    out_fakes.append(node->fake ? node->fake : py::none());
    out_metas.insert(out_metas.end(), node->metas.begin(), node->metas.end());
  }
  sub->set_output(std::move(out_args));
  sub->lint();
  const int line = where.line;
  const std::string& filename = where.filename;
  const std::string& function = where.function;
  py::object target = make_target(std::move(sub));

  // In this graph: one call, a getitem per output, the outputs' users redirected to them.
  for (Node* input : inputs) {
    auto& users = input->users;
    users.erase(std::remove_if(users.begin(), users.end(), [&](Node* u) { return in_body.count(u) > 0; }),
                users.end());
  }
  auto call = std::make_unique<Node>();
  call->kind = NodeKind::kCallFunction;
  call->name = unique_name("checkpoint");
  call->target = std::move(target);
  call->target_text = target_text;
  for (Node* input : inputs) call->args.push_back(Arg::of(input));
  call->fake = py::tuple(out_fakes);
  call->metas = std::move(out_metas);
  call->tuple_result = true;
  call->line = line;
  call->filename = filename;
  call->function = function;
  Node* call_raw = call.get();
  for (Node* input : inputs) input->users.push_back(call_raw);
  std::vector<std::unique_ptr<Node>> made;
  made.push_back(std::move(call));
  static PyObject* const kGetitem =
      py::object(py::module_::import("operator").attr("getitem")).release().ptr();
  for (size_t k = 0; k < outputs.size(); ++k) {
    Node* out = outputs[k];
    auto item = std::make_unique<Node>();
    item->kind = NodeKind::kCallFunction;
    item->name = out->name;  // (taken from the node moved out)
    item->target = py::reinterpret_borrow<py::object>(kGetitem);
    item->target_text = "operator.getitem";
    item->infix = "[]";
    item->args = {Arg::of(call_raw), Arg::constant(py::int_(k))};
    item->fake = out->fake;
    item->metas = out->metas;
    item->tuple_result = out->tuple_result;
    item->line = line;
    item->filename = filename;
    item->function = function;
    call_raw->users.push_back(item.get());
    for (Node* user : out->users) {
      if (in_body.count(user)) continue;
      for (Arg& arg : user->args) redirect_arg(arg, out, item.get());
      for (auto& kw : user->kwargs) redirect_arg(kw.second, out, item.get());
      if (std::find(item->users.begin(), item->users.end(), user) == item->users.end()) {
        item->users.push_back(user);
      }
    }
    made.push_back(std::move(item));
  }
  std::vector<std::unique_ptr<Node>> kept;
  kept.reserve(nodes_.size() - body.size() + made.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (i == first) {
      for (auto& m : made) kept.push_back(std::move(m));
    }
    if (in_body.count(nodes_[i].get())) continue;
    kept.push_back(std::move(nodes_[i]));
  }
  nodes_ = std::move(kept);
  lint();
}

Node* Graph::set_output(std::vector<Arg> outputs) {
  FJ_CHECK(output() == nullptr, "graph already has an output");
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::kOutput;
  node->name = "output";
  node->args.push_back(Arg::tuple(std::move(outputs)));
  return append(std::move(node));
}

void Graph::remove_unused() {
  // From the last node back: a node's users come after it, so one pass drops whole chains.
  std::vector<std::unique_ptr<Node>> kept;
  kept.reserve(nodes_.size());
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    Node* node = it->get();
    const bool droppable = node->kind == NodeKind::kCallFunction || node->kind == NodeKind::kCallMethod;
    if (droppable && (node->infix == "[]" || node->pure) && node->users.empty()) {
      auto unlink = [node](Node* input) {
        auto& users = input->users;
        users.erase(std::find(users.begin(), users.end(), node));
      };
      for (const Arg& arg : node->args) arg.for_each_node(unlink);
      for (const auto& kw : node->kwargs) kw.second.for_each_node(unlink);
      continue;
    }
    kept.push_back(std::move(*it));
  }
  std::reverse(kept.begin(), kept.end());
  nodes_ = std::move(kept);
}

std::vector<Node*> Graph::placeholders() const {
  std::vector<Node*> out;
  for (const auto& node : nodes_) {
    if (node->kind == NodeKind::kPlaceholder) out.push_back(node.get());
  }
  return out;
}

Node* Graph::output() const {
  if (nodes_.empty() || nodes_.back()->kind != NodeKind::kOutput) return nullptr;
  return nodes_.back().get();
}

int Graph::num_calls() const {
  int count = 0;
  for (const auto& node : nodes_) {
    count += node->kind == NodeKind::kCallFunction || node->kind == NodeKind::kCallMethod;
  }
  return count;
}

bool Graph::writes_without_version() const {
  for (const auto& node : nodes_) {
    if (::framejit::writes_without_version(*node)) return true;
  }
  return false;
}

bool Graph::mutates_tensors() const {
  for (const auto& node : nodes_) {
    if (mutates_an_argument(*node)) return true;
  }
  return false;
}

bool returns_none_inplace(const std::string& target_text) {
  return target_text == "operator.setitem" || target_text == "numpy.ndarray.setitem";
}

bool is_inplace_operator(const std::string& target_text) {
  static const char* kInplace[] = {"iadd", "iand", "ifloordiv", "ilshift", "imatmul", "imul",
                                   "imod", "ior", "ipow", "irshift", "isub", "itruediv", "ixor"};
  // (operator's on tensors; NumPy's on arrays of the trace, python/framejit/_numpy.py)
  for (const char* prefix : {"operator.", "numpy.ndarray."}) {
    if (target_text.compare(0, std::strlen(prefix), prefix) != 0) continue;
    for (const char* name : kInplace) {
      if (target_text.compare(std::strlen(prefix), std::string::npos, name) == 0) return true;
    }
  }
  return false;
}

namespace {

bool is_true_const(const Arg& arg) {
  return arg.kind == Arg::Kind::kConst && arg.value.ptr() == Py_True;
}

// Normalisations that update their running statistics in training: which of their positional
// arguments those are. Their names do not say so, nor (on CPU and meta tensors) their version
// counters.
struct StatsUpdating {
  const char* target;
  int running_mean;  // positional index; the keyword is "running_mean" / "running_var"
};
constexpr StatsUpdating kStatsUpdating[] = {
    {"torch.nn.functional.batch_norm", 1}, {"torch.batch_norm", 3},
    {"torch.nn.functional.instance_norm", 1}, {"torch.instance_norm", 3},
    {"torch.native_batch_norm", 3}};

const StatsUpdating* stats_updating(const Node& node) {
  for (const StatsUpdating& op : kStatsUpdating) {
    if (node.target_text != op.target) continue;
    for (const Arg& arg : node.args) {
      if (is_true_const(arg)) return &op;  // a training / use_input_stats flag
    }
    for (const auto& kw : node.kwargs) {
      if (is_true_const(kw.second)) return &op;
    }
  }
  return nullptr;
}

}  // namespace

std::vector<const Arg*> written_arguments(const Node& node) {
  std::vector<const Arg*> out;
  if (node.kind != NodeKind::kCallFunction && node.kind != NodeKind::kCallMethod) return out;
  const std::string& text = node.target_text;
  bool first = (!text.empty() && text.back() == '_') ||  // add_, torch.relu_, __setitem__
               is_inplace_operator(text) || returns_none_inplace(text);
  for (const auto& kw : node.kwargs) {
    if (kw.first == "out") out.push_back(&kw.second);
    if (kw.first == "inplace" && is_true_const(kw.second)) first = true;  // F.relu(x, inplace=True)
  }
  if (first && !node.args.empty()) out.push_back(&node.args[0]);
  if (const StatsUpdating* op = stats_updating(node)) {
    for (int i = op->running_mean; i < op->running_mean + 2 && i < static_cast<int>(node.args.size()); ++i) {
      out.push_back(&node.args[i]);
    }
    for (const auto& kw : node.kwargs) {
      if (kw.first == "running_mean" || kw.first == "running_var") out.push_back(&kw.second);
    }
  }
  return out;
}

bool mutates_an_argument(const Node& node) { return !written_arguments(node).empty(); }

bool writes_without_version(const Node& node) { return stats_updating(node) != nullptr; }

void Graph::lint() const {
  std::unordered_set<const Node*> seen;
  std::unordered_set<std::string> names;
  bool past_placeholders = false;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node* node = nodes_[i].get();
    FJ_CHECK(names.insert(node->name).second, "duplicate node name {}", node->name);
    if (node->kind == NodeKind::kPlaceholder) {
      FJ_CHECK(!past_placeholders, "placeholder {} after a call", node->name);
    } else {
      past_placeholders = true;
    }
    FJ_CHECK(node->kind != NodeKind::kOutput || i + 1 == nodes_.size(),
             "output node is not last");
    auto check_input = [&](Node* input) {
      FJ_CHECK(seen.count(input), "{} uses {} before it is defined", node->name, input->name);
      FJ_CHECK(std::count(input->users.begin(), input->users.end(), node) >= 1,
               "{} missing from the users of {}", node->name, input->name);
    };
    for (const Arg& arg : node->args) arg.for_each_node(check_input);
    for (const auto& kw : node->kwargs) kw.second.for_each_node(check_input);
    seen.insert(node);
  }
  for (const auto& node : nodes_) {
    for (const Node* user : node->users) {
      FJ_CHECK(seen.count(user), "{} lists a user that is not in the graph", node->name);
    }
  }
  FJ_CHECK(output() != nullptr, "graph has no output node");
}

}  // namespace framejit
