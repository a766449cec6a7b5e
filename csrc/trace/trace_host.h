// What the tracer needs from the layer that runs it, as a small interface: the runtime implements
// it (runtime/code_state.cpp), tests can implement it without a live frame. The tracer includes
// nothing from runtime/.
#pragma once

#include <Python.h>

#include "bytecode/decode.h"

namespace framejit {

class TraceHost {
 public:
  virtual ~TraceHost() = default;
  // Whether the hook traces frames of `code` itself (not torch, the standard library, framejit,
  // ...): a call into such code is inlined. Borrowed: code.
  virtual bool traces_into(PyCodeObject* code) = 0;
  // The decoded bytecode of `code`, decoded once and kept for the code object's life.
  virtual const Bytecode& bytecode_of(PyCodeObject* code) = 0;
};

}  // namespace framejit
