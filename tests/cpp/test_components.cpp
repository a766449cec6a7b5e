// The trace layer's components on their own, without a live frame or a Tracer: the entry state
// (sources, inputs and the guards it alone writes), side effects, the exit builder, the mode
// stack and the size tracker.
#include <pybind11/embed.h>

#include <catch2/catch.hpp>

#include "common/check.h"
#include "trace/entry_state.h"
#include "trace/exit_builder.h"
#include "trace/mode_stack.h"
#include "trace/recorder.h"
#include "trace/side_effects.h"
#include "trace/sizes.h"

namespace py = pybind11;
using namespace framejit;

namespace {

// A code object to name the graph after, and a frame whose locals are `values` (held here,
// borrowed by the frame, as a real frame's locals are by the tracer).
struct FakeFrame {
  py::object code;
  py::dict globals;
  py::dict builtins;
  std::vector<py::object> held;
  std::vector<PyObject*> locals;
  TraceSite site;

  explicit FakeFrame(const std::vector<py::object>& values) : held(values) {
    py::dict ns;
    py::exec("def f(a, b, c, d): pass", ns);
    code = ns["f"].attr("__code__");
    builtins = py::module_::import("builtins").attr("__dict__");
    for (const auto& v : held) locals.push_back(v.ptr());
    site.code = reinterpret_cast<PyCodeObject*>(code.ptr());
  }
  PyCodeObject* code_object() { return reinterpret_cast<PyCodeObject*>(code.ptr()); }
  FrameState state() { return FrameState{locals.data(), globals.ptr(), builtins.ptr()}; }
};

py::object torch_ones(int n) { return py::module_::import("torch").attr("ones")(n); }

bool guards_pass(const GuardSet& guards, const SourceTable& sources, const FrameState& frame) {
  SlotValues slots;
  return guards.check(sources, frame, slots);
}

}  // namespace

TEST_CASE("entry state: loads wrap values once, make placeholders and write the guards") {
  py::object tensor = torch_ones(3);
  py::tuple pair = py::make_tuple(1, 2);
  FakeFrame frame({py::int_(3), pair, py::none(), tensor});
  GraphRecorder recorder(frame.code_object(), frame.site);
  EntryState entry(frame.state(), 0, recorder);

  ValuePtr a = entry.load(SourceTable::local(0, "a"));
  REQUIRE(a != nullptr);
  CHECK(a->is_const());
  CHECK(entry.load(SourceTable::local(0, "a")) == a);  // the same source, the same Value
  ValuePtr b = entry.load(SourceTable::local(1, "b"));
  REQUIRE(b->kind == VKind::kTuple);
  CHECK(b->items.size() == 2);
  ValuePtr d = entry.load(SourceTable::local(3, "d"));
  REQUIRE(d->is_tensor());
  CHECK(d->node->kind == NodeKind::kPlaceholder);
  CHECK(entry.slot_of_placeholder(d->node) == d->source);
  REQUIRE(entry.inputs().size() == 1);  // the tensor is the graph's one input
  CHECK(entry.inputs()[0].kind == Rebuild::Kind::kSlot);
  CHECK(entry.live_value(d->source) == tensor.ptr());

  // A local that cannot be read (unbound) is forgotten: no guard will read it.
  FakeFrame unbound({py::int_(1)});
  unbound.locals.push_back(nullptr);
  GraphRecorder other(unbound.code_object(), unbound.site);
  EntryState partial(unbound.state(), 0, other);
  CHECK(partial.load(SourceTable::local(1, "b")) == nullptr);
  CHECK(partial.sources().size() == 0);

  const SourceTable sources = entry.take_sources();
  const GuardSet guards = entry.take_guards();
  const std::string text = guards.to_string(sources);
  CHECK(text.find("L['a']") != std::string::npos);
  CHECK(text.find("L['d']") != std::string::npos);
  CHECK(guards_pass(guards, sources, frame.state()));

  // Each assumption fails on its own: another constant, another tuple length, another dtype.
  FakeFrame changed({py::int_(4), pair, py::none(), tensor});
  CHECK_FALSE(guards_pass(guards, sources, changed.state()));
  FakeFrame longer({py::int_(3), py::make_tuple(1, 2, 3), py::none(), tensor});
  CHECK_FALSE(guards_pass(guards, sources, longer.state()));
  py::object doubles = tensor.attr("double")();
  FakeFrame retyped({py::int_(3), pair, py::none(), doubles});
  CHECK_FALSE(guards_pass(guards, sources, retyped.state()));
}

TEST_CASE("entry state: explicit guards (dict keys, class attributes, globals dict)") {
  py::dict d;
  d["k"] = py::int_(1);
  FakeFrame frame({d, py::int_(0), py::int_(0), py::int_(0)});
  GraphRecorder recorder(frame.code_object(), frame.site);
  EntryState entry(frame.state(), 0, recorder);
  ValuePtr dict = entry.load(SourceTable::local(0, "a"));
  entry.guard_dict_keys(dict->source, py::make_tuple("k").ptr());
  entry.guard_dict_contains(dict->source, py::str("missing").ptr(), false);
  entry.guard_globals_dict(frame.globals.ptr());
  const SourceTable sources = entry.take_sources();
  const GuardSet guards = entry.take_guards();
  CHECK(guards_pass(guards, sources, frame.state()));
  d["missing"] = py::int_(2);
  CHECK_FALSE(guards_pass(guards, sources, frame.state()));
  d.attr("pop")("missing");
  CHECK(guards_pass(guards, sources, frame.state()));
  FakeFrame elsewhere({d, py::int_(0), py::int_(0), py::int_(0)});  // other globals dict
  CHECK_FALSE(guards_pass(guards, sources, elsewhere.state()));
}

TEST_CASE("side effects: latest write wins, another reference to a written object breaks") {
  py::dict ns;
  py::exec("class O: pass\no = O()", ns);
  ValuePtr o = Value::object(ns["o"], 0);
  ValuePtr again = Value::object(ns["o"], 1);  // the same object read through another source
  SideEffects effects;
  effects.record(o, "a", Value::constant(py::int_(1)));
  effects.record(o, "a", Value::constant(py::int_(2)));
  const ValuePtr* stored = effects.pending(o, "a");
  REQUIRE(stored != nullptr);
  CHECK((*stored)->obj.cast<int>() == 2);
  CHECK(effects.pending(o, "b") == nullptr);
  CHECK_THROWS_AS(effects.pending(again, "a"), Unsupported);
  CHECK(effects.writes().size() == 2);

  py::object module = py::module_::import("math");
  effects.record(Value::object(module), "answer", Value::constant(py::int_(42)));
  const ValuePtr* global = effects.stored_global(module.attr("__dict__").ptr(), "answer");
  REQUIRE(global != nullptr);
  CHECK((*global)->obj.cast<int>() == 42);
  CHECK(SideEffects::module_owning(module.attr("__dict__")).is(module));
  py::dict plain;
  plain["__name__"] = "no_such_module_here";
  CHECK(SideEffects::module_owning(plain).is_none());
}

TEST_CASE("exit builder: constants, containers memoised once, tensors as outputs") {
  FakeFrame frame({torch_ones(2), py::int_(0), py::int_(0), py::int_(0)});
  GraphRecorder recorder(frame.code_object(), frame.site);
  EntryState entry(frame.state(), 0, recorder);
  ValuePtr x = entry.load(SourceTable::local(0, "a"));
  ExitBuilder exits;
  CHECK(exits.rebuild_of(Value::constant(py::int_(5))).kind == Rebuild::Kind::kConst);
  CHECK(exits.rebuild_of(x).kind == Rebuild::Kind::kSlot);  // an input passed on: its source

  NodeSpec spec;
  spec.target = py::module_::import("torch").attr("neg");
  spec.target_text = "torch.neg";
  spec.args = {Arg::of(x->node)};
  spec.fake = x->obj;
  spec.metas = {GraphRecorder::meta_of(x->obj, x->device)};
  spec.name_hint = "neg";
  Node* neg = recorder.add(std::move(spec));
  ValuePtr y = Value::tensor(neg, x->obj, x->device);
  ValuePtr list = Value::list({y, Value::constant(py::int_(1))});
  const Rebuild first = exits.rebuild_of(list);
  const Rebuild second = exits.rebuild_of(list);
  CHECK(first.kind == Rebuild::Kind::kList);
  CHECK(first.memo == second.memo);  // one list however often it is referenced
  CHECK(exits.exit().memo_size == 1);
  CHECK(first.items[0].kind == Rebuild::Kind::kOutput);
  CHECK(exits.rebuild_of(y).index == first.items[0].index);  // one output per tensor
  CHECK(exits.take_outputs().size() == 1);
}

TEST_CASE("mode stack: restore leaves open blocks and puts the grad mode back") {
  py::object torch = py::module_::import("torch");
  REQUIRE(torch.attr("is_grad_enabled")().cast<bool>());
  py::list left;
  py::object leave = py::cpp_function([left](py::object context) mutable { left.append(context); });
  {
    ModeStack modes;
    modes.set_grad_enabled(false);
    CHECK_FALSE(ModeStack::grad_enabled());
    py::object token = py::str("ctx");
    modes.open_block(CallSite{{nullptr, 7}}, leave, token);
    REQUIRE(modes.in_block());
    CHECK(modes.innermost_site().back().second == 7);
    modes.restore();
    CHECK_FALSE(modes.in_block());
  }
  CHECK(ModeStack::grad_enabled());
  REQUIRE(py::len(left) == 1);
  CHECK(left[0].cast<std::string>() == "ctx");
}

TEST_CASE("size tracker: a size read into Python pins only its input dimension") {
  py::object x = py::module_::import("torch").attr("ones")(2, 5);
  FakeFrame frame({x, py::int_(0), py::int_(0), py::int_(0)});
  GraphRecorder recorder(frame.code_object(), frame.site);
  EntryState entry(frame.state(), 0, recorder);
  SizeTracker sizes(entry, recorder);
  sizes.set_symbolic(true);
  ValuePtr t = entry.load(SourceTable::local(0, "a"));
  ValuePtr size = sizes.tensor_size(t, 1, "x.size(1)");
  CHECK(size->kind == VKind::kSymNum);
  CHECK(sizes.pinned_dims().empty());
  ValuePtr pinned = sizes.specialize(size);
  CHECK(pinned->is_const());
  CHECK(pinned->obj.cast<int>() == 5);
  REQUIRE(sizes.pinned_dims().count(t->source) == 1);
  CHECK(sizes.pinned_dims().at(t->source) == std::set<int>{1});
  CHECK_FALSE(sizes.sizes_read());

  SizeTracker fixed(entry, recorder);  // constant sizes: every size of the region is guarded
  CHECK(fixed.tensor_size(t, 0, "x.size(0)")->is_const());
  CHECK(fixed.sizes_read());
}
