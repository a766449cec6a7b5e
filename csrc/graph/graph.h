// The graph IR: a closed set of node kinds over a tree of arguments, with fake metadata per value.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/py.h"

namespace framejit {

// What the printer and the guards need to know of a tensor, without holding a tensor.
struct TensorMeta {
  std::string dtype;  // short form: f32, i64, b8, ...
  std::vector<int64_t> sizes;
  std::string device;  // "cpu", "cuda:0", ...
  bool scalar = false;  // a Python number input (dtype is "int" or "float")

  std::string to_string() const;  // f32[2, 3], plus " cuda:0" off the CPU
};

enum class NodeKind : uint8_t { kPlaceholder, kCallFunction, kCallMethod, kOutput };

const char* node_kind_name(NodeKind kind);

class Node;

// A node argument: a node, a Python constant, or a tuple/list/dict of arguments.
struct Arg {
  enum class Kind : uint8_t { kNode, kConst, kTuple, kList, kDict };
  Kind kind = Kind::kConst;
  Node* node = nullptr;
  py::object value;                // kConst
  std::vector<Arg> items;          // kTuple, kList, kDict (values)
  std::vector<std::string> keys;   // kDict

  static Arg of(Node* node);
  static Arg constant(py::object value);
  static Arg tuple(std::vector<Arg> items);
  static Arg list(std::vector<Arg> items);
  static Arg dict(std::vector<std::string> keys, std::vector<Arg> values);

  // Calls fn(Node*) for every node reference inside this argument.
  template <typename Fn>
  void for_each_node(Fn&& fn) const {
    if (kind == Kind::kNode) {
      fn(node);
      return;
    }
    for (const Arg& item : items) item.for_each_node(fn);
  }
};

using Kwargs = std::vector<std::pair<std::string, Arg>>;

class Node {
 public:
  NodeKind kind;
  std::string name;
  py::object target;        // kCallFunction: the callable; kCallMethod: the method name (str)
  std::string target_text;  // how it is printed: "torch.add", "operator.add", "mean"
  std::string infix;        // for operator targets: "+", "-", "[]" (getitem), "neg"...; else empty
  std::vector<Arg> args;
  Kwargs kwargs;
  py::object fake;                // meta tensor, or a tuple of them, or None
  std::vector<TensorMeta> metas;  // one per tensor in `fake`
  bool tuple_result = false;      // fake is a tuple (users read it through getitem nodes)
  int line = -1;                  // the user's source line
  std::string filename;           // set when the node comes from an inlined function
  std::string function;
  std::vector<Node*> users;
  bool pure = false;              // no effect but its result: dropped where nothing uses it
  int scope = -1;                 // the checkpointed function it was recorded in (open_scope)

  std::string meta_text() const;  // "f32[2, 3]" or "(f32[2], f32[2])"
};

class Graph {
 public:
  Graph(std::string filename, std::string function_name, int first_line)
      : filename_(std::move(filename)),
        function_name_(std::move(function_name)),
        first_line_(first_line) {}

  Node* add_placeholder(const std::string& name_hint, py::object fake, TensorMeta meta);
  Node* add_call(NodeKind kind, py::object target, std::string target_text, std::string infix,
                 std::vector<Arg> args, Kwargs kwargs, py::object fake,
                 std::vector<TensorMeta> metas, bool tuple_result, int line,
                 const std::string& name_hint);
  Node* set_output(std::vector<Arg> outputs);

  // Drops getitem nodes (the tracer makes one per element of a tuple result) and pure nodes
  // (arithmetic on numbers whose value the trace used as a constant) that nothing uses.
  void remove_unused();

  // Scopes: the calls recorded between open_scope() and close_scope() (a checkpointed
  // function's body) are tagged with the scope's number; outline_scope later moves them into a
  // graph of their own, called by one node. Scopes do not nest.
  int open_scope();
  void close_scope() { open_scope_ = -1; }
  int current_scope() const { return open_scope_; }
  // The scope's calls as a new graph: its placeholders the values from outside they read (in
  // the order first read), its output the tuple of its values read after it. In this graph
  // they become one call of make_target(that graph) (printed as `target_text(inputs)`) and a
  // getitem per output, which take the outputs' names. Nothing to do for a scope with no call
  // or whose values nothing reads.
  using MakeTarget = std::function<py::object(std::unique_ptr<Graph>)>;
  // `where`: the node's line, file and function (the call that opened the scope).
  void outline_scope(int scope, const MakeTarget& make_target, const std::string& target_text,
                     const Node& where);
  // The calls of the scope that write into a tensor made outside it (an input of the body):
  // their names, to report (a recompute would write them again).
  std::vector<std::string> scope_writes_outside(int scope) const;
  // The printed bodies of the outlined scopes (name, text): print_graph prints them after the
  // graph (whoever outlines fills it in).
  std::vector<std::pair<std::string, std::string>>& outlined_texts() { return outlined_texts_; }
  const std::vector<std::pair<std::string, std::string>>& outlined_texts() const { return outlined_texts_; }

  // Invariants: names unique, users consistent, args refer to earlier nodes, one output last.
  // Raises InternalError naming the first violation.
  void lint() const;

  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  std::vector<Node*> placeholders() const;
  Node* output() const;
  int num_calls() const;  // call_function + call_method nodes
  // Whether any node may write into a tensor (an input's or one made in the graph): a graph that
  // raised at run time can be run again as Python only if it wrote into no input.
  bool mutates_tensors() const;
  // Whether a node writes where version counters do not show it.
  bool writes_without_version() const;

  const std::string& filename() const { return filename_; }
  const std::string& function_name() const { return function_name_; }
  int first_line() const { return first_line_; }

 private:
  std::string unique_name(const std::string& hint);
  Node* append(std::unique_ptr<Node> node);

  std::string filename_;
  std::string function_name_;
  int first_line_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::unordered_set<std::string> used_names_;
  std::unordered_map<std::string, int> next_suffix_;  // per base name: the next _N to try
  int open_scope_ = -1;
  int scope_count_ = 0;
  std::vector<std::pair<std::string, std::string>> outlined_texts_;
};

// Calls that mutate their first argument and return None (tensor[...] = value).
bool returns_none_inplace(const std::string& target_text);
// operator.iadd, operator.imul, ...: the augmented assignments.
bool is_inplace_operator(const std::string& target_text);
// The arguments a call node may write into: self of an in-place method or function (`add_`,
// `torch.relu_`, `inplace=True`), of an augmented assignment or an item write; `out=`; the
// running statistics of a normalisation in training.
std::vector<const Arg*> written_arguments(const Node& node);
bool mutates_an_argument(const Node& node);
// Whether it writes without moving the tensors' version counters (batch norm's statistics).
bool writes_without_version(const Node& node);

// Turns any text into a Python identifier in FX's style ("inputs['x']" -> "inputs_x_").
std::string sanitize_name(const std::string& text);

}  // namespace framejit
