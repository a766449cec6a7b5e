// The native backend's interpreter on hand-built programs: results equal the same aten calls made
// directly, multiple returns and lists, in-place ops and views, autograd and grad mode, printing.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <catch2/catch.hpp>

#include "backends/program.h"

using framejit::native::Operand;
using framejit::native::Program;

namespace {

Operand reg(int r) { return Operand::reg_of(r); }
Operand constant(c10::IValue v) { return Operand::constant_of(std::move(v)); }

// (x + y * 2) * x, with add's alpha left to its default.
Program add_mul_program() {
  Program p(2);
  int add = p.new_register();
  int mul = p.new_register();
  p.add_call(Program::find_op("aten::add", "Tensor"), {reg(0), reg(1), constant(2)}, {add});
  p.add_call(Program::find_op("aten::mul", "Tensor"), {reg(add), reg(0)}, {mul});
  p.set_outputs({reg(mul)});
  p.finish();
  return p;
}

}  // namespace

TEST_CASE("a straight-line program equals the same aten calls") {
  Program p = add_mul_program();
  at::Tensor x = at::randn({3, 4});
  at::Tensor y = at::randn({3, 4});
  auto out = p.run({x, y});
  REQUIRE(out.size() == 1);
  REQUIRE(at::allclose(out[0].toTensor(), (x + y * 2) * x));
  // The program holds no reference to its inputs after the call.
  REQUIRE(x.use_count() == 1);
  REQUIRE(y.use_count() == 1);
}

TEST_CASE("the printed program shows one aten op per line with defaults filled in") {
  Program p = add_mul_program();
  REQUIRE(p.to_string("f") ==
          "def f(%0, %1):\n"
          "    %2 = aten::add.Tensor(%0, %1, alpha=2)\n"
          "    %3 = aten::mul.Tensor(%2, %0)\n"
          "    return (%3,)\n");
}

TEST_CASE("multiple returns, dropped results, list results unpacked and list arguments") {
  Program p(3);  // x, weight, bias
  int normed = p.new_register();
  int first = p.new_register();
  int second = p.new_register();
  int joined = p.new_register();
  c10::List<int64_t> shape({4});
  p.add_call(Program::find_op("aten::native_layer_norm", ""),
             {reg(0), constant(shape), reg(1), reg(2), constant(1e-5)}, {normed, -1, -1});
  p.add_call(Program::find_op("aten::split", "Tensor"), {reg(normed), constant(2), constant(1)},
             {-1}, {first, second});
  c10::TypePtr tensor_list = c10::ListType::ofTensors();
  p.add_call(Program::find_op("aten::cat", ""),
             {Operand::list_of(tensor_list, {reg(second), reg(first)}), constant(1)}, {joined});
  p.set_outputs({reg(joined), reg(first)});
  p.finish();

  at::Tensor x = at::randn({2, 4});
  at::Tensor w = at::randn({4});
  at::Tensor b = at::randn({4});
  auto out = p.run({x, w, b});
  at::Tensor expected_norm = at::layer_norm(x, {4}, w, b, 1e-5);
  auto halves = expected_norm.split(2, 1);
  REQUIRE(at::allclose(out[0].toTensor(), at::cat({halves[1], halves[0]}, 1), 1e-5, 1e-6));
  REQUIRE(at::allclose(out[1].toTensor(), halves[0], 1e-5, 1e-6));
  REQUIRE(p.to_string().find("[%4, %5] = aten::split.Tensor(%3, 2, 1)") != std::string::npos);
  REQUIRE(p.to_string().find("%3, _, _ = aten::native_layer_norm(%0, [4], %1, %2, 1e-05)") !=
          std::string::npos);
}

TEST_CASE("in-place ops mutate the caller's tensor and views alias it") {
  Program p(1);
  int view = p.new_register();
  p.add_call(Program::find_op("aten::add_", "Scalar"), {reg(0), constant(1)}, {-1});
  p.add_call(Program::find_op("aten::view", ""), {reg(0), constant(c10::List<int64_t>({4}))},
             {view});
  p.set_outputs({reg(view)});
  p.finish();
  at::Tensor x = at::zeros({2, 2});
  auto out = p.run({x});
  REQUIRE(at::equal(x, at::ones({2, 2})));
  at::Tensor v = out[0].toTensor();
  v.mul_(3);
  REQUIRE(at::equal(x, at::full({2, 2}, 3.0)));  // the view shares x's storage
}

TEST_CASE("ops go through autograd: gradients equal eager, no_grad is respected") {
  Program p = add_mul_program();
  at::Tensor x = at::randn({5}).requires_grad_();
  at::Tensor y = at::randn({5}).requires_grad_();
  auto out = p.run({x, y});
  at::Tensor z = out[0].toTensor();
  REQUIRE(z.requires_grad());
  z.sum().backward();
  // d/dx (x + 2y) x = 2x + 2y; d/dy = 2x
  REQUIRE(at::allclose(x.grad(), 2 * x.detach() + 2 * y.detach()));
  REQUIRE(at::allclose(y.grad(), 2 * x.detach()));
  {
    at::NoGradGuard no_grad;
    REQUIRE_FALSE(p.run({x, y})[0].toTensor().requires_grad());
  }
}

TEST_CASE("bad programs are rejected when built, not when run") {
  REQUIRE_THROWS(Program::find_op("aten::no_such_op", ""));
  Program p(1);
  int out = p.new_register();
  // aten::mul.Tensor has no default for `other`.
  REQUIRE_THROWS(p.add_call(Program::find_op("aten::mul", "Tensor"), {reg(0)}, {out}));
  // Two targets for an op with one return.
  REQUIRE_THROWS(p.add_call(Program::find_op("aten::neg", ""), {reg(0)}, {out, out}));
  Program unfinished = Program(1);
  REQUIRE_THROWS(unfinished.run({at::ones({1})}));
}
