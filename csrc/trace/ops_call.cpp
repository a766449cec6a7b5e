// Opcode handlers: calls (3.11's PRECALL/CALL pair and 3.12's CALL), keyword names, f(*a, **k).
#include "common/check.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

void op_precall(Tracer&, const Instr&) {}

void op_kw_names(Tracer& t, const Instr& i) { t.kw_names() = t.co_const(i.arg); }

ValuePtr call_with(Tracer& t, const ValuePtr& callable_or_null, const ValuePtr& callable_or_self,
                   std::vector<ValuePtr> args, py::object kw_names) {
  // Stack layout before CALL n: [NULL | method, callable | self, arg1 .. argn].
  ValuePtr fn = callable_or_self;
  if (callable_or_null->kind != VKind::kNull) {
    fn = callable_or_null;
    args.insert(args.begin(), callable_or_self);
  }
  KwValues kwargs;
  if (kw_names && !kw_names.is_none()) {
    const size_t n_kw = py::len(kw_names);
    FJ_CHECK(n_kw <= args.size(), "more keyword names than arguments");
    const size_t first = args.size() - n_kw;
    for (size_t k = 0; k < n_kw; ++k) {
      kwargs.emplace_back(py::str(kw_names[py::int_(k)]).cast<std::string>(), args[first + k]);
    }
    args.resize(first);
  }
  return t.call(fn, std::move(args), std::move(kwargs));
}

void op_call(Tracer& t, const Instr& i) {
  py::object kw_names = std::move(t.kw_names());
  t.kw_names() = py::object();
  std::vector<ValuePtr> args = t.pop_n(static_cast<size_t>(i.arg));
  ValuePtr callable_or_self = t.pop();
  ValuePtr callable_or_null = t.pop();
  ValuePtr result = call_with(t, callable_or_null, callable_or_self, std::move(args), kw_names);
  if (result) t.push(result);  // null: the callee was inlined and pushes its result on return
}

// f(*args, **kwargs): [NULL, callable, args tuple, (kwargs dict if arg & 1)].
void op_call_function_ex(Tracer& t, const Instr& i) {
  ValuePtr kwargs_value = (i.arg & 1) ? t.pop() : nullptr;
  ValuePtr args_value = t.pop();
  ValuePtr fn = t.pop();
  ValuePtr null = t.pop();
  std::vector<ValuePtr> args;
  if (args_value->is_sequence()) {
    args = args_value->items;
  } else if (args_value->is_const() && PyTuple_CheckExact(args_value->obj.ptr())) {
    for (py::handle item : args_value->obj) {  // a constant tuple: f(*(), **kw), f(*(1, 2))
      args.push_back(Value::constant(py::reinterpret_borrow<py::object>(item)));
    }
  } else {
    FJ_UNSUPPORTED(kUnsupportedValue, "f(*args, **kwargs) with {}", args_value->describe());
  }
  KwValues kwargs;
  if (kwargs_value && kwargs_value->kind == VKind::kDict) {
    for (size_t k = 0; k < kwargs_value->keys.size(); ++k) {
      kwargs.emplace_back(py::str(kwargs_value->keys[k]).cast<std::string>(),
                          kwargs_value->items[k]);
    }
  } else if (kwargs_value) {
    // A dict that existed before the region (f(**self.defaults)): its keys guarded, its items
    // read by source.
    std::vector<std::pair<py::object, ValuePtr>> entries;
    if (!t.dict_by_source(kwargs_value, entries)) {
      FJ_UNSUPPORTED(kUnsupportedValue, "f(*args, **kwargs) with {}", kwargs_value->describe());
    }
    for (auto& [key, value] : entries) {
      if (!PyUnicode_CheckExact(key.ptr())) FJ_UNSUPPORTED(kUnsupportedValue, "f(**kwargs) with a key that is not a str");
      kwargs.emplace_back(key.cast<std::string>(), std::move(value));
    }
  }
  if (null->kind != VKind::kNull) {
    FJ_UNSUPPORTED(kUnsupportedValue, "f(*args) on a method");
  }
  ValuePtr result = t.call(fn, std::move(args), std::move(kwargs));
  if (result) t.push(result);
}

// MAKE_FUNCTION (3.11 and 3.12): [defaults?, kwdefaults?, annotations?, closure?, code].
void op_make_function(Tracer& t, const Instr& i) {
  ValuePtr code = t.pop();
  FJ_CHECK(code->is_const() && PyCode_Check(code->obj.ptr()), "MAKE_FUNCTION without code");
  ValuePtr closure = (i.arg & 0x08) ? t.pop() : Value::null();
  if (i.arg & 0x04) t.pop();  // annotations: not needed to run the function
  ValuePtr kwdefaults = (i.arg & 0x02) ? t.pop() : Value::null();
  ValuePtr defaults = (i.arg & 0x01) ? t.pop() : Value::null();
  if (defaults->kind == VKind::kConst && PyTuple_Check(defaults->obj.ptr())) {
    std::vector<ValuePtr> items;
    for (py::handle item : defaults->obj) {
      items.push_back(Value::constant(py::reinterpret_borrow<py::object>(item)));
    }
    defaults = Value::tuple(std::move(items));
  }
  if ((defaults->kind != VKind::kNull && defaults->kind != VKind::kTuple) ||
      (kwdefaults->kind != VKind::kNull && kwdefaults->kind != VKind::kDict) ||
      (closure->kind != VKind::kNull && closure->kind != VKind::kTuple)) {
    FJ_UNSUPPORTED(kUnsupportedValue, "MAKE_FUNCTION with defaults or closure not traced");
  }
  ValuePtr fn = Value::object(code->obj);
  fn->role = ObjRole::kMadeFunction;
  fn->items = {defaults, kwdefaults, closure};
  fn->globals = t.frame_globals();
  t.push(fn);
}

}  // namespace

void register_call_ops(HandlerTable& table) {
  auto set = [&](Op op, OpHandler handler) { table[static_cast<size_t>(op)] = handler; };
  set(Op::PRECALL, op_precall);
  set(Op::KW_NAMES, op_kw_names);
  set(Op::CALL, op_call);
  set(Op::CALL_FUNCTION_EX, op_call_function_ex);
  set(Op::MAKE_FUNCTION, op_make_function);
}

}  // namespace framejit
