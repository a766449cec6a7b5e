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

// 3.12's inlined comprehensions save the enclosing frame's variable of the same name (NULL when
// unbound) and clear it; a STORE_FAST after the loop puts the saved value back.
void op_load_fast_and_clear(Tracer& t, const Instr& i) {
  t.push(t.local_or_null(i.arg));
  t.set_local(i.arg, Value::null());
}

void op_load_const(Tracer& t, const Instr& i) { t.push(Value::constant(t.co_const(i.arg))); }

void op_load_global(Tracer& t, const Instr& i) {
  ValuePtr value = t.global(t.co_name(pyver::load_global_name(i.arg)));
  if (pyver::load_global_pushes_null(i.arg)) {
    t.push_with_null(std::move(value));
  } else {
    t.push(std::move(value));
  }
}

// 3.13's pairs of local accesses in one instruction: the first local in the high 4 bits of the
// argument, the second in the low 4.
void op_load_fast_load_fast(Tracer& t, const Instr& i) {
  t.push(t.local(i.arg >> 4));
  t.push(t.local(i.arg & 15));
}

void op_store_fast_load_fast(Tracer& t, const Instr& i) {
  t.set_local(i.arg >> 4, t.pop());
  t.push(t.local(i.arg & 15));
}

void op_store_fast_store_fast(Tracer& t, const Instr& i) {
  t.set_local(i.arg >> 4, t.pop());
  t.set_local(i.arg & 15, t.pop());
}

void op_return_value(Tracer& t, const Instr&) { t.finish(t.pop()); }

// `import a.b` / `from a import b` of a module already imported (`import torch` inside a
// function): sys.modules' entry, read by source (guarded as a module is), without the import
// machinery. A module not imported yet would run its import: the region ends before it.
void op_import_name(Tracer& t, const Instr& i) {
  ValuePtr fromlist = t.pop();
  ValuePtr level = t.pop();
  if (!level->is_const() || !PyLong_CheckExact(level->obj.ptr()) || !fromlist->is_constant_tree()) {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "import with a computed level or fromlist");
  }
  std::string name = t.co_name(i.arg);
  const long dots = level->obj.cast<long>();
  if (dots > 0) {
    py::object package = t.frame_globals().attr("get")("__package__");
    if (package.is_none()) FJ_UNSUPPORTED(kUnsupportedOpcode, "relative import outside a package");
    name = py::module_::import("importlib.util")
               .attr("resolve_name")(std::string(static_cast<size_t>(dots), '.') + name, package)
               .cast<std::string>();
  }
  py::object modules = py::module_::import("sys").attr("modules");
  if (!modules.contains(name)) {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "import of '{}', which is not imported yet", name);
  }
  const py::object names = fromlist->as_python();
  const bool from = !names.is_none() && py::len(names) > 0;
  if (from) {
    // `from pkg import sub` of a submodule not imported yet: the import machinery imports it
    // (and runs its code) before IMPORT_FROM reads it, so Python runs this import.
    py::object imported = modules[py::str(name)];
    for (py::handle item : names) {
      if (!PyUnicode_Check(item.ptr())) continue;
      const std::string attr = item.cast<std::string>();
      if (attr != "*" && !py::hasattr(imported, attr.c_str())) {
        FJ_UNSUPPORTED(kUnsupportedOpcode, "from {} import {}, which is not imported yet", name, attr);
      }
    }
  }
  const std::string bound = from ? name : name.substr(0, name.find('.'));
  ValuePtr module = t.entry().load(SourceTable::imported_module(bound));
  if (!module) FJ_UNSUPPORTED(kUnsupportedOpcode, "import of '{}'", bound);
  t.push(std::move(module));
}

void op_import_from(Tracer& t, const Instr& i) { t.push(t.attr(t.peek(), t.co_name(i.arg))); }

// Generators: RETURN_GENERATOR's result is popped at once (the generator value exists
// already: the call made it). A generator expression's YIELD_VALUE records its value and
// receives None, as next() sends; any other generator's hands its value to the consumer
// (generators.cpp).
void op_return_generator(Tracer& t, const Instr&) {
  if (!t.frame().generator && !t.frame().lazy_generator) {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "RETURN_GENERATOR outside a generator");
  }
  t.push(Value::constant(py::none()));
}

void op_yield_value(Tracer& t, const Instr& i) {
  if (t.frame().lazy_generator) return t.generator_yield(t.pop(), i);
  if (!t.frame().generator) FJ_UNSUPPORTED(kUnsupportedOpcode, "yield outside a generator");
  t.frame().yields.push_back(t.pop());
  t.push(Value::constant(py::none()));
}

// Closures. A local captured by an inner function lives in a cell; cells of the frame's own
// function arrive through COPY_FREE_VARS.
void op_make_cell(Tracer& t, const Instr& i) {
  ValuePtr cell = std::make_shared<Value>();
  cell->kind = VKind::kCell;
  TraceFrame& fr = t.frame();
  ValuePtr initial = fr.locals[i.arg];
  if (!initial && !t.inlined()) {
    try {
      initial = t.local(i.arg);  // an argument that is also a cell variable
    } catch (const Unsupported&) {
      initial = nullptr;  // a plain cell variable: empty until assigned
    }
  }
  if (initial && initial->kind != VKind::kNull) cell->items.push_back(initial);
  t.set_local(i.arg, cell);
}

void op_copy_free_vars(Tracer& t, const Instr& i) { t.copy_free_vars(i.arg); }

void op_load_deref(Tracer& t, const Instr& i) { t.push(t.cell_get(t.local(i.arg))); }

void op_store_deref(Tracer& t, const Instr& i) { t.cell_set(t.local(i.arg), t.pop()); }

void op_load_closure(Tracer& t, const Instr& i) { t.push(t.local(i.arg)); }

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
  set(Op::LOAD_FAST_LOAD_FAST, op_load_fast_load_fast);
  set(Op::STORE_FAST_LOAD_FAST, op_store_fast_load_fast);
  set(Op::STORE_FAST_STORE_FAST, op_store_fast_store_fast);
  set(Op::LOAD_FAST_CHECK, op_load_fast);
  set(Op::STORE_FAST, op_store_fast);
  set(Op::DELETE_FAST, op_delete_fast);
  set(Op::LOAD_FAST_AND_CLEAR, op_load_fast_and_clear);
  set(Op::LOAD_CONST, op_load_const);
  set(Op::LOAD_GLOBAL, op_load_global);
  set(Op::IMPORT_NAME, op_import_name);
  set(Op::IMPORT_FROM, op_import_from);
  set(Op::RETURN_VALUE, op_return_value);
  set(Op::RETURN_GENERATOR, op_return_generator);
  set(Op::YIELD_VALUE, op_yield_value);
  set(Op::RETURN_CONST, op_return_const);
  set(Op::MAKE_CELL, op_make_cell);
  set(Op::COPY_FREE_VARS, op_copy_free_vars);
  set(Op::LOAD_DEREF, op_load_deref);
  set(Op::STORE_DEREF, op_store_deref);
  set(Op::LOAD_CLOSURE, op_load_closure);
}

}  // namespace framejit
