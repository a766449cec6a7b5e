// The symbolic interpreter: runs a frame's bytecode from an entry pc over abstract values,
// recording torch calls into a Graph, the sources it read into a SourceTable and what it assumed
// into a GuardSet, until an exit (return, or an instruction it leaves to the runtime or CPython).
#pragma once

#include <array>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bytecode/decode.h"
#include "common/check.h"
#include "graph/graph.h"
#include "guards/guards.h"
#include "guards/source.h"
#include "region/exit.h"
#include "region/rebuild.h"
#include "trace/kinds.h"
#include "trace/size_deps.h"
#include "trace/trace_host.h"
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

// Drops the cache of meta results (framejit.reset()).
void clear_meta_cache();
// How torch calls met their meta results since the process started (framejit._C.meta_stats()).
struct MetaCacheStats {
  uint64_t hits = 0;         // replayed from the cache
  uint64_t misses = 0;       // run on meta tensors, then cached
  uint64_t uncacheable = 0;  // run on meta tensors every time (in-place, unkeyable arguments)
};
MetaCacheStats& meta_cache_stats();

// A keyword argument at a call: name and value.
using KwValues = std::vector<std::pair<std::string, ValuePtr>>;

// A call site (code object, code unit of its CALL) whose callee must not be inlined, because
// tracing through it broke; the region then ends at that call instead.
using CallSite = std::pair<PyCodeObject*, int>;

// Thrown out of Tracer::run when an inlined callee cannot be traced: the caller retraces with
// `site` not inlined (at most a few times: once per level of inlining).
struct InlineBreak {
  CallSite site;
  std::string reason;
};

// Thrown out of Tracer::run when a region with symbolic sizes ends at an instruction that had a
// size expression among its operands: the caller retraces with sizes as constants (specialised),
// so a symbolic size never makes a region shorter than a constant one would.
struct StaticSizesRetrace {};

// One Python frame being traced: the region's own frame (the root) or an inlined callee.
struct TraceFrame {
  PyCodeObject* code = nullptr;  // borrowed: the root frame's, or kept alive by `function`
  const Bytecode* bytecode = nullptr;
  std::vector<ValuePtr> locals;
  std::vector<bool> dirty;  // root: locals stored or deleted during the trace
  std::vector<ValuePtr> stack;
  py::object kw_names;
  py::object function;   // inlined: the function object
  ValuePtr function_value;
  py::object globals;    // inlined: the function's globals dict (root: read through sources)
  int pc = 0;
  int call_site = -1;    // inlined: code unit of the CALL in the caller
  // A generator expression run to completion when called: its yields, returned as an iterator
  // over them (eager where Python is lazy; only `<genexpr>` code is run this way).
  bool generator = false;
  std::vector<ValuePtr> yields;
  // An __init__ inlined for a new object: the call's result is this object, not None.
  ValuePtr constructed;
};

// A value read from somewhere the guards do not cover (a torch namespace, a class attribute):
// constants for None/numbers/str/dtype/device, else an object used by reference.
ValuePtr wrap_unsourced(py::object value);

// The Python type a traced value has at run time (tensors: their exact type).
py::object type_of(const ValuePtr& value);

// "cpu", "cuda:0", ...: str() of a torch.device (read directly) or of anything else.
std::string device_string(py::handle device);

// A function-like class attribute resolved for `self` by framejit._support (is_function_like),
// bound as Python binds it: methods and property getters to self, classmethods to self's class.
// Borrowed: fn.
ValuePtr bind_class_attribute(AttrKind kind, py::handle fn, const ValuePtr& self);

// The items a value yields when iterated, if the trace knows them one by one (tuples, lists,
// an unrolled iterator's remaining items, constant tuples and ranges). Reading does not consume
// an iterator: the caller marks it exhausted once the use is traced.
bool iterable_items(const ValuePtr& v, std::vector<ValuePtr>& out);

// Whether the last dotted part of `text` ("split" of "torch.split", or a bare method name) is
// one of `names`.
bool base_name_in(const std::string& text, std::initializer_list<const char*> names);

// What the Tensor method `name` is to the tracer (cached _support.tensor_method_kind).
TensorMethodKind tensor_method_kind(const std::string& name);

class Tracer {
 public:
  // Borrowed: code, frame (both must outlive the tracer). `frame.stack` is the value stack at
  // `entry_pc` (empty at 0). Calls at `no_inline` sites are not traced into.
  Tracer(TraceHost& host, PyCodeObject* code, const Bytecode& bytecode, const FrameState& frame,
         int entry_pc, const std::map<CallSite, std::string>* no_inline = nullptr);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Traces from the entry to the first exit and fills exit(). Instructions the tracer cannot
  // handle end the region there (see ExitKind). Throws InlineBreak when an inlined callee
  // cannot be traced, InternalError on framejit bugs.
  void run();

  // ---- results ----
  SourceTable& sources() { return sources_; }
  // A tensor size (or something computed from sizes) became a Python value: the trace holds
  // for these sizes only. `what` says how, for the guards log.
  void note_size_read(const std::string& what) {
    if (size_read_.empty()) size_read_ = what;
  }
  bool sizes_read() const { return !size_read_.empty(); }
  const std::string& size_read() const { return size_read_; }
  // Finer: size `dim` of `tensor` (-1: all its sizes) became a Python value. Only the input
  // sizes it is computed from are pinned (SizeDeps), unless the walk cannot tell, which counts
  // as note_size_read. Symbolic-size traces only.
  void note_dim_read(const ValuePtr& tensor, int dim, const std::string& what);
  // Every size of `tensor` (numel, nbytes) became a Python value.
  void note_sizes_read(const ValuePtr& tensor, const std::string& what) {
    if (symbolic_sizes_) {
      note_dim_read(tensor, -1, what);
    } else {
      note_size_read(what);
    }
  }
  // How many tensors the split / chunk / unbind node `split` returns depends on sizes.
  void note_split_count(Node* split, const std::string& what);
  // The input dimensions pinned so far, by source slot, and for each the read that pinned it
  // ("L['x'].size(1): a size used as a Python value at model.py:12"), for the guards log.
  const std::map<int, std::set<int>>& pinned_dims() const { return pinned_dims_; }
  const std::vector<std::string>& dim_reads() const { return dim_reads_; }
  // "model.py:12": where the instruction being traced is.
  std::string here() const;
  GuardSet& guards() { return guards_; }
  Graph& graph() { return graph_; }
  const std::vector<Rebuild>& inputs() const { return inputs_; }
  RegionExit& exit() { return exit_; }
  const std::vector<bool>& entry_nulls() const { return entry_nulls_; }
  int instructions_traced() const { return steps_; }

  // ---- for opcode handlers: they act on the innermost frame ----
  TraceFrame& frame() { return *frames_.back(); }
  bool inlined() const { return frames_.size() > 1; }
  const Instr& instr() const { return *current_; }
  int entry_pc() const { return entry_pc_; }
  void push(ValuePtr value) { frame().stack.push_back(std::move(value)); }
  ValuePtr pop();
  std::vector<ValuePtr> pop_n(size_t n);
  ValuePtr& peek(size_t depth = 0);
  void jump(int target) { next_pc_ = target; }
  // RETURN_VALUE: ends the region in the root frame, returns to the caller in an inlined one.
  void finish(const ValuePtr& value);

  ValuePtr local(int index);
  void set_local(int index, ValuePtr value);
  void delete_local(int index);
  ValuePtr global(const std::string& name);
  // STORE_GLOBAL: replayed at the exit as setattr on the module whose __dict__ the globals are;
  // later reads in the trace see the stored value.
  void store_global(const std::string& name, ValuePtr value);
  ValuePtr attr(const ValuePtr& base, const std::string& name);
  ValuePtr item(const ValuePtr& base, const ValuePtr& key);
  // The entries of a dict that existed before the region (read by source): keys in order,
  // their list guarded, each value read by source. False if `dict` is not such a dict, or
  // has a key that is not a constant.
  bool dict_by_source(const ValuePtr& dict, std::vector<std::pair<py::object, ValuePtr>>& out);
  // getattr(obj, name[, default]), hasattr(obj, name) and setattr(obj, name, value) with a
  // constant name (access.cpp): an attribute the object lacks is guarded absent from its
  // instance dicts; setattr is `obj.name = value`.
  ValuePtr attribute_builtin(py::handle fn, const std::vector<ValuePtr>& args,
                             const KwValues& kwargs);
  bool attribute_present(const ValuePtr& base, const std::string& name);
  // The value this region last stored as base.name (replayed at the exit), or nullptr. Throws
  // Unsupported when the same object was written through another value.
  const ValuePtr* pending_attr(const ValuePtr& base, const std::string& name) const;
  // A CLASS_ATTRIBUTE guard on the class of `base` (or on `base`, a class): looking `name` up
  // on it finds something iff `present` (kTypeVersion: usually one tag compare).
  void guard_class_attribute(const ValuePtr& base, const std::string& name, bool present);
  // containers.cpp: list/tuple/dict methods answered or performed at trace time; nullptr when
  // not handled there. args[0] is self.
  ValuePtr container_method(const std::string& name, const std::vector<ValuePtr>& args,
                            const KwValues& kwargs);
  ValuePtr dict_view(const ValuePtr& self, const std::string& name);
  // super() in a method: a real super object for (__class__, the first argument), whose
  // attributes bind to the traced first argument (access.cpp).
  ValuePtr zero_arg_super();
  // grad_mode.cpp: `with torch.no_grad()` / `enable_grad()` traced into the graph.
  ValuePtr grad_mode_manager(py::handle cls);
  ValuePtr set_grad_enabled_call(const std::vector<ValuePtr>& args);
  ValuePtr inference_mode_call(const std::vector<ValuePtr>& args, const KwValues& kwargs);
  // torch.autocast(...) with arguments known at trace time: entered in the graph like
  // inference_mode (enter/exit nodes; a region breaking inside leaves the block to the runtime).
  ValuePtr autocast_call(const std::vector<ValuePtr>& args, const KwValues& kwargs);
  void enter_inference_mode(const ValuePtr& manager);
  // A region may not end inside an in-graph inference_mode block: the trace is redone with that
  // block left to the runtime (the site joins no_inline). Throws InlineBreak when one is open.
  void check_no_open_inference_block(const std::string& why);
  void enter_with(const ValuePtr& manager);
  ValuePtr exit_with(const ValuePtr& exit, const std::vector<ValuePtr>& args);
  void switch_grad_mode(bool enabled);
  // A node calling fn(arg) that switches a mode (no result the graph reads, except inference
  // mode's context, which its exit node takes).
  Node* record_mode_switch(py::handle fn, const char* target_text, Arg arg, const char* name_hint);
  Node* record_mode_switch(py::handle fn, const char* target_text, std::vector<Arg> args,
                           const char* name_hint);
  void push_with_exit(ValuePtr exit);  // BEFORE_WITH's results: the __exit__, then None
  void restore_grad_mode();  // the real mode as it was before the trace switched it
  // cls(*args, **kwargs) for a plain user class (objects.cpp): a kNewObject value, its __init__
  // (`init`, or None-like object.__init__) inlined with it as self. Pushes the object.
  void new_object(const ValuePtr& fn, py::handle cls, py::handle init, std::vector<ValuePtr> args,
                  KwValues kwargs);
  ValuePtr new_object_attr(const ValuePtr& self, const std::string& name);
  // functools.partial (objects.cpp): making one from values known at trace time, and calling
  // one (its func called with its args and keywords first). nullptr when `callable` is neither;
  // a kNull value when the call was inlined (nothing to push yet).
  ValuePtr partial_call(const ValuePtr& fn, py::handle callable, std::vector<ValuePtr>& args,
                        KwValues& kwargs);
  void new_object_store(const ValuePtr& self, const std::string& name, ValuePtr value);
  void store_item(const ValuePtr& container, const ValuePtr& key, const ValuePtr& value);
  ValuePtr call(const ValuePtr& fn, std::vector<ValuePtr> args, KwValues kwargs);
  // Traces into a Python function: binds the arguments and pushes its frame. The result is
  // pushed on the caller's stack when the callee returns.
  void inline_call(const ValuePtr& fn, py::handle function, std::vector<ValuePtr> args,
                   KwValues kwargs);
  // Calling an nn.Module without hooks: traces into type(module).forward.
  void inline_module_call(const ValuePtr& module, std::vector<ValuePtr> args, KwValues kwargs);
  // Python truthiness of a value known at trace time; throws Unsupported (kDataDependent) for
  // tensors and other values only the run time knows.
  bool truthy(const ValuePtr& value);
  // Whether a source reads the frame's own state (locals, stack, items of those): numbers there
  // are not specialised in regions that start mid-frame.
  bool is_frame_state(int slot) const;
  // Pins a number to its trace-time value (guards on every source it came from; a size in it
  // specialises the trace's sizes).
  ValuePtr specialize(const ValuePtr& value);

  // ---- symbolic sizes (sizes.cpp) ----
  // Whether sizes read from tensors stay graph values until Python needs their value.
  void set_symbolic_sizes(bool on) { symbolic_sizes_ = on; }
  // Size `dim` of a tensor value: a size expression (symbolic), or a constant that specialises
  // the trace's sizes. `how` names the read for the guards log.
  ValuePtr tensor_size(const ValuePtr& tensor, int64_t dim, const std::string& how);
  // x.shape / x.size(): a torch.Size of tensor_size() items.
  ValuePtr tensor_shape(const ValuePtr& tensor, const std::string& how);
  // The graph node computing a size expression (x.size(0), then operator nodes on it), made
  // once per value.
  Node* size_node(const ValuePtr& value);
  // The value with every size expression in it pinned to its trace-time value.
  ValuePtr concretize(const ValuePtr& value);
  // After an in-place op on `tensor` that may change its shape (x.t_(), x.unsqueeze_(0)): the
  // sizes read from it before are pinned (they are what they were, not what the tensor has now).
  void pin_sizes_of(const ValuePtr& tensor, const std::string& why);
  // Arguments of a call answered at trace time (a metadata query): every number known only at
  // run time, sizes included, pinned to its trace-time value (also inside containers).
  void make_constant_args(std::vector<ValuePtr>& args, KwValues& kwargs);
  // The children of a module container with a source (ModuleList, Sequential, ParameterList),
  // or the keys of a ModuleDict, in iteration order, with a guard on their number. False for
  // anything else.
  bool module_children(const ValuePtr& container, std::vector<ValuePtr>& out);
  // Module.modules(), named_modules(), children(), parameters(), named_buffers(), ... of a
  // module with a source: an iterator over the live tree, each member read by source, with the
  // exact keys of every _modules (and _parameters / _buffers) dict on the way guarded.
  ValuePtr module_listing(py::handle fn, const std::vector<ValuePtr>& args, const KwValues& kwargs);
  // (key, value read by source) of module.<store> (_modules, _parameters, _buffers), an exact
  // dict whose key list is guarded.
  std::vector<std::pair<std::string, ValuePtr>> module_dict_items(const ValuePtr& module,
                                                                  const char* store);
  // obj.name = value on an object that existed before the region: recorded, read back by later
  // loads in the trace, and replayed at the exit.
  void store_attr(const ValuePtr& target, const std::string& name, ValuePtr value);
  // Cells (closure variables): the content of a cell value, and storing into one.
  ValuePtr cell_get(const ValuePtr& cell);
  void cell_set(const ValuePtr& cell, ValuePtr value);
  // COPY_FREE_VARS: the cells of the current frame's function closure.
  void copy_free_vars(int n);

  py::object co_const(int index) const;
  std::string co_name(int index) const;
  std::string co_varname(int index) const;  // localsplus name
  py::object& kw_names() { return frame().kw_names; }
  // The globals dict of the innermost frame.
  py::object frame_globals() {
    return inlined() ? frame().globals : py::reinterpret_borrow<py::object>(frame_.globals);
  }

  // Records `fn(*args, **kwargs)` (kCallFunction) or `args[0].method(...)` (kCallMethod) on the
  // meta tensors and returns the abstract result. `infix` is set for operator targets.
  ValuePtr record_call(NodeKind kind, py::handle fn, const std::string& method,
                       std::vector<ValuePtr> args, KwValues kwargs, const std::string& infix,
                       const std::string& name_hint);
  // Records a call_function of an `operator` function ("add", "getitem") on the values.
  ValuePtr record_operator(const char* fn_name, const char* infix, std::vector<ValuePtr> args);
  // The rows of a tensor being iterated or unpacked (`for x in xs`, `a, b = x`): a tuple of
  // x.unbind(0)'s results, as Tensor.__iter__ does; how many there are guards x's first size.
  ValuePtr tensor_rows(const ValuePtr& tensor);
  // The tensor attribute `name` (shape, dtype, device, T, ...).
  ValuePtr tensor_attr(const ValuePtr& tensor, const std::string& name);
  // The graph input standing for a float SymNum used in a torch call (one per value).
  ValuePtr scalar_input(const ValuePtr& value);
  TraceHost& host() { return host_; }

  // A value read from source `slot` whose live value is `real`: installs guards, makes
  // placeholders for tensors. The same slot always gives the same Value.
  ValuePtr wrap_source(int slot, py::handle real);
  // Interns `source`, reads its live value and wraps it. Returns nullptr (and forgets the source)
  // if it cannot be read: an unbound local, a missing global, key or attribute.
  ValuePtr load_source(Source source);
  // The live value source `slot` was read as (Borrowed; the tracer holds it). Only for slots
  // load_source has read.
  PyObject* live_value(int slot) const {
    FJ_CHECK(slot >= 0 && static_cast<size_t>(slot) < live_.size() && live_[slot] != nullptr,
             "slot {} was not read", slot);
    return live_[slot];
  }

 private:
  std::optional<bool> grad_at_start_;  // set once the trace switched the real grad mode
  // Open in-graph inference_mode and autocast blocks (their BEFORE_WITH), and for each the
  // function that leaves it and its trace-time context, innermost last.
  std::vector<CallSite> inference_sites_;
  std::vector<std::pair<py::object, py::object>> inference_contexts_;
  void enter_mode_block(const ValuePtr& manager, ObjRole exit_role, py::object enter,
                        const char* enter_text, std::vector<Arg> enter_args,
                        py::tuple real_args, py::object leave, const char* name_hint);
  std::string size_read_;  // the first way a size was read, "" if none
  std::vector<std::string> dim_reads_;
  std::map<int, std::set<int>> pinned_dims_;
  std::unordered_map<Node*, int> tensor_slots_;  // tensor placeholder -> its source slot
  // Nodes whose tensor changed shape in place after they were made (x.t_(), x.unsqueeze_(0)).
  std::unordered_set<Node*> reshaped_;
  RankMemo ranks_;
  void note_size_deps(SizeDeps& deps, const std::string& what);
  bool symbolic_sizes_ = false;
  // Size expression leaves by (tensor node, dim), and the graph nodes made for size expressions.
  std::map<std::pair<Node*, int64_t>, ValuePtr> size_leaves_;
  // Keyed by address, so each entry holds its key alive: a freed Value's address is reused.
  std::unordered_map<const Value*, std::pair<ValuePtr, Node*>> size_nodes_;
  bool stack_holds_size_expr() const;
  // The size expression leaf for size `dim` (whose value now is `value`) of a tensor, made once.
  ValuePtr size_leaf(const ValuePtr& tensor, int64_t dim, py::handle value);
  void wrap_entry_stack();
  void end_at(const Instr& ins, const Unsupported& why);
  std::vector<ValuePtr> bind_arguments(PyCodeObject* code, py::handle function,
                                       const ValuePtr& fn, std::vector<ValuePtr> args,
                                       KwValues kwargs);
  void build_exit_state(ExitKind kind);
  void build_attr_writes();
  Rebuild rebuild_of(const ValuePtr& value);
  TensorMeta meta_of(py::handle meta, py::handle device);
  // Marks a node made inside an inlined callee with the callee's file and function.
  void locate(Node* node);

  TraceHost& host_;
  PyCodeObject* code_;  // the root frame's code
  FrameState frame_;
  int entry_pc_;
  const std::map<CallSite, std::string>* no_inline_;
  std::vector<PyObject*> live_;  // live values of sources by slot (owned: decref'd in dtor)

  std::vector<std::unique_ptr<TraceFrame>> frames_;  // [0] is the root
  std::vector<bool> entry_nulls_;
  const Instr* current_ = nullptr;
  int next_pc_ = 0;
  int steps_ = 0;
  bool finished_ = false;

  SourceTable sources_;
  GuardSet guards_;
  Graph graph_;
  std::vector<Rebuild> inputs_;
  std::unordered_map<int, ValuePtr> by_slot_;
  // Key (held alive, as above) -> the graph input standing for it.
  std::unordered_map<const Value*, std::pair<ValuePtr, ValuePtr>> scalar_inputs_;
  struct PendingWrite {
    ValuePtr target;
    std::string name;
    ValuePtr value;
  };
  std::vector<PendingWrite> attr_writes_;  // in program order (global writes: on the module)
  RegionExit exit_;
  // Exit rebuilding state.
  std::vector<Arg> outputs_;
  std::unordered_map<Node*, int> output_index_;
};

}  // namespace framejit
