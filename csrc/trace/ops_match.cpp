// Opcode handlers of `match` statements (GET_LEN, MATCH_SEQUENCE, MATCH_MAPPING, MATCH_KEYS,
// MATCH_CLASS): each pattern is decided at trace time from what the
// trace knows of the subject (its kind, its class, its items and attributes, read and guarded
// as any other read of them), so a `match` costs no graph break and no node.
#include "common/check.h"
#include "trace/pyrefs.h"
#include "trace/python_rules.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

// Whether the subject's class carries a pattern-matching flag (Py_TPFLAGS_SEQUENCE or
// Py_TPFLAGS_MAPPING): what CPython itself tests.
bool has_flag(const ValuePtr& subject, unsigned long flag) {
  if (subject->kind == VKind::kTuple || subject->kind == VKind::kList) {
    return flag == Py_TPFLAGS_SEQUENCE;  // (a namedtuple is a tuple)
  }
  if (subject->kind == VKind::kDict) return flag == Py_TPFLAGS_MAPPING;
  return PyType_HasFeature(reinterpret_cast<PyTypeObject*>(type_of(subject).ptr()), flag);
}

void op_get_len(Tracer& t, const Instr&) {  // [subject] -> [subject, len(subject)]
  static PyObject* const kLen = PyDict_GetItemString(PyEval_GetBuiltins(), "len");  // Borrowed
  ValuePtr subject = t.peek(0);
  ValuePtr length = t.call(Value::object(py::reinterpret_borrow<py::object>(kLen)), {subject}, {});
  if (length) t.push(std::move(length));  // (else a class's __len__ was inlined: pushed on return)
}

void op_match_sequence(Tracer& t, const Instr&) {
  t.push(Value::constant(py::bool_(has_flag(t.peek(0), Py_TPFLAGS_SEQUENCE))));
}

void op_match_mapping(Tracer& t, const Instr&) {
  t.push(Value::constant(py::bool_(has_flag(t.peek(0), Py_TPFLAGS_MAPPING))));
}

// [subject, keys] -> [subject, keys, values tuple or None]: the values of all the keys, or None
// if one is missing (as subject.get(key, <missing>) finds them).
void op_match_keys(Tracer& t, const Instr&) {
  const ValuePtr keys = t.sizes().concretize(t.peek(0));
  const ValuePtr subject = t.peek(1);
  if (!keys->is_constant_tree()) FJ_UNSUPPORTED(kUnsupportedValue, "mapping pattern keys {}", keys->describe());
  std::vector<ValuePtr> values;
  for (py::handle key_obj : keys->as_python()) {
    const py::object key = py::reinterpret_borrow<py::object>(key_obj);
    if (subject->kind == VKind::kDict) {
      const long at = subject->find_key(key);
      if (at < 0) {
        t.push(Value::constant(py::none()));
        return;
      }
      values.push_back(subject->items[at]);
      continue;
    }
    if (subject->kind == VKind::kObject && t.reads_as_dict(subject, "get")) {
      t.check_items_unchanged(subject);
      const bool present = PyDict_Contains(subject->obj.ptr(), key.ptr()) == 1;
      t.entry().guard_dict_contains(subject->source, key.ptr(), present);
      if (!present) {
        t.push(Value::constant(py::none()));
        return;
      }
      values.push_back(t.stored_item(subject, key));
      continue;
    }
    FJ_UNSUPPORTED(kUnsupportedValue, "a mapping pattern on {}", subject->describe());
  }
  t.push(Value::tuple(std::move(values)));
}

// Builtins whose single positional sub-pattern matches the subject itself (`case int(n)`).
bool matches_self(PyObject* cls) {
  for (PyTypeObject* type : {&PyBool_Type, &PyByteArray_Type, &PyBytes_Type, &PyDict_Type,
                             &PyFloat_Type, &PyFrozenSet_Type, &PyLong_Type, &PyList_Type,
                             &PySet_Type, &PyUnicode_Type, &PyTuple_Type}) {
    if (cls == reinterpret_cast<PyObject*>(type)) return true;
  }
  return false;
}

// MATCH_CLASS(count): [subject, cls, names] -> [attributes tuple or None]: None unless the
// subject is an instance of cls with the count positional attributes cls.__match_args__ names
// and the keyword ones.
void op_match_class(Tracer& t, const Instr& i) {
  const ValuePtr names = t.pop();
  const ValuePtr cls = t.pop();
  const ValuePtr subject = t.pop();
  if ((cls->kind != VKind::kObject && cls->kind != VKind::kConst) || cls->is_special_object() ||
      !PyType_Check(cls->obj.ptr()) || !names->is_constant_tree()) {
    FJ_UNSUPPORTED(kUnsupportedValue, "a class pattern of {}", cls->describe());
  }
  const int instance = PyObject_IsSubclass(type_of(subject).ptr(), cls->obj.ptr());
  if (instance < 0) throw py::error_already_set();
  if (instance == 0) {
    t.push(Value::constant(py::none()));
    return;
  }
  std::vector<std::string> wanted;
  const int count = i.arg;
  if (count > 0) {
    if (count == 1 && matches_self(cls->obj.ptr())) {
      wanted.push_back(std::string());  // the subject itself
    } else {
      py::object match_args = py::getattr(cls->obj, "__match_args__", py::none());
      if (!PyTuple_CheckExact(match_args.ptr()) || py::len(match_args) < static_cast<size_t>(count)) {
        FJ_PROGRAM_RAISED(kUnsupportedValue, "{} accepts fewer positional sub-patterns ({} given)",
                          safe_repr(cls->obj), count);
      }
      for (int k = 0; k < count; ++k) wanted.push_back(py::str(match_args[py::int_(k)]).cast<std::string>());
    }
  }
  for (py::handle name : names->as_python()) wanted.push_back(py::str(name).cast<std::string>());
  std::vector<ValuePtr> found;
  for (const std::string& name : wanted) {
    if (name.empty()) {
      found.push_back(subject);
      continue;
    }
    if (!t.attribute_present(subject, name)) {  // an attribute the subject lacks: no match (as AttributeError is)
      t.push(Value::constant(py::none()));
      return;
    }
    ValuePtr value = t.attr(subject, name);
    if (value->is(ObjRole::kProperty) || value->is(ObjRole::kAttrHook)) {
      FJ_UNSUPPORTED(kUnsupportedValue, "a class pattern reading .{}, computed by its class", name);
    }
    found.push_back(std::move(value));
  }
  t.push(Value::tuple(std::move(found)));
}

}  // namespace

void register_match_ops(HandlerTable& table) {
  auto set = [&](Op op, OpHandler handler) { table[static_cast<size_t>(op)] = handler; };
  set(Op::GET_LEN, op_get_len);
  set(Op::MATCH_SEQUENCE, op_match_sequence);
  set(Op::MATCH_MAPPING, op_match_mapping);
  set(Op::MATCH_KEYS, op_match_keys);
  set(Op::MATCH_CLASS, op_match_class);
}

}  // namespace framejit
