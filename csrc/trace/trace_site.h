// Where the trace is: the frame and instruction being traced. The tracer updates it before each
// instruction; the components read it to place graph nodes and name file:line in messages.
#pragma once

#include <Python.h>

#include <string>

#include "bytecode/decode.h"

namespace framejit {

class Node;

struct TraceSite {
  PyCodeObject* code = nullptr;  // borrowed: the innermost frame's code
  const Instr* instr = nullptr;  // the instruction being traced (nullptr before the first)
  bool inlined = false;          // inside an inlined callee, not the region's own frame

  int line() const { return instr ? instr->line : -1; }
  // "model.py:12".
  std::string here() const;
  // Marks a node made inside an inlined callee with the callee's file and function (the printed
  // graph names them); a node of the region's own frame keeps the graph's.
  void locate(Node* node) const;
};

}  // namespace framejit
