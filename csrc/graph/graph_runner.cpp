// The IR runner: a graph flattened once into steps over registers, run by vectorcall.
#include "graph/graph_runner.h"

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/ref.h"
#include "graph/fx_export.h"

namespace framejit {

namespace {

// Where a call argument comes from. Constants are borrowed from the graph, which the runner owns.
struct Operand {
  enum class Kind : uint8_t { kRegister, kConstant, kTuple, kList, kDict };
  Kind kind = Kind::kConstant;
  int reg = -1;
  PyObject* constant = nullptr;  // Borrowed (kConstant)
  std::vector<Operand> items;    // kTuple, kList, kDict (values)
  py::object keys;               // kDict: a tuple of str
};

// One call node. `args` holds the positional operands, then one per name in kwnames.
struct Step {
  PyObject* callable = nullptr;  // Borrowed from the node: the function, or the method name
  bool method = false;           // call_method: args[0] is the object
  std::vector<Operand> args;
  Py_ssize_t num_positional = 0;
  py::object kwnames;  // tuple of str, or None
  int out = -1;
  std::vector<int> frees;  // registers dead once this step has run
};

struct Program {
  std::unique_ptr<Graph> graph;
  int num_inputs = 0;
  std::vector<int> input_regs;  // per placeholder: its register, or -1 when nothing reads it
  int num_regs = 0;
  std::vector<Step> steps;
  Operand output;
};

struct GraphRunnerObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Program* program;  // Owned; null once cleared by the GC
};

Operand operand_of(const Arg& arg, const std::unordered_map<const Node*, int>& regs) {
  Operand op;
  switch (arg.kind) {
    case Arg::Kind::kNode: {
      auto it = regs.find(arg.node);
      FJ_CHECK(it != regs.end(), "runner: {} read before it is computed", arg.node->name);
      op.kind = Operand::Kind::kRegister;
      op.reg = it->second;
      return op;
    }
    case Arg::Kind::kConst:
      op.kind = Operand::Kind::kConstant;
      op.constant = arg.value.ptr();
      return op;
    case Arg::Kind::kTuple:
    case Arg::Kind::kList:
    case Arg::Kind::kDict: {
      op.kind = arg.kind == Arg::Kind::kTuple  ? Operand::Kind::kTuple
                : arg.kind == Arg::Kind::kList ? Operand::Kind::kList
                                               : Operand::Kind::kDict;
      for (const Arg& item : arg.items) op.items.push_back(operand_of(item, regs));
      if (arg.kind == Arg::Kind::kDict) {
        py::tuple keys(arg.keys.size());
        for (size_t i = 0; i < arg.keys.size(); ++i) keys[i] = py::str(arg.keys[i]);
        op.keys = std::move(keys);
      }
      return op;
    }
  }
  throw InternalError("runner: unknown argument kind");
}

void note_reads(const Operand& op, int step, std::vector<int>& last_use) {
  if (op.kind == Operand::Kind::kRegister) last_use[op.reg] = step;
  for (const Operand& item : op.items) note_reads(item, step, last_use);
}

std::unique_ptr<Program> flatten(std::unique_ptr<Graph> graph) {
  auto program = std::make_unique<Program>();
  std::unordered_map<const Node*, int> regs;
  for (const auto& node : graph->nodes()) {
    if (node->kind == NodeKind::kPlaceholder) {
      const int reg = program->num_regs++;
      regs[node.get()] = reg;
      program->input_regs.push_back(node->users.empty() ? -1 : reg);
      ++program->num_inputs;
      continue;
    }
    if (node->kind == NodeKind::kOutput) {
      program->output = operand_of(node->args.at(0), regs);
      continue;
    }
    Step step;
    step.callable = node->target.ptr();
    step.method = node->kind == NodeKind::kCallMethod;
    for (const Arg& arg : node->args) step.args.push_back(operand_of(arg, regs));
    step.num_positional = static_cast<Py_ssize_t>(step.args.size());
    if (!node->kwargs.empty()) {
      py::tuple names(node->kwargs.size());
      for (size_t i = 0; i < node->kwargs.size(); ++i) {
        names[i] = py::str(node->kwargs[i].first);
        step.args.push_back(operand_of(node->kwargs[i].second, regs));
      }
      step.kwnames = std::move(names);
    }
    FJ_CHECK(!step.method || step.num_positional > 0, "runner: method {} without an object",
             node->name);
    step.out = program->num_regs++;
    regs[node.get()] = step.out;
    program->steps.push_back(std::move(step));
  }
  // Liveness: a register dies after the last step that reads it (or its own step when nothing
  // does); the output's registers live until the result is built.
  const int num_steps = static_cast<int>(program->steps.size());
  std::vector<int> last_use(program->num_regs, -1);
  for (int i = 0; i < num_steps; ++i) {
    Step& step = program->steps[i];
    last_use[step.out] = i;
    for (const Operand& op : step.args) note_reads(op, i, last_use);
  }
  note_reads(program->output, num_steps, last_use);
  for (int reg = 0; reg < program->num_regs; ++reg) {
    if (last_use[reg] >= 0 && last_use[reg] < num_steps) {
      program->steps[last_use[reg]].frees.push_back(reg);
    }
  }
  program->graph = std::move(graph);
  return program;
}

// The operand's value: Borrowed for registers and constants, New for containers (`owned` set).
// NULL with an error set on failure.
PyObject* value_of(const Operand& op, const Ref* regs, bool* owned) {
  *owned = false;
  switch (op.kind) {
    case Operand::Kind::kRegister:
      return regs[op.reg].get();
    case Operand::Kind::kConstant:
      return op.constant;
    case Operand::Kind::kTuple:
    case Operand::Kind::kList:
    case Operand::Kind::kDict:
      break;
  }
  *owned = true;
  const Py_ssize_t n = static_cast<Py_ssize_t>(op.items.size());
  PyObject* out = op.kind == Operand::Kind::kTuple  ? PyTuple_New(n)
                  : op.kind == Operand::Kind::kList ? PyList_New(n)
                                                    : PyDict_New();
  if (out == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    bool item_owned;
    PyObject* item = value_of(op.items[i], regs, &item_owned);
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    if (!item_owned) Py_INCREF(item);  // now New either way
    if (op.kind == Operand::Kind::kTuple) {
      PyTuple_SET_ITEM(out, i, item);  // steals
    } else if (op.kind == Operand::Kind::kList) {
      PyList_SET_ITEM(out, i, item);  // steals
    } else {
      const int rc = PyDict_SetItem(out, PyTuple_GET_ITEM(op.keys.ptr(), i), item);  // no steal
      Py_DECREF(item);
      if (rc < 0) {
        Py_DECREF(out);
        return nullptr;
      }
    }
  }
  return out;
}

// Runs one step into regs[step.out]. Returns false with an error set on failure.
bool run_step(const Step& step, Ref* regs) {
  constexpr size_t kInline = 8;
  const size_t n = step.args.size();
  PyObject* inline_argv[kInline + 1];
  bool inline_owned[kInline];
  std::vector<PyObject*> heap_argv;
  std::vector<char> heap_owned;
  PyObject** argv = inline_argv;
  bool* owned = inline_owned;
  if (n > kInline) {
    heap_argv.resize(n + 1);
    heap_owned.resize(n);
    argv = heap_argv.data();
    owned = reinterpret_cast<bool*>(heap_owned.data());
  }
  // argv[0] stays free so the callee may use it (PY_VECTORCALL_ARGUMENTS_OFFSET).
  size_t built = 0;
  PyObject* result = nullptr;
  for (; built < n; ++built) {
    argv[built + 1] = value_of(step.args[built], regs, &owned[built]);
    if (argv[built + 1] == nullptr) break;
  }
  if (built == n) {
    PyObject* kwnames = step.kwnames ? step.kwnames.ptr() : nullptr;
    const size_t nargsf = static_cast<size_t>(step.num_positional) | PY_VECTORCALL_ARGUMENTS_OFFSET;
    result = step.method ? PyObject_VectorcallMethod(step.callable, argv + 1, nargsf, kwnames)
                         : PyObject_Vectorcall(step.callable, argv + 1, nargsf, kwnames);
  }
  for (size_t i = 0; i < built; ++i) {
    if (owned[i]) Py_DECREF(argv[i + 1]);
  }
  if (result == nullptr) return false;
  regs[step.out].reset(result);  // New
  for (int reg : step.frees) regs[reg].reset();
  return true;
}

PyObject* run_program(const Program& program, PyObject* const* inputs, size_t n) {
  constexpr int kInlineRegs = 64;
  RefBuffer<kInlineRegs> registers;  // released when the run ends, however it ends
  registers.reset(static_cast<size_t>(program.num_regs));
  Ref* regs = registers.data();
  for (size_t i = 0; i < n; ++i) {
    if (program.input_regs[i] >= 0) regs[program.input_regs[i]] = Ref::borrow(inputs[i]);
  }
  bool ok = true;
  for (const Step& step : program.steps) {
    if (!run_step(step, regs)) {
      ok = false;
      break;
    }
  }
  PyObject* result = nullptr;
  if (ok) {
    bool owned;
    result = value_of(program.output, regs, &owned);
    if (result != nullptr && !owned) Py_INCREF(result);
  }
  return result;
}

// Called as a method: args[0] is the module the runner is bound to (ignored), then the inputs.
PyObject* runner_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<GraphRunnerObject*>(callable);
  const size_t nargs = PyVectorcall_NARGS(nargsf);
  if (self->program == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "framejit graph runner used after it was cleared");
    return nullptr;
  }
  const Program& program = *self->program;
  if ((kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) || nargs == 0 ||
      nargs - 1 != static_cast<size_t>(program.num_inputs)) {
    PyErr_Format(PyExc_TypeError,
                 "forward() of a framejit graph takes %d positional inputs after the module, got "
                 "%zd%s",
                 program.num_inputs, nargs == 0 ? 0 : static_cast<Py_ssize_t>(nargs - 1),
                 kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0 ? " and keywords" : "");
    return nullptr;
  }
  return run_program(program, args + 1, nargs - 1);
}

// Stored on a class it binds like a function: instance.forward is a bound method.
PyObject* runner_descr_get(PyObject* self, PyObject* obj, PyObject* /*type*/) {
  if (obj == nullptr || obj == Py_None) return Py_NewRef(self);
  return PyMethod_New(self, obj);  // New
}

// Py_VISIT expects the callback and its argument to be called `visit` and `arg`.
int visit_arg(const Arg& a, visitproc visit, void* arg) {
  if (a.kind == Arg::Kind::kConst) Py_VISIT(a.value.ptr());
  for (const Arg& item : a.items) {
    if (int rc = visit_arg(item, visit, arg)) return rc;
  }
  return 0;
}

int runner_traverse(PyObject* obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<GraphRunnerObject*>(obj);
  if (self->program == nullptr) return 0;
  for (const auto& node : self->program->graph->nodes()) {
    Py_VISIT(node->target.ptr());
    Py_VISIT(node->fake.ptr());
    for (const Arg& a : node->args) {
      if (int rc = visit_arg(a, visit, arg)) return rc;
    }
    for (const auto& kw : node->kwargs) {
      if (int rc = visit_arg(kw.second, visit, arg)) return rc;
    }
  }
  return 0;
}

int runner_clear(PyObject* obj) {
  auto* self = reinterpret_cast<GraphRunnerObject*>(obj);
  // Detached first: deleting releases Python objects, whose finalizers may run a GC pass
  // (traverse) or call this runner, and must find no half-deleted program.
  Program* program = self->program;
  self->program = nullptr;
  delete program;
  return 0;
}

void runner_dealloc(PyObject* obj) {
  PyObject_GC_UnTrack(obj);
  runner_clear(obj);
  Py_TYPE(obj)->tp_free(obj);
}

PyObject* runner_fx_graph_method(PyObject* self, PyObject* /*unused*/) {
  try {
    return runner_fx_graph(self).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// A runner is immutable: copies share it (GraphModule's deepcopy copies its __dict__).
PyObject* runner_copy(PyObject* self, PyObject* /*unused*/) { return Py_NewRef(self); }

PyObject* runner_num_steps(PyObject* obj, void*) {
  auto* self = reinterpret_cast<GraphRunnerObject*>(obj);
  return PyLong_FromSsize_t(self->program ? static_cast<Py_ssize_t>(self->program->steps.size()) : 0);
}

PyMethodDef runner_methods[] = {
    {"fx_graph", runner_fx_graph_method, METH_NOARGS,
     "The graph as a new torch.fx.Graph (nodes carry meta['example_value'])."},
    {"__copy__", runner_copy, METH_NOARGS, nullptr},
    {"__deepcopy__", runner_copy, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef runner_getset[] = {
    {"num_steps", runner_num_steps, nullptr, "call nodes run per call", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject GraphRunnerType = {
    PyVarObject_HEAD_INIT(nullptr, 0) "framejit._C.GraphRunner",
};

}  // namespace

PyObject* make_graph_runner_type() {
  GraphRunnerType.tp_basicsize = sizeof(GraphRunnerObject);
  GraphRunnerType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                             Py_TPFLAGS_METHOD_DESCRIPTOR;
  GraphRunnerType.tp_vectorcall_offset = offsetof(GraphRunnerObject, vectorcall);
  GraphRunnerType.tp_call = PyVectorcall_Call;
  GraphRunnerType.tp_descr_get = runner_descr_get;
  GraphRunnerType.tp_dealloc = runner_dealloc;
  GraphRunnerType.tp_traverse = runner_traverse;
  GraphRunnerType.tp_clear = runner_clear;
  GraphRunnerType.tp_methods = runner_methods;
  GraphRunnerType.tp_getset = runner_getset;
  GraphRunnerType.tp_doc =
      "A traced graph run from framejit's IR: runner(module, *inputs) -> tuple of outputs.";
  if (PyType_Ready(&GraphRunnerType) < 0) return nullptr;
  return Py_NewRef(reinterpret_cast<PyObject*>(&GraphRunnerType));
}

PyObject* new_graph_runner(std::unique_ptr<Graph> graph) {
  FJ_CHECK(GraphRunnerType.tp_flags & Py_TPFLAGS_READY, "runner: type not made yet");
  std::unique_ptr<Program> program = flatten(std::move(graph));
  auto* self = PyObject_GC_New(GraphRunnerObject, &GraphRunnerType);
  if (self == nullptr) return nullptr;
  self->vectorcall = runner_call;
  self->program = program.release();
  PyObject_GC_Track(self);
  return reinterpret_cast<PyObject*>(self);
}

py::object runner_fx_graph(PyObject* runner) {
  FJ_CHECK(Py_TYPE(runner) == &GraphRunnerType, "runner_fx_graph: not a GraphRunner");
  auto* self = reinterpret_cast<GraphRunnerObject*>(runner);
  FJ_CHECK(self->program != nullptr, "runner_fx_graph: the runner was cleared");
  return export_fx_graph(*self->program->graph);
}

}  // namespace framejit
