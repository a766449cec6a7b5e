// The description of a region's exit, shared by the tracer that writes it and the runtime that
// performs it: where the region stops, what the runtime does there, the Python state to rebuild
// and the attribute and global writes to replay.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "bytecode/opcodes.h"
#include "common/py.h"
#include "region/rebuild.h"

namespace framejit {

// Where a region stops and what the runtime does there. The region's graph has run and the
// Python state (locals written into the frame, the value stack) is as CPython would have it
// just before instruction `pc`.
enum class ExitKind : uint8_t {
  kReturn,   // RETURN_VALUE: the frame's result is `result`
  kBranch,   // a jump on a value the trace could not decide: the runtime tests its truth
  kCall,     // a call the trace could not inline: the runtime makes it (the callee's frame meets
             // the hook), pushes the result and goes on
  kIter,     // GET_ITER / FOR_ITER on an iterator the trace could not unroll: performed likewise
  kWith,     // BEFORE_WITH: the runtime enters the context manager (torch.no_grad(), ...); the
             // body is traced under the state it sets, and __exit__ is a call like any other
  kSubscr,   // BINARY_SUBSCR the trace could not record (x[x > 0]: a size that depends on the
             // data): the runtime reads the item, pushes it and goes on
  kDeopt,    // anything else: CPython resumes the frame at `pc`
};

const char* exit_kind_name(ExitKind kind);

struct RegionExit {
  ExitKind kind = ExitKind::kDeopt;
  int pc = 0;         // code unit where the instruction at the exit starts (EXTENDED_ARGs first)
  int op_pc = 0;      // code unit of its opcode: where an exception it raises is reported
  int next_pc = 0;    // the instruction after it
  int target_pc = 0;  // kBranch: the jump target; kIter (FOR_ITER): where exhaustion goes
  Op op = Op::kUnknown;
  int nargs = 0;       // kCall: positional arguments on the stack (CALL n)
  py::object kwnames;  // kCall: keyword names (a tuple) or None
  bool kwnames_on_stack = false;  // kCall: 3.13's CALL_KW, the names one stack entry above the args
  std::vector<std::pair<int, Rebuild>> locals;  // locals written back (kNull: deleted)
  std::vector<Rebuild> stack;                   // the whole value stack at the exit
  Rebuild result;                               // kReturn
  // Attribute writes to objects that existed before the region, replayed in program order
  // (setattr(target, name, value)) after the graph ran and before the exit is performed; and,
  // with name None, the new contents of the lists and dicts of the entry state the region
  // changed in place (target[:] = value for a list, clear() and update(value) for a dict), put
  // in before the exit's locals and stack are built (an iterator over one starts from them).
  struct AttrWrite {
    Rebuild target;
    py::object name;
    Rebuild value;
    bool generic = false;  // object.__setattr__'s store, past the class's own __setattr__
    bool item = false;     // target[key] = value (name unused)
    Rebuild key;
    bool call = false;     // target.name(value), called for its effect (a ContextVar's set)
  };
  std::vector<AttrWrite> attr_writes;
  // Python arithmetic of the region on numbers known only at run time (math.log(x.item()),
  // 1 / n), computed even where nothing reads the result, since it may raise: before the graph
  // runs where it reads only entry values (an error then leaves nothing to undo), else at the
  // exit.
  std::vector<Rebuild> checks_before;
  std::vector<Rebuild> checks;
  int memo_size = 0;
  std::string reason;  // why the trace stopped here, with the user's file:line
};

}  // namespace framejit
