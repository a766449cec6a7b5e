// Opcode handlers: calls (3.11's PRECALL/CALL pair, 3.12's CALL, 3.13's CALL / CALL_KW),
// keyword names, f(*a, **k), functions made at run time.
#include "bytecode/version.h"
#include "common/check.h"
#include "trace/python_rules.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

void op_precall(Tracer&, const Instr&) {}

void op_kw_names(Tracer& t, const Instr& i) { t.kw_names() = t.co_const(i.arg); }

ValuePtr call_with(Tracer& t, ValuePtr callable_or_null, ValuePtr callable_or_self,
                   std::vector<ValuePtr> args, py::object kw_names) {
  // Stack layout before CALL n: [NULL | method, callable | self, arg1 .. argn]; 3.13 has
  // [callable | method, NULL | self, ...], put in 3.12's order here.
  if (pyver::kNullAboveCallable && callable_or_self->kind == VKind::kNull) {
    std::swap(callable_or_null, callable_or_self);
  }
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

// 3.13: CALL with the keyword names as a constant tuple on the stack, above the arguments.
void op_call_kw(Tracer& t, const Instr& i) {
  ValuePtr names = t.pop();
  FJ_CHECK(names->is_const() && PyTuple_CheckExact(names->obj.ptr()), "CALL_KW without names");
  std::vector<ValuePtr> args = t.pop_n(static_cast<size_t>(i.arg));
  ValuePtr callable_or_self = t.pop();
  ValuePtr callable_or_null = t.pop();
  ValuePtr result = call_with(t, callable_or_null, callable_or_self, std::move(args), names->obj);
  if (result) t.push(result);
}

// f(*args, **kwargs): [NULL, callable, args tuple, (kwargs dict if arg & 1)]; 3.13 has the
// NULL above the callable.
void op_call_function_ex(Tracer& t, const Instr& i) {
  ValuePtr kwargs_value = (i.arg & 1) ? t.pop() : nullptr;
  ValuePtr args_value = t.pop();
  ValuePtr fn = t.pop();
  ValuePtr null = t.pop();
  if (pyver::kNullAboveCallable) std::swap(fn, null);
  std::vector<ValuePtr> args;
  if (args_value->is_sequence()) {
    args = args_value->items;
  } else if (args_value->is_const() && PyTuple_Check(args_value->obj.ptr())) {
    // a constant tuple: f(*(), **kw), f(*(1, 2)), x.view(*shape) of a torch.Size pinned to its
    // numbers (CPython makes a tuple of what is not one)
    for (py::handle item : args_value->obj) {
      args.push_back(Value::constant(py::reinterpret_borrow<py::object>(item)));
    }
  } else if (args_value->kind == VKind::kIter && iterable_items(args_value, args)) {
    // f(*(getattr(self, f"original{i}") for i in range(n))): CPython makes a tuple of what the
    // iterator has left (torch's weight_norm parametrization), using it up.
    args_value->exhaust();
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

// A function made in the trace: items {defaults, kwdefaults, closure}, each NULL when not given.
constexpr int kDefaults = 0x01, kKwDefaults = 0x02, kAnnotations = 0x04, kClosure = 0x08;

void set_function_attribute(ValuePtr& fn, int flag, ValuePtr value) {
  if (flag == kAnnotations) return;  // not needed to run the function
  if (flag == kDefaults && value->kind == VKind::kConst && PyTuple_Check(value->obj.ptr())) {
    std::vector<ValuePtr> items;
    for (py::handle item : value->obj) {
      items.push_back(Value::constant(py::reinterpret_borrow<py::object>(item)));
    }
    value = Value::tuple(std::move(items));
  }
  const bool traced = (flag == kDefaults && value->kind == VKind::kTuple) ||
                      (flag == kKwDefaults && value->kind == VKind::kDict) ||
                      (flag == kClosure && value->kind == VKind::kTuple);
  if (!traced) FJ_UNSUPPORTED(kUnsupportedValue, "MAKE_FUNCTION with defaults or closure not traced");
  fn->items[flag == kDefaults ? 0 : flag == kKwDefaults ? 1 : 2] = std::move(value);
}

// MAKE_FUNCTION: 3.11 and 3.12 [defaults?, kwdefaults?, annotations?, closure?, code] as the
// argument's flags say; 3.13 [code], each attribute then set by SET_FUNCTION_ATTRIBUTE.
void op_make_function(Tracer& t, const Instr& i) {
  ValuePtr code = t.pop();
  FJ_CHECK(code->is_const() && PyCode_Check(code->obj.ptr()), "MAKE_FUNCTION without code");
  ValuePtr fn = Value::object(code->obj);
  fn->role = ObjRole::kMadeFunction;
  fn->items = {Value::null(), Value::null(), Value::null()};
  fn->globals = t.frame_globals();
  for (int flag : {kClosure, kAnnotations, kKwDefaults, kDefaults}) {  // the stack's order, top first
    if (i.arg & flag) set_function_attribute(fn, flag, t.pop());
  }
  t.push(fn);
}

// 3.13: [value, function] -> [function] with one attribute (the argument's flag) set.
void op_set_function_attribute(Tracer& t, const Instr& i) {
  ValuePtr fn = t.pop();
  ValuePtr value = t.pop();
  FJ_CHECK(fn->is(ObjRole::kMadeFunction), "SET_FUNCTION_ATTRIBUTE on {}", fn->describe());
  ValuePtr copy = std::make_shared<Value>(*fn);  // values are shared: change a copy
  set_function_attribute(copy, i.arg, std::move(value));
  t.push(copy);
}

}  // namespace

void register_call_ops(HandlerTable& table) {
  auto set = [&](Op op, OpHandler handler) { table[static_cast<size_t>(op)] = handler; };
  set(Op::PRECALL, op_precall);
  set(Op::KW_NAMES, op_kw_names);
  set(Op::CALL, op_call);
  set(Op::CALL_KW, op_call_kw);
  set(Op::SET_FUNCTION_ATTRIBUTE, op_set_function_attribute);
  set(Op::CALL_FUNCTION_EX, op_call_function_ex);
  set(Op::MAKE_FUNCTION, op_make_function);
}

}  // namespace framejit
