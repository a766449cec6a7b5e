// Opcode handlers: jumps. Conditions known at trace time are followed; a condition on a
// tensor's value stops the trace (the graph-break issue turns that into a region exit).
#include <algorithm>

#include "bytecode/version.h"
#include "common/check.h"
#include "trace/modes.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

void op_jump(Tracer& t, const Instr& i) { t.jump(i.target); }

// 3.13's TO_BOOL before a conditional jump: [value] -> [bool(value)].
void op_to_bool(Tracer& t, const Instr& i) {
  ValuePtr value = t.pop();
  if (t.inline_truth(value)) return;  // its __bool__ / __len__, inlined: the bool on its return
  t.push(t.as_bool_for_jump(std::move(value), i));
}

template <bool kJumpIf>
void op_pop_jump_if(Tracer& t, const Instr& i) {
  ValuePtr cond = t.pop();
  if (cond->kind == VKind::kObject) {
    // A class's own __bool__ / __len__ (`if cache:`): inlined, then this jump again on its bool.
    t.repeat_instruction();
    if (t.inline_truth(cond)) return;
    t.jump(i.next);
  }
  if (t.truthy(cond) == kJumpIf) t.jump(i.target);
}

bool is_none(const ValuePtr& v) {
  if (v->kind == VKind::kConst || v->kind == VKind::kObject) return v->obj.is_none();
  if (v->kind == VKind::kNull) throw InternalError("None test of NULL");
  return false;  // tensors and containers are never None
}

template <bool kJumpIfNone>
void op_pop_jump_if_none(Tracer& t, const Instr& i) {
  ValuePtr v = t.pop();
  if (is_none(v) == kJumpIfNone) t.jump(i.target);
}

// `a or b` / `a and b` in 3.11: keep the value and jump, or pop it and go on.
template <bool kJumpIf>
void op_jump_or_pop(Tracer& t, const Instr& i) {
  if (t.truthy(t.peek()) == kJumpIf) {
    t.jump(i.target);
  } else {
    t.pop();
  }
}

// iter(x) for sequences the trace knows element by element: the loop is unrolled.
void op_get_iter(Tracer& t, const Instr&) {
  ValuePtr it = t.iterator_of(t.peek());
  t.pop();
  t.push(std::move(it));
}

void op_for_iter(Tracer& t, const Instr& i) {
  ValuePtr it = t.peek();
  if (it->kind != VKind::kIter) {
    FJ_UNSUPPORTED(kUnsupportedValue, "next() of {} is not traced yet", it->describe());
  }
  if (it->generator_waits()) {  // its frame runs to a yield
    t.resume_generator(*it, TraceFrame::GenMode::kStep, pyver::for_iter_exhausted_pc(i.target));
    return;
  }
  if (ValuePtr item = it->next()) {
    t.push(std::move(item));
    return;
  }
  t.pop();
  t.jump(pyver::for_iter_exhausted_pc(i.target));
}

// `yield from x` in a generator the trace runs: GET_YIELD_FROM_ITER keeps a generator, else
// iter(x); SEND steps it (None is all the trace ever sends: it resumes generators with next).
void op_get_yield_from_iter(Tracer& t, const Instr& i) {
  const ValuePtr& source = t.peek();
  if (source->kind == VKind::kIter && source->iter_form == IterForm::kGenerator) return;
  op_get_iter(t, i);
}

void op_send(Tracer& t, const Instr& i) {
  ValuePtr sent = t.pop();
  if (!sent->is_const() || !sent->obj.is_none()) {
    FJ_UNSUPPORTED(kUnsupportedValue, "send() of {} into a generator", sent->describe());
  }
  ValuePtr receiver = t.peek();
  if (receiver->kind != VKind::kIter) {
    FJ_UNSUPPORTED(kUnsupportedValue, "yield from {} is not traced yet", receiver->describe());
  }
  if (receiver->generator_waits()) {
    t.resume_generator(*receiver, TraceFrame::GenMode::kSend, i.target);
    return;
  }
  if (ValuePtr item = receiver->next()) {
    t.push(std::move(item));
    return;
  }
  if (!pyver::kSendKeepsReceiver) t.pop();  // an iterator's end: the value None
  t.push(Value::constant(py::none()));
  t.jump(i.target);
}

void op_end_send(Tracer& t, const Instr&) {  // 3.12: [receiver, value] -> [value]
  ValuePtr value = t.pop();
  t.pop();
  t.push(std::move(value));
}

void op_end_for(Tracer& t, const Instr&) {  // 3.12: reached only by a jump; pops two values
  t.pop();
  t.pop();
}

// Exceptions raised and caught inside the trace (Tracer::raise_exception).
// An exception object the trace can raise: an instance, or a class called with no arguments.
ValuePtr exception_instance(const ValuePtr& exc) {
  if ((exc->kind == VKind::kObject || exc->kind == VKind::kConst) && !exc->is_special_object() &&
      PyExceptionClass_Check(exc->obj.ptr())) {
    ValuePtr made = simple_exception(exc->obj, py::tuple(), py::dict());
    if (!made) FJ_UNSUPPORTED(kUnsupportedCall, "raise of {}, made by Python code", exc->describe());
    return made;
  }
  return exc;
}

void op_raise_varargs(Tracer& t, const Instr& i) {
  if (i.arg == 0) {  // bare `raise` in an except block
    ValuePtr handled = t.handled_exception();
    if (!handled) FJ_UNSUPPORTED(kUnsupportedOpcode, "bare raise outside an except block of the trace");
    return t.raise_exception(handled);
  }
  if (i.arg == 2) {  // raise exc from cause
    ValuePtr cause = t.pop();
    ValuePtr exc = exception_instance(t.pop());
    if (!(cause->is_const() && cause->obj.is_none())) cause = exception_instance(cause);
    const bool cause_ok = (cause->is_const() && cause->obj.is_none()) ||
                          ((cause->kind == VKind::kObject || cause->kind == VKind::kConst) &&
                           !cause->is_special_object() && PyExceptionInstance_Check(cause->obj.ptr()));
    // Only an exception the trace made gets its __cause__ here (one read by source is the
    // program's object, whose change would outlive the trace).
    if (!cause_ok || exc->kind != VKind::kObject || !exc->remake || exc->source >= 0 ||
        !PyExceptionInstance_Check(exc->obj.ptr())) {
      FJ_UNSUPPORTED(kUnsupportedValue, "raise {} from {}", exc->describe(), cause->describe());
    }
    PyException_SetCause(exc->obj.ptr(), Py_NewRef(cause->obj.ptr()));  // steals; suppresses the context
    exc->cause = std::move(cause);
    return t.raise_exception(exc);
  }
  t.raise_exception(exception_instance(t.pop()));
}

void op_reraise(Tracer& t, const Instr&) { t.raise_exception(t.pop()); }

// [exc] -> [the exception handled before, exc]; POP_EXCEPT pops the former.
void op_push_exc_info(Tracer& t, const Instr&) {
  ValuePtr exc = t.pop();
  ValuePtr before = t.handled_exception();
  t.push(before ? before : Value::constant(py::none()));
  t.enter_handler(exc);
  t.push(std::move(exc));
}

void op_pop_except(Tracer& t, const Instr&) {
  t.pop();
  t.leave_handler();
}

// [exit, lasti, prev_exc, exc] -> [..., exc, exit(type(exc), exc, traceback)]: a with block's
// body raised in the trace. The __exit__ of a manager the trace inlines is called with the
// exception (its traceback None: the trace has none); its answer decides, as in Python,
// whether the block swallows it. A mode manager's (no_grad, autocast) never swallows one.
void op_with_except_start(Tracer& t, const Instr&) {
  const ValuePtr exc = t.peek(0);
  const ValuePtr exit = t.peek(3);
  if (!exit->is(ObjRole::kWithExit) || (exc->kind != VKind::kObject && exc->kind != VKind::kConst)) {
    FJ_UNSUPPORTED(kUnsupportedValue, "an exception leaving a with block of {}", exit->describe());
  }
  std::vector<ValuePtr> args = {
      Value::object(py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(exc->obj.ptr())))),
      exc, Value::constant(py::none())};
  if (ValuePtr result = t.call(exit, std::move(args), {})) t.push(std::move(result));
}

// [exc, type] -> [exc, isinstance(exc, type)]
void op_check_exc_match(Tracer& t, const Instr&) {
  ValuePtr type = t.pop();
  const ValuePtr& exc = t.peek();
  auto a_class = [](const ValuePtr& v) {
    return (v->kind == VKind::kObject || v->kind == VKind::kConst) && !v->is_special_object() &&
           PyType_Check(v->obj.ptr());
  };
  py::object classes;
  if (a_class(type)) {
    classes = type->obj;
  } else if (type->kind == VKind::kTuple &&
             std::all_of(type->items.begin(), type->items.end(), a_class)) {
    py::list items;
    for (const ValuePtr& item : type->items) items.append(item->obj);
    classes = py::tuple(items);
  } else {
    FJ_UNSUPPORTED(kUnsupportedValue, "except clause on {}", type->describe());
  }
  if (exc->kind != VKind::kObject && exc->kind != VKind::kConst) {
    FJ_UNSUPPORTED(kUnsupportedValue, "except clause matching {}", exc->describe());
  }
  const int match = PyErr_GivenExceptionMatches(exc->obj.ptr(), classes.ptr());
  t.push(Value::constant(py::bool_(match != 0)));
}

}  // namespace

bool Tracer::set_items_by_source(const ValuePtr& set, std::vector<ValuePtr>& out) {
  py::tuple items = py::reinterpret_steal<py::tuple>(PySequence_Tuple(set->obj.ptr()));
  if (!items) throw py::error_already_set();
  for (py::handle item : items) {
    if (!guard_comparable(item.ptr())) return false;
  }
  entry_.guard_dict_keys(set->source, items.ptr());
  for (py::handle item : items) out.push_back(Value::constant(py::reinterpret_borrow<py::object>(item)));
  return true;
}

bool Tracer::enum_members(const ValuePtr& cls, std::vector<ValuePtr>& out) {
  static PyObject* const kIter = PyUnicode_InternFromString("__iter__");
  PyTypeObject* meta = Py_TYPE(cls->obj.ptr());
  if (_PyType_Lookup(meta, kIter) !=
      _PyType_Lookup(reinterpret_cast<PyTypeObject*>(PyRefs::get().enum_meta.ptr()), kIter)) {
    return false;  // a metaclass iterating in its own way
  }
  py::dict members = cls->obj.attr("_member_map_");
  for (py::handle name : cls->obj.attr("_member_names_")) {
    out.push_back(Value::object(py::reinterpret_borrow<py::object>(members[name])));
  }
  return true;
}

ValuePtr Tracer::iterator_of(const ValuePtr& seq) {
  if (seq->kind == VKind::kIter) return seq;
  if (seq->kind == VKind::kSymNum) {
    // range(n) of a number of the entry state: its value, where this place may pin it.
    if (ValuePtr pinned = sizes_.concretize(seq); pinned->is_const()) return iterator_of(pinned);
  }
  // Iterated as it is at each step: the loop body may change it (lst.append, d[k] = v).
  if (seq->kind == VKind::kList || seq->kind == VKind::kDict) return Value::iter_over(seq);
  if (seq->is(ObjRole::kDictView)) {
    if (seq->over->kind == VKind::kDict) {
      const char view = seq->method == "values" ? 'v' : seq->method == "items" ? 'i' : 'k';
      return Value::iter_over(seq->over, view);
    }
    // A dict read by source: its guarded snapshot (changing it ends the region), rebuilt at
    // an exit as a real iterator over the real dict, which raises if the dict changes size.
    ValuePtr it = Value::iter(dict_view_items(*seq));
    it->over = seq->over;
    it->view = seq->method == "values" ? 'v' : seq->method == "items" ? 'i' : 'k';
    for (py::handle key : py::list(seq->over->obj)) it->keys.push_back(py::reinterpret_borrow<py::object>(key));
    seq->over->add_iterator(it);  // a change of its size ends the region first (make_writable)
    return it;
  }
  if (reads_as_dict(seq, "__iter__")) {
    // `for k in d` of a dict read by source: as `for k in d.keys()`.
    ValuePtr it = Value::iter(stored_view(seq, "keys")->items);
    it->over = seq;
    it->view = 'k';
    for (py::handle key : py::list(seq->obj)) it->keys.push_back(py::reinterpret_borrow<py::object>(key));
    seq->add_iterator(it);
    return it;
  }
  std::vector<ValuePtr> items;
  if (seq->is_sequence()) {
    items = seq->items;
  } else if (seq->kind == VKind::kTensor) {
    items = tensor_rows(seq)->items;
  } else if (seq->kind == VKind::kObject && seq->source >= 0 && module_children(seq, items)) {
    // ModuleList, Sequential, ParameterList: children read by source; ModuleDict: its keys.
  } else if (seq->is_const() && PyRange_Check(seq->obj.ptr())) {
    // Made one item at a time: a loop that breaks early never makes the rest.
    ValuePtr it = Value::iter({});
    it->iter_form = IterForm::kRange;
    it->lazy_range = seq->obj;
    return it;
  } else if (seq->is_const() && (PyTuple_Check(seq->obj.ptr()) || PyUnicode_Check(seq->obj.ptr()) ||
                                  PyList_CheckExact(seq->obj.ptr()) || ordered_set(seq))) {
    for (py::handle item : seq->obj) {
      items.push_back(Value::constant(py::reinterpret_borrow<py::object>(item)));
    }
  } else if (seq->is(ObjRole::kPlain) && !seq->bound_self && seq->source >= 0 &&
             PyAnySet_CheckExact(seq->obj.ptr()) && set_items_by_source(seq, items)) {
    // `for t in self.layer_types_set`: a set read by source, in the order it iterates now
    // (equal sets may iterate in other orders: the order itself is guarded).
  } else if (seq->kind == VKind::kObject && PyRefs::get().is_enum_class(seq->obj.ptr()) &&
             enum_members(seq, items)) {
    // `for m in Mode`: its members in definition order (fixed with the class, guarded by
    // identity as every class read by source is).
  } else if (ValuePtr generator = python_generator_iter(seq)) {
    return generator;  // a class whose __iter__ is a generator function (collections.abc's)
  } else {
    FJ_UNSUPPORTED(kUnsupportedValue, "iterating over {} is not traced yet", seq->describe());
  }
  return Value::iter(std::move(items));
}

void op_before_with(Tracer& t, const Instr&) {
  ValuePtr manager = t.pop();
  if (t.enter_python_with(manager)) return;  // a class of the user's or a library's
  enter_with(t, manager);                    // a mode manager of the trace, or a null context
}

void register_control_ops(HandlerTable& table) {
  auto set = [&](Op op, OpHandler handler) { table[static_cast<size_t>(op)] = handler; };
  set(Op::JUMP_FORWARD, op_jump);
  set(Op::TO_BOOL, op_to_bool);
  set(Op::JUMP_BACKWARD, op_jump);
  set(Op::JUMP_BACKWARD_NO_INTERRUPT, op_jump);
  set(Op::POP_JUMP_FORWARD_IF_TRUE, op_pop_jump_if<true>);
  set(Op::POP_JUMP_BACKWARD_IF_TRUE, op_pop_jump_if<true>);
  set(Op::POP_JUMP_IF_TRUE, op_pop_jump_if<true>);
  set(Op::POP_JUMP_FORWARD_IF_FALSE, op_pop_jump_if<false>);
  set(Op::POP_JUMP_BACKWARD_IF_FALSE, op_pop_jump_if<false>);
  set(Op::POP_JUMP_IF_FALSE, op_pop_jump_if<false>);
  set(Op::POP_JUMP_FORWARD_IF_NONE, op_pop_jump_if_none<true>);
  set(Op::POP_JUMP_BACKWARD_IF_NONE, op_pop_jump_if_none<true>);
  set(Op::POP_JUMP_IF_NONE, op_pop_jump_if_none<true>);
  set(Op::POP_JUMP_FORWARD_IF_NOT_NONE, op_pop_jump_if_none<false>);
  set(Op::POP_JUMP_BACKWARD_IF_NOT_NONE, op_pop_jump_if_none<false>);
  set(Op::POP_JUMP_IF_NOT_NONE, op_pop_jump_if_none<false>);
  set(Op::JUMP_IF_TRUE_OR_POP, op_jump_or_pop<true>);
  set(Op::JUMP_IF_FALSE_OR_POP, op_jump_or_pop<false>);
  set(Op::GET_ITER, op_get_iter);
  set(Op::BEFORE_WITH, op_before_with);
  set(Op::FOR_ITER, op_for_iter);
  set(Op::END_FOR, op_end_for);
  set(Op::GET_YIELD_FROM_ITER, op_get_yield_from_iter);
  set(Op::SEND, op_send);
  set(Op::END_SEND, op_end_send);
  set(Op::RAISE_VARARGS, op_raise_varargs);
  set(Op::RERAISE, op_reraise);
  set(Op::PUSH_EXC_INFO, op_push_exc_info);
  set(Op::POP_EXCEPT, op_pop_except);
  set(Op::CHECK_EXC_MATCH, op_check_exc_match);
  set(Op::WITH_EXCEPT_START, op_with_except_start);
}

}  // namespace framejit
