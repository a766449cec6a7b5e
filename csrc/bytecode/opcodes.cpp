// Opcode name strings and the per-version raw-byte tables, all expanded from the .def lists.
#include "bytecode/opcodes.h"

#include <Python.h>

namespace framejit {

const char* op_name(Op op) {
  switch (op) {
#define FJ_OPNAME(name) \
  case Op::name:        \
    return #name;
#include "bytecode/opnames.def"
#undef FJ_OPNAME
    case Op::kUnknown:
      break;
  }
  return "<unknown>";
}

namespace {

// Each version's table: the FJ_OP lines of its .def file fill `table`.
#define FJ_OP(name, number, caches, jump) \
  table[number] = OpInfo{Op::name, caches, static_cast<JumpKind>(jump)};

OpTable make_table_311() {
  OpTable table{};
#include "bytecode/opcodes_311.def"
#undef FJ_HAVE_ARGUMENT
  return table;
}

OpTable make_table_312() {
  OpTable table{};
#include "bytecode/opcodes_312.def"
#undef FJ_HAVE_ARGUMENT
  return table;
}

OpTable make_table_313() {
  OpTable table{};
#include "bytecode/opcodes_313.def"
#undef FJ_HAVE_ARGUMENT
  return table;
}

#undef FJ_OP

}  // namespace

const OpTable& op_table_311() {
  static const OpTable table = make_table_311();
  return table;
}

const OpTable& op_table_312() {
  static const OpTable table = make_table_312();
  return table;
}

const OpTable& op_table_313() {
  static const OpTable table = make_table_313();
  return table;
}

const OpTable& native_op_table() {
#if PY_VERSION_HEX >= 0x030D0000
  return op_table_313();
#elif PY_VERSION_HEX >= 0x030C0000
  return op_table_312();
#else
  return op_table_311();
#endif
}

}  // namespace framejit
