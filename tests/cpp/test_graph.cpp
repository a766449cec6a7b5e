// Graph IR: construction, use-def links, the verifier, dead getitem removal and the printer.
#include <pybind11/embed.h>

#include <catch2/catch.hpp>

#include "common/check.h"
#include "graph/graph.h"
#include "graph/graph_runner.h"
#include "graph/printer.h"

namespace py = pybind11;
using namespace framejit;

namespace {

TensorMeta meta(std::vector<int64_t> sizes, std::string dtype = "f32") {
  return TensorMeta{std::move(dtype), std::move(sizes), "cpu"};
}

py::object op(const char* name) { return py::module_::import("operator").attr(name); }

}  // namespace

TEST_CASE("printer writes readable Python with the user's lines") {
  Graph g("/src/model.py", "my_function", 10);
  Node* x = g.add_placeholder("inputs_x", py::none(), meta({2, 3}));
  Node* y = g.add_placeholder("inputs_y", py::none(), meta({2, 3}));
  Node* add = g.add_call(NodeKind::kCallFunction, op("add"), "operator.add", "+",
                         {Arg::of(x), Arg::constant(py::float_(0.5))}, {}, py::none(),
                         {meta({2, 3})}, false, 12, "add");
  Node* mean = g.add_call(NodeKind::kCallMethod, py::str("mean"), "mean", "", {Arg::of(add)},
                          {{"dim", Arg::constant(py::int_(1))}}, py::none(), {meta({2})}, false,
                          13, "mean");
  Node* mul = g.add_call(NodeKind::kCallFunction, op("mul"), "operator.mul", "*",
                         {Arg::of(add), Arg::of(y)}, {}, py::none(), {meta({2, 3})}, false, 13,
                         "mul");
  g.set_output({Arg::of(mul), Arg::of(mean)});
  g.lint();
  auto lines = [](int line) { return "code at line " + std::to_string(line); };
  const std::string expected =
      "def forward(self, inputs_x: \"f32[2, 3]\", inputs_y: \"f32[2, 3]\"):\n"
      "    # File: /src/model.py:12 in my_function, code: code at line 12\n"
      "    add: \"f32[2, 3]\" = inputs_x + 0.5\n"
      "    # File: /src/model.py:13 in my_function, code: code at line 13\n"
      "    mean: \"f32[2]\" = add.mean(dim = 1)\n"
      "    mul: \"f32[2, 3]\" = add * inputs_y\n"
      "    return (mul, mean)\n";
  CHECK(print_graph(g, lines) == expected);
  CHECK(g.num_calls() == 3);
  CHECK(add->users.size() == 2);
}

TEST_CASE("names are unique and sanitised") {
  Graph g("f.py", "f", 1);
  Node* a = g.add_placeholder("L['x']", py::none(), meta({1}));
  Node* b = g.add_placeholder("x", py::none(), meta({1}));
  Node* c = g.add_placeholder("1x", py::none(), meta({1}));
  CHECK(a->name == "L_x_");
  CHECK(b->name == "x");
  CHECK(c->name == "_1x");
  Node* d = g.add_call(NodeKind::kCallFunction, op("neg"), "operator.neg", "-", {Arg::of(b)}, {},
                       py::none(), {meta({1})}, false, 1, "x");
  CHECK(d->name == "x_1");
}

TEST_CASE("unused getitem nodes are removed, used ones kept") {
  Graph g("f.py", "f", 1);
  Node* x = g.add_placeholder("x", py::none(), meta({4}));
  Node* chunk = g.add_call(NodeKind::kCallMethod, py::str("chunk"), "chunk", "",
                           {Arg::of(x), Arg::constant(py::int_(2))}, {}, py::none(),
                           {meta({2}), meta({2})}, true, 2, "chunk");
  Node* first = g.add_call(NodeKind::kCallFunction, op("getitem"), "operator.getitem", "[]",
                           {Arg::of(chunk), Arg::constant(py::int_(0))}, {}, py::none(),
                           {meta({2})}, false, 2, "getitem");
  g.add_call(NodeKind::kCallFunction, op("getitem"), "operator.getitem", "[]",
             {Arg::of(chunk), Arg::constant(py::int_(1))}, {}, py::none(), {meta({2})}, false, 2,
             "getitem");
  g.set_output({Arg::of(first)});
  g.remove_unused();
  g.lint();
  CHECK(g.nodes().size() == 4);  // x, chunk, getitem, output
  CHECK(chunk->users.size() == 1);
  CHECK(print_graph(g, nullptr).find("getitem: \"f32[2]\" = chunk[0]") != std::string::npos);
  CHECK(chunk->meta_text() == "(f32[2], f32[2])");
}

TEST_CASE("unused pure nodes are removed with the chains they end, impure ones kept") {
  Graph g("f.py", "f", 1);
  Node* x = g.add_placeholder("x", py::none(), meta({4}));
  Node* div = g.add_call(NodeKind::kCallFunction, op("floordiv"), "operator.floordiv", "//",
                         {Arg::constant(py::int_(8)), Arg::constant(py::int_(2))}, {}, py::none(),
                         {meta({})}, false, 2, "div");
  div->pure = true;
  Node* twice = g.add_call(NodeKind::kCallFunction, op("mul"), "operator.mul", "*",
                           {Arg::of(div), Arg::constant(py::int_(2))}, {}, py::none(), {meta({})},
                           false, 2, "twice");
  twice->pure = true;  // its only user: both go
  Node* write = g.add_call(NodeKind::kCallMethod, py::str("add_"), "add_", "",
                           {Arg::of(x), Arg::constant(py::int_(1))}, {}, py::none(), {meta({4})},
                           false, 3, "add_");  // unused but not pure: kept
  g.set_output({Arg::of(x)});
  g.remove_unused();
  g.lint();
  CHECK(g.nodes().size() == 3);  // x, add_, output
  CHECK(x->users.size() == 2);
  CHECK(write->users.empty());
}

TEST_CASE("a scope's calls are outlined into their own graph, called by one node") {
  Graph g("/src/model.py", "f", 1);
  Node* x = g.add_placeholder("x", py::none(), meta({4}));
  Node* w = g.add_placeholder("w", py::none(), meta({4}));
  Node* before = g.add_call(NodeKind::kCallFunction, op("neg"), "operator.neg", "-", {Arg::of(x)}, {},
                            py::none(), {meta({4})}, false, 2, "before");
  const int scope = g.open_scope();
  Node* mul = g.add_call(NodeKind::kCallFunction, op("mul"), "operator.mul", "*",
                         {Arg::of(before), Arg::of(w)}, {}, py::none(), {meta({4})}, false, 3, "mul");
  Node* inner = g.add_call(NodeKind::kCallFunction, op("add"), "operator.add", "+",
                           {Arg::of(mul), Arg::of(mul)}, {}, py::none(), {meta({4})}, false, 3, "inner");
  Node* kept = g.add_call(NodeKind::kCallFunction, op("sub"), "operator.sub", "-",
                          {Arg::of(inner), Arg::of(w)}, {}, py::none(), {meta({4})}, false, 3, "kept");
  g.close_scope();
  CHECK(g.scope_writes_outside(scope).empty());
  Node* after = g.add_call(NodeKind::kCallFunction, op("add"), "operator.add", "+",
                           {Arg::of(kept), Arg::of(mul)}, {}, py::none(), {meta({4})}, false, 4, "after");
  g.set_output({Arg::of(after)});
  std::string body_text;
  Node where;
  where.line = 3;
  g.outline_scope(scope, [&](std::unique_ptr<Graph> body) {
    body_text = print_graph(*body, nullptr);
    return op("add");  // (any callable: the runner is not run here)
  }, "self.body", where);
  g.lint();
  // The body: its inputs from outside in the order first read, its values read after it out.
  CHECK(body_text ==
        "def forward(self, before: \"f32[4]\", w: \"f32[4]\"):\n"
        "    # File: /src/model.py:3 in f, code: \n"
        "    mul: \"f32[4]\" = before * w\n"
        "    inner: \"f32[4]\" = mul + mul\n"
        "    kept: \"f32[4]\" = inner - w\n"
        "    return (mul, kept)\n");
  CHECK(print_graph(g, nullptr) ==
        "def forward(self, x: \"f32[4]\", w: \"f32[4]\"):\n"
        "    # File: /src/model.py:2 in f, code: \n"
        "    before: \"f32[4]\" = -x\n"
        "    # File: /src/model.py:3 in f, code: \n"
        "    checkpoint: \"(f32[4], f32[4])\" = self.body(before, w)\n"
        "    mul: \"f32[4]\" = checkpoint[0]\n"
        "    kept: \"f32[4]\" = checkpoint[1]\n"
        "    # File: /src/model.py:4 in f, code: \n"
        "    after: \"f32[4]\" = kept + mul\n"
        "    return (after,)\n");
  CHECK(w->users.size() == 1);  // the call only
  CHECK(g.num_calls() == 5);    // before, the call, two getitems, after
}

TEST_CASE("a scope writing into a value from outside it is reported") {
  Graph g("f.py", "f", 1);
  Node* x = g.add_placeholder("x", py::none(), meta({4}));
  const int scope = g.open_scope();
  g.add_call(NodeKind::kCallMethod, py::str("add_"), "add_", "", {Arg::of(x), Arg::constant(py::int_(1))},
             {}, py::none(), {meta({4})}, false, 2, "add_");
  g.close_scope();
  CHECK(g.scope_writes_outside(scope) == std::vector<std::string>{"add_"});
}

TEST_CASE("the verifier rejects a graph without an output") {
  Graph g("f.py", "f", 1);
  g.add_placeholder("x", py::none(), meta({1}));
  CHECK_THROWS_AS(g.lint(), InternalError);
}

TEST_CASE("the runner executes calls, methods, containers and keywords, and frees its values") {
  static PyObject* runner_type = make_graph_runner_type();  // once per process
  REQUIRE(runner_type != nullptr);
  auto g = std::make_unique<Graph>("f.py", "f", 1);
  Node* x = g->add_placeholder("x", py::none(), meta({}));
  Node* y = g->add_placeholder("y", py::none(), meta({}));
  g->add_placeholder("unused", py::none(), meta({}));
  Node* add = g->add_call(NodeKind::kCallFunction, op("add"), "operator.add", "+",
                          {Arg::of(x), Arg::of(y)}, {}, py::none(), {}, false, 2, "add");
  Node* mul = g->add_call(NodeKind::kCallFunction, op("mul"), "operator.mul", "*",
                          {Arg::of(add), Arg::constant(py::int_(3))}, {}, py::none(), {}, false,
                          3, "mul");
  Node* bits = g->add_call(NodeKind::kCallMethod, py::str("bit_length"), "bit_length", "",
                           {Arg::of(mul)}, {}, py::none(), {}, false, 4, "bits");
  py::object sorted_fn = py::module_::import("builtins").attr("sorted");
  Node* order = g->add_call(NodeKind::kCallFunction, sorted_fn, "sorted", "",
                            {Arg::list({Arg::of(mul), Arg::of(add), Arg::of(x)})},
                            {{"reverse", Arg::constant(py::bool_(true))}}, py::none(), {}, false,
                            5, "order");
  g->set_output({Arg::of(bits), Arg::of(order),
                 Arg::dict({"sum"}, {Arg::of(add)})});
  g->lint();
  py::object runner = py::reinterpret_steal<py::object>(new_graph_runner(std::move(g)));
  REQUIRE(runner);
  CHECK(runner.attr("num_steps").cast<int>() == 4);

  py::object big = py::int_(1) << py::int_(100);  // not cached by CPython: refcounts are ours
  const Py_ssize_t before = Py_REFCNT(big.ptr());
  py::tuple result = runner(py::none(), big, py::int_(1), py::none()).cast<py::tuple>();
  py::object sum = big + py::int_(1);
  CHECK(result[0].cast<int>() == (sum * py::int_(3)).attr("bit_length")().cast<int>());
  CHECK(result[1].cast<py::list>().size() == 3);
  py::object first = result[1].cast<py::list>()[0];
  py::object summed = result[2].cast<py::dict>()["sum"];
  CHECK(first.equal(sum * py::int_(3)));
  CHECK(summed.equal(sum));
  result = py::tuple();
  first = py::none();
  CHECK(Py_REFCNT(big.ptr()) == before);  // the runner kept nothing (x was in the sorted list)

  CHECK_THROWS_AS(runner(py::none(), big), py::error_already_set);  // wrong arity
}
