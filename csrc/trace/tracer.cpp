// The tracer's core: the instruction loop, locals and globals, and the region's exit state.
#include "trace/tracer.h"

#include <fmt/format.h>

#include <algorithm>

#include "bytecode/version.h"
#include "common/check.h"
#include "common/fault.h"
#include "trace/modes.h"
#include "trace/pyrefs.h"

namespace framejit {

namespace {

constexpr int kMaxSteps = 200000;  // instructions per trace; a runaway constant loop stops here

const HandlerTable& handlers();

// 3.12's CALL_INTRINSIC_1 folds what 3.11 had as opcodes of their own: `+x` (UNARY_POSITIVE)
// and the *args tuple of a call (LIST_TO_TUPLE); those opcodes' handlers run it.
void op_call_intrinsic_1(Tracer& t, const Instr& i) {
  constexpr int kUnaryPositive = 5;  // INTRINSIC_UNARY_POSITIVE
  constexpr int kListToTuple = 6;    // INTRINSIC_LIST_TO_TUPLE
  if (i.arg == kUnaryPositive) return handlers()[static_cast<size_t>(Op::UNARY_POSITIVE)](t, i);
  if (i.arg == kListToTuple) return handlers()[static_cast<size_t>(Op::LIST_TO_TUPLE)](t, i);
  FJ_UNSUPPORTED(kUnsupportedOpcode, "CALL_INTRINSIC_1 {} is not traced yet", i.arg);
}

const HandlerTable& handlers() {
  static const HandlerTable table = [] {
    HandlerTable t{};
    register_stack_ops(t);
    register_arith_ops(t);
    register_attr_ops(t);
    register_call_ops(t);
    register_build_ops(t);
    register_match_ops(t);
    register_control_ops(t);
    t[static_cast<size_t>(Op::CALL_INTRINSIC_1)] = op_call_intrinsic_1;
    return t;
  }();
  return table;
}

bool is_jump(Op op) {
  switch (op) {
    case Op::POP_JUMP_FORWARD_IF_TRUE:
    case Op::POP_JUMP_BACKWARD_IF_TRUE:
    case Op::POP_JUMP_IF_TRUE:
    case Op::POP_JUMP_FORWARD_IF_FALSE:
    case Op::POP_JUMP_BACKWARD_IF_FALSE:
    case Op::POP_JUMP_IF_FALSE:
    case Op::JUMP_IF_TRUE_OR_POP:
    case Op::JUMP_IF_FALSE_OR_POP:
      return true;
    default:
      return false;
  }
}

}  // namespace

Tracer::Tracer(TraceHost& host, PyCodeObject* code, const Bytecode& bytecode,
               const FrameState& frame, int entry_pc,
               const std::map<CallSite, std::string>* no_inline)
    : host_(host),
      code_(code),
      entry_pc_(entry_pc),
      no_inline_(no_inline),
      recorder_(code, site_),
      entry_(frame, entry_pc, recorder_),
      sizes_(entry_, recorder_) {
  entry_handler_ = bytecode.at(entry_pc).handler;
  auto root = std::make_shared<TraceFrame>();
  root->code = code;
  root->bytecode = &bytecode;
  root->locals.resize(static_cast<size_t>(code->co_nlocalsplus));
  root->dirty.resize(root->locals.size(), false);
  root->pc = entry_pc;
  frames_.push_back(std::move(root));
  site_.code = code;
}

Tracer::~Tracer() {
  // A trace that stops inside a generator's frame: the frame and its kept iterator hold each
  // other (TraceFrame::owner_kept).
  for (const auto& frame : frames_) frame->owner_kept.reset();
}

void Tracer::wrap_entry_stack() {
  const FrameState& fs = entry_.frame();
  for (int i = 0; i < fs.stack_size; ++i) {
    if (fs.stack[i] == nullptr) {
      entry_nulls_.push_back(true);
      push(Value::null());
      continue;
    }
    entry_nulls_.push_back(false);
    ValuePtr value = entry_.load(SourceTable::stack(i));
    FJ_CHECK(value != nullptr, "entry stack value {} unreadable", i);
    push(std::move(value));
  }
}

void Tracer::run() {
  // However the trace ends, the thread's grad mode is what it was (with blocks switch it).
  struct RestoreGradMode {
    Tracer* tracer;
    ~RestoreGradMode() {
      try {
        tracer->modes_.restore();
      } catch (...) {
        PyErr_Clear();
      }
    }
  } restore{this};
  const HandlerTable& table = handlers();
  wrap_entry_stack();
  while (!finished_) {
    TraceFrame* fr = frames_.back().get();
    const size_t depth = frames_.size();
    const Instr& ins = fr->bytecode->at(fr->pc);
    if (depth > 1 ? ins.handler >= 0 : ins.handler != entry_handler_) crosses_handlers_ = true;
    site_.code = fr->code;
    site_.instr = &ins;
    site_.inlined = depth > 1;
    next_pc_ = ins.next;
    // Handlers pop before they find out they cannot go on; the exit needs the stack as it was.
    std::vector<ValuePtr> saved_stack = fr->stack;
    py::object saved_kw_names = fr->kw_names;
    // Ctrl-C while a long function is traced: out of the trace, to the user.
    if (PyErr_CheckSignals() < 0) throw py::error_already_set();
    if (fault_due(FaultSite::kTrace)) throw InternalError("injected fault in the tracer");
    try {
      if (steps_ >= kMaxSteps) {
        FJ_UNSUPPORTED(kTraceTooLong, "trace exceeded {} instructions", kMaxSteps);
      }
      OpHandler handler = table[static_cast<size_t>(ins.op)];
      if (handler == nullptr) {
        FJ_UNSUPPORTED(kUnsupportedOpcode, "opcode {} is not supported yet", op_name(ins.op));
      }
      // Both below start again from the stack the instruction had; what they do instead can
      // itself be unsupported, which ends the region as any handler's failure does.
      try {
        handler(*this, ins);
      } catch (const TracedRaise& raised) {
        fr->stack = saved_stack;
        fr->kw_names = saved_kw_names;
        if (frames_.size() > depth) drop_frames_to(depth);
        raise_exception(raised.exc);  // unsupported where nothing in the trace catches it
      } catch (const GeneratorNeeded& needed) {
        // A consumer needs an item of a generator not yet run (all of them: to its end): run
        // it that far, then this instruction again.
        fr->stack = saved_stack;
        fr->kw_names = saved_kw_names;
        if (frames_.size() > depth) drop_frames_to(depth);
        resume_generator(*needed.generator,
                         needed.all ? TraceFrame::GenMode::kDrain : TraceFrame::GenMode::kBuffer, -1);
        next_pc_ = fr->pc;
      }
    } catch (Unsupported& e) {
      fr->stack = saved_stack;
      if ((e.program_raised || e.compile_path_only) && compiling_asked_) {
        throw CompilingFlagRetrace{fmt::format("{} in {} ({}:{})", e.what(), str_text(fr->code->co_qualname),
                                               str_text(fr->code->co_filename), ins.line)};
      }
      if (sizes_.symbolic()) {
        if (const SizeExprKind held = stack_size_exprs(); held != SizeExprKind::kNone) {
          throw StaticSizesRetrace{held == SizeExprKind::kIntInputs};
        }
      }
      if (depth > 1) {
        // Inside an inlined callee: the region must end at the outermost-but-one call instead,
        // so retrace with this callee's call site not inlined.
        const int line = ins.line;
        throw InlineBreak{path_to(depth - 1),
                          fmt::format("{} [{}] in {} ({}:{})", e.what(),
                                      break_kind_name(e.kind()), str_text(fr->code->co_qualname),
                                      str_text(fr->code->co_filename), line)};
      }
      fr->stack = std::move(saved_stack);
      fr->kw_names = std::move(saved_kw_names);
      end_at(ins, e);
      return;
    }
    ++steps_;
    // A RETURN_VALUE in a callee popped its frame; a call that inlined pushed one. Either way the
    // frame that ran this instruction goes on at next_pc_.
    if (depth <= frames_.size() && frames_[depth - 1].get() == fr) fr->pc = next_pc_;
  }
}

CallSite Tracer::path_to(size_t frame_index) const {
  CallSite path;
  for (size_t i = 1; i <= frame_index && i < frames_.size(); ++i) {
    if (frames_[i]->lazy_generator) {  // run from wherever it is consumed: keyed by its making
      path = frames_[i]->made_at;
      continue;
    }
    path.emplace_back(frames_[i - 1]->code, frames_[i]->call_site);
  }
  return path;
}

CallSite Tracer::call_site_here() const {
  CallSite path = path_to(frames_.size() - 1);
  path.emplace_back(frames_.back()->code, instr().offset);
  return path;
}

void Tracer::end_at(const Instr& ins, const Unsupported& why) {
  check_no_open_mode_block(*this, why.what());
  RegionExit& exit_ = exits_.exit();
  exit_.pc = ins.start;
  exit_.op_pc = ins.offset;
  exit_.next_pc = ins.next;
  exit_.target_pc = ins.target;
  exit_.op = ins.op;
  exit_.reason = fmt::format("{} [{}]", why.what(), break_kind_name(why.kind()));
  ExitKind kind = ExitKind::kDeopt;
  if (is_jump(ins.op) && why.kind() == BreakKind::kDataDependent) {
    kind = ExitKind::kBranch;
    exit_.next_pc = frame().bytecode->landing(ins.next);
    exit_.target_pc = frame().bytecode->landing(ins.target);
  } else if (ins.op == Op::CALL || ins.op == Op::CALL_KW || ins.op == Op::CALL_FUNCTION_EX) {
    kind = ExitKind::kCall;
    exit_.nargs = ins.op == Op::CALL_FUNCTION_EX ? -1 - (ins.arg & 1) : ins.arg;
    exit_.kwnames = frame().kw_names ? frame().kw_names : py::none();
    if (ins.op == Op::CALL_KW) {  // 3.13: the names are on the stack, above the arguments
      const ValuePtr& names = frame().stack.back();
      FJ_CHECK(names->is_const(), "CALL_KW without constant names");
      exit_.kwnames = names->obj;
      exit_.kwnames_on_stack = true;
    }
  } else if (ins.op == Op::GET_ITER || ins.op == Op::FOR_ITER) {
    kind = ExitKind::kIter;
  } else if (ins.op == Op::BEFORE_WITH) {
    kind = ExitKind::kWith;
  } else if (ins.op == Op::BINARY_SUBSCR) {
    kind = ExitKind::kSubscr;
  }
  build_exit_state(kind);
}

namespace {

// Whether Python's close() of this half-run generator, which it calls when nothing refers to the
// generator any more, does nothing: not started, or stopped at a yield no handler of its own
// covers (a finally or with block would run there).
bool closes_quietly(const Value& it) {
  const TraceFrame* frame = it.gen_frame.get();
  if (frame == nullptr || frame->suspended_at < 0) return true;
  const Instr& yield = frame->bytecode->at(frame->suspended_at);
  if (yield.handler < 0) return true;
  const Instr& handler = frame->bytecode->at(yield.handler);
  return pyver::is_generator_stop_handler(handler.op == Op::CALL_INTRINSIC_1, handler.arg);
}

}  // namespace

void Tracer::check_root_state_at_exit(std::vector<ValuePtr> values, bool returning) {
  for (const Handling& h : handling_) {
    if (h.frame == 0) {
      throw InlineBreak{root_raise_, "its except block ends the region: " + exits_.exit().reason};
    }
  }
  const TraceFrame& root = *frames_[0];
  const size_t given = values.size();
  values.insert(values.end(), root.stack.begin(), root.stack.end());
  std::vector<ValuePtr> locals;  // the changed ones, written back by the exit
  for (size_t i = 0; i < root.locals.size(); ++i) {
    if (root.dirty[i]) locals.push_back(root.locals[i]);
  }
  auto check_generators = [&](const std::vector<ValuePtr>& kept, bool dropped_if_quiet) {
    for (const ValuePtr& value : kept) {
      Value* gen = live_generator_in(value);
      if (gen == nullptr) continue;
      // At a return the frame's locals go: a generator held only there is closed by Python.
      if (dropped_if_quiet && value.get() == gen && closes_quietly(*gen)) continue;
      // Only the trace could go on running it: traced again with the call that made it left
      // to Python, which then makes a real generator.
      throw InlineBreak{gen->gen_frame->made_at,
                        "the region ends with the generator half run: " + exits_.exit().reason};
    }
  };
  check_generators(locals, returning);
  check_generators(values, false);
  // ContextVar tokens: at a return only in the result (the frame's stack and locals go).
  if (returning) {
    values.resize(given);
  } else {
    values.insert(values.end(), locals.begin(), locals.end());
  }
  check_context_tokens(values);
}

void Tracer::build_exit_state(ExitKind kind) {
  check_root_state_at_exit({});
  RegionExit& exit_ = exits_.exit();
  exit_.kind = kind;
  for (const PendingWrite& write : effects_.writes()) entry_.guard_not_aliased(write.target, write.name);
  for (const ValuePtr& container : effects_.adopted()) entry_.guard_not_aliased(container, "");
  exits_.add_writes(effects_);
  add_context_writes();
  TraceFrame& root = *frames_[0];
  for (size_t i = 0; i < root.locals.size(); ++i) {
    if (!root.dirty[i]) continue;
    Rebuild r;
    r.kind = Rebuild::Kind::kNull;
    if (root.locals[i] && root.locals[i]->kind != VKind::kNull) r = exits_.rebuild_of(root.locals[i]);
    exit_.locals.emplace_back(static_cast<int>(i), std::move(r));
  }
  for (const auto& value : root.stack) exit_.stack.push_back(exits_.rebuild_of(value));
  add_number_checks(exit_);
  recorder_.finish(exits_.take_outputs());
}

void Tracer::add_number_checks(RegionExit& exit) {
  for (const auto& number : runtime_numbers_) {
    Rebuild check = exits_.rebuild_of(number);
    (check.reads_outputs() ? exit.checks : exit.checks_before).push_back(std::move(check));
  }
}

ValuePtr Tracer::pop() {
  auto& stack = frame().stack;
  FJ_CHECK(!stack.empty(), "pop from an empty stack at {}", op_name(instr().op));
  ValuePtr value = std::move(stack.back());
  stack.pop_back();
  return value;
}

std::vector<ValuePtr> Tracer::pop_n(size_t n) {
  auto& stack = frame().stack;
  FJ_CHECK(stack.size() >= n, "pop of {} from a stack of {}", n, stack.size());
  std::vector<ValuePtr> out(std::make_move_iterator(stack.end() - static_cast<long>(n)),
                            std::make_move_iterator(stack.end()));
  stack.resize(stack.size() - n);
  return out;
}

ValuePtr& Tracer::peek(size_t depth) {
  auto& stack = frame().stack;
  FJ_CHECK(stack.size() > depth, "peek {} into a stack of {}", depth, stack.size());
  return stack[stack.size() - 1 - depth];
}

py::object Tracer::co_const(int index) const {
  return py::reinterpret_borrow<py::object>(
      PyTuple_GET_ITEM(frames_.back()->code->co_consts, index));
}

std::string Tracer::co_name(int index) const {
  return str_text(PyTuple_GET_ITEM(frames_.back()->code->co_names, index));
}

std::string Tracer::co_varname(int index) const {
  return str_text(PyTuple_GET_ITEM(frames_.back()->code->co_localsplusnames, index));
}

ValuePtr Tracer::local(int index) {
  TraceFrame& fr = frame();
  FJ_CHECK(index >= 0 && index < static_cast<int>(fr.locals.size()), "local {} out of range",
           index);
  if (fr.locals[index]) {
    if (fr.locals[index]->kind == VKind::kNull) {
      FJ_UNSUPPORTED(kUnsupportedValue, "local '{}' is unbound here", co_varname(index));
    }
    return fr.locals[index];
  }
  if (inlined()) {  // callee locals all come from its arguments
    FJ_UNSUPPORTED(kUnsupportedValue, "local '{}' is unbound here", co_varname(index));
  }
  ValuePtr value = entry_.load(SourceTable::local(index, co_varname(index)));
  if (!value) FJ_UNSUPPORTED(kUnsupportedValue, "local '{}' is unbound here", co_varname(index));
  fr.locals[index] = value;
  return value;
}

void Tracer::set_local(int index, ValuePtr value) {
  // Storing also shadows the entry value: later loads see the new value, not the source.
  TraceFrame& fr = frame();
  fr.locals[index] = std::move(value);
  if (!inlined()) fr.dirty[index] = true;
}

ValuePtr Tracer::local_or_null(int index) {
  TraceFrame& fr = frame();
  FJ_CHECK(index >= 0 && index < static_cast<int>(fr.locals.size()), "local {} out of range",
           index);
  if (fr.locals[index]) return fr.locals[index];  // a value, or the Null of an unbound one
  if (inlined()) return Value::null();           // callee locals all come from its arguments
  // A frame's own local not read yet: at the function's start, a variable that is no argument
  // is unbound whatever the call (no guard needed). Mid-frame it may or may not be bound.
  PyCodeObject* code = frame().code;
  int n_args = code->co_argcount + code->co_kwonlyargcount;
  n_args += (code->co_flags & CO_VARARGS) ? 1 : 0;
  n_args += (code->co_flags & CO_VARKEYWORDS) ? 1 : 0;
  if (entry_pc_ == 0 && index >= n_args && index < code->co_nlocals) return Value::null();
  if (index < code->co_nlocals) {
    // Mid-frame (a 3.12 comprehension after a break saves its variable): whether it is bound
    // now, guarded; unbound, a Null, which the comprehension's STORE_FAST puts back after it.
    ValuePtr bound = entry_.load(SourceTable::local_bound(index, co_varname(index)));
    if (bound && bound->is_const() && bound->obj.ptr() == Py_False) {
      frame().locals[index] = Value::null();
      return frame().locals[index];
    }
  }
  return local(index);
}

void Tracer::delete_local(int index) {
  local(index);  // an unbound local would raise here at run time: leave that to CPython
  // A later load must fail as in Python; a Null keeps local() from re-reading the frame.
  set_local(index, Value::null());
}

ValuePtr Tracer::global(const std::string& name) {
  // A global this region stored.
  if (const ValuePtr* stored = effects_.stored_global(frame_globals().ptr(), name)) return *stored;
  ValuePtr value;
  if (inlined()) {
    value = entry_.load(SourceTable::global_of(frame().globals, name));
  } else {
    value = entry_.load(SourceTable::global(name));
  }
  if (!value) FJ_UNSUPPORTED(kUnsupportedValue, "name '{}' is not defined", name);
  return value;
}

void Tracer::store_global(const std::string& name, ValuePtr value) {
  // The module owning these globals: a write to it is a write to them. Code run with a globals
  // dict of no module (exec with a plain dict) ends the region before the write instead.
  py::object globals = frame_globals();
  py::object owner = SideEffects::module_owning(globals);
  if (owner.is_none()) {
    FJ_UNSUPPORTED(kSideEffect, "assignment to global '{}' of code run without its module", name);
  }
  if (!inlined()) {
    // The same code object may run with other globals (a function made from its code): the
    // module found here is only right while the frame's globals are this dict.
    entry_.guard_globals_dict(globals.ptr());
  }
  effects_.record(wrap_unsourced(std::move(owner)), name, std::move(value));
}

namespace {

// The class of an object read by source that is an instance of a Python class (a heap type),
// not a class itself; nullptr for anything else.
PyTypeObject* sourced_instance_class(const ValuePtr& value) {
  if (!value->is(ObjRole::kPlain) || value->bound_self || value->source < 0 ||
      PyType_Check(value->obj.ptr())) {
    return nullptr;
  }
  PyTypeObject* type = Py_TYPE(value->obj.ptr());
  return (type->tp_flags & Py_TPFLAGS_HEAPTYPE) ? type : nullptr;
}

}  // namespace

bool Tracer::truthy(const ValuePtr& value) {
  switch (value->kind) {
    case VKind::kTensor:
      if (py::object known = known_value(value)) {  // computed from numbers in the trace
        const int result = PyObject_IsTrue(known.ptr());
        if (result < 0) throw py::error_already_set();
        return result == 1;
      }
      FJ_UNSUPPORTED(kDataDependent, "branch on the value of a tensor");
    case VKind::kSymNum:
      if (sizes_.holds_frame_int(value)) {
        if (ValuePtr pinned = sizes_.pinned_already(value)) return truthy(pinned);
        FJ_UNSUPPORTED(kDataDependent, "branch on a number computed at run time");
      }
      if (value->int_input) {
        // `if n:` of an int input: `n != 0`, decided (and guarded) as that comparison.
        static PyObject* const kNe = py::object(PyRefs::get().operator_module.attr("ne")).release().ptr();
        const bool nonzero = PyObject_IsTrue(value->obj.ptr()) == 1;
        ValuePtr compared = Value::sym_num(py::reinterpret_borrow<py::object>(kNe),
                                           {value, Value::constant(py::int_(0))}, py::bool_(nonzero));
        return truthy(sizes_.decide(compared));
      }
      if (value->is_size_expr()) return truthy(sizes_.decide(value));
      // Decided only where its numbers are pinned already (`i < n - 1` after range(n)): a
      // branch exit costs no compile, and a loop counter pinned here for the branch alone would
      // compile again once it changes.
      if (ValuePtr pinned = sizes_.pinned_already(value)) return truthy(pinned);
      FJ_UNSUPPORTED(kDataDependent, "branch on a number computed at run time");
    case VKind::kConst: {
      const int result = PyObject_IsTrue(value->obj.ptr());
      if (result < 0) throw py::error_already_set();
      return result == 1;
    }
    case VKind::kTuple:
    case VKind::kList:
    case VKind::kDict:
      return !value->items.empty();
    case VKind::kObject:
      if (value->is(ObjRole::kDictView)) return !dict_view_items(*value).empty();
      if (!value->is(ObjRole::kNewObject) && PyRefs::get().is_enum_member(value->obj.ptr()) &&
          !PyType_Check(value->obj.ptr())) {
        // An Enum member (guarded by identity, a singleton of its class): its truth is its
        // class's answer for it, fixed with it (an IntEnum's 0, a str Enum's "" are false).
        const int result = PyObject_IsTrue(value->obj.ptr());
        if (result < 0) throw py::error_already_set();
        return result == 1;
      }
      if (is_identity_object(value->obj.ptr()) && !value->is(ObjRole::kNewObject)) return true;
      if (PyTypeObject* type = value->is(ObjRole::kNewObject)
                                   ? reinterpret_cast<PyTypeObject*>(value->obj.ptr())  // obj: its class
                                   : sourced_instance_class(value)) {
        // An instance of a Python class (made in the trace, or read by source): with neither
        // __bool__ nor __len__ it is true (`if self.layer_norm:` of an nn.Module), while its
        // class still has neither.
        static PyObject* const kBool = PyUnicode_InternFromString("__bool__");
        static PyObject* const kLen = PyUnicode_InternFromString("__len__");
        PyObject* hook = _PyType_Lookup(type, kBool);  // Borrowed
        if (hook == nullptr) hook = _PyType_Lookup(type, kLen);
        if (hook == nullptr) {
          if (!value->is(ObjRole::kNewObject)) {
            guard_class_attribute(value, "__bool__", false);
            guard_class_attribute(value, "__len__", false);
          }
          return true;
        }
        if (value->is(ObjRole::kNewObject)) {
          if (value->mapping && !PyFunction_Check(hook)) return !value->mapping->items.empty();
          FJ_UNSUPPORTED(kUnsupportedValue, "truth value of {}, which its class's __bool__ / __len__ "
                         "decides", value->describe());
        }
      }
      if (value->is(ObjRole::kPlain) && !value->bound_self && value->source >= 0 &&
          (is_plain_dict(value->obj.ptr()) || PyList_CheckExact(value->obj.ptr()))) {
        check_items_unchanged(value);
        // `d or {}` of a dict read by source: its emptiness, guarded by its length.
        const Py_ssize_t n = PyObject_Length(value->obj.ptr());
        entry_.guard_len(value->source, n);
        return n > 0;
      }
      FJ_UNSUPPORTED(kDataDependent, "truth value of {}", value->describe());
    case VKind::kIter:
    case VKind::kCell:
      return true;
    case VKind::kNull:
      break;
  }
  throw InternalError("truth value of NULL");
}

void Tracer::push_with_null(ValuePtr callable) {
  if (!pyver::kNullAboveCallable) push(Value::null());
  push(std::move(callable));
  if (pyver::kNullAboveCallable) push(Value::null());
}

ValuePtr Tracer::as_bool_for_jump(ValuePtr value, const Instr& i) {
  try {
    return Value::constant(py::bool_(truthy(value)));
  } catch (Unsupported& e) {
    if (e.kind() != BreakKind::kDataDependent) throw;
    const int index = frame().bytecode->index_at(i.next);
    const Op next = index >= 0 ? frame().bytecode->instrs()[index].op : Op::kUnknown;
    if (next == Op::POP_JUMP_IF_TRUE || next == Op::POP_JUMP_IF_FALSE) return value;
    throw;
  }
}

void Tracer::finish(const ValuePtr& value) {
  if (frame().lazy_generator) {
    end_generator(/*returned=*/true, value);
    return;
  }
  if (inlined()) {
    if (frame().checkpoint_body) {
      frame().checkpoint_body = false;
      end_checkpoint_body();
    }
    if (frame().result_truth == 3) {
      const ValuePtr n = sizes_.concretize(value);
      if (!n->is_const() || !PyLong_CheckExact(n->obj.ptr()) || n->obj.cast<Py_ssize_t>() < 0) {
        FJ_UNSUPPORTED(kUnsupportedValue, "__len__ returned {}", value->describe());
      }
      frames_.pop_back();
      push(n);
      return;
    }
    if (frame().result_truth != 0) {
      const bool truth = truthy(value) != (frame().result_truth == 2);
      frames_.pop_back();
      push(Value::constant(py::bool_(truth)));
      return;
    }
    if (frame().discard_result) {  // STORE_ATTR / STORE_SUBSCR through __setattr__ / __setitem__
      frames_.pop_back();
      return;
    }
    ValuePtr result = frame().generator ? Value::generator_iter(std::move(frame().yields))
                      : frame().constructed ? frame().constructed
                      : frame().on_found    ? frame().on_found
                                            : value;
    const bool null_above = frame().null_above_result;
    frames_.pop_back();
    push(result);
    if (null_above) push(Value::null());
    return;
  }
  check_root_state_at_exit({value}, /*returning=*/true);
  RegionExit& exit_ = exits_.exit();
  exit_.kind = ExitKind::kReturn;
  for (const PendingWrite& write : effects_.writes()) entry_.guard_not_aliased(write.target, write.name);
  for (const ValuePtr& container : effects_.adopted()) entry_.guard_not_aliased(container, "");
  exits_.add_writes(effects_);
  add_context_writes();
  exit_.pc = instr().start;
  exit_.op_pc = instr().offset;
  exit_.op = instr().op;
  exit_.result = exits_.rebuild_of(value);
  add_number_checks(exit_);
  recorder_.finish(exits_.take_outputs());
  finished_ = true;
}

void Tracer::raise_missing_attribute(const ValuePtr& base, const std::string& name) {
  // From the innermost frame out: the instruction each is at (the call into the frame above,
  // for the callers) must lie in no try block, which could catch the error first.
  for (size_t d = frames_.size(); d-- > 1;) {
    const TraceFrame& f = *frames_[d];
    const int at = d + 1 == frames_.size() ? f.pc : frames_[d + 1]->call_site;
    if (f.bytecode->at(at).handler >= 0) break;
    if (!f.on_missing) continue;
    ValuePtr result = f.on_missing;
    drop_frames_to(d);  // the __getattribute__ call and everything it called
    push(std::move(result));
    return;
  }
  FJ_UNSUPPORTED(kUnsupportedValue, "{} has no attribute '{}' (AttributeError)", base->describe(), name);
}

namespace {

// kSizes if a tensor size occurs in a size expression of `value`, else kIntInputs if an int
// input does, else kNone.
Tracer::SizeExprKind size_exprs_in(const ValuePtr& value) {
  if (!value->holds_size_expr()) return Tracer::SizeExprKind::kNone;
  if (value->kind == VKind::kSymNum && !value->fn) {
    return value->size_of ? Tracer::SizeExprKind::kSizes : Tracer::SizeExprKind::kIntInputs;
  }
  Tracer::SizeExprKind most = Tracer::SizeExprKind::kNone;
  for (const auto& item : value->items) most = std::max(most, size_exprs_in(item));
  // (sizes since pinned to constants in arithmetic count as sizes, as they always did)
  return most == Tracer::SizeExprKind::kNone ? Tracer::SizeExprKind::kSizes : most;
}

}  // namespace

Tracer::SizeExprKind Tracer::stack_size_exprs() const {
  SizeExprKind most = SizeExprKind::kNone;
  for (const auto& frame : frames_) {
    for (const auto& value : frame->stack) {
      if (value) most = std::max(most, size_exprs_in(value));
    }
  }
  return most;
}

}  // namespace framejit
