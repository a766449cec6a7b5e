// Abstract value constructors and descriptions.
#include "trace/value.h"

#include <algorithm>
#include <unordered_map>

#include "common/check.h"
#include "graph/graph.h"
#include "trace/entry_state.h"
#include "trace/pyrefs.h"

namespace framejit {

const char* vkind_name(VKind kind) {
  switch (kind) {
    case VKind::kTensor: return "Tensor";
    case VKind::kConst: return "Const";
    case VKind::kObject: return "Object";
    case VKind::kTuple: return "Tuple";
    case VKind::kList: return "List";
    case VKind::kDict: return "Dict";
    case VKind::kNull: return "Null";
    case VKind::kSymNum: return "SymNum";
    case VKind::kIter: return "Iter";
    case VKind::kCell: return "Cell";
  }
  return "?";
}

ValuePtr Value::constant(py::object value, int source) {
  auto v = std::make_shared<Value>();
  v->kind = VKind::kConst;
  v->obj = std::move(value);
  v->source = source;
  return v;
}

ValuePtr Value::object(py::object value, int source) {
  auto v = std::make_shared<Value>();
  v->kind = VKind::kObject;
  v->obj = std::move(value);
  v->source = source;
  return v;
}

ValuePtr Value::tensor(Node* node, py::object meta, py::object device, int source) {
  auto v = std::make_shared<Value>();
  v->kind = VKind::kTensor;
  v->node = node;
  v->obj = std::move(meta);
  v->device = std::move(device);
  v->source = source;
  return v;
}

ValuePtr Value::plain_tensor(const ValuePtr& value) {
  if (!value->ndarray) return value;
  ValuePtr out = std::make_shared<Value>(*value);
  out->ndarray = false;
  return out;
}

ValuePtr Value::tuple(std::vector<ValuePtr> items, py::object pytype) {
  auto v = std::make_shared<Value>();
  v->kind = VKind::kTuple;
  v->items = std::move(items);
  v->pytype = pytype ? std::move(pytype)
                     : py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyTuple_Type));
  return v;
}

ValuePtr Value::list(std::vector<ValuePtr> items) {
  auto v = std::make_shared<Value>();
  v->kind = VKind::kList;
  v->items = std::move(items);
  return v;
}

ValuePtr Value::dict(std::vector<py::object> keys, std::vector<ValuePtr> values) {
  auto v = std::make_shared<Value>();
  v->kind = VKind::kDict;
  v->keys = std::move(keys);
  v->items = std::move(values);
  return v;
}

ValuePtr Value::null() {
  auto v = std::make_shared<Value>();
  v->kind = VKind::kNull;
  return v;
}

ValuePtr Value::sym_num(py::object fn, std::vector<ValuePtr> args, py::object value) {
  auto v = std::make_shared<Value>();
  v->kind = VKind::kSymNum;
  v->fn = std::move(fn);
  v->items = std::move(args);
  v->obj = std::move(value);
  return v;
}

ValuePtr Value::iter(std::vector<ValuePtr> items) {
  auto v = std::make_shared<Value>();
  v->kind = VKind::kIter;
  v->items = std::move(items);
  return v;
}

ValuePtr Value::generator_iter(std::vector<ValuePtr> items) {
  ValuePtr v = iter(std::move(items));
  v->pytype = PyRefs::get().generator_type;
  return v;
}

ValuePtr Value::map_items(const ValuePtr& value,
                          const std::function<ValuePtr(const ValuePtr&)>& fn) {
  if (value->kind != VKind::kTuple && value->kind != VKind::kList && value->kind != VKind::kDict) {
    return value;
  }
  bool changed = false;
  std::vector<ValuePtr> items;
  for (const auto& item : value->items) {
    items.push_back(fn(item));
    changed = changed || items.back() != item;
  }
  if (!changed) return value;
  ValuePtr copy = std::make_shared<Value>(*value);
  copy->items = std::move(items);
  copy->source = -1;
  return copy;
}

bool Value::is_size_expr() const {
  if (kind != VKind::kSymNum) return false;
  if (size_of || int_input) return true;
  if (!fn) return false;  // an entry number
  for (const auto& item : items) {
    if (item->kind == VKind::kSymNum && !item->is_size_expr()) return false;
  }
  return true;  // sizes, or arithmetic whose sizes were since pinned to constants
}

bool Value::holds_tensor() const {
  if (kind == VKind::kTensor) return true;
  for (const auto& item : items) {
    if (item->holds_tensor()) return true;
  }
  return false;
}

bool Value::holds_size_expr() const {
  if (kind == VKind::kSymNum) return is_size_expr();
  if (kind != VKind::kTuple && kind != VKind::kList && kind != VKind::kDict) return false;
  for (const auto& item : items) {
    if (item->holds_size_expr()) return true;
  }
  return false;
}

bool Value::holds_sym_num() const {
  if (kind == VKind::kSymNum) return true;
  if (kind != VKind::kTuple && kind != VKind::kList && kind != VKind::kDict) return false;
  for (const auto& item : items) {
    if (item->holds_sym_num()) return true;
  }
  return false;
}

bool Value::is_constant_tree() const {
  switch (kind) {
    case VKind::kConst:
      return true;
    case VKind::kTuple:
    case VKind::kList:
    case VKind::kDict:
      for (const auto& item : items) {
        if (!item->is_constant_tree()) return false;
      }
      return true;
    default:
      return false;
  }
}

ValuePtr Value::constant_tree(py::object value, int depth) {
  PyObject* obj = value.ptr();
  const bool is_list = PyList_CheckExact(obj), is_tuple = PyTuple_CheckExact(obj);
  if (depth < 8 && (is_list || is_tuple)) {
    std::vector<ValuePtr> items;
    for (py::handle item : value) {
      items.push_back(constant_tree(py::reinterpret_borrow<py::object>(item), depth + 1));
    }
    return is_list ? list(std::move(items)) : tuple(std::move(items));
  }
  if (depth < 8 && PyDict_CheckExact(obj)) {
    std::vector<py::object> keys;
    std::vector<ValuePtr> values;
    PyObject *key, *item;
    Py_ssize_t at = 0;
    while (PyDict_Next(obj, &at, &key, &item)) {
      keys.push_back(py::reinterpret_borrow<py::object>(key));
      values.push_back(constant_tree(py::reinterpret_borrow<py::object>(item), depth + 1));
    }
    return dict(std::move(keys), std::move(values));
  }
  return constant(std::move(value));
}

bool Value::as_key(py::object& out) const {
  if (is_constant_tree()) {
    out = as_python();
    return true;
  }
  if (kind == VKind::kObject && role == ObjRole::kPlain && !bound_self && obj &&
      is_identity_object(obj.ptr())) {
    out = obj;
    return true;
  }
  return false;
}

py::object Value::as_python() const {
  switch (kind) {
    case VKind::kConst:
    case VKind::kObject:
      return obj;
    case VKind::kTuple: {
      py::list items_py;
      for (const auto& item : items) items_py.append(item->as_python());
      py::tuple t(items_py);
      if (pytype.ptr() == reinterpret_cast<PyObject*>(&PyTuple_Type)) return std::move(t);
      PyObject* made = make_tuple_of_type(t.release().ptr(), pytype.ptr());  // New
      if (made == nullptr) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(made);
    }
    case VKind::kList: {
      py::list out;
      for (const auto& item : items) out.append(item->as_python());
      if (is_deque()) return pytype(out, deque_maxlen());
      return std::move(out);
    }
    case VKind::kDict: {
      // (a defaultdict's own class with its factory, an OrderedDict's)
      py::object out = !pytype ? py::object(py::dict()) : factory ? pytype(factory->obj) : pytype();
      for (size_t i = 0; i < items.size(); ++i) out[keys[i]] = items[i]->as_python();
      return out;
    }
    default:
      throw InternalError(std::string("as_python on ") + vkind_name(kind));
  }
}

std::string Value::describe() const {
  switch (kind) {
    case VKind::kTensor:
      return "Tensor(" + (node ? node->meta_text() : std::string("?")) + ")";
    case VKind::kConst:
      return "Const(" + short_repr(obj) + ")";
    case VKind::kObject:
      return "Object(" + short_repr(obj) + ")";
    case VKind::kNull:
      return "NULL";
    case VKind::kSymNum:
      return "SymNum(" + safe_repr(obj) + ")";
    default: {
      std::string out = std::string(vkind_name(kind)) + "(";
      for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i]->describe();
      return out + ")";
    }
  }
}

long Value::find_key(const py::object& key) const {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].equal(key)) return static_cast<long>(i);
  }
  return -1;
}

void Value::set_key(py::object key, ValuePtr value) {
  const long at = find_key(key);
  if (at >= 0) {
    items[at] = std::move(value);
    return;
  }
  if (being_iterated()) FJ_UNSUPPORTED(kSideEffect, "a dict changes size while a loop iterates it");
  keys.push_back(std::move(key));
  items.push_back(std::move(value));
}

ValuePtr Value::iter_over(const ValuePtr& container, char view) {
  ValuePtr it = Value::iter({});
  it->iter_form = IterForm::kOver;
  it->over = container;
  it->view = view;
  it->over_size = container->items.size();
  if (container->kind == VKind::kDict) container->add_iterator(it);
  return it;
}

bool Value::is_ordered_dict() const {
  return kind == VKind::kDict && pytype && pytype.is(PyRefs::get().ordered_dict_type);
}

bool Value::being_iterated() const {
  for (const std::weak_ptr<Value>& weak : iterators) {
    const ValuePtr it = weak.lock();
    if (it && !it->exhausted) return true;
  }
  return false;
}

namespace {

// Entry i of a dict value as its view `view` yields it.
ValuePtr dict_entry(const Value& dict, size_t i, char view) {
  if (view == 'v') return dict.items.at(i);
  ValuePtr key = Value::constant(dict.keys.at(i));
  if (view == 'k') return key;
  return Value::tuple({std::move(key), dict.items.at(i)});
}

// A copy of an iterator and of the iterators it reads (one copy per iterator however often it
// is read: zip(it, it) stays one iterator read twice).
ValuePtr copy_iterator(const ValuePtr& it, std::unordered_map<const Value*, ValuePtr>& copies) {
  if (it->kind != VKind::kIter) return it;
  auto found = copies.find(it.get());
  if (found != copies.end()) return found->second;
  auto copy = std::make_shared<Value>(*it);
  copies[it.get()] = copy;
  if (copy->iter_form == IterForm::kEnumerate || copy->iter_form == IterForm::kZip) {
    for (ValuePtr& inner : copy->items) inner = copy_iterator(inner, copies);
  }
  return copy;
}

}  // namespace

namespace {

// The first value in `value` or what it holds (a container's items, a new object's attributes,
// a bound method's self) that `match` accepts.
template <typename Match>
Value* held_value(const ValuePtr& value, const Match& match, int depth = 0) {
  if (!value || depth > 8) return nullptr;  // (a container holding itself)
  if (match(*value)) return value.get();
  if (value->is_sequence() || value->kind == VKind::kDict ||
      (value->kind == VKind::kIter && !value->exhausted) || value->is(ObjRole::kNewObject)) {
    for (const ValuePtr& item : value->items) {  // (a new object's: its attributes)
      if (Value* found = held_value(item, match, depth + 1)) return found;
    }
  }
  // A bound method (a block's __exit__) of an object holding one.
  if (value->kind == VKind::kObject && value->bound_self) {
    return held_value(value->bound_self, match, depth + 1);
  }
  return nullptr;
}

}  // namespace

Value* live_generator_in(const ValuePtr& value) {
  return held_value(value, [](const Value& v) {
    return v.kind == VKind::kIter && v.iter_form == IterForm::kGenerator;
  });
}

Value* context_token_in(const ValuePtr& value) {
  return held_value(value, [](const Value& v) { return v.is(ObjRole::kContextToken); });
}

std::vector<ValuePtr> dict_view_items(const Value& view) {
  if (view.over->kind != VKind::kDict) return view.items.at(0)->items;  // a sourced dict's snapshot
  const char mode = view.method == "values" ? 'v' : view.method == "items" ? 'i' : 'k';
  std::vector<ValuePtr> out;
  for (size_t i = 0; i < view.over->keys.size(); ++i) out.push_back(dict_entry(*view.over, i, mode));
  return out;
}

Value* Value::live_generator(bool all) {
  if (kind != VKind::kIter || exhausted) return nullptr;
  if (iter_form == IterForm::kGenerator) return all || index >= items.size() ? this : nullptr;
  if (iter_form == IterForm::kEnumerate) return items.at(0)->live_generator(all);
  if (iter_form == IterForm::kZip) {
    for (size_t i = 0; i < items.size(); ++i) {
      Value* g = items[i]->live_generator(all);
      if (g == nullptr) continue;
      if (all) return g;
      // zip steps its iterators in order and stops at the first that ends: the generator runs
      // only if each one before it has an item (looked at on copies, nothing consumed).
      std::unordered_map<const Value*, ValuePtr> copies;
      for (size_t before = 0; before < i; ++before) {
        if (!copy_iterator(items[before], copies)->next()) return nullptr;
      }
      return g;
    }
  }
  return nullptr;
}

ValuePtr Value::next() {
  if (exhausted) return nullptr;
  if (Value* g = live_generator()) throw GeneratorNeeded{g};
  ValuePtr out;
  switch (iter_form) {
    case IterForm::kItems:
      if (over && over->adopted) {
        // A dict read by source that the trace has changed since the loop began: with the same
        // keys in the same order, its entries as they are now; otherwise left to the real
        // iterator over the real dict, which sees the change (or raises) as in Python.
        bool same = over->keys.size() == keys.size();
        for (size_t i = 0; same && i < keys.size(); ++i) same = over->keys[i].equal(keys[i]);
        if (!same) FJ_UNSUPPORTED(kSideEffect, "a loop over a dict whose keys it changes");
        if (index < keys.size()) out = dict_entry(*over, index++, view);
        break;
      }
      if (index < items.size()) out = items[index++];
      break;
    case IterForm::kOver:
      if (over->kind == VKind::kDict) {
        if (over->items.size() != over_size) {
          FJ_UNSUPPORTED(kSideEffect, "a dict changed size while a loop iterates it");
        }
        if (index < over->keys.size()) out = dict_entry(*over, index++, view);
      } else if (index < over->items.size()) {
        out = over->items[index++];
      }
      break;
    case IterForm::kRange: {
      const Py_ssize_t n = PyObject_Size(lazy_range.ptr());
      if (n < 0) throw py::error_already_set();
      if (index < static_cast<size_t>(n)) {
        PyObject* item = PySequence_GetItem(lazy_range.ptr(), static_cast<Py_ssize_t>(index++));
        if (item == nullptr) throw py::error_already_set();  // New
        out = Value::constant(py::reinterpret_steal<py::object>(item));
      }
      break;
    }
    case IterForm::kEnumerate:
      if (ValuePtr item = items.at(0)->next()) {
        out = Value::tuple({Value::constant(py::int_(count++)), std::move(item)});
      }
      break;
    case IterForm::kZip: {
      std::vector<ValuePtr> row;
      for (const ValuePtr& inner : items) {
        ValuePtr item = inner->next();
        if (!item) break;
        row.push_back(std::move(item));
      }
      if (!items.empty() && row.size() == items.size()) out = Value::tuple(std::move(row));
      break;
    }
    case IterForm::kReversed:
      if (count >= 0 && static_cast<size_t>(count) < over->items.size()) out = over->items[count--];
      break;
    case IterForm::kGenerator:  // an item it yielded ahead (live_generator() threw if none)
      out = items[index++];
      return out;
  }
  if (!out) exhausted = true;
  return out;
}

bool Value::rest(size_t max, std::vector<ValuePtr>& out) const {
  if (Value* g = const_cast<Value*>(this)->live_generator(/*all=*/true)) throw GeneratorNeeded{g, true};
  if (iter_form == IterForm::kRange && !exhausted) {
    const Py_ssize_t n = PyObject_Size(lazy_range.ptr());
    if (n < 0) throw py::error_already_set();
    if (static_cast<size_t>(n) - std::min(index, static_cast<size_t>(n)) > max) return false;
  }
  std::unordered_map<const Value*, ValuePtr> copies;
  auto copy = std::make_shared<Value>(*this);
  copies[this] = copy;
  if (copy->iter_form == IterForm::kEnumerate || copy->iter_form == IterForm::kZip) {
    for (ValuePtr& inner : copy->items) inner = copy_iterator(inner, copies);
  }
  while (ValuePtr item = copy->next()) {
    if (out.size() == max) return false;
    out.push_back(std::move(item));
  }
  return true;
}

void Value::exhaust() {
  if (iter_form == IterForm::kRange && !exhausted) {
    const Py_ssize_t n = PyObject_Size(lazy_range.ptr());
    if (n < 0) throw py::error_already_set();
    index = std::max(index, static_cast<size_t>(n));
    exhausted = true;
    return;
  }
  while (next()) {
  }
}

}  // namespace framejit
