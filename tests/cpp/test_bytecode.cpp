// Bytecode decoding: EXTENDED_ARG folding, inline caches, jump targets, lines, both versions.
#include <pybind11/embed.h>

#include <catch2/catch.hpp>

#include "bytecode/decode.h"

namespace py = pybind11;
using framejit::Bytecode;
using framejit::Op;

namespace {

PyCodeObject* compile_fn(const char* source, const char* name) {
  py::dict scope;
  py::exec(source, scope);
  py::object fn = scope[name];
  return reinterpret_cast<PyCodeObject*>(py::object(fn.attr("__code__")).release().ptr());
}

}  // namespace

TEST_CASE("straight-line function decodes to the instructions dis shows") {
  PyCodeObject* code = compile_fn("def f(x, y):\n    z = x + y\n    return z * 2\n", "f");
  auto bc = Bytecode::from_code(code);
  py::object dis = py::module_::import("dis");
  std::vector<std::string> expected;
  std::vector<int> expected_lines;
  for (py::handle ins : dis.attr("get_instructions")(py::reinterpret_borrow<py::object>(
           reinterpret_cast<PyObject*>(code)))) {
    const std::string name = ins.attr("opname").cast<std::string>();
    if (name == "CACHE" || name == "EXTENDED_ARG") continue;
    expected.push_back(name);
    py::object line = ins.attr("positions").attr("lineno");
    expected_lines.push_back(line.is_none() ? -1 : line.cast<int>());
  }
  std::vector<std::string> got;
  for (const auto& ins : bc->instrs()) got.push_back(framejit::op_name(ins.op));
  CHECK(got == expected);
  std::vector<int> got_lines;
  for (const auto& ins : bc->instrs()) got_lines.push_back(ins.line);
  CHECK(got_lines == expected_lines);
  // pybind11's exec adds a coding line, so the source's line 3 is line 4 here.
  const auto& last = bc->instrs().back();
  CHECK(last.op == Op::RETURN_VALUE);
  CHECK(last.line == 4);
  Py_DECREF(code);
}

TEST_CASE("EXTENDED_ARG is folded into the next instruction's argument") {
  // EXTENDED_ARG 1; LOAD_CONST 2  => LOAD_CONST 258 starting at unit 0, opcode at unit 1.
  const auto& table = framejit::op_table_311();
  uint8_t extended = 0, load_const = 0;
  for (int i = 0; i < 256; ++i) {
    if (table[i].op == Op::EXTENDED_ARG) extended = static_cast<uint8_t>(i);
    if (table[i].op == Op::LOAD_CONST) load_const = static_cast<uint8_t>(i);
  }
  const uint8_t bytes[] = {extended, 1, load_const, 2};
  auto bc = Bytecode::decode(bytes, sizeof(bytes), table);
  REQUIRE(bc->instrs().size() == 1);
  CHECK(bc->instrs()[0].arg == 258);
  CHECK(bc->instrs()[0].start == 0);
  CHECK(bc->instrs()[0].offset == 1);
  CHECK(bc->index_at(0) == 0);
  CHECK(bc->index_at(1) == -1);
}

TEST_CASE("inline caches are skipped and relative jumps resolved in 3.11 and 3.12") {
  for (const auto* table : {&framejit::op_table_311(), &framejit::op_table_312()}) {
    uint8_t binary_op = 0, jump_forward = 0, jump_backward = 0, nop = 0;
    for (int i = 0; i < 256; ++i) {
      const Op op = (*table)[i].op;
      if (op == Op::BINARY_OP) binary_op = static_cast<uint8_t>(i);
      if (op == Op::JUMP_FORWARD) jump_forward = static_cast<uint8_t>(i);
      if (op == Op::JUMP_BACKWARD) jump_backward = static_cast<uint8_t>(i);
      if (op == Op::NOP) nop = static_cast<uint8_t>(i);
    }
    REQUIRE((*table)[binary_op].cache_entries == 1);
    // 0: NOP  1: BINARY_OP 0 (+1 cache)  3: JUMP_FORWARD 1  4: NOP  5: JUMP_BACKWARD 6
    const uint8_t bytes[] = {nop, 0, binary_op, 0, 0, 0, jump_forward, 1, nop, 0,
                             jump_backward, 6};
    auto bc = Bytecode::decode(bytes, sizeof(bytes), *table);
    REQUIRE(bc->instrs().size() == 5);
    CHECK(bc->instrs()[1].next == 3);
    CHECK(bc->instrs()[2].target == 5);
    CHECK(bc->instrs()[4].target == 0);
  }
}

TEST_CASE("the printed listing names each instruction and its jump target") {
  PyCodeObject* code = compile_fn("def g(a):\n    return a if a else 0\n", "g");
  auto bc = Bytecode::from_code(code);
  const std::string text = bc->to_string();
  CHECK(text.find("RESUME") != std::string::npos);
  CHECK(text.find("(-> ") != std::string::npos);
  CHECK(text.find("RETURN_VALUE") != std::string::npos);
  Py_DECREF(code);
}
