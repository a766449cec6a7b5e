// The symbolic interpreter: runs a frame's bytecode over abstract values, recording torch calls
// into a Graph, the sources it read into a SourceTable and what it assumed into a GuardSet.
#pragma once

#include <array>
#include <string>
#include <unordered_map>
#include <vector>

#include "bytecode/decode.h"
#include "graph/graph.h"
#include "guards/guards.h"
#include "guards/source.h"
#include "runtime/rebuild.h"
#include "trace/value.h"

namespace framejit {

class Tracer;
using OpHandler = void (*)(Tracer&, const Instr&);
using HandlerTable = std::array<OpHandler, static_cast<size_t>(Op::kUnknown) + 1>;

// Handler families, one file each (ops_*.cpp).
void register_stack_ops(HandlerTable& table);
void register_arith_ops(HandlerTable& table);
void register_attr_ops(HandlerTable& table);
void register_call_ops(HandlerTable& table);
void register_build_ops(HandlerTable& table);
void register_control_ops(HandlerTable& table);

// A keyword argument at a call: name and value.
using KwValues = std::vector<std::pair<std::string, ValuePtr>>;

class Tracer {
 public:
  // Borrowed: code, frame (both must outlive the tracer).
  Tracer(PyCodeObject* code, const Bytecode& bytecode, const FrameState& frame);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Traces from the first instruction to RETURN_VALUE. Throws Unsupported when something cannot
  // be traced; sources() and guards() then hold what was assumed up to that point.
  void run();

  // ---- results ----
  SourceTable& sources() { return sources_; }
  GuardSet& guards() { return guards_; }
  Graph& graph() { return graph_; }
  const std::vector<int>& input_slots() const { return input_slots_; }
  const Rebuild& result() const { return result_; }
  int pc() const { return pc_; }

  // ---- for opcode handlers ----
  const Instr& instr() const { return *current_; }
  void push(ValuePtr value) { stack_.push_back(std::move(value)); }
  ValuePtr pop();
  std::vector<ValuePtr> pop_n(size_t n);
  ValuePtr& peek(size_t depth = 0);
  void jump(int target) { next_pc_ = target; }
  void finish(const ValuePtr& value);

  ValuePtr local(int index);
  void set_local(int index, ValuePtr value);
  void delete_local(int index);
  ValuePtr global(const std::string& name);
  ValuePtr attr(const ValuePtr& base, const std::string& name);
  ValuePtr item(const ValuePtr& base, const ValuePtr& key);
  void store_item(const ValuePtr& container, const ValuePtr& key, const ValuePtr& value);
  ValuePtr call(const ValuePtr& fn, std::vector<ValuePtr> args, KwValues kwargs);
  // Python truthiness of a value known at trace time; throws Unsupported for tensors.
  bool truthy(const ValuePtr& value);

  py::object co_const(int index) const;
  std::string co_name(int index) const;
  std::string co_varname(int index) const;  // localsplus name
  py::object& kw_names() { return kw_names_; }

  // Records `fn(*args, **kwargs)` (kCallFunction) or `args[0].method(...)` (kCallMethod) on the
  // meta tensors and returns the abstract result. `infix` is set for operator targets.
  ValuePtr record_call(NodeKind kind, py::handle fn, const std::string& method,
                       std::vector<ValuePtr> args, KwValues kwargs, const std::string& infix,
                       const std::string& name_hint);
  // Records a call_function of an `operator` function ("add", "getitem") on the values.
  ValuePtr record_operator(const char* fn_name, const char* infix, std::vector<ValuePtr> args);
  // The tensor attribute `name` (shape, dtype, device, T, ...).
  ValuePtr tensor_attr(const ValuePtr& tensor, const std::string& name);

  // A value read from source `slot` whose live value is `real`: installs guards, makes
  // placeholders for tensors. The same slot always gives the same Value.
  ValuePtr wrap_source(int slot, py::handle real);
  // Interns `source`, reads its live value and wraps it. Returns nullptr (and forgets the source)
  // if it cannot be read: an unbound local, a missing global, key or attribute.
  ValuePtr load_source(Source source);

 private:
  void build_result(const ValuePtr& value);
  Rebuild rebuild_of(const ValuePtr& value, std::vector<Arg>& outputs,
                     std::unordered_map<Node*, int>& output_index);
  ValuePtr wrap_call_result(py::handle result, py::object device, Node* node,
                            const std::vector<ValuePtr>& args, bool inplace);
  TensorMeta meta_of(py::handle meta, py::handle device);

  PyCodeObject* code_;
  const Bytecode& bytecode_;
  FrameState frame_;
  std::vector<PyObject*> live_;  // live values of sources by slot (owned: decref'd in dtor)

  std::vector<ValuePtr> locals_;
  std::vector<ValuePtr> stack_;
  py::object kw_names_;
  const Instr* current_ = nullptr;
  int pc_ = 0;
  int next_pc_ = 0;
  bool finished_ = false;

  SourceTable sources_;
  GuardSet guards_;
  Graph graph_;
  std::vector<int> input_slots_;
  std::unordered_map<int, ValuePtr> by_slot_;
  Rebuild result_;
};

}  // namespace framejit
