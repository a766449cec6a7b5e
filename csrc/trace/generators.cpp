// Generators and exceptions inside the trace.
//
// A generator function called in an inlined frame gives a kIter kGenerator value that owns the
// function's frame, not started. A FOR_ITER over it pushes that frame above the loop's
// (kStep): its yield pops it again and hands the value to the loop, its return ends the loop,
// so the two frames interleave exactly as in Python. Any other consumer asks Value::next for
// an item (zip, enumerate, a builtin stepping it) or Value::rest for all of them (list(),
// sorted()), which throws GeneratorNeeded; the tracer then runs the frame to its next yield
// (kBuffer: the item kept on the iterator) or to its end (kDrain) and executes the consumer's
// instruction again. A consumer that stops early (zip with a shorter argument) so runs the
// generator no further than Python does, and one that never ends (itertools.count's form)
// can be stepped.
//
// An exception raised in an inlined frame (RAISE_VARARGS, RERAISE) unwinds through the frames'
// exception tables as CPython does, into the root frame's too. Where none catches it, or where
// the region would end inside the root frame's except block (CPython's exception state cannot
// be rebuilt there), the raise is left to CPython: the call, or the region, ends at it.
#include <fmt/format.h>

#include <algorithm>

#include "bytecode/version.h"
#include "common/check.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

constexpr size_t kMaxDrainedItems = 100000;  // a generator that never returns stops here

std::string safe_type_name(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

}  // namespace

ValuePtr simple_exception(py::handle cls, const py::tuple& args, const py::dict& kwargs) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  static PyObject* const kInit = PyUnicode_InternFromString("__init__");
  static PyObject* const kNew = PyUnicode_InternFromString("__new__");
  for (PyObject* name : {kInit, kNew}) {
    PyObject* found = _PyType_Lookup(type, name);  // Borrowed
    if (found == nullptr) return nullptr;
    if (PyFunction_Check(found)) return nullptr;
    if (PyObject_TypeCheck(found, &PyStaticMethod_Type) || PyObject_TypeCheck(found, &PyClassMethod_Type)) {
      return nullptr;  // a __new__ written in Python
    }
  }
  ValuePtr exc = Value::object(cls(*args, **kwargs));
  exc->remake = py::make_tuple(cls, args, kwargs);
  return exc;
}

void Tracer::resume_generator(Value& it, TraceFrame::GenMode mode, int exhausted_pc,
                              ValuePtr keep) {
  std::shared_ptr<TraceFrame> frame = it.gen_frame;
  FJ_CHECK(frame != nullptr, "resuming a generator that has finished");
  if (frame->owner != nullptr) {
    FJ_UNSUPPORTED(kUnsupportedValue, "a generator that is already running (ValueError)");
  }
  if (frames_.size() >= kMaxFrames) {
    FJ_UNSUPPORTED(kUnsupportedCall, "running a generator deeper than {} frames", kMaxFrames);
  }
  frame->owner = &it;
  frame->owner_kept = std::move(keep);  // (a cycle while it runs: cut at its yield, end, ~Tracer)
  frame->gen_mode = mode;
  frame->exhausted_pc = exhausted_pc;
  frame->call_site = instr().offset;  // where an exception leaving the generator goes on
  frames_.push_back(std::move(frame));
}

void Tracer::generator_yield(ValuePtr value, const Instr& i) {
  TraceFrame& gen = frame();
  push(Value::constant(py::none()));  // what next() sends in when the frame resumes
  if (gen.gen_mode == TraceFrame::GenMode::kDrain) {
    if (gen.yields.size() >= kMaxDrainedItems) {
      FJ_UNSUPPORTED(kUnsupportedValue, "a generator yielding more than {} items", kMaxDrainedItems);
    }
    gen.yields.push_back(std::move(value));
    return;
  }
  gen.pc = i.next;
  gen.suspended_at = i.start;
  Value* owner = gen.owner;
  gen.owner = nullptr;
  ValuePtr kept = std::move(gen.owner_kept);  // alive until the value is handed over
  const bool buffered = gen.gen_mode == TraceFrame::GenMode::kBuffer;
  frames_.pop_back();  // suspended: its iterator still holds it
  if (buffered) {  // kept for the consumer, whose instruction runs again
    owner->items.push_back(std::move(value));
    return;
  }
  push(std::move(value));
}

void Tracer::end_generator(bool returned, ValuePtr result) {
  // next(gen) with no default, where the generator returns: StopIteration at the consumer's
  // call. Traced where the consumer's call is inside a try block (`except StopIteration`, as
  // contextlib's generator managers step a generator past its end); otherwise the region ends
  // (before anything changes: the instruction loop ends it with the frames as they are).
  const Instr* stopped_at = nullptr;
  if (returned && frames_.back()->gen_mode == TraceFrame::GenMode::kNext && !frames_.back()->next_default) {
    FJ_CHECK(frames_.size() >= 2, "a generator frame without its consumer");
    const TraceFrame& consumer = *frames_[frames_.size() - 2];
    stopped_at = &consumer.bytecode->at(frames_.back()->call_site);
    if (stopped_at->handler < 0) {
      FJ_UNSUPPORTED(kUnsupportedValue, "next() of a generator that returns (StopIteration)");
    }
  }
  std::shared_ptr<TraceFrame> gen = frames_.back();
  frames_.pop_back();
  FJ_CHECK(gen->owner != nullptr, "a generator frame without its iterator");
  Value& it = *gen->owner;
  ValuePtr kept = std::move(gen->owner_kept);  // `it` stays alive to the end of this function
  gen->owner = nullptr;
  it.gen_frame.reset();
  it.iter_form = IterForm::kItems;
  if (gen->gen_mode == TraceFrame::GenMode::kDrain || gen->gen_mode == TraceFrame::GenMode::kBuffer) {
    // The consumer's instruction runs again over what it has not taken yet: the items yielded
    // ahead, then those drained.
    it.items.erase(it.items.begin(), it.items.begin() + static_cast<long>(std::min(it.index, it.items.size())));
    for (ValuePtr& item : gen->yields) it.items.push_back(std::move(item));
    it.index = 0;
    it.exhausted = false;
    return;
  }
  it.index = 0;
  it.items.clear();
  it.exhausted = true;
  if (returned && gen->gen_mode == TraceFrame::GenMode::kSend) {  // `yield from` ends
    TraceFrame& consumer = frame();
    if (!pyver::kSendKeepsReceiver) consumer.stack.pop_back();
    consumer.stack.push_back(result ? std::move(result) : Value::constant(py::none()));
    consumer.pc = gen->exhausted_pc;
    return;
  }
  if (stopped_at != nullptr) {
    // The loop's instruction was the generator's return: its frame stays alive while the
    // StopIteration is raised at the consumer's call, as if that instruction raised it.
    retired_frames_.push_back(std::move(gen));
    site_.code = frame().code;
    site_.instr = stopped_at;
    site_.inlined = frames_.size() > 1;
    raise_exception(simple_exception(py::handle(PyExc_StopIteration), py::tuple(), py::dict()));
    return;
  }
  if (returned && gen->gen_mode == TraceFrame::GenMode::kNext) {
    push(gen->next_default);
    return;
  }
  if (returned) {  // the FOR_ITER's loop ends: the iterator popped, on at the loop's exit
    TraceFrame& consumer = frame();
    consumer.stack.pop_back();
    consumer.pc = gen->exhausted_pc;
  }
}

void Tracer::drop_frames_to(size_t n) {
  while (frames_.size() > n) {
    if (frames_.back()->checkpoint_body) {
      recorder_.close_checkpoint();
      FJ_UNSUPPORTED(kUnsupportedCall, "an exception leaving a checkpointed function");
    }
    if (frames_.back()->lazy_generator) {
      end_generator(/*returned=*/false);
    } else {
      frames_.pop_back();
    }
  }
}

ValuePtr Tracer::python_generator_iter(const ValuePtr& obj) {
  const bool made = obj->is(ObjRole::kNewObject);  // obj: its class
  if (!made && (!obj->is(ObjRole::kPlain) || obj->bound_self || PyType_Check(obj->obj.ptr()))) {
    return nullptr;
  }
  static PyObject* const kIter = PyUnicode_InternFromString("__iter__");
  PyTypeObject* type = made ? reinterpret_cast<PyTypeObject*>(obj->obj.ptr()) : Py_TYPE(obj->obj.ptr());
  PyObject* hook = _PyType_Lookup(type, kIter);  // Borrowed
  if (hook == nullptr || !PyFunction_Check(hook)) return nullptr;
  const auto* code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(hook));
  if (!(code->co_flags & CO_GENERATOR)) return nullptr;
  if (!inline_special_method(obj, kIter, {}, /*may_make_generator=*/true)) return nullptr;
  return pop();  // the generator inline_call pushed
}

void Tracer::raise_exception(const ValuePtr& exc) {
  if ((exc->kind != VKind::kObject && exc->kind != VKind::kConst) || exc->is_special_object() ||
      !PyExceptionInstance_Check(exc->obj.ptr())) {
    FJ_UNSUPPORTED(kUnsupportedValue, "raise of {}", exc->describe());
  }
  if (!may_inline(call_site_here())) {
    FJ_UNSUPPORTED(kUnsupportedOpcode, "raise {} (its except block is Python's: {})",
                   safe_type_name(exc->obj), no_inline_->at(call_site_here()));
  }
  const bool stop_iteration = PyErr_GivenExceptionMatches(exc->obj.ptr(), PyExc_StopIteration);
  const bool attribute_error = PyErr_GivenExceptionMatches(exc->obj.ptr(), PyExc_AttributeError);
  const size_t top = frames_.size();
  for (size_t d = top; d-- > 0;) {
    TraceFrame& f = *frames_[d];
    const int at = d + 1 == top ? instr().offset : frames_[d + 1]->call_site;
    const Instr& ins = f.bytecode->at(at);
    if (ins.handler < 0 && attribute_error && f.on_missing && d > 0) {
      // Out of a __getattribute__ that getattr(obj, name, default) / hasattr inlined: the
      // default (as raise_missing_attribute).
      ValuePtr result = f.on_missing;
      drop_frames_to(d);
      push(std::move(result));
      return;
    }
    if (ins.handler < 0) {
      if (f.lazy_generator && stop_iteration) {  // PEP 479: a RuntimeError, Python's to raise
        FJ_UNSUPPORTED(kUnsupportedValue, "StopIteration leaving a generator");
      }
      continue;
    }
    if (d == 0) {
      if (root_raise_.empty()) root_raise_ = call_site_here();
      root_caught_.push_back(exc.get());
    }
    drop_frames_to(d + 1);
    if (static_cast<int>(f.stack.size()) < ins.handler_depth) {
      throw InternalError(fmt::format("exception handler at {} expects a deeper stack", ins.handler));
    }
    f.stack.resize(static_cast<size_t>(ins.handler_depth));
    if (ins.handler_lasti) f.stack.push_back(Value::constant(py::int_(ins.offset)));
    f.stack.push_back(exc);
    f.pc = ins.handler;  // a frame below the raising one
    jump(ins.handler);   // the raising frame itself: the loop goes on at next_pc_
    return;
  }
  if (std::find(root_caught_.begin(), root_caught_.end(), exc.get()) != root_caught_.end()) {
    // Raised again after an except block of the root frame had it (RERAISE, bare `raise`):
    // CPython's from the first raise on, its exception state being CPython's to keep.
    throw InlineBreak{root_raise_, "an exception the root frame raises again"};
  }
  FJ_PROGRAM_RAISED(kUnsupportedOpcode, "raise {} ({}) with no handler inside the trace",
                    safe_type_name(exc->obj), py::str(exc->obj).cast<std::string>());
}

}  // namespace framejit
