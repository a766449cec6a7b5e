// Python face of the native backend: NativeProgram (built by framejit/_native.py from a lowered
// aten graph) and NativeFunction, the callable a region calls, which picks the program lowered
// for its inputs' metadata and runs it without Python per op.
#include "backends/native_function.h"

#include "backends/program.h"
#include "common/py.h"
#include "guards/tensor_check.h"

#include <ATen/SavedTensorHooks.h>
#include <ATen/ScalarOps.h>
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <pybind11/stl.h>

#include <deque>
#include <memory>

namespace framejit::native {
namespace {

// The Python description of one operand, per schema argument (see framejit/_native.py):
// ("r", reg) | ("c", value) | ("l", [operands]) | ("d",) for the schema's default.
Operand operand_from_py(const py::handle& desc, const c10::TypePtr& type) {
  auto tuple = desc.cast<py::tuple>();
  const std::string kind = tuple[0].cast<std::string>();
  if (kind == "r") return Operand::reg_of(tuple[1].cast<int>());
  if (kind == "c") {
    c10::TypePtr base = type->kind() == c10::TypeKind::OptionalType ? type->containedType(0) : type;
    PyObject* value = tuple[1].ptr();
    if (base->kind() == c10::TypeKind::TensorType &&
        (PyBool_Check(value) || PyLong_Check(value) || PyFloat_Check(value) || PyComplex_Check(value))) {
      // A number where the schema wants a Tensor (x.add_(1) is add_.Tensor): a wrapped-number
      // tensor, as torch's Python argument parser makes, so type promotion treats it as a scalar.
      at::Tensor wrapped = c10::scalar_to_tensor(torch::jit::toIValue(tuple[1], c10::NumberType::get()).toScalar());
      wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
      return Operand::constant_of(std::move(wrapped));
    }
    return Operand::constant_of(torch::jit::toIValue(tuple[1], type));
  }
  TORCH_CHECK(kind == "l", "framejit native: unknown operand kind ", kind);
  c10::TypePtr list_type = type;
  if (list_type->kind() == c10::TypeKind::OptionalType) list_type = list_type->containedType(0);
  TORCH_CHECK(list_type->kind() == c10::TypeKind::ListType,
              "framejit native: a list of values where the schema has ", type->str());
  std::vector<Operand> items;
  for (const py::handle& item : tuple[1].cast<py::list>()) {
    items.push_back(operand_from_py(item, list_type->containedType(0)));
  }
  return Operand::list_of(list_type, std::move(items));
}

// The program under construction, as Python sees it.
struct ProgramBuilder {
  explicit ProgramBuilder(int num_inputs) : program(std::make_shared<Program>(num_inputs)) {}

  void add_call(const std::string& name, const std::string& overload, const py::list& args,
                std::vector<int> outputs, std::vector<int> unpack) {
    c10::OperatorHandle op = Program::find_op(name, overload);
    const auto& params = op.schema().arguments();
    TORCH_CHECK(args.size() <= params.size(), "framejit native: too many arguments for ", name);
    std::vector<Operand> operands;
    for (size_t i = 0; i < args.size(); ++i) {
      if (py::len(args[i]) == 1) {  // ("d",): the schema's default
        TORCH_CHECK(params[i].default_value().has_value(), "framejit native: ", name,
                    " has no default for '", params[i].name(), "'");
        operands.push_back(Operand::constant_of(*params[i].default_value()));
        continue;
      }
      operands.push_back(operand_from_py(args[i], params[i].type()));
    }
    program->add_call(op, std::move(operands), std::move(outputs), std::move(unpack));
  }

  // A Python callable as one instruction (a generated kernel's launcher): called with the
  // registers' values, it returns `num_outputs` tensors (a tuple, or the tensor when one).
  void add_python_call(const std::string& name, py::object fn, const std::vector<int>& arg_regs,
                       std::vector<int> outputs) {
    std::vector<Operand> operands;
    for (int reg : arg_regs) operands.push_back(Operand::reg_of(reg));
    const size_t num_outputs = outputs.size();
    auto holder = std::make_shared<py::object>(std::move(fn));
    BoxedCall call = [holder, num_outputs](torch::jit::Stack& stack) {
      py::gil_scoped_acquire gil;  // held already on framejit's call path; reentrant
      py::tuple args(stack.size());
      for (size_t i = 0; i < stack.size(); ++i) args[i] = torch::jit::toPyObject(std::move(stack[i]));
      stack.clear();
      py::object out = (*holder)(*args);
      if (num_outputs == 1 && THPVariable_Check(out.ptr())) {
        stack.emplace_back(THPVariable_Unpack(out.ptr()));
        return;
      }
      for (const py::handle& item : out.cast<py::tuple>()) {
        TORCH_CHECK(THPVariable_Check(item.ptr()), "framejit native: a Python call returned a ",
                    Py_TYPE(item.ptr())->tp_name, ", expected tensors");
        stack.emplace_back(THPVariable_Unpack(item.ptr()));
      }
    };
    program->add_boxed_call(name, std::move(call), std::move(operands), std::move(outputs));
  }

  void set_outputs(const py::list& outputs) {
    std::vector<Operand> operands;
    for (const py::handle& out : outputs) operands.push_back(operand_from_py(out, c10::AnyType::get()));
    program->set_outputs(std::move(operands));
  }

  std::shared_ptr<Program> program;
};

// What one lowering assumed about the call: each input's metadata (or value, for numbers) and
// the thread's grad and inference modes.
struct Variant {
  struct Input {
    bool is_tensor = false;
    TensorSpec spec;
    py::object value;  // numbers: baked into the program, so part of the key
  };
  std::vector<Input> inputs;
  bool grad_enabled = true;
  bool inference_mode = false;
  std::shared_ptr<Program> program;  // null: this key runs the fallback

  // Borrowed: args.
  bool matches(PyObject* const* args, size_t nargs, bool grad, bool inference) const {
    if (grad != grad_enabled || inference != inference_mode || nargs != inputs.size()) return false;
    for (size_t i = 0; i < nargs; ++i) {
      const Input& input = inputs[i];
      if (input.is_tensor) {
        if (!tensor_matches(input.spec, args[i])) return false;
        continue;
      }
      if (!same_constant(args[i], input.value.ptr())) return false;
    }
    return true;
  }
};

constexpr size_t kMaxVariants = 8;

struct NativeFunctionObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* lower;     // Strong: lower(args: tuple) -> ProgramBuilder | None
  PyObject* fallback;  // Strong: runs the graph another way (the eager backend)
  // A deque: lowering runs Python (which may let another thread in and add a variant), and a
  // variant found before must stay where it is.
  std::deque<Variant>* variants;
};

bool autocast_on() {
  return at::autocast::is_autocast_enabled(at::kCPU) || at::autocast::is_autocast_enabled(at::kCUDA);
}

// New reference: the fallback's result. Borrowed: args.
PyObject* call_fallback(NativeFunctionObject* self, PyObject* const* args, size_t nargs) {
  return PyObject_Vectorcall(self->fallback, args, nargs, nullptr);
}

// The variant for these inputs, lowering a new one on a miss. Null with an error set on failure.
const Variant* find_or_lower(NativeFunctionObject* self, PyObject* const* args, size_t nargs,
                             bool grad, bool inference) {
  for (const Variant& variant : *self->variants) {
    if (variant.matches(args, nargs, grad, inference)) return &variant;
  }
  if (self->variants->size() >= kMaxVariants) return nullptr;  // caller falls back, no error
  Variant variant;
  variant.grad_enabled = grad;
  variant.inference_mode = inference;
  for (size_t i = 0; i < nargs; ++i) {
    Variant::Input input;
    input.is_tensor = is_tensor(args[i]);
    if (input.is_tensor) {
      input.spec = tensor_spec_of(args[i]);
    } else {
      input.value = py::reinterpret_borrow<py::object>(args[i]);
    }
    variant.inputs.push_back(std::move(input));
  }
  py::tuple arg_tuple(nargs);
  for (size_t i = 0; i < nargs; ++i) arg_tuple[i] = py::reinterpret_borrow<py::object>(args[i]);
  py::object lowered;
  {
    // Lowering traces with fake tensors: saved-tensor hooks (checkpoint's) must not see them.
    struct HooksPaused {
      bool prior = at::SavedTensorDefaultHooks::set_tracing(true);
      ~HooksPaused() { at::SavedTensorDefaultHooks::set_tracing(prior); }
    } paused;
    lowered = py::reinterpret_borrow<py::object>(self->lower)(arg_tuple);
  }
  if (!lowered.is_none()) variant.program = lowered.cast<ProgramBuilder&>().program;
  self->variants->push_back(std::move(variant));
  return &self->variants->back();
}

PyObject* native_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  auto* self = reinterpret_cast<NativeFunctionObject*>(callable);
  const size_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError, "a framejit native graph takes positional arguments only");
    return nullptr;
  }
  // Under autocast the lowered ops would be cast a second time: run the graph as it is.
  if (autocast_on()) return call_fallback(self, args, nargs);
  const Variant* variant = find_or_lower(self, args, nargs, c10::GradMode::is_enabled(),
                                         c10::InferenceMode::is_enabled());
  if (variant == nullptr || !variant->program) return call_fallback(self, args, nargs);

  // Inputs unpacked once; numbers were baked in at lowering and are passed as None.
  std::vector<c10::IValue> inputs(nargs);
  for (size_t i = 0; i < nargs; ++i) {
    if (variant->inputs[i].is_tensor) inputs[i] = THPVariable_Unpack(args[i]);
  }
  std::vector<c10::IValue> outputs = variant->program->run(std::move(inputs));
  py::tuple result(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].isTensor()) {
      result[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(outputs[i]).toTensor()));
    } else {
      result[i] = torch::jit::toPyObject(std::move(outputs[i]));
    }
  }
  return result.release().ptr();
  END_HANDLE_TH_ERRORS
}

void native_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<NativeFunctionObject*>(obj);
  PyObject_GC_UnTrack(obj);
  Py_CLEAR(self->lower);
  Py_CLEAR(self->fallback);
  delete self->variants;
  self->variants = nullptr;
  Py_TYPE(obj)->tp_free(obj);
}

int native_traverse(PyObject* obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<NativeFunctionObject*>(obj);
  Py_VISIT(self->lower);
  Py_VISIT(self->fallback);
  return 0;
}

int native_clear(PyObject* obj) {
  auto* self = reinterpret_cast<NativeFunctionObject*>(obj);
  Py_CLEAR(self->lower);
  Py_CLEAR(self->fallback);
  return 0;
}

PyObject* native_variants(PyObject* obj, void*) {
  auto* self = reinterpret_cast<NativeFunctionObject*>(obj);
  Py_ssize_t lowered = 0;
  for (const Variant& v : *self->variants) lowered += v.program ? 1 : 0;
  return Py_BuildValue("(nn)", lowered, static_cast<Py_ssize_t>(self->variants->size()) - lowered);
}

PyGetSetDef native_getset[] = {
    {"variants", native_variants, nullptr,
     "(programs lowered, keys that run the fallback) so far", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject NativeFunctionType = {
    PyVarObject_HEAD_INIT(nullptr, 0) "framejit._C.NativeFunction",
};

// New reference. Borrowed: lower, fallback.
PyObject* make_native_function(PyObject* lower, PyObject* fallback) {
  auto* self = PyObject_GC_New(NativeFunctionObject, &NativeFunctionType);
  if (self == nullptr) return nullptr;
  self->vectorcall = native_call;
  self->lower = Py_NewRef(lower);
  self->fallback = Py_NewRef(fallback);
  self->variants = new std::deque<Variant>();
  PyObject_GC_Track(self);
  return reinterpret_cast<PyObject*>(self);
}

}  // namespace

void register_native(py::module_& m) {
  NativeFunctionType.tp_basicsize = sizeof(NativeFunctionObject);
  NativeFunctionType.tp_flags =
      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  NativeFunctionType.tp_vectorcall_offset = offsetof(NativeFunctionObject, vectorcall);
  NativeFunctionType.tp_call = PyVectorcall_Call;
  NativeFunctionType.tp_dealloc = native_dealloc;
  NativeFunctionType.tp_traverse = native_traverse;
  NativeFunctionType.tp_clear = native_clear;
  NativeFunctionType.tp_getset = native_getset;
  NativeFunctionType.tp_doc = "A graph run by framejit's native backend (aten ops from C++).";
  if (PyType_Ready(&NativeFunctionType) < 0) throw py::error_already_set();

  py::class_<ProgramBuilder>(m, "NativeProgram")
      .def(py::init<int>(), py::arg("num_inputs"))
      .def("new_register", [](ProgramBuilder& b) { return b.program->new_register(); })
      .def("add_call", &ProgramBuilder::add_call, py::arg("name"), py::arg("overload"),
           py::arg("args"), py::arg("outputs"), py::arg("unpack") = std::vector<int>{})
      .def("add_python_call", &ProgramBuilder::add_python_call, py::arg("name"), py::arg("fn"),
           py::arg("args"), py::arg("outputs"))
      .def("set_outputs", &ProgramBuilder::set_outputs)
      .def("finish", [](ProgramBuilder& b) { b.program->finish(); })
      .def("text", [](ProgramBuilder& b, const std::string& name) { return b.program->to_string(name); },
           py::arg("name") = "program")
      .def("__len__", [](ProgramBuilder& b) { return b.program->size(); });
  m.def(
      "make_native_function",
      [](py::object lower, py::object fallback) {
        PyObject* fn = make_native_function(lower.ptr(), fallback.ptr());  // New
        if (fn == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(fn);
      },
      py::arg("lower"), py::arg("fallback"),
      "A callable that runs graphs lowered by lower(args) -> NativeProgram | None, keyed by its "
      "inputs' metadata; None (or too many variants) runs fallback(*args).");
}

}  // namespace framejit::native
