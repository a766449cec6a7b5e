// Opcodes as one enum covering every supported Python, and the raw-byte table of the running one.
#pragma once

#include <array>
#include <cstdint>

namespace framejit {

// Semantic opcodes: the union of the names in opcodes_<ver>.def (see opnames.def). Raw opcode
// numbers differ between Python versions; everything past decoding uses this enum.
enum class Op : uint8_t {
#define FJ_OPNAME(name) name,
#include "bytecode/opnames.def"
#undef FJ_OPNAME
  kUnknown,
};

enum class JumpKind : uint8_t { kNone = 0, kForward = 1, kBackward = 2 };

struct OpInfo {
  Op op = Op::kUnknown;
  uint8_t cache_entries = 0;  // inline CACHE code units that follow the instruction
  JumpKind jump = JumpKind::kNone;
};

using OpTable = std::array<OpInfo, 256>;

const char* op_name(Op op);

// The table for the Python this module was compiled against.
const OpTable& native_op_table();

// Tables for each supported version, so tests can decode bytes of either.
const OpTable& op_table_311();
const OpTable& op_table_312();
const OpTable& op_table_313();

}  // namespace framejit
