// The symbolic interpreter: runs a frame's bytecode from an entry pc over abstract values until an
// exit (a return, or an instruction it leaves to the runtime or CPython). It owns the frames, the
// value stacks and the pc loop; what the trace learns lives in its components, each with its own
// header: the entry state (sources, live values, inputs, guards), the graph recorder, the size
// tracker, side effects, the mode stack and the exit builder. Handlers reach them through the
// accessors below.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bytecode/decode.h"
#include "common/check.h"
#include "trace/entry_state.h"
#include "trace/exit_builder.h"
#include "trace/mode_stack.h"
#include "trace/python_rules.h"
#include "trace/recorder.h"
#include "trace/retrace.h"
#include "trace/side_effects.h"
#include "trace/sizes.h"
#include "trace/trace_host.h"
#include "trace/trace_site.h"
#include "trace/value.h"

namespace framejit {

class Tracer;

// Thrown by Python semantics that raise at trace time where CPython would (a missing key of a
// dict read by source, its absence guarded): the run loop puts the instruction's stack back
// and raises `exc` there (Tracer::raise_exception), so a try block in the trace catches it.
struct TracedRaise {
  ValuePtr exc;
};

// cls(*args, **kwargs) for an exception class whose __new__ and __init__ are builtin (no
// Python code runs): the exception, made now, with what remakes a fresh one at a region's exit
// (Value::remake); nullptr for other classes (generators.cpp).
ValuePtr simple_exception(py::handle cls, const py::tuple& args, const py::dict& kwargs);

// Whether the trace inlines the Python function `fn` (calls.cpp): the policy traces its file, or
// it is a helper of torch.nn's own modules or functional.
bool is_user_function(TraceHost& host, py::handle fn);

using OpHandler = void (*)(Tracer&, const Instr&);
using HandlerTable = std::array<OpHandler, static_cast<size_t>(Op::kUnknown) + 1>;

// Handler families, one file each (ops_*.cpp).
void register_stack_ops(HandlerTable& table);
void register_arith_ops(HandlerTable& table);
void register_attr_ops(HandlerTable& table);
void register_call_ops(HandlerTable& table);
void register_build_ops(HandlerTable& table);
void register_match_ops(HandlerTable& table);
void register_control_ops(HandlerTable& table);

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
  // Any other generator function's frame (trace/generators.cpp): held by its kIter kGenerator
  // value, on the frame stack only while it runs. kStep: a FOR_ITER asked for one item (a yield
  // suspends the frame and hands the item over; the return ends the loop, which goes on at
  // `exhausted_pc`); kDrain: run to the end for a consumer that needs its items (they collect
  // in `yields`), whose instruction then runs again. `owner` is set while it runs.
  // kNext: next(gen[, default]) asked for one item: as kStep, but the return gives `default`.
  // kSend: `yield from` (SEND) asked for one item: its yield goes above the receiver, its
  // return value goes on at `exhausted_pc` (the SEND's target).
  // kBuffer: a consumer that steps it (zip, a builtin) asked for one item: the yield is kept on
  // the iterator (its `items`) and the consumer's instruction runs again.
  enum class GenMode : uint8_t { kStep, kNext, kDrain, kSend, kBuffer };
  bool lazy_generator = false;
  GenMode gen_mode = GenMode::kStep;
  int exhausted_pc = -1;
  int suspended_at = -1;  // code unit of the yield it last stopped at (-1: not started)
  ValuePtr next_default;  // kNext
  Value* owner = nullptr;
  ValuePtr owner_kept;    // kNext: the iterator, which only the CALL's arguments held
  CallSite made_at;  // where the generator function was called: not inlined there on a retrace
  // An __init__ inlined for a new object: the call's result is this object, not None.
  ValuePtr constructed;
  // A class's own __getattribute__ inlined for getattr(obj, name, default) / hasattr: an
  // attribute found missing (object.__getattribute__'s AttributeError) in it or in what it
  // calls makes the call's result `on_missing` (the default, False); a return makes it
  // `on_found` where set (True), else the value returned.
  ValuePtr on_missing;
  ValuePtr on_found;
  // A __contains__ inlined for `in` (1) / `not in` (2), a __bool__ / __len__ for a truth test
  // (1): the call's result is the truth of what it returns (negated for 2). A __len__ inlined
  // for len() (3): what it returns, which must be a non-negative int known at trace time.
  int result_truth = 0;
  // A __setattr__ / __setitem__ inlined for STORE_ATTR / STORE_SUBSCR: its result is dropped.
  bool discard_result = false;
  // The function torch.utils.checkpoint.checkpoint was called with: the calls recorded until it
  // returns are the checkpointed body (GraphRecorder::open_checkpoint).
  bool checkpoint_body = false;
  // A property getter inlined for LOAD_ATTR's method form on 3.13: its result goes under the
  // NULL that CALL expects above a callable (pyver::kNullAboveCallable).
  bool null_above_result = false;
};

class Tracer {
 public:
  static constexpr size_t kMaxFrames = 24;  // inlined frames; deeper recursion ends at the call

  // Borrowed: code, frame (both must outlive the tracer). `frame.stack` is the value stack at
  // `entry_pc` (empty at 0). Calls at `no_inline` sites are not traced into.
  Tracer(TraceHost& host, PyCodeObject* code, const Bytecode& bytecode, const FrameState& frame,
         int entry_pc, const std::map<CallSite, std::string>* no_inline = nullptr);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // What size expressions the trace's stacks hold (StaticSizesRetrace), in increasing order.
  enum class SizeExprKind : uint8_t { kNone, kIntInputs, kSizes };

  // Traces from the entry to the first exit and fills exit(). Instructions the tracer cannot
  // handle end the region there (see ExitKind). Throws InlineBreak when an inlined callee
  // cannot be traced, StaticSizesRetrace, CompilingFlagRetrace, InternalError on framejit bugs.
  void run();
  // What `torch.compiler.is_compiling()` and the library checks built on it answer: True
  // unless a trace that answered True raised (CompilingFlagRetrace).
  void set_compiling_answer(bool answer) { compiling_answer_ = answer; }

  // ---- components ----
  EntryState& entry() { return entry_; }
  GraphRecorder& recorder() { return recorder_; }
  SizeTracker& sizes() { return sizes_; }
  SideEffects& side_effects() { return effects_; }
  ModeStack& modes() { return modes_; }
  RegionExit& exit() { return exits_.exit(); }
  bool may_inline(const CallSite& site) const { return !no_inline_ || !no_inline_->count(site); }
  // The path of inlined calls to the instruction being traced (see CallSite); path_to(i): to
  // the call that made frame i.
  CallSite call_site_here() const;
  CallSite path_to(size_t frame_index) const;
  const std::vector<bool>& entry_nulls() const { return entry_nulls_; }
  int instructions_traced() const { return steps_; }

  // ---- the interpreter, for opcode handlers: they act on the innermost frame ----
  TraceFrame& frame() { return *frames_.back(); }
  bool inlined() const { return frames_.size() > 1; }
  const Instr& instr() const { return *site_.instr; }
  int entry_pc() const { return entry_pc_; }
  void push(ValuePtr value) { frame().stack.push_back(std::move(value)); }
  ValuePtr pop();
  std::vector<ValuePtr> pop_n(size_t n);
  ValuePtr& peek(size_t depth = 0);
  void jump(int target) { next_pc_ = target; }
  // RETURN_VALUE: ends the region in the root frame, returns to the caller in an inlined one.
  void finish(const ValuePtr& value);

  ValuePtr local(int index);
  // The local's value, or a Null where it is unbound (LOAD_FAST_AND_CLEAR).
  ValuePtr local_or_null(int index);
  void set_local(int index, ValuePtr value);
  void delete_local(int index);
  ValuePtr global(const std::string& name);
  // STORE_GLOBAL: replayed at the exit as setattr on the module whose __dict__ the globals are;
  // later reads in the trace see the stored value.
  void store_global(const std::string& name, ValuePtr value);
  py::object co_const(int index) const;
  std::string co_name(int index) const;
  std::string co_varname(int index) const;  // localsplus name
  py::object& kw_names() { return frame().kw_names; }
  // The globals dict of the innermost frame.
  py::object frame_globals() {
    return inlined() ? frame().globals : py::reinterpret_borrow<py::object>(entry_.frame().globals);
  }
  // Python truthiness of a value known at trace time; throws Unsupported (kDataDependent) for
  // tensors and other values only the run time knows.
  bool truthy(const ValuePtr& value);
  // A callable and the NULL that CALL expects with it (no self), in this version's stack order
  // (pyver::kNullAboveCallable).
  void push_with_null(ValuePtr callable);
  // 3.13's conversions to bool before a conditional jump (TO_BOOL, COMPARE_OP's bool bit): the
  // value's truth as a constant where the trace knows it. A truth that depends on a tensor's
  // value leaves the value as it is when a conditional jump follows `i` (that jump ends the
  // region as a branch, whose truth the runtime takes); anywhere else the region ends at `i`,
  // so CPython converts the real value (3.13's jumps and UNARY_NOT accept only a bool).
  ValuePtr as_bool_for_jump(ValuePtr value, const Instr& i);

  // ---- Python semantics over values (access.cpp, calls.cpp, inline.cpp, objects.cpp,
  // containers.cpp, torch_calls.cpp) ----
  // base.name. How a class's own __getattribute__ (in Python) is met: kValue: the read is
  // unsupported (a break); kInlinable: a kAttrHook value comes back, for LOAD_ATTR to inline the
  // call; kGeneric: looked up past it, as object.__getattribute__ does (super().__getattribute__
  // inside that method).
  enum class AttrLookup : uint8_t { kValue, kInlinable, kGeneric };
  ValuePtr attr(const ValuePtr& base, const std::string& name, AttrLookup how = AttrLookup::kValue);
  // base.name as Python reads it: a property's getter or the class's __getattribute__ is
  // inlined (nullptr: the value arrives with that call's return), anything else is attr().
  ValuePtr read_attribute(const ValuePtr& base, const std::string& name,
                          AttrLookup how = AttrLookup::kInlinable);
  // The second half of read_attribute, for what attr() gave: a property's getter or a
  // __getattribute__ hook is inlined (nullptr), anything else is the value.
  ValuePtr finish_read(const ValuePtr& attribute);
  // A kAttrHook for `base.name` that Python finds nowhere, where type(base) has a __getattr__
  // the trace can inline (the missing attribute guarded to stay missing); nullptr otherwise.
  ValuePtr missing_attribute_hook(const ValuePtr& base, const std::string& name, AttrLookup how);
  // For `base.name` that Python finds nowhere and no __getattr__ makes up: a kAttrHook that
  // raises the AttributeError in the trace (the absence guarded); nullptr where that is not
  // decided without running code.
  ValuePtr missing_attribute_raise(const ValuePtr& base, const std::string& name, AttrLookup how);
  ValuePtr item(const ValuePtr& base, const ValuePtr& key);
  // base[key] for a constant key the dict lacks, where its class makes the value: a
  // defaultdict whose factory the trace calls (a lambda, a class, set: the call and the store
  // are inlined; one that existed before the region is adopted first, make_writable), or a
  // dict subclass with a Python __missing__ (Counter's 0: inlined, the key's absence guarded).
  // True: the value arrives with that call's return.
  bool missing_key(const ValuePtr& base, const ValuePtr& key);
  // obj.name = value on an object that existed before the region: recorded, read back by later
  // loads in the trace, and replayed at the exit. On an object the trace made: stored, or its
  // class's Python __setattr__ inlined (true: the call's frame is pushed; its result is the
  // caller's to set).
  bool store_attr(const ValuePtr& target, const std::string& name, ValuePtr value);
  // del obj.name on an object the trace made: deleted, or its class's Python __delattr__
  // inlined (true: the call's frame is pushed; its result is dropped). Unsupported on anything
  // else.
  bool delete_attr(const ValuePtr& target, const std::string& name);
  // The write of obj.name = value on an object that existed before (generic: object.__setattr__,
  // past the class's own), recorded for the exit; false (nothing inlined).
  bool record_store(const ValuePtr& target, const std::string& name, ValuePtr value, bool generic);
  // container[key] = value; true where the container's Python __setitem__ was inlined.
  bool store_item(const ValuePtr& container, const ValuePtr& key, const ValuePtr& value);
  // del container[key] on a list or dict (one that existed before: see make_writable).
  void delete_item(const ValuePtr& container, const ValuePtr& key);
  // getattr / hasattr / setattr with a constant name; an absent attribute is guarded absent.
  ValuePtr attribute_builtin(py::handle fn, const std::vector<ValuePtr>& args,
                             const KwValues& kwargs);
  // generic: as object.__getattribute__ finds it (past the class's own __getattribute__).
  bool attribute_present(const ValuePtr& base, const std::string& name, bool generic = false);
  // object.__getattribute__ found no attribute `name` on base: AttributeError. Caught by the
  // innermost getattr-with-default / hasattr whose __getattribute__ call is being traced (its
  // frames are dropped and its result pushed) when no try block lies in between; else
  // unsupported.
  void raise_missing_attribute(const ValuePtr& base, const std::string& name);
  // A guard that looking `name` up on the class of `base` (or on `base`, a class) finds
  // something iff `present` (with `same_object`: finds what it finds now, a method replaced on
  // the class fails it).
  // Guards what super().name resolved to: see access.cpp.
  void guard_super_attribute(const ValuePtr& proxy, const std::string& name);
  void guard_class_attribute(const ValuePtr& base, const std::string& name, bool present,
                             bool same_object = false);
  // Whether `value`, read by source, answers `name` (keys, items, __iter__, __contains__, ...) as
  // a plain dict does: a dict or OrderedDict, or an instance of a subclass (ModelOutput, a user
  // OrderedDict) whose class leaves that builtin method as it is, which is then guarded.
  bool reads_as_dict(const ValuePtr& value, const char* name);
  // dict[key] of a dict (subclass) read by source, as stored (past a class's own __getitem__);
  // the key is known present.
  ValuePtr stored_item(const ValuePtr& dict, const py::object& key);
  // keys() / values() / items() of a dict (subclass) read by source, from its storage in its
  // own order, the keys guarded: for callers that checked the method they stand for
  // (reads_as_dict: `for k in d` checks __iter__, d.items() checks items).
  ValuePtr stored_view(const ValuePtr& self, const std::string& name);
  // The entries of a dict that existed before the region (read by source), keys guarded.
  bool dict_by_source(const ValuePtr& dict, std::vector<std::pair<py::object, ValuePtr>>& out);
  // os.environ[key] / .get(key, fallback) / `key in os.environ` (contains), os.environ read by
  // source: answered from its data dict, the key's presence and value guarded; nullptr for any
  // other container. A missing key without a fallback ends the region (KeyError).
  ValuePtr environ_lookup(const ValuePtr& env, const ValuePtr& key, const ValuePtr& fallback,
                          bool contains);
  // A tensor's value where the trace knows it (Value::known, not changed in place since), the
  // numbers it came from pinned; an empty object where it does not.
  py::object known_value(const ValuePtr& tensor);
  // Standard-library calls answered by the tracer (stdlib_calls.cpp): a Logger's level checks
  // (isEnabledFor, and debug / info / ... / log when the level is disabled: nothing), and
  // logging.getLogger(name) of an existing logger; nullptr for any other call, or one these
  // cannot answer (the call is then treated as any other).
  ValuePtr stdlib_call(const ValuePtr& fn, const std::vector<ValuePtr>& args, const KwValues& kwargs);
  // logger.isEnabledFor(level) for a Logger read by source and a level known at trace time,
  // guarded by what it read (logger.disabled, logger._cache[level]); nullopt when not answered.
  std::optional<bool> logger_enabled(const ValuePtr& logger, const ValuePtr& level);
  ValuePtr logger_lookup(const std::vector<ValuePtr>& args, const KwValues& kwargs);
  // var.get / var.set / var.reset of a contextvars.ContextVar read by source: the method bound
  // to it (calls answered by stdlib_call); nullptr for anything else.
  ValuePtr context_var_method(const ValuePtr& base, const std::string& name);
  // The call of one of those: get() reads the variable by source (its value guarded as any
  // value read by source is) or gives what this region set; set(v) gives a token of the trace
  // (ObjRole::kContextToken) and reset(token) undoes it; the exit replays var.set(value) for
  // each variable whose value then differs from its entry's.
  ValuePtr context_var_call(const std::string& name, const ValuePtr& var, const std::vector<ValuePtr>& args,
                            const KwValues& kwargs);
  // Before an exit is built: a token in the state it keeps traces again with the set that made
  // it left to Python (InlineBreak); then var.set(value) for each variable this region changed.
  void check_context_tokens(const std::vector<ValuePtr>& values);
  void add_context_writes();
  // An Enum member's .value / .name (also _value_ / _name_): a constant, the member guarded by
  // identity; nullptr for anything else.
  ValuePtr enum_member_attr(const ValuePtr& member, const std::string& name);
  // An Enum member as the constant it is (guarded by identity), for builtins that read it
  // (int(act), str(mode)); any other value as it is.
  ValuePtr enum_as_constant(const ValuePtr& value);
  // NumPy on arrays of the trace (numpy_calls.cpp): each function, method, operator and
  // attribute one graph node run by torch._numpy (python/framejit/_numpy.py).
  // x.numpy(force=...): the same graph value as a NumPy array.
  ValuePtr tensor_to_numpy(const ValuePtr& tensor, const std::vector<ValuePtr>& args, const KwValues& kwargs);
  // A call of a NumPy function (or of torch.from_numpy / as_tensor / tensor on an array) when an
  // argument is an array of the trace (has_array) or it makes an array from constants; nullptr
  // when not.
  ValuePtr numpy_function_call(py::handle fn, const std::vector<ValuePtr>& args, const KwValues& kwargs,
                               bool has_array);
  ValuePtr ndarray_method(const std::string& name, const std::vector<ValuePtr>& args, const KwValues& kwargs);
  ValuePtr ndarray_operator(const char* op, const std::vector<ValuePtr>& args);
  ValuePtr ndarray_attr(const ValuePtr& array, const std::string& name);
  // Whether a value is (or holds, in its containers) an array of the trace.
  static bool holds_ndarray(const ValuePtr& value);
  // The dict() builtin: a dict of the trace.
  ValuePtr dict_call(const std::vector<ValuePtr>& args, const KwValues& kwargs);
  // collections.deque(iterable=(), maxlen=None): a list of the trace made as a deque
  // (Value::is_deque), rebuilt as one where it leaves the region.
  ValuePtr deque_call(const std::vector<ValuePtr>& args, const KwValues& kwargs);
  // A deque's own method on a deque of the trace (args[0]); nullptr for the rest (those it
  // shares with list are container_method's).
  ValuePtr deque_method(const std::string& name, const std::vector<ValuePtr>& args);
  // The (key, value) entries dict(from) / d.update(from) take, in order: a dict of the trace, an
  // object it made over one, a dict read by source (keys guarded), a constant dict, or pairs
  // (a list, tuple or iterator of two-item sequences; an iterator is consumed). False, with
  // nothing consumed, for anything else.
  bool mapping_entries(const ValuePtr& from, std::vector<std::pair<py::object, ValuePtr>>& out);
  // The children of a module container with a source (ModuleList, Sequential, ...), or the
  // keys of a ModuleDict, in iteration order, their number guarded. False for anything else.
  bool module_children(const ValuePtr& container, std::vector<ValuePtr>& out);
  // Module.modules(), parameters(), ...: an iterator over the live tree, read by source.
  ValuePtr module_listing(py::handle fn, const std::vector<ValuePtr>& args, const KwValues& kwargs);
  // (key, value read by source) of module.<store> (_modules, _parameters, _buffers).
  std::vector<std::pair<std::string, ValuePtr>> module_dict_items(const ValuePtr& module,
                                                                  const char* store);
  // A number the region computes from run-time numbers: evaluated at the exit (see
  // RegionExit::checks) whether or not anything reads it.
  void note_runtime_number(const ValuePtr& number) {
    if (!number->is_size_expr()) runtime_numbers_.push_back(number);
  }
  // Whether an instruction the region traced is covered by another exception handler than its
  // entry instruction (or, in an inlined callee, by any): an exception raised at the region's
  // entry would then skip a try/except the failing op was inside.
  bool crosses_handlers() const { return crosses_handlers_; }
  // Before the trace changes `container` in place: a list or exact dict that existed before the
  // region (read by source) becomes the trace's (Value::adopted; a dict's keys are guarded in
  // order and its items read by source), and the exit writes its final contents into the real
  // object. Nothing for containers the trace made; unsupported for anything else.
  void make_writable(const ValuePtr& container);
  // list/tuple/dict methods answered or performed at trace time; nullptr when not handled.
  ValuePtr container_method(const std::string& name, const std::vector<ValuePtr>& args,
                            const KwValues& kwargs);
  // The items of d.keys() / values() / items() as a list value, now (a sourced dict's keys are
  // guarded); nullptr for what is no dict.
  ValuePtr dict_view(const ValuePtr& self, const std::string& name);
  // iter(seq): an iterator value over what the trace knows item by item (GET_ITER, and the
  // arguments of enumerate / zip); unsupported for anything else.
  ValuePtr iterator_of(const ValuePtr& seq);
  // The members of an Enum class, in definition order; false if its metaclass iterates
  // otherwise.
  bool enum_members(const ValuePtr& cls, std::vector<ValuePtr>& out);
  // The items of a set (or frozenset) read by source in the order it iterates them now, that
  // order guarded; false for a set of items a guard cannot compare.
  bool set_items_by_source(const ValuePtr& set, std::vector<ValuePtr>& out);
  // enumerate / zip / reversed as iterators that read their arguments lazily; nullptr when not
  // handled here.
  ValuePtr iterator_builtin(const std::string& name, const std::vector<ValuePtr>& args,
                            const KwValues& kwargs);
  // super() in a method: binds to the traced first argument.
  ValuePtr zero_arg_super();
  // Cells (closure variables), and COPY_FREE_VARS.
  ValuePtr cell_get(const ValuePtr& cell);
  void cell_set(const ValuePtr& cell, ValuePtr value);
  void copy_free_vars(int n);
  // `fn` as a value with a source: itself, or (a function bound from a class, Value::class_of)
  // read off that class; nullptr when it has none.
  ValuePtr function_source(const ValuePtr& fn);

  // A call: the result, or nullptr when the callee was inlined (its frame pushed; the result
  // comes with its return).
  ValuePtr call(const ValuePtr& fn, std::vector<ValuePtr> args, KwValues kwargs);
  ValuePtr autograd_function_call(std::vector<ValuePtr> args, KwValues kwargs);
  // Traces into a Python function / an nn.Module without hooks (type(module).forward).
  // A generator function's call (may_make_generator) pushes its generator, not started.
  void inline_call(const ValuePtr& fn, py::handle function, std::vector<ValuePtr> args,
                   KwValues kwargs, bool may_make_generator = false);
  // module(*args, **kwargs) through nn.Module.__call__: its forward inlined (nullptr), or the
  // value of a forward set on the instance called as any callable.
  ValuePtr inline_module_call(const ValuePtr& module, std::vector<ValuePtr> args, KwValues kwargs);

  // ---- generators and exceptions inside the trace (generators.cpp) ----
  // Runs the frame of the live generator `it` (kIter kGenerator) from where it stopped, pushed
  // above the current frame; `exhausted_pc` (kStep) is where the FOR_ITER's loop ends.
  // `keep`: the iterator's value where nothing else holds it while the frame runs (next()).
  void resume_generator(Value& it, TraceFrame::GenMode mode, int exhausted_pc,
                        ValuePtr keep = nullptr);
  // YIELD_VALUE in a generator frame the trace runs.
  void generator_yield(ValuePtr value, const Instr& i);
  // iter(obj) where obj's class defines __iter__ as a Python generator function: its generator
  // (not started); nullptr for anything else.
  ValuePtr python_generator_iter(const ValuePtr& obj);
  // `raise exc` at the current instruction (RAISE_VARARGS, RERAISE): the innermost handler in
  // an inlined frame takes it (the frames above it dropped, a generator among them finished);
  // unsupported where none would before the root frame, which CPython then raises in.
  void raise_exception(const ValuePtr& exc);
  // PUSH_EXC_INFO / POP_EXCEPT: the exception an except block handles (bare `raise`).
  ValuePtr handled_exception() const { return handling_.empty() ? nullptr : handling_.back().exc; }
  void enter_handler(ValuePtr exc) { handling_.push_back({std::move(exc), frames_.size() - 1}); }
  void leave_handler() {
    if (!handling_.empty()) handling_.pop_back();
  }
  // When the class of `self` (a plain object, not a class, or an object the trace made) defines
  // the special method `name` as a Python function (a Mapping subclass's __contains__ / __len__ /
  // __getitem__, ModelOutput's __setitem__): guards that on the class where `self` has a source
  // (or its class one) and inlines name(self, *rest). False, doing nothing, otherwise.
  // Borrowed: name (an interned str).
  bool inline_special_method(const ValuePtr& self, PyObject* name, std::vector<ValuePtr> rest,
                             bool may_make_generator = false);
  // The truth of an object (made in the trace or read by source) whose class decides it in
  // Python (__bool__, else __len__): that method inlined, its result's truth pushed as a bool
  // on its return (true: the call's frame is pushed).
  bool inline_truth(const ValuePtr& value);
  // `a <op> b` (a binary operator, its in-place form or a comparison) where the class of a or b
  // defines the operator in Python (`__add__`, `__radd__`, `__iadd__`, `__eq__`, ...): the
  // methods Python would try, in its order (a subclass's reflected method first, `!=` through
  // `__eq__` negated), run by _python_forms.trace_operator, which returns the first answer that
  // is not NotImplemented (true: its frame is pushed). What each lookup found is guarded. False,
  // doing nothing, where neither class does, or where an attempt would be C code not known to
  // answer NotImplemented (a builtin other than a number, None, str or a tensor).
  struct OperatorMethods {
    const char* name;       // "__add__", "__lt__"
    const char* reflected;  // "__radd__", "__gt__"
    const char* inplace;    // "__iadd__" for `+=`; nullptr otherwise
    const char* symbol;     // "+", "+=", "<": for the TypeError
    bool comparison;
  };
  bool inline_operator(const ValuePtr& a, const ValuePtr& b, const OperatorMethods& op);
  // `-v` / `+v` / `~v` where the class of v defines `name` (`__neg__`, ...) as a Python function
  // the policy traces: inlined (true).
  bool inline_unary_operator(const ValuePtr& v, const char* name);
  // The current instruction runs again once the frame goes on (after a call it inlined).
  void repeat_instruction() { next_pc_ = frame().pc; }
  // BEFORE_WITH on an object whose class defines __enter__ and __exit__ as Python functions the
  // policy traces: pushes the bound __exit__ (a kWithExit value) and inlines __enter__, whose
  // result is pushed when it returns. False, doing nothing, for any other manager.
  bool enter_python_with(const ValuePtr& manager);
  // base[key] of a dict read by source, keyed by an object of the entry state that hashes by
  // identity (a parameter in an optimizer's state), the key guarded to stay that object; nullptr
  // for any other subscript.
  ValuePtr item_by_object(const ValuePtr& base, const ValuePtr& key);
  // `key` missing from `dict` (read by source): raises KeyError in the trace, the key's absence
  // guarded; a class with __missing__ ends the region there instead.
  [[noreturn]] void raise_missing_key(const ValuePtr& dict, const py::object& key);
  // Reading a dict read by source as a whole (its length, keys, `in`) after the region stored
  // an item into it (item_by_object) ends the region: its real object does not show the store.
  void check_items_unchanged(const ValuePtr& dict);
  // cls(*args, **kwargs) for a plain user class: a kNewObject value, its __init__ inlined.
  void new_object(const ValuePtr& fn, py::handle cls, py::handle init, std::vector<ValuePtr> args,
                  KwValues kwargs);
  // object.__new__(cls) of a plain class (copy.deepcopy's form): a kNewObject with no
  // attributes yet (fn: the class's value, guarded where read by source).
  ValuePtr blank_object(const ValuePtr& fn, py::handle cls);
  // self.name as Python reads it on an object the trace made: through its class's Python
  // __getattribute__ (a kAttrHook for the caller to inline; unsupported for how == kValue),
  // or new_object_attr (how == kGeneric: as object.__getattribute__ finds it).
  ValuePtr new_object_read(const ValuePtr& self, const std::string& name, AttrLookup how);
  // What object.__getattribute__ finds: an attribute stored in the trace, else the class's.
  ValuePtr new_object_attr(const ValuePtr& self, const std::string& name);
  // Whether object.__getattribute__ finds `name` on it (false: AttributeError).
  bool new_object_has(const ValuePtr& self, const std::string& name);
  void new_object_store(const ValuePtr& self, const std::string& name, ValuePtr value);
  // del self.name, as object.__delattr__ does it (an attribute the trace stored).
  void new_object_delete(const ValuePtr& self, const std::string& name);
  // A method of a new object's builtin base (dict.get, OrderedDict.__setitem__,
  // object.__setattr__, reached by super() or inherited): on its items or attributes.
  ValuePtr new_object_method(const std::string& name, std::vector<ValuePtr>& args,
                             const KwValues& kwargs);
  // functools.partial made or called; nullptr when `callable` is neither, kNull when inlined.
  // torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, ...): fn traced in place
  // as the body of a checkpoint scope (true, `result` what call() returns), or false where the
  // call is left to Python (reentrant or selective checkpointing, a body that broke).
  bool checkpoint_call(std::vector<ValuePtr>& args, KwValues& kwargs, ValuePtr& result);
  // The checkpointed body's frame returns: its calls must not write into tensors from outside.
  void end_checkpoint_body();
  ValuePtr partial_call(const ValuePtr& fn, py::handle callable, std::vector<ValuePtr>& args,
                        KwValues& kwargs);
  // partial.func / .args / .keywords of a partial made in the trace (ObjRole::kPartial).
  ValuePtr partial_attr(const ValuePtr& partial, const std::string& name);
  // A set the trace made (a display, set(...), a set method's result): a constant value whose
  // object is the trace's own, so its methods change it in place (an exit copies it).
  ValuePtr made_set(py::object set);
  // set(...) / frozenset(...) of constants; s.add(...), s.union(...), ... on a set made_set
  // gave. nullptr for any other call.
  ValuePtr set_call(py::handle callable, const std::vector<ValuePtr>& args, const KwValues& kwargs);
  ValuePtr set_method(const ValuePtr& self, const std::string& name,
                      const std::vector<ValuePtr>& args, const KwValues& kwargs);

  // Records `fn(*args, **kwargs)` (kCallFunction) or `args[0].method(...)` (kCallMethod) on the
  // meta tensors and returns the abstract result. `infix` is set for operator targets.
  ValuePtr record_call(NodeKind kind, py::handle fn, const std::string& method,
                       std::vector<ValuePtr> args, KwValues kwargs, const std::string& infix,
                       const std::string& name_hint);
  ValuePtr record_operator(const char* fn_name, const char* infix, std::vector<ValuePtr> args);
  // x.addcdiv(_)/addcmul(_)(t1, t2, value=v) with a tensor v, as the ops eager's kernel computes;
  // nullptr for any other form of the call.
  ValuePtr addc_with_tensor_value(const std::string& method, const std::vector<ValuePtr>& args,
                                  const KwValues& kwargs);
  // The rows of a tensor being iterated or unpacked: x.unbind(0)'s results, as Tensor.__iter__.
  ValuePtr tensor_rows(const ValuePtr& tensor);
  ValuePtr tensor_attr(const ValuePtr& tensor, const std::string& name);

 private:
  std::vector<py::object> made_sets_;  // held: an address is never another set's
  std::vector<ValuePtr> recursive_functions_;  // the content of cells that hold them weakly
  void wrap_entry_stack();
  // Drops the frames above the first n (an exception or a caught AttributeError unwinding);
  // a generator among them is finished.
  void drop_frames_to(size_t n);
  // The generator frame on top returned (or an exception left it): it is popped, and its
  // iterator holds what it yielded while draining (else it is exhausted). `result`: what it
  // returned (a `yield from`'s value).
  void end_generator(bool returned, ValuePtr result = nullptr);
  // Before a region's exit state is built: a live generator in the root frame's stack or
  // changed locals (or in `values`) throws InlineBreak at the call that made it; an except
  // block open in the root frame, at the raise that entered it.
  // Throws InlineBreak where the exit would keep what only the trace can hold: a generator half
  // run, a ContextVar token (check_context_tokens). `returning`: the frame's locals end with the
  // region (a generator half run there is dropped where Python's close() of it would do nothing;
  // tokens there do not matter).
  void check_root_state_at_exit(std::vector<ValuePtr> values, bool returning = false);
  void end_at(const Instr& ins, const Unsupported& why);
  void build_exit_state(ExitKind kind);
  void add_number_checks(RegionExit& exit);
  SizeExprKind stack_size_exprs() const;
  std::vector<ValuePtr> bind_arguments(PyCodeObject* code, py::handle function,
                                       const ValuePtr& fn, std::vector<ValuePtr> args,
                                       KwValues kwargs);

  TraceHost& host_;
  PyCodeObject* code_;  // the root frame's code
  int entry_pc_;
  const std::map<CallSite, std::string>* no_inline_;
  // ContextVars this region set: the variable (by source) and its value now (nullptr: the one
  // it had at the entry, after a reset).
  struct ContextVarState {
    ValuePtr var;
    ValuePtr current;
  };
  std::vector<ContextVarState> context_vars_;
  struct ContextToken {
    ValuePtr token;
    CallSite made_at;  // the set's call site
    bool used = false;  // reset with it already
  };
  std::vector<ContextToken> context_tokens_;
  TraceSite site_;
  GraphRecorder recorder_;
  EntryState entry_;
  SizeTracker sizes_;
  SideEffects effects_;
  ModeStack modes_;
  ExitBuilder exits_;
  std::vector<std::shared_ptr<TraceFrame>> frames_;  // [0] is the root
  struct Handling {
    ValuePtr exc;
    size_t frame;  // index in frames_
  };
  std::vector<Handling> handling_;  // exceptions whose except blocks the trace is in, innermost last
  // The raise an exception caught in the root frame came from: where a region would end with
  // it still in flight or its except block open (CPython's exception state cannot be rebuilt),
  // the trace starts again with that raise left to CPython.
  CallSite root_raise_;
  std::vector<const Value*> root_caught_;  // the exceptions a root frame's handler took
  // Generator frames that returned while the instruction loop still held them (next() past the
  // end raising StopIteration into its consumer): kept to the end of the trace.
  std::vector<std::shared_ptr<TraceFrame>> retired_frames_;
  bool compiling_answer_ = true;
  bool compiling_asked_ = false;  // a compiling flag answered True in this trace
  std::vector<bool> entry_nulls_;
  int next_pc_ = 0;
  int steps_ = 0;
  bool finished_ = false;
  std::vector<ValuePtr> runtime_numbers_;  // see note_runtime_number
  int entry_handler_ = -1;         // the exception handler around the entry instruction
  bool crosses_handlers_ = false;  // an instruction traced has another (or, inlined, any)
};

}  // namespace framejit
