// The tracer's core: the instruction loop, locals and globals, wrapping entry-state values
// (with their guards), and the exit: graph outputs plus how to rebuild the Python state.
#include "trace/tracer.h"

#include <fmt/format.h>

#include "common/check.h"
#include "guards/tensor_check.h"
#include "trace/pyrefs.h"

namespace framejit {

namespace {

constexpr int kMaxSteps = 200000;  // instructions per trace; a runaway constant loop stops here

const HandlerTable& handlers() {
  static const HandlerTable table = [] {
    HandlerTable t{};
    register_stack_ops(t);
    register_arith_ops(t);
    register_attr_ops(t);
    register_call_ops(t);
    register_build_ops(t);
    register_control_ops(t);
    return t;
  }();
  return table;
}

std::string code_string(PyObject* obj) {
  const char* data = obj ? PyUnicode_AsUTF8(obj) : nullptr;
  if (data == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return data;
}

// Values of these exact types are constants: guarded by value, folded at trace time.
bool is_constant_type(PyObject* obj) {
  PyTypeObject* type = Py_TYPE(obj);
  if (obj == Py_None || obj == Py_Ellipsis || type == &PyLong_Type || type == &PyFloat_Type ||
      type == &PyBool_Type || type == &PyUnicode_Type || type == &PyBytes_Type ||
      type == &PyComplex_Type || type == &PySlice_Type) {
    return true;
  }
  const PyRefs& refs = PyRefs::get();
  return reinterpret_cast<PyObject*>(type) == refs.dtype_type.ptr() ||
         reinterpret_cast<PyObject*>(type) == refs.device_type.ptr() ||
         reinterpret_cast<PyObject*>(type) == refs.size_type.ptr();
}

// Objects that are stable by identity: modules, functions, classes, builtins, descriptors.
bool is_identity_object(PyObject* obj) {
  return PyModule_Check(obj) || PyFunction_Check(obj) || PyCFunction_Check(obj) ||
         PyType_Check(obj) || Py_TYPE(obj) == &PyMethodDescr_Type ||
         Py_TYPE(obj) == &PyWrapperDescr_Type || Py_TYPE(obj) == &PyClassMethodDescr_Type;
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

void collect_leaves(const ValuePtr& value, std::vector<ValuePtr>& out) {
  if (value->kind != VKind::kSymNum) return;
  if (!value->fn) {
    out.push_back(value);
    return;
  }
  for (const auto& item : value->items) collect_leaves(item, out);
}

}  // namespace

Tracer::Tracer(TraceHost& host, PyCodeObject* code, const Bytecode& bytecode,
               const FrameState& frame, int entry_pc,
               const std::map<CallSite, std::string>* no_inline)
    : host_(host),
      code_(code),
      frame_(frame),
      entry_pc_(entry_pc),
      no_inline_(no_inline),
      graph_(code_string(code->co_filename), code_string(code->co_qualname),
             code->co_firstlineno) {
  auto root = std::make_unique<TraceFrame>();
  root->code = code;
  root->bytecode = &bytecode;
  root->locals.resize(static_cast<size_t>(code->co_nlocalsplus));
  root->dirty.resize(root->locals.size(), false);
  root->pc = entry_pc;
  frames_.push_back(std::move(root));
}

Tracer::~Tracer() {
  for (PyObject* value : live_) Py_XDECREF(value);
}

void Tracer::wrap_entry_stack() {
  for (int i = 0; i < frame_.stack_size; ++i) {
    if (frame_.stack[i] == nullptr) {
      entry_nulls_.push_back(true);
      push(Value::null());
      continue;
    }
    entry_nulls_.push_back(false);
    ValuePtr value = load_source(SourceTable::stack(i));
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
        tracer->restore_grad_mode();
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
    current_ = &ins;
    next_pc_ = ins.next;
    // Handlers pop before they find out they cannot go on; the exit needs the stack as it was.
    std::vector<ValuePtr> saved_stack = fr->stack;
    py::object saved_kw_names = fr->kw_names;
    try {
      if (steps_ >= kMaxSteps) {
        FJ_UNSUPPORTED(kTraceTooLong, "trace exceeded {} instructions", kMaxSteps);
      }
      OpHandler handler = table[static_cast<size_t>(ins.op)];
      if (handler == nullptr) {
        FJ_UNSUPPORTED(kUnsupportedOpcode, "opcode {} is not supported yet", op_name(ins.op));
      }
      handler(*this, ins);
    } catch (Unsupported& e) {
      fr->stack = saved_stack;
      if (symbolic_sizes_ && stack_holds_size_expr()) throw StaticSizesRetrace{};
      if (depth > 1) {
        // Inside an inlined callee: the region must end at the outermost-but-one call instead,
        // so retrace with this callee's call site not inlined.
        const TraceFrame& caller = *frames_[depth - 2];
        const int line = ins.line;
        throw InlineBreak{{caller.code, fr->call_site},
                          fmt::format("{} [{}] in {} ({}:{})", e.what(),
                                      break_kind_name(e.kind()), code_string(fr->code->co_qualname),
                                      code_string(fr->code->co_filename), line)};
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

void Tracer::end_at(const Instr& ins, const Unsupported& why) {
  check_no_open_inference_block(why.what());
  exit_.pc = ins.start;
  exit_.op_pc = ins.offset;
  exit_.next_pc = ins.next;
  exit_.target_pc = ins.target;
  exit_.op = ins.op;
  exit_.reason = fmt::format("{} [{}]", why.what(), break_kind_name(why.kind()));
  ExitKind kind = ExitKind::kDeopt;
  if (is_jump(ins.op) && why.kind() == BreakKind::kDataDependent) {
    kind = ExitKind::kBranch;
  } else if (ins.op == Op::CALL || ins.op == Op::CALL_FUNCTION_EX) {
    kind = ExitKind::kCall;
    exit_.nargs = ins.op == Op::CALL ? ins.arg : -1 - (ins.arg & 1);
    exit_.kwnames = frame().kw_names ? frame().kw_names : py::none();
  } else if (ins.op == Op::GET_ITER || ins.op == Op::FOR_ITER) {
    kind = ExitKind::kIter;
  } else if (ins.op == Op::BEFORE_WITH) {
    kind = ExitKind::kWith;
  } else if (ins.op == Op::BINARY_SUBSCR) {
    kind = ExitKind::kSubscr;
  }
  build_exit_state(kind);
}

void Tracer::build_attr_writes() {
  for (const PendingWrite& write : attr_writes_) {
    exit_.attr_writes.push_back(
        {rebuild_of(write.target), py::str(write.name), rebuild_of(write.value)});
  }
}

void Tracer::build_exit_state(ExitKind kind) {
  exit_.kind = kind;
  build_attr_writes();
  TraceFrame& root = *frames_[0];
  for (size_t i = 0; i < root.locals.size(); ++i) {
    if (!root.dirty[i]) continue;
    Rebuild r;
    r.kind = Rebuild::Kind::kNull;
    if (root.locals[i] && root.locals[i]->kind != VKind::kNull) r = rebuild_of(root.locals[i]);
    exit_.locals.emplace_back(static_cast<int>(i), std::move(r));
  }
  for (const auto& value : root.stack) exit_.stack.push_back(rebuild_of(value));
  graph_.set_output(std::move(outputs_));
  graph_.remove_unused_getitems();
}

ValuePtr Tracer::pop() {
  auto& stack = frame().stack;
  FJ_CHECK(!stack.empty(), "pop from an empty stack at {}", op_name(current_->op));
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
  return code_string(PyTuple_GET_ITEM(frames_.back()->code->co_names, index));
}

std::string Tracer::co_varname(int index) const {
  return code_string(PyTuple_GET_ITEM(frames_.back()->code->co_localsplusnames, index));
}

ValuePtr Tracer::load_source(Source source) {
  const int known = sources_.size();
  const int slot = sources_.intern(std::move(source));
  if (slot < known) return by_slot_.at(slot);  // read and wrapped before
  live_.resize(static_cast<size_t>(slot) + 1, nullptr);
  live_[slot] = sources_.read(slot, frame_, live_.data());  // New or NULL
  if (live_[slot] == nullptr) {
    sources_.pop_last();
    live_.pop_back();
    return nullptr;
  }
  return wrap_source(slot, py::reinterpret_borrow<py::object>(live_[slot]));
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
  ValuePtr value = load_source(SourceTable::local(index, co_varname(index)));
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

void Tracer::delete_local(int index) {
  local(index);  // an unbound local would raise here at run time: leave that to CPython
  // A later load must fail as in Python; a Null keeps local() from re-reading the frame.
  set_local(index, Value::null());
}

ValuePtr Tracer::global(const std::string& name) {
  PyObject* globals = frame_globals().ptr();
  for (auto it = attr_writes_.rbegin(); it != attr_writes_.rend(); ++it) {
    // A global this region stored (latest write wins).
    if (it->name == name && PyModule_Check(it->target->obj.ptr()) &&
        PyModule_GetDict(it->target->obj.ptr()) == globals) {
      return it->value;
    }
  }
  ValuePtr value;
  if (inlined()) {
    value = load_source(SourceTable::global_of(frame().globals, name));
  } else {
    value = load_source(SourceTable::global(name));
  }
  if (!value) FJ_UNSUPPORTED(kUnsupportedValue, "name '{}' is not defined", name);
  return value;
}

void Tracer::store_global(const std::string& name, ValuePtr value) {
  // The module owning these globals: a write to it is a write to them. Code run with a globals
  // dict of no module (exec with a plain dict) ends the region before the write instead.
  py::object globals = frame_globals();
  PyObject* module_name = PyDict_GetItemString(globals.ptr(), "__name__");  // Borrowed
  PyObject* module = nullptr;
  if (module_name != nullptr && PyUnicode_Check(module_name)) {
    module = PyImport_GetModule(module_name);  // New or NULL
    if (module == nullptr) PyErr_Clear();
  }
  py::object owner = py::reinterpret_steal<py::object>(module);
  // An exact module: its setattr is the dict store STORE_GLOBAL does (a subclass may not be).
  if (!owner || !PyModule_CheckExact(owner.ptr()) ||
      PyModule_GetDict(owner.ptr()) != globals.ptr()) {
    FJ_UNSUPPORTED(kSideEffect, "assignment to global '{}' of code run without its module", name);
  }
  if (!inlined()) {
    // The same code object may run with other globals (a function made from its code): the
    // module found here is only right while the frame's globals are this dict.
    guards_.add_id(sources_.intern(SourceTable::globals_dict()), globals.ptr());
  }
  attr_writes_.push_back({wrap_unsourced(std::move(owner)), name, std::move(value)});
}

TensorMeta Tracer::meta_of(py::handle meta, py::handle device) {
  PyRefs& refs = PyRefs::get();
  TensorMeta out;
  if (!is_tensor(meta.ptr())) {
    out.dtype = refs.short_dtype(meta.attr("dtype"));
    for (py::handle size : meta.attr("shape")) out.sizes.push_back(size.cast<int64_t>());
  } else {
    // Read from the tensor itself: three Python attribute reads and str(device) per node were
    // a fifth of the tracing time of a long chain.
    int8_t code = 0;
    tensor_sizes_and_dtype(meta.ptr(), out.sizes, code);
    out.dtype = refs.short_dtype_of(code, meta);
  }
  out.device = device_string(device);
  return out;
}

std::string device_string(py::handle device) {
  std::string text = device_text(device.ptr());  // a torch.device, read without Python
  return text.empty() ? py::str(device).cast<std::string>() : text;
}

ValuePtr Tracer::wrap_source(int slot, py::handle real) {
  auto found = by_slot_.find(slot);
  if (found != by_slot_.end()) return found->second;
  PyRefs& refs = PyRefs::get();
  PyObject* obj = real.ptr();
  ValuePtr value;
  if (is_tensor(obj)) {
    if (!is_plain_tensor_type(obj) &&
        refs.support.attr("has_torch_function_override")(real).cast<bool>()) {
      // Meta tensors would not run the subclass's __torch_function__: shapes could differ.
      FJ_UNSUPPORTED(kUnsupportedValue, "tensor subclass {} overrides __torch_function__",
                     Py_TYPE(obj)->tp_name);
    }
    guards_.add_tensor(slot, obj);
    py::object meta = py::reinterpret_steal<py::object>(meta_like(obj));  // dense: in C++
    if (!meta) meta = refs.support.attr("make_meta")(real);
    py::object device = real.attr("device");
    Node* node = graph_.add_placeholder(sources_.at(slot).name_hint, meta, meta_of(meta, device));
    inputs_.push_back(Rebuild::slot(slot));
    tensor_slots_.emplace(node, slot);
    value = Value::tensor(node, meta, device, slot);
    value->pytype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(obj)));
  } else if (entry_pc_ > 0 && (PyLong_CheckExact(obj) || PyFloat_CheckExact(obj)) &&
             is_frame_state(slot)) {
    // A number in the middle of a frame (a loop counter, the result of .item()): its type is
    // guarded, its value only where the trace needs it (see specialize()).
    guards_.add_type(slot, reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    value = Value::sym_num(py::object(), {}, py::reinterpret_borrow<py::object>(real));
    value->source = slot;
  } else if (is_constant_type(obj)) {
    if (obj == Py_None || obj == Py_Ellipsis) {
      guards_.add_id(slot, obj);
    } else {
      guards_.add_const(slot, obj);
    }
    value = Value::constant(py::reinterpret_borrow<py::object>(real), slot);
  } else if (PyTuple_CheckExact(obj) || PyList_CheckExact(obj)) {
    guards_.add_type(slot, reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    guards_.add_len(slot, n);
    std::vector<ValuePtr> items;
    for (Py_ssize_t i = 0; i < n; ++i) {
      ValuePtr item = load_source(sources_.item(slot, py::int_(i)));
      FJ_CHECK(item != nullptr, "item {} of {} unreadable", i, sources_.at(slot).text);
      items.push_back(std::move(item));
    }
    value = PyTuple_CheckExact(obj) ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    value->source = slot;
  } else if (is_identity_object(obj)) {
    guards_.add_id(slot, obj);
    value = Value::object(py::reinterpret_borrow<py::object>(real), slot);
  } else {
    guards_.add_type(slot, reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    value = Value::object(py::reinterpret_borrow<py::object>(real), slot);
  }
  by_slot_[slot] = value;
  return value;
}

bool Tracer::is_frame_state(int slot) const {
  // Items of containers count too: the (i, t) pair a performed FOR_ITER pushed for a loop over
  // enumerate() holds the loop counter.
  while (sources_.at(slot).kind == SourceKind::kItem) slot = sources_.at(slot).base;
  const SourceKind kind = sources_.at(slot).kind;
  return kind == SourceKind::kLocal || kind == SourceKind::kStack;
}

ValuePtr Tracer::specialize(const ValuePtr& value) {
  if (value->kind != VKind::kSymNum) return value;
  std::vector<ValuePtr> leaves;
  collect_leaves(value, leaves);
  for (const auto& leaf : leaves) {
    if (leaf->size_of) {
      note_dim_read(leaf->size_of, leaf->size_dim, "a size used as a Python value");
    } else {
      guards_.add_const(leaf->source, leaf->obj.ptr());
    }
  }
  return Value::constant(value->obj);
}

ValuePtr Tracer::scalar_input(const ValuePtr& value) {
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
  const std::string hint = value->source >= 0 ? sources_.at(value->source).name_hint : "scalar";
  Node* node = graph_.add_placeholder(hint, value->obj, meta);
  inputs_.push_back(expr(value));
  auto input = std::make_shared<Value>(*value);
  input->node = node;
  scalar_inputs_[value.get()] = std::make_pair(value, input);
  return input;
}

bool Tracer::truthy(const ValuePtr& value) {
  switch (value->kind) {
    case VKind::kTensor:
      FJ_UNSUPPORTED(kDataDependent, "branch on the value of a tensor");
    case VKind::kSymNum:
      if (value->is_size_expr()) return truthy(specialize(value));
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
      if (is_identity_object(value->obj.ptr())) return true;
      FJ_UNSUPPORTED(kDataDependent, "truth value of {}", value->describe());
    case VKind::kIter:
    case VKind::kCell:
      return true;
    case VKind::kNull:
      break;
  }
  throw InternalError("truth value of NULL");
}

void Tracer::finish(const ValuePtr& value) {
  if (inlined()) {
    ValuePtr result = frame().generator ? Value::iter(std::move(frame().yields))
                      : frame().constructed ? frame().constructed
                                            : value;
    frames_.pop_back();
    push(result);
    return;
  }
  exit_.kind = ExitKind::kReturn;
  build_attr_writes();
  exit_.pc = current_->start;
  exit_.op_pc = current_->offset;
  exit_.op = current_->op;
  exit_.result = rebuild_of(value);
  graph_.set_output(std::move(outputs_));
  graph_.remove_unused_getitems();
  finished_ = true;
}

Rebuild Tracer::rebuild_of(const ValuePtr& value) {
  // An entry-state value passed on unchanged keeps its identity: read it again from its source.
  const bool from_source =
      value->source >= 0 && value->node == nullptr &&
      !(value->kind == VKind::kSymNum && value->fn);
  if (from_source || (value->kind == VKind::kTensor && value->node->kind == NodeKind::kPlaceholder &&
                      value->source >= 0)) {
    return Rebuild::slot(value->source);
  }
  Rebuild r;
  switch (value->kind) {
    case VKind::kTensor: {
      auto it = output_index_.find(value->node);
      if (it == output_index_.end()) {
        it = output_index_.emplace(value->node, static_cast<int>(outputs_.size())).first;
        outputs_.push_back(Arg::of(value->node));
      }
      r.kind = Rebuild::Kind::kOutput;
      r.index = it->second;
      return r;
    }
    case VKind::kConst:
      return Rebuild::constant(value->obj);
    case VKind::kObject:
      if (value->role == ObjRole::kNewObject) {  // an object made in the trace, escaping
        py::tuple names(value->keys.size());
        for (size_t i = 0; i < value->keys.size(); ++i) names[i] = value->keys[i];
        std::vector<Rebuild> parts = {Rebuild::constant(value->obj), Rebuild::constant(names)};
        for (const auto& part : value->items) parts.push_back(rebuild_of(part));
        r = Rebuild::call(PyRefs::get().support.attr("new_object"), std::move(parts));
        if (value->memo < 0) value->memo = exit_.memo_size++;
        r.memo = value->memo;
        return r;
      }
      if (value->role == ObjRole::kGradManager) {  // a fresh, not yet entered manager
        return Rebuild::call(py::reinterpret_borrow<py::object>(
                                 reinterpret_cast<PyObject*>(Py_TYPE(value->obj.ptr()))), {});
      }
      if (value->role == ObjRole::kInferenceManager) {  // made in the trace, not yet entered
        return Rebuild::call(PyRefs::get().torch.attr("inference_mode"),
                             {Rebuild::constant(value->obj.attr("mode"))});
      }
      if (value->role == ObjRole::kAutocastManager) {  // made in the trace, not yet entered
        std::vector<Rebuild> given;
        for (const auto& item : value->items) given.push_back(Rebuild::constant(item->obj));
        return Rebuild::call(PyRefs::get().torch.attr("autocast"), std::move(given));
      }
      FJ_CHECK(value->role != ObjRole::kInferenceExit && value->role != ObjRole::kAutocastExit,
               "a region ends inside an in-graph inference_mode or autocast block");
      if (value->role == ObjRole::kGradSet) {  // made (and switched) in the trace, not yet entered
        return Rebuild::call(PyRefs::get().support.attr("grad_mode_setter"),
                             {Rebuild::constant(value->obj[py::int_(0)]), Rebuild::constant(value->obj[py::int_(1)])});
      }
      if (value->role == ObjRole::kGradExit) {  // the __exit__ of a block the region ends inside
        return Rebuild::call(PyRefs::get().support.attr("grad_mode_exit"), {Rebuild::constant(value->obj)});
      }
      if (value->role == ObjRole::kSuper) {  // super() kept across the exit: super(cls, self)
        return Rebuild::call(py::module_::import("builtins").attr("super"),
                             {Rebuild::constant(value->obj), rebuild_of(value->bound_self)});
      }
      if (value->role == ObjRole::kMadeFunction) {  // a function made in the trace, escaping
        std::vector<Rebuild> parts = {Rebuild::constant(value->obj), Rebuild::constant(value->globals)};
        for (const auto& part : value->items) parts.push_back(rebuild_of(part));
        for (auto& part : parts) {
          if (part.kind == Rebuild::Kind::kNull) part = Rebuild::constant(py::none());
        }
        r = Rebuild::call(PyRefs::get().support.attr("make_function"), std::move(parts));
        if (value->memo < 0) value->memo = exit_.memo_size++;
        r.memo = value->memo;
        return r;
      }
      if (value->bound_self) {  // a bound method: types.MethodType(function, self)
        return Rebuild::call(py::module_::import("types").attr("MethodType"),
                             {Rebuild::constant(value->obj), rebuild_of(value->bound_self)});
      }
      if (value->role == ObjRole::kTypeMethod) {
        // LOAD_METHOD's [method, self] pair: CPython holds the function found on the type.
        FJ_CHECK(value->obj && !value->obj.is_none(), "method marker without its function");
      }
      return Rebuild::constant(value->obj);
    case VKind::kCell: {
      // A cell made by MAKE_CELL in this region: a new cell with the content it has now.
      std::vector<Rebuild> content;
      if (!value->items.empty()) content.push_back(rebuild_of(value->items[0]));
      r = Rebuild::call(py::module_::import("types").attr("CellType"), std::move(content));
      if (value->memo < 0) value->memo = exit_.memo_size++;
      r.memo = value->memo;
      return r;
    }
    case VKind::kSymNum: {
      if (value->size_of) {  // the size of a tensor the exit has: read again from it
        return Rebuild::call(PyRefs::get().tensor_type.attr("size"),
                             {rebuild_of(value->size_of),
                              Rebuild::constant(py::int_(value->size_dim))});
      }
      std::vector<Rebuild> args;
      for (const auto& item : value->items) args.push_back(rebuild_of(item));
      return Rebuild::call(value->fn, std::move(args));
    }
    case VKind::kIter: {
      std::vector<Rebuild> rest;
      for (size_t i = value->index; i < value->items.size(); ++i) {
        rest.push_back(rebuild_of(value->items[i]));
      }
      Rebuild tuple;
      tuple.kind = Rebuild::Kind::kTuple;
      tuple.value = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyTuple_Type));
      tuple.items = std::move(rest);
      r = Rebuild::call(py::module_::import("builtins").attr("iter"), {std::move(tuple)});
      if (value->memo < 0) value->memo = exit_.memo_size++;
      r.memo = value->memo;
      return r;
    }
    case VKind::kTuple:
    case VKind::kList:
    case VKind::kDict:
      r.kind = value->kind == VKind::kTuple  ? Rebuild::Kind::kTuple
               : value->kind == VKind::kList ? Rebuild::Kind::kList
                                             : Rebuild::Kind::kDict;
      r.value = value->pytype;
      r.keys = value->keys;
      for (const auto& item : value->items) r.items.push_back(rebuild_of(item));
      if (value->kind != VKind::kTuple) {  // mutable: one object however often it is referenced
        if (value->memo < 0) value->memo = exit_.memo_size++;
        r.memo = value->memo;
      }
      return r;
    case VKind::kNull:
      r.kind = Rebuild::Kind::kNull;
      return r;
  }
  throw InternalError("unknown value kind at exit");
}

}  // namespace framejit
