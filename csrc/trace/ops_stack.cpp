// Opcode handlers: stack shuffling, locals, constants, globals, return.
#include "bytecode/version.h"
#include "common/check.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

void op_nop(Tracer&, const Instr&) {}

void op_pop_top(Tracer& t, const Instr&) { t.pop(); }

void op_push_null(Tracer& t, const Instr&) { t.push(Value::null()); }

void op_copy(Tracer& t, const Instr& i) { t.push(t.peek(static_cast<size_t>(i.arg) - 1)); }

void op_swap(Tracer& t, const Instr& i) { std::swap(t.peek(0), t.peek(static_cast<size_t>(i.arg) - 1)); }

void op_load_fast(Tracer& t, const Instr& i) { t.push(t.local(i.arg)); }

void op_store_fast(Tracer& t, const Instr& i) { t.set_local(i.arg, t.pop()); }

void op_delete_fast(Tracer& t, const Instr& i) { t.delete_local(i.arg); }

void op_load_const(Tracer& t, const Instr& i) { t.push(Value::constant(t.co_const(i.arg))); }

void op_load_global(Tracer& t, const Instr& i) {
  if (pyver::load_global_pushes_null(i.arg)) t.push(Value::null());
  t.push(t.global(t.co_name(pyver::load_global_name(i.arg))));
}

void op_return_value(Tracer& t, const Instr&) { t.finish(t.pop()); }

void op_return_const(Tracer& t, const Instr& i) { t.finish(Value::constant(t.co_const(i.arg))); }

}  // namespace

void register_stack_ops(HandlerTable& table) {
  auto set = [&](Op op, OpHandler handler) { table[static_cast<size_t>(op)] = handler; };
  set(Op::RESUME, op_nop);
  set(Op::NOP, op_nop);
  set(Op::POP_TOP, op_pop_top);
  set(Op::PUSH_NULL, op_push_null);
  set(Op::COPY, op_copy);
  set(Op::SWAP, op_swap);
  set(Op::LOAD_FAST, op_load_fast);
  set(Op::LOAD_FAST_CHECK, op_load_fast);
  set(Op::STORE_FAST, op_store_fast);
  set(Op::DELETE_FAST, op_delete_fast);
  set(Op::LOAD_CONST, op_load_const);
  set(Op::LOAD_GLOBAL, op_load_global);
  set(Op::RETURN_VALUE, op_return_value);
  set(Op::RETURN_CONST, op_return_const);
}

}  // namespace framejit
