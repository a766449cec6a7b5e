// Decoding a code object's bytecode into one instruction list with resolved jumps and lines.
#pragma once

#include <Python.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bytecode/opcodes.h"

namespace framejit {

struct Instr {
  Op op = Op::kUnknown;
  uint8_t raw = 0;
  int arg = 0;      // full argument, EXTENDED_ARG prefixes folded in
  int start = 0;    // code unit of the first EXTENDED_ARG prefix (where jumps land)
  int offset = 0;   // code unit of the opcode itself
  int next = 0;     // code unit of the following instruction, inline caches skipped
  int target = -1;  // code unit a jump goes to, -1 for non-jumps
  int line = -1;    // source line, -1 if none
  int handler = -1;  // code unit of the exception handler covering it (exception table), -1 if none
  int handler_depth = 0;       // the value stack's depth the handler starts from
  bool handler_lasti = false;  // the handler expects the raising instruction's offset pushed
};

class Bytecode {
 public:
  // Decodes raw code units with `table`; lines are left at -1.
  static std::unique_ptr<Bytecode> decode(const uint8_t* bytes, size_t size, const OpTable& table);
  // Decodes a live code object (its unquickened bytes from PyCode_GetCode) with line numbers.
  // Borrowed: code. Raises InternalError on malformed input.
  static std::unique_ptr<Bytecode> from_code(PyCodeObject* code);

  const std::vector<Instr>& instrs() const { return instrs_; }
  // Index into instrs() of the instruction starting at code unit `pc`, or -1.
  int index_at(int pc) const;
  const Instr& at(int pc) const;
  // Where control goes on from code unit `pc`, through unconditional jumps: a region starting
  // there is the same region (3.12 closes `while` with a conditional exit and a JUMP_BACKWARD).
  int landing(int pc) const;
  int size_in_units() const { return static_cast<int>(unit_to_index_.size()); }

  // One instruction per line, in the style of dis: "  12 LOAD_FAST 0 (-> 20)".
  std::string to_string() const;

 private:
  std::vector<Instr> instrs_;
  std::vector<int> unit_to_index_;  // code unit -> index of the instruction starting there, or -1
};

}  // namespace framejit
