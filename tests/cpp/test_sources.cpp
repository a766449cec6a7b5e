// Sources (reading entry-state values again on every call) and Rebuild (the exit state).
#include <pybind11/embed.h>

#include <catch2/catch.hpp>

#include "guards/source.h"
#include "region/rebuild.h"

namespace py = pybind11;
using namespace framejit;

TEST_CASE("sources read locals, globals, items and attributes, and intern by text") {
  py::dict globals;
  globals["W"] = py::int_(7);
  py::dict builtins = py::module_::import("builtins").attr("__dict__");
  py::dict inputs;
  inputs["x"] = py::float_(1.5);
  PyObject* locals[1] = {inputs.ptr()};
  FrameState frame{locals, globals.ptr(), builtins.ptr()};

  SourceTable table;
  const int local = table.intern(SourceTable::local(0, "inputs"));
  const int item = table.intern(table.item(local, py::str("x")));
  const int global = table.intern(SourceTable::global("W"));
  const int builtin = table.intern(SourceTable::global("len"));
  const int attr = table.intern(table.attr(item, "real"));
  CHECK(table.intern(SourceTable::local(0, "inputs")) == local);
  CHECK(table.at(item).text == "L['inputs']['x']");
  CHECK(table.at(item).name_hint == "inputs_x");
  CHECK(table.at(attr).text == "L['inputs']['x'].real");

  SlotValues slots;
  slots.reset(static_cast<size_t>(table.size()));
  for (int slot = 0; slot < table.size(); ++slot) {
    slots.set(slot, table.read(slot, frame, slots.data()));
  }
  CHECK(slots[local] == inputs.ptr());
  CHECK(py::handle(slots[item]).cast<double>() == 1.5);
  CHECK(py::handle(slots[global]).cast<int>() == 7);
  CHECK(slots[builtin] == builtins["len"].ptr());
  CHECK(py::handle(slots[attr]).cast<double>() == 1.5);

  // A missing key reads as NULL without leaving an exception behind.
  const int missing = table.intern(table.item(local, py::str("nope")));
  CHECK(table.read(missing, frame, slots.data()) == nullptr);
  CHECK(PyErr_Occurred() == nullptr);
}

TEST_CASE("rebuild builds containers, calls and memoised objects") {
  SlotValues slots;
  slots.reset(1);
  py::int_ three(3);
  slots.set(0, three.inc_ref().ptr());
  py::tuple outputs = py::make_tuple(py::str("out0"));

  Rebuild list;
  list.kind = Rebuild::Kind::kList;
  list.items = {Rebuild::slot(0), Rebuild::constant(py::str("c"))};
  list.memo = 0;
  Rebuild out;
  out.kind = Rebuild::Kind::kOutput;
  out.index = 0;
  Rebuild tuple;
  tuple.kind = Rebuild::Kind::kTuple;
  tuple.value = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyTuple_Type));
  tuple.items = {list, list, out,
                 Rebuild::call(py::module_::import("operator").attr("add"),
                               {Rebuild::slot(0), Rebuild::constant(py::int_(4))})};

  MemoTable memo(1);
  py::object built = py::reinterpret_steal<py::object>(tuple.build(outputs.ptr(), slots, memo));
  REQUIRE(built);
  CHECK(py::repr(built).cast<std::string>() == "([3, 'c'], [3, 'c'], 'out0', 7)");
  // The same list object twice: a list held by two locals stays one list.
  CHECK(py::tuple(built)[0].ptr() == py::tuple(built)[1].ptr());
  CHECK(tuple.to_string() == "([slot[0], 'c'], [slot[0], 'c'], out[0], <built-in function add>(slot[0], 4))");
}
