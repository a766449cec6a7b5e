// The tracer's core: the instruction loop, locals and globals, wrapping entry-state values
// (with their guards), and turning the returned value into graph outputs plus a Rebuild.
#include "trace/tracer.h"

#include <fmt/format.h>

#include "common/check.h"
#include "guards/tensor_check.h"
#include "trace/pyrefs.h"

namespace framejit {

namespace {

constexpr int kMaxSteps = 200000;  // instructions per trace; a runaway constant loop stops here

const HandlerTable& handlers() {
  static const HandlerTable table = [] {
    HandlerTable t{};
    register_stack_ops(t);
    register_arith_ops(t);
    register_attr_ops(t);
    register_call_ops(t);
    register_build_ops(t);
    register_control_ops(t);
    return t;
  }();
  return table;
}

std::string code_string(PyObject* obj) {
  const char* data = obj ? PyUnicode_AsUTF8(obj) : nullptr;
  if (data == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return data;
}

// Values of these exact types are constants: guarded by value, folded at trace time.
bool is_constant_type(PyObject* obj) {
  PyTypeObject* type = Py_TYPE(obj);
  if (obj == Py_None || obj == Py_Ellipsis || type == &PyLong_Type || type == &PyFloat_Type ||
      type == &PyBool_Type || type == &PyUnicode_Type || type == &PyBytes_Type ||
      type == &PyComplex_Type || type == &PySlice_Type) {
    return true;
  }
  const PyRefs& refs = PyRefs::get();
  return reinterpret_cast<PyObject*>(type) == refs.dtype_type.ptr() ||
         reinterpret_cast<PyObject*>(type) == refs.device_type.ptr() ||
         reinterpret_cast<PyObject*>(type) == refs.size_type.ptr();
}

// Objects that are stable by identity: modules, functions, classes, builtins, descriptors.
bool is_identity_object(PyObject* obj) {
  return PyModule_Check(obj) || PyFunction_Check(obj) || PyCFunction_Check(obj) ||
         PyType_Check(obj) || Py_TYPE(obj) == &PyMethodDescr_Type ||
         Py_TYPE(obj) == &PyWrapperDescr_Type || Py_TYPE(obj) == &PyClassMethodDescr_Type;
}

}  // namespace

Tracer::Tracer(PyCodeObject* code, const Bytecode& bytecode, const FrameState& frame)
    : code_(code),
      bytecode_(bytecode),
      frame_(frame),
      graph_(code_string(code->co_filename), code_string(code->co_qualname),
             code->co_firstlineno) {
  locals_.resize(static_cast<size_t>(code->co_nlocalsplus));
}

Tracer::~Tracer() {
  for (PyObject* value : live_) Py_XDECREF(value);
}

void Tracer::run() {
  const HandlerTable& table = handlers();
  int steps = 0;
  pc_ = 0;
  while (!finished_) {
    const Instr& ins = bytecode_.at(pc_);
    current_ = &ins;
    next_pc_ = ins.next;
    try {
      if (++steps > kMaxSteps) {
        FJ_UNSUPPORTED(kTraceTooLong, "trace exceeded {} instructions", kMaxSteps);
      }
      OpHandler handler = table[static_cast<size_t>(ins.op)];
      if (handler == nullptr) {
        FJ_UNSUPPORTED(kUnsupportedOpcode, "opcode {} is not supported yet", op_name(ins.op));
      }
      handler(*this, ins);
    } catch (Unsupported& e) {
      if (e.pc < 0) e.pc = ins.offset;
      throw;
    }
    pc_ = next_pc_;
  }
}

ValuePtr Tracer::pop() {
  FJ_CHECK(!stack_.empty(), "pop from an empty stack at {}", op_name(current_->op));
  ValuePtr value = std::move(stack_.back());
  stack_.pop_back();
  return value;
}

std::vector<ValuePtr> Tracer::pop_n(size_t n) {
  FJ_CHECK(stack_.size() >= n, "pop of {} from a stack of {}", n, stack_.size());
  std::vector<ValuePtr> out(std::make_move_iterator(stack_.end() - static_cast<long>(n)),
                            std::make_move_iterator(stack_.end()));
  stack_.resize(stack_.size() - n);
  return out;
}

ValuePtr& Tracer::peek(size_t depth) {
  FJ_CHECK(stack_.size() > depth, "peek {} into a stack of {}", depth, stack_.size());
  return stack_[stack_.size() - 1 - depth];
}

py::object Tracer::co_const(int index) const {
  return py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(code_->co_consts, index));
}

std::string Tracer::co_name(int index) const {
  return code_string(PyTuple_GET_ITEM(code_->co_names, index));
}

std::string Tracer::co_varname(int index) const {
  return code_string(PyTuple_GET_ITEM(code_->co_localsplusnames, index));
}

ValuePtr Tracer::load_source(Source source) {
  const int known = sources_.size();
  const int slot = sources_.intern(std::move(source));
  if (slot < known) return by_slot_.at(slot);  // read and wrapped before
  live_.resize(static_cast<size_t>(slot) + 1, nullptr);
  live_[slot] = sources_.read(slot, frame_, live_.data());  // New or NULL
  if (live_[slot] == nullptr) {
    sources_.pop_last();
    live_.pop_back();
    return nullptr;
  }
  return wrap_source(slot, py::reinterpret_borrow<py::object>(live_[slot]));
}

ValuePtr Tracer::local(int index) {
  FJ_CHECK(index >= 0 && index < static_cast<int>(locals_.size()), "local {} out of range", index);
  if (locals_[index]) {
    if (locals_[index]->kind == VKind::kNull) {
      FJ_UNSUPPORTED(kUnsupportedValue, "local '{}' is unbound here", co_varname(index));
    }
    return locals_[index];
  }
  ValuePtr value = load_source(SourceTable::local(index, co_varname(index)));
  if (!value) FJ_UNSUPPORTED(kUnsupportedValue, "local '{}' is unbound here", co_varname(index));
  locals_[index] = value;
  return value;
}

void Tracer::set_local(int index, ValuePtr value) {
  // Storing also shadows the entry value: later loads see the new value, not the source.
  locals_[index] = std::move(value);
}

void Tracer::delete_local(int index) {
  local(index);  // an unbound local would raise here at run time: leave that to CPython
  // A later load must fail as in Python; a Null keeps local() from re-reading the frame.
  locals_[index] = Value::null();
}

ValuePtr Tracer::global(const std::string& name) {
  ValuePtr value = load_source(SourceTable::global(name));
  if (!value) FJ_UNSUPPORTED(kUnsupportedValue, "name '{}' is not defined", name);
  return value;
}

TensorMeta Tracer::meta_of(py::handle meta, py::handle device) {
  PyRefs& refs = PyRefs::get();
  TensorMeta out;
  out.dtype = refs.short_dtype(meta.attr("dtype"));
  for (py::handle size : meta.attr("shape")) out.sizes.push_back(size.cast<int64_t>());
  out.device = py::str(device).cast<std::string>();
  return out;
}

ValuePtr Tracer::wrap_source(int slot, py::handle real) {
  auto found = by_slot_.find(slot);
  if (found != by_slot_.end()) return found->second;
  PyRefs& refs = PyRefs::get();
  PyObject* obj = real.ptr();
  ValuePtr value;
  if (is_tensor(obj)) {
    guards_.add_tensor(slot, obj);
    py::object meta = refs.support.attr("make_meta")(real);
    py::object device = real.attr("device");
    Node* node = graph_.add_placeholder(sources_.at(slot).name_hint, meta, meta_of(meta, device));
    input_slots_.push_back(slot);
    value = Value::tensor(node, meta, device, slot);
    value->pytype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(obj)));
  } else if (is_constant_type(obj)) {
    if (obj == Py_None || obj == Py_Ellipsis) {
      guards_.add_id(slot, obj);
    } else {
      guards_.add_const(slot, obj);
    }
    value = Value::constant(py::reinterpret_borrow<py::object>(real), slot);
  } else if (PyTuple_CheckExact(obj) || PyList_CheckExact(obj)) {
    guards_.add_type(slot, reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    guards_.add_len(slot, n);
    std::vector<ValuePtr> items;
    for (Py_ssize_t i = 0; i < n; ++i) {
      ValuePtr item = load_source(sources_.item(slot, py::int_(i)));
      FJ_CHECK(item != nullptr, "item {} of {} unreadable", i, sources_.at(slot).text);
      items.push_back(std::move(item));
    }
    value = PyTuple_CheckExact(obj) ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    value->source = slot;
  } else if (is_identity_object(obj)) {
    guards_.add_id(slot, obj);
    value = Value::object(py::reinterpret_borrow<py::object>(real), slot);
  } else {
    guards_.add_type(slot, reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    value = Value::object(py::reinterpret_borrow<py::object>(real), slot);
  }
  by_slot_[slot] = value;
  return value;
}

bool Tracer::truthy(const ValuePtr& value) {
  switch (value->kind) {
    case VKind::kTensor:
      FJ_UNSUPPORTED(kDataDependent, "branch on the value of a tensor");
    case VKind::kConst: {
      const int result = PyObject_IsTrue(value->obj.ptr());
      if (result < 0) throw py::error_already_set();
      return result == 1;
    }
    case VKind::kTuple:
    case VKind::kList:
    case VKind::kDict:
      return !value->items.empty();
    case VKind::kObject:
      if (is_identity_object(value->obj.ptr())) return true;
      FJ_UNSUPPORTED(kUnsupportedValue, "truth value of {} is not traced yet", value->describe());
    case VKind::kNull:
      break;
  }
  throw InternalError("truth value of NULL");
}

void Tracer::finish(const ValuePtr& value) {
  build_result(value);
  finished_ = true;
}

Rebuild Tracer::rebuild_of(const ValuePtr& value, std::vector<Arg>& outputs,
                           std::unordered_map<Node*, int>& output_index) {
  Rebuild r;
  // An entry-state value returned unchanged keeps its identity: read it again from its source.
  const bool from_source = value->source >= 0 &&
                           (value->kind != VKind::kTensor ||
                            value->node->kind == NodeKind::kPlaceholder);
  if (from_source) {
    r.kind = Rebuild::Kind::kSlot;
    r.index = value->source;
    return r;
  }
  switch (value->kind) {
    case VKind::kTensor: {
      if (value->node->kind == NodeKind::kPlaceholder) {
        throw InternalError("placeholder without a source");
      }
      auto it = output_index.find(value->node);
      if (it == output_index.end()) {
        it = output_index.emplace(value->node, static_cast<int>(outputs.size())).first;
        outputs.push_back(Arg::of(value->node));
      }
      r.kind = Rebuild::Kind::kOutput;
      r.index = it->second;
      return r;
    }
    case VKind::kConst:
    case VKind::kObject:
      r.kind = Rebuild::Kind::kConst;
      r.value = value->obj;
      return r;
    case VKind::kTuple:
    case VKind::kList:
    case VKind::kDict:
      r.kind = value->kind == VKind::kTuple  ? Rebuild::Kind::kTuple
               : value->kind == VKind::kList ? Rebuild::Kind::kList
                                             : Rebuild::Kind::kDict;
      r.value = value->pytype;
      r.keys = value->keys;
      for (const auto& item : value->items) {
        r.items.push_back(rebuild_of(item, outputs, output_index));
      }
      return r;
    case VKind::kNull:
      break;
  }
  throw InternalError("returning NULL");
}

void Tracer::build_result(const ValuePtr& value) {
  std::vector<Arg> outputs;
  std::unordered_map<Node*, int> output_index;
  result_ = rebuild_of(value, outputs, output_index);
  graph_.set_output(std::move(outputs));
  graph_.remove_unused_getitems();
}

}  // namespace framejit
