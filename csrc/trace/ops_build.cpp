// Opcode handlers: building and unpacking tuples, lists, dicts, slices and strings.
#include "common/check.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

void op_build_tuple(Tracer& t, const Instr& i) {
  t.push(Value::tuple(t.pop_n(static_cast<size_t>(i.arg))));
}

void op_build_list(Tracer& t, const Instr& i) {
  t.push(Value::list(t.pop_n(static_cast<size_t>(i.arg))));
}

// Sets hold constants only: a set the trace builds (a display, a comprehension) is a constant
// value holding a set of its own, changed only by the SET_ADD / SET_UPDATE that build it and
// rebuilt as a copy wherever it leaves the trace.
void add_to_set(Tracer& t, PyObject* set, const ValuePtr& item_in) {
  const ValuePtr item = t.sizes().concretize(item_in);
  if (!item->is_constant_tree()) {
    FJ_UNSUPPORTED(kUnsupportedValue, "a set of {}", item->describe());
  }
  py::object key = item->as_python();
  if (PyObject_Hash(key.ptr()) == -1 || PySet_Add(set, key.ptr()) < 0) {
    PyErr_Clear();  // unhashable: Python raises TypeError at this instruction
    FJ_UNSUPPORTED(kUnsupportedValue, "a set item {} that cannot be hashed", item->describe());
  }
}

PyObject* building_set(const ValuePtr& set) {
  if (!set->is_const() || !PySet_CheckExact(set->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedValue, "adding to {}", set->describe());
  }
  return set->obj.ptr();
}

void op_build_set(Tracer& t, const Instr& i) {
  std::vector<ValuePtr> items = t.pop_n(static_cast<size_t>(i.arg));
  py::object set = py::reinterpret_steal<py::object>(PySet_New(nullptr));
  if (!set) throw py::error_already_set();
  for (const ValuePtr& item : items) add_to_set(t, set.ptr(), item);
  t.push(t.made_set(std::move(set)));
}

void op_set_add(Tracer& t, const Instr& i) {  // set comprehensions
  PyObject* set = building_set(t.peek(static_cast<size_t>(i.arg)));
  ValuePtr item = t.pop();
  add_to_set(t, set, item);
}

void op_set_update(Tracer& t, const Instr& i) {  // {*a, *b}, and displays of constants
  PyObject* set = building_set(t.peek(static_cast<size_t>(i.arg)));
  ValuePtr items = t.pop();
  if (items->is_const() && (PyFrozenSet_CheckExact(items->obj.ptr()) || PySet_CheckExact(items->obj.ptr()) ||
                            PyTuple_CheckExact(items->obj.ptr()))) {
    for (py::handle item : items->obj) {
      add_to_set(t, set, Value::constant(py::reinterpret_borrow<py::object>(item)));
    }
    return;
  }
  if (!items->is_sequence()) FJ_UNSUPPORTED(kUnsupportedValue, "set.update with {}", items->describe());
  for (const ValuePtr& item : items->items) add_to_set(t, set, item);
}

py::object constant_key(const ValuePtr& key) {
  if (!key->is_constant_tree()) {
    FJ_UNSUPPORTED(kUnsupportedValue, "dict key {} not known at trace time", key->describe());
  }
  return key->as_python();
}

void op_build_map(Tracer& t, const Instr& i) {
  std::vector<ValuePtr> flat = t.pop_n(2 * static_cast<size_t>(i.arg));
  ValuePtr dict = Value::dict({}, {});
  for (size_t k = 0; k < flat.size(); k += 2) dict->set_key(constant_key(flat[k]), flat[k + 1]);
  t.push(dict);
}

void op_build_const_key_map(Tracer& t, const Instr& i) {
  ValuePtr keys = t.pop();
  std::vector<ValuePtr> values = t.pop_n(static_cast<size_t>(i.arg));
  FJ_CHECK(keys->is_const() && PyTuple_Check(keys->obj.ptr()), "BUILD_CONST_KEY_MAP keys");
  ValuePtr dict = Value::dict({}, {});
  for (size_t k = 0; k < values.size(); ++k) {
    dict->set_key(keys->obj[py::int_(k)], values[k]);
  }
  t.push(dict);
}

void op_build_slice(Tracer& t, const Instr& i) {
  t.push(t.sizes().slice_of(t.pop_n(static_cast<size_t>(i.arg))));
}

void op_list_extend(Tracer& t, const Instr& i) {
  ValuePtr list = t.peek(static_cast<size_t>(i.arg));
  t.make_writable(list);
  ValuePtr items = t.pop();
  if (items->is_sequence()) {
    for (const auto& item : items->items) list->items.push_back(item);
  } else if (items->is_const() && PyTuple_Check(items->obj.ptr())) {
    for (py::handle item : items->obj) {
      list->items.push_back(Value::constant(py::reinterpret_borrow<py::object>(item)));
    }
  } else if (items->kind == VKind::kIter || items->is(ObjRole::kDictView)) {
    std::vector<ValuePtr> rest;  // [*it], f(*d.values())
    if (!iterable_items(items, rest)) {
      FJ_UNSUPPORTED(kUnsupportedValue, "list.extend with {}", items->describe());
    }
    if (items->kind == VKind::kIter) items->exhaust();
    for (auto& item : rest) list->items.push_back(std::move(item));
  } else {
    FJ_UNSUPPORTED(kUnsupportedValue, "list.extend with {}", items->describe());
  }
}

void op_list_append(Tracer& t, const Instr& i) {
  ValuePtr list = t.peek(static_cast<size_t>(i.arg));
  t.make_writable(list);
  ValuePtr item = t.pop();
  list->items.push_back(item);
}

void op_map_add(Tracer& t, const Instr& i) {  // dict comprehensions
  ValuePtr dict = t.peek(static_cast<size_t>(i.arg) + 1);
  t.make_writable(dict);
  ValuePtr value = t.pop();
  ValuePtr key = t.pop();
  if (dict->kind != VKind::kDict) {
    FJ_UNSUPPORTED(kUnsupportedValue, "MAP_ADD into {}", dict->describe());
  }
  dict->set_key(constant_key(key), value);
}

void op_list_to_tuple(Tracer& t, const Instr&) {
  ValuePtr list = t.pop();
  t.push(Value::tuple(list->items));
}

void merge_into(Tracer& t, const Instr& i, bool merge);

// DICT_UPDATE ({**a, **b}, d.update): later keys win. DICT_MERGE (f(**a, **b)): a key given
// twice is a TypeError, which the runtime raises.
void op_dict_update(Tracer& t, const Instr& i) { merge_into(t, i, false); }
void op_dict_merge(Tracer& t, const Instr& i) { merge_into(t, i, true); }

void merge_into(Tracer& t, const Instr& i, bool merge) {
  ValuePtr dict = t.peek(static_cast<size_t>(i.arg));
  t.make_writable(dict);
  ValuePtr update = t.pop();
  std::vector<std::pair<py::object, ValuePtr>> entries;
  if (update->kind == VKind::kDict) {
    for (size_t k = 0; k < update->keys.size(); ++k) entries.emplace_back(update->keys[k], update->items[k]);
  } else if (!t.dict_by_source(update, entries)) {  // f(**kwargs) with the caller's kwargs dict
    FJ_UNSUPPORTED(kUnsupportedValue, "dict update with {}", update->describe());
  }
  for (auto& [key, value] : entries) {
    if (merge) {
      bool repeated = !PyUnicode_Check(key.ptr());
      for (const auto& known : dict->keys) repeated = repeated || known.equal(key);
      if (repeated) {
        FJ_UNSUPPORTED(kUnsupportedValue, "keyword argument {} given twice (or not a str)",
                       safe_repr(key));
      }
    }
    dict->set_key(key, value);
  }
}

// The items of a sequence being unpacked (UNPACK_SEQUENCE, UNPACK_EX).
std::vector<ValuePtr> unpacked_items(Tracer& t, const ValuePtr& seq) {
  std::vector<ValuePtr> items;
  if (seq->kind == VKind::kTensor) return t.tensor_rows(seq)->items;  // a, b = x
  // `norm, block, residual = self.layers[i]` of a ModuleList (read by source): its children,
  // as iterating it gives them (a ModuleDict's names).
  if (seq->kind == VKind::kObject && seq->source >= 0 && t.module_children(seq, items)) return items;
  if (!iterable_items(seq, items)) {
    FJ_UNSUPPORTED(kUnsupportedValue, "unpacking {} is not traced yet", seq->describe());
  }
  return items;
}

// a, *rest, b = seq: arg's low byte counts the names before the star, the high byte those after.
void op_unpack_ex(Tracer& t, const Instr& i) {
  ValuePtr seq = t.pop();
  std::vector<ValuePtr> items = unpacked_items(t, seq);
  const size_t before = i.arg & 0xff;
  const size_t after = (i.arg >> 8) & 0xff;
  if (items.size() < before + after) {
    FJ_UNSUPPORTED(kUnsupportedValue, "unpacking {} values into at least {}", items.size(),
                   before + after);
  }
  if (seq->kind == VKind::kIter) seq->exhaust();
  for (size_t k = 0; k < after; ++k) t.push(items[items.size() - 1 - k]);
  t.push(Value::list({items.begin() + static_cast<long>(before), items.end() - static_cast<long>(after)}));
  for (size_t k = before; k-- > 0;) t.push(items[k]);
}

void op_unpack_sequence(Tracer& t, const Instr& i) {
  ValuePtr seq = t.pop();
  std::vector<ValuePtr> items = unpacked_items(t, seq);
  if (static_cast<int>(items.size()) != i.arg) {
    FJ_UNSUPPORTED(kUnsupportedValue, "unpacking {} values into {}", items.size(), i.arg);
  }
  if (seq->kind == VKind::kIter) seq->exhaust();
  for (auto it = items.rbegin(); it != items.rend(); ++it) t.push(*it);
}

// An f-string's field, known at trace time: `conversion` 0 none, 1 !s, 2 !r, 3 !a.
ValuePtr format_field(Tracer& t, ValuePtr value, int conversion, const ValuePtr& spec) {
  value = t.sizes().concretize(value);
  if (!value->is_constant_tree() || (spec && !spec->is_const())) {
    FJ_UNSUPPORTED(kUnsupportedValue, "f-string of {}", value->describe());
  }
  py::object v = value->as_python();
  if (conversion == 1) v = py::str(v);
  if (conversion == 2) v = py::repr(v);
  if (conversion == 3) v = py::module_::import("builtins").attr("ascii")(v);
  return Value::constant(py::module_::import("builtins").attr("format")(
      v, spec ? spec->obj : py::str("")));
}

// 3.11 and 3.12: one instruction per field (conversion in the low bits, bit 2: a spec below).
void op_format_value(Tracer& t, const Instr& i) {
  ValuePtr spec = (i.arg & 0x04) ? t.pop() : nullptr;
  ValuePtr value = t.pop();
  t.push(format_field(t, std::move(value), i.arg & 0x03, spec));
}

// 3.13 splits it: CONVERT_VALUE (!s / !r / !a), then FORMAT_SIMPLE or FORMAT_WITH_SPEC.
void op_convert_value(Tracer& t, const Instr& i) {
  ValuePtr value = t.pop();
  t.push(format_field(t, std::move(value), i.arg, nullptr));  // a str: format(s, "") is s
}

void op_format_simple(Tracer& t, const Instr&) {
  ValuePtr value = t.pop();
  t.push(format_field(t, std::move(value), 0, nullptr));
}

void op_format_with_spec(Tracer& t, const Instr&) {
  ValuePtr spec = t.pop();
  ValuePtr value = t.pop();
  t.push(format_field(t, std::move(value), 0, spec));
}

void op_build_string(Tracer& t, const Instr& i) {
  std::vector<ValuePtr> parts = t.pop_n(static_cast<size_t>(i.arg));
  std::string out;
  for (const auto& part : parts) {
    FJ_CHECK(part->is_const(), "BUILD_STRING part {}", part->describe());
    out += part->obj.cast<std::string>();
  }
  t.push(Value::constant(py::str(out)));
}

}  // namespace

void register_build_ops(HandlerTable& table) {
  auto set = [&](Op op, OpHandler handler) { table[static_cast<size_t>(op)] = handler; };
  set(Op::BUILD_TUPLE, op_build_tuple);
  set(Op::BUILD_LIST, op_build_list);
  set(Op::BUILD_SET, op_build_set);
  set(Op::SET_ADD, op_set_add);
  set(Op::SET_UPDATE, op_set_update);
  set(Op::BUILD_MAP, op_build_map);
  set(Op::BUILD_CONST_KEY_MAP, op_build_const_key_map);
  set(Op::BUILD_SLICE, op_build_slice);
  set(Op::LIST_EXTEND, op_list_extend);
  set(Op::LIST_APPEND, op_list_append);
  set(Op::LIST_TO_TUPLE, op_list_to_tuple);
  set(Op::MAP_ADD, op_map_add);
  set(Op::DICT_UPDATE, op_dict_update);
  set(Op::DICT_MERGE, op_dict_merge);
  set(Op::UNPACK_SEQUENCE, op_unpack_sequence);
  set(Op::UNPACK_EX, op_unpack_ex);
  set(Op::FORMAT_VALUE, op_format_value);
  set(Op::CONVERT_VALUE, op_convert_value);
  set(Op::FORMAT_SIMPLE, op_format_simple);
  set(Op::FORMAT_WITH_SPEC, op_format_with_spec);
  set(Op::BUILD_STRING, op_build_string);
}

}  // namespace framejit
