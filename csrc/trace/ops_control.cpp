// Opcode handlers: jumps. Conditions known at trace time are followed; a condition on a
// tensor's value stops the trace (the graph-break issue turns that into a region exit).
#include "common/check.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

void op_jump(Tracer& t, const Instr& i) { t.jump(i.target); }

template <bool kJumpIf>
void op_pop_jump_if(Tracer& t, const Instr& i) {
  ValuePtr cond = t.pop();
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

}  // namespace

void register_control_ops(HandlerTable& table) {
  auto set = [&](Op op, OpHandler handler) { table[static_cast<size_t>(op)] = handler; };
  set(Op::JUMP_FORWARD, op_jump);
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
}

}  // namespace framejit
