// Bytecode decoding: EXTENDED_ARG folding, inline caches skipped, relative jumps resolved.
#include "bytecode/decode.h"

#include <fmt/format.h>

#include "common/check.h"

namespace framejit {

std::unique_ptr<Bytecode> Bytecode::decode(const uint8_t* bytes, size_t size,
                                           const OpTable& table) {
  FJ_CHECK(size % 2 == 0, "bytecode length {} is odd", size);
  auto bc = std::make_unique<Bytecode>();
  const int units = static_cast<int>(size / 2);
  bc->unit_to_index_.assign(units, -1);
  int unit = 0;
  while (unit < units) {
    Instr instr;
    instr.start = unit;
    int arg = 0;
    while (true) {
      FJ_CHECK(unit < units, "bytecode ends inside EXTENDED_ARG at unit {}", unit);
      const uint8_t raw = bytes[2 * unit];
      arg = (arg << 8) | bytes[2 * unit + 1];
      if (table[raw].op != Op::EXTENDED_ARG) {
        instr.raw = raw;
        break;
      }
      ++unit;
    }
    const OpInfo& info = table[instr.raw];
    instr.op = info.op;
    instr.arg = arg;
    instr.offset = unit;
    instr.next = unit + 1 + info.cache_entries;
    if (info.jump == JumpKind::kForward) instr.target = instr.next + arg;
    if (info.jump == JumpKind::kBackward) instr.target = instr.next - arg;
    bc->unit_to_index_[instr.start] = static_cast<int>(bc->instrs_.size());
    bc->instrs_.push_back(instr);
    unit = instr.next;
  }
  return bc;
}

std::unique_ptr<Bytecode> Bytecode::from_code(PyCodeObject* code) {
  PyObject* raw = PyCode_GetCode(code);  // New: bytes without the adaptive interpreter's rewrites
  if (raw == nullptr) {
    PyErr_Clear();
    throw InternalError("PyCode_GetCode failed");
  }
  auto bc = decode(reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(raw)),
                   static_cast<size_t>(PyBytes_GET_SIZE(raw)), native_op_table());
  Py_DECREF(raw);
  // One pass over the line table (co_lines: (start byte, end byte, line) ranges); calling
  // PyCode_Addr2Line per instruction would rescan the table each time.
  std::vector<int> unit_line(bc->unit_to_index_.size(), -1);
  PyObject* ranges = PyObject_CallMethod(reinterpret_cast<PyObject*>(code), "co_lines", nullptr);
  PyObject* iter = ranges ? PyObject_GetIter(ranges) : nullptr;  // New
  Py_XDECREF(ranges);
  if (iter == nullptr) {
    PyErr_Clear();
    throw InternalError("co_lines() failed");
  }
  while (PyObject* range = PyIter_Next(iter)) {  // New
    long start = 0, end = 0;
    PyObject* line = Py_None;
    if (PyArg_ParseTuple(range, "llO", &start, &end, &line) && line != Py_None) {
      const int value = static_cast<int>(PyLong_AsLong(line));
      for (long unit = start / 2; unit < end / 2 && unit < static_cast<long>(unit_line.size());
           ++unit) {
        unit_line[unit] = value;
      }
    }
    PyErr_Clear();
    Py_DECREF(range);
  }
  Py_DECREF(iter);
  for (Instr& instr : bc->instrs_) instr.line = unit_line[instr.offset];
  // The exception table (3.11+): entries of four varints (start, length, target in code units;
  // depth and lasti), 6 bits per byte, bit 6 set on every byte but an entry field's last.
  PyObject* table = PyObject_GetAttrString(reinterpret_cast<PyObject*>(code), "co_exceptiontable");
  if (table == nullptr || !PyBytes_Check(table)) {
    Py_XDECREF(table);
    PyErr_Clear();
    throw InternalError("co_exceptiontable is not bytes");
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(table));
  const size_t n = static_cast<size_t>(PyBytes_GET_SIZE(table));
  size_t at = 0;
  auto varint = [&](long& out) {
    if (at >= n) return false;
    uint8_t b = bytes[at++];
    out = b & 63;
    while ((b & 64) && at < n) {
      b = bytes[at++];
      out = (out << 6) | (b & 63);
    }
    return true;
  };
  long start = 0, length = 0, target = 0, depth_lasti = 0;
  while (varint(start) && varint(length) && varint(target) && varint(depth_lasti)) {
    for (long unit = start; unit < start + length && unit < bc->size_in_units(); ++unit) {
      const int index = bc->index_at(static_cast<int>(unit));
      // An instruction's range covers its EXTENDED_ARG prefixes and caches: keyed by its start.
      if (index < 0) continue;
      Instr& ins = bc->instrs_[index];
      ins.handler = static_cast<int>(target);
      ins.handler_depth = static_cast<int>(depth_lasti >> 1);
      ins.handler_lasti = (depth_lasti & 1) != 0;
    }
  }
  Py_DECREF(table);
  return bc;
}

int Bytecode::index_at(int pc) const {
  if (pc < 0 || pc >= static_cast<int>(unit_to_index_.size())) return -1;
  return unit_to_index_[pc];
}

const Instr& Bytecode::at(int pc) const {
  const int index = index_at(pc);
  FJ_CHECK(index >= 0, "no instruction starts at code unit {}", pc);
  return instrs_[index];
}

int Bytecode::landing(int pc) const {
  // Bounded: `while True: pass` is a jump to itself.
  for (size_t hops = 0; hops < instrs_.size(); ++hops) {
    const int index = index_at(pc);
    if (index < 0) return pc;
    const Instr& ins = instrs_[index];
    if (ins.op != Op::JUMP_FORWARD && ins.op != Op::JUMP_BACKWARD &&
        ins.op != Op::JUMP_BACKWARD_NO_INTERRUPT) {
      return pc;
    }
    pc = ins.target;
  }
  return pc;
}

std::string Bytecode::to_string() const {
  std::string out;
  for (const Instr& instr : instrs_) {
    out += fmt::format("{:>4} {}", instr.start, op_name(instr.op));
    if (instr.raw >= 90 || instr.arg != 0) out += fmt::format(" {}", instr.arg);
    if (instr.target >= 0) out += fmt::format(" (-> {})", instr.target);
    out += "\n";
  }
  return out;
}

}  // namespace framejit
