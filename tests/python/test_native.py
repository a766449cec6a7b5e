"""backend="native": graphs lowered to aten ops and run from C++. Every model of the zoo and every
straight-line foundation case equals eager (forward, gradients, buffers, mutated inputs), and
each graph really ran as a native program (no silent fallback)."""
import copy
import logging
import operator
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit import _C
from framejit.testing import CompileCounter, same

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.zoo import ZOO  # noqa: E402
from models.zoo import run_seeded as run  # noqa: E402
import test_straight_line as straight  # noqa: E402


def lowered(counter):
    """(programs lowered, keys that ran the fallback) over every graph the counter saw."""
    programs = sum(fn.variants[0] for fn in counter.compiled)
    fallbacks = sum(fn.variants[1] for fn in counter.compiled)
    return programs, fallbacks


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_forward_gradients_and_buffers_equal_eager(name, training):
    torch.manual_seed(1)
    eager = ZOO[name]().train(training)
    model = copy.deepcopy(eager)
    counter = CompileCounter("native")
    compiled = framejit.compile(model, backend=counter)
    for step in range(2):
        args = ZOO[name].example(batch=3)
        out = run(compiled, args, seed=step)
        ref = run(eager, args, seed=step)
        assert same(out, ref, rtol=1e-4, atol=1e-5)
        leaves = torch.utils._pytree.tree_leaves
        sum(t.float().sum() for t in leaves(out)).backward()
        sum(t.float().sum() for t in leaves(ref)).backward()
        for (pname, p), q in zip(model.named_parameters(), eager.parameters()):
            assert same(p.grad, q.grad, rtol=1e-4, atol=1e-5), pname
        for (bname, b), c in zip(model.named_buffers(), eager.buffers()):
            assert same(b, c, rtol=1e-5, atol=1e-6), bname
    assert counter.frame_count == 1
    assert lowered(counter) == (1, 0)


@pytest.mark.parametrize("case", straight.CASES, ids=repr)
def test_foundation_cases_run_natively(case):
    counter = CompileCounter("native")
    compiled = framejit.compile(straight._fresh(case.fn), backend=counter)
    for seed, dtype in ((0, case.dtypes[0]), (1, case.dtypes[0]), (2, case.dtypes[1])):
        straight._check_same(case, compiled, straight._inputs(case, dtype, seed), f"seed {seed}")
    assert counter.frame_count == 2 * case.graphs
    programs, fallbacks = lowered(counter)
    assert fallbacks == 0 and programs == counter.frame_count


def test_gradients_through_inputs_and_no_grad():
    def f(x, w):
        return torch.tanh(x @ w).sum(dim=1) * 2

    compiled = framejit.compile(f, backend="native")
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    compiled(x, w).sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    f(x, w).sum().backward()
    assert same(gx, x.grad) and same(gw, w.grad)
    with torch.no_grad():
        assert compiled(x, w).grad_fn is None
    with torch.inference_mode():
        assert same(compiled(x, w), f(x, w))


def test_inplace_on_input_views_and_aliasing_behave_as_eager():
    def f(x):
        x.add_(1)
        v = x.view(-1)
        return v, x.t()

    compiled = framejit.compile(f, backend="native")
    a = torch.zeros(2, 3)
    v, t = compiled(a)
    assert torch.equal(a, torch.ones(2, 3))
    v.mul_(5)  # the returned view shares a's storage, as in eager
    assert torch.equal(a, torch.full((2, 3), 5.0))
    assert t._base is a or t.data_ptr() == a.data_ptr()


def test_one_tensor_passed_twice_is_one_input_guarded_the_same():
    # make_fx memoises fakes by identity; a program lowered from f(a, a) once read one input twice,
    # and the next call with the same metadata, f(b, a), computed f(b, b). Now the trace takes
    # f(a, a)'s two arguments as one input, guarded to be one object: f(b, a) compiles again with
    # two (as torch.compile does).
    def f(x, y):
        return x * 1 + y * 2

    counter = CompileCounter("native")
    compiled = framejit.compile(f, backend=counter)
    a, b = torch.ones(2), torch.full((2,), 2.0)
    for args in ((a, a), (b, a), (a, b), (b, b)):
        assert same(compiled(*args), f(*args))
    assert counter.frame_count == 2 and lowered(counter) == (2, 0)
    assert [sum(n.op == "placeholder" for n in g.graph.nodes) for g in counter.graphs] == [1, 2]

    def g(x, y):  # in place through one alias: the other sees it, as in eager
        x.add_(1)
        return y * 2

    compiled = framejit.compile(g, backend="native")
    a, ref = torch.zeros(3), torch.zeros(3)
    assert same(compiled(a, a), g(ref, ref)) and same(a, ref)

def test_output_code_prints_one_aten_op_per_line(caplog):
    framejit.set_logs("output_code", handler=False)
    compiled = framejit.compile(lambda x, w: F.gelu(F.linear(x, w)), backend="native")
    with caplog.at_level(logging.INFO, logger="framejit.output_code"):
        compiled(torch.randn(2, 4), torch.randn(3, 4))
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "framejit.output_code")
    assert "NATIVE PROGRAM" in text
    assert "# %0: float32[2, 4] cpu" in text
    assert "= aten::t(%1)" in text and "= aten::mm(%0, %" in text and "aten::gelu(" in text


def test_output_code_prints_constants_as_python_would(caplog):
    def f(x):
        y = F.layer_norm(x[:, 1:3], (2,), eps=1e-5) * 2 + 0.1
        return y.to(torch.float16, memory_format=torch.contiguous_format).expand(4, 3, 2)

    framejit.set_logs("output_code", handler=False)
    compiled = framejit.compile(f, backend="native")
    x = torch.randn(3, 4)
    with caplog.at_level(logging.INFO, logger="framejit.output_code"):
        assert same(compiled(x), f(x))
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "framejit.output_code")
    # Sizes, wrapped numbers, floats, dtypes and memory formats each as one short token.
    assert "aten::slice.Tensor(%0, 1, 1, 3, 1)" in text
    assert "aten::mul.Tensor(%" in text and ", 2)" in text and ", 0.1, alpha=1)" in text
    assert ", 1e-05)" in text
    assert "dtype=Half" in text and "memory_format=Contiguous" in text
    assert "[4, 3, 2]" in text and "Type{}" not in text


def _graph_module(fn, *args):
    return torch.fx.symbolic_trace(fn), list(args)


def masked(x):
    return (x[x > 0] * 2,)  # the output's size depends on x's values


def scaled_by_item(x):
    return (x * x.sum().item(),)  # a number computed in the graph


@pytest.mark.parametrize("fn", [masked, scaled_by_item])
def test_a_graph_that_cannot_be_lowered_runs_as_is_with_one_log_line(fn, caplog):
    gm, args = _graph_module(fn, torch.randn(8))
    native_fn = framejit.backends.native(gm, args)
    with caplog.at_level(logging.WARNING, logger="framejit.native"):
        for _ in range(3):
            x = torch.randn(8)
            assert same(native_fn(x), fn(x))
    lines = [r for r in caplog.records if r.name == "framejit.native"]
    assert len(lines) == 1 and "data-dependent" in lines[0].getMessage(), lines
    assert native_fn.variants == (0, 1)


def test_programs_are_keyed_on_metadata_and_numbers():
    def scaled(x, s):
        return (x * s + x.shape[0],)

    gm = torch.fx.symbolic_trace(scaled)
    fn = framejit.backends.native(gm, [])
    for shape, s in (((2, 3), 2.0), ((2, 3), 2.0), ((4, 3), 2.0), ((2, 3), 3.0)):
        x = torch.randn(shape)
        assert same(fn(x, s), scaled(x, s))
    assert fn.variants == (3, 0)
    # Non-contiguous strides lower again instead of running a view baked for contiguous input.
    x = torch.randn(3, 2).t()
    assert same(fn(x, 2.0), scaled(x, 2.0))
    assert fn.variants == (4, 0)


def test_a_number_baked_into_a_program_is_matched_by_its_bits():
    # Fuzz seed 241035: a program lowered for s = 0.0 ran again for s = -0.0 (0.0 == -0.0), so
    # `x + s` turned eager's -0. entries into 0.; NaN (NaN != NaN) lowered again on every call.
    def shifted(x, s):
        return (x + s,)

    fn = framejit.backends.native(torch.fx.symbolic_trace(shifted), [])
    x = torch.tensor([-0.0, 0.0])
    for s in (0.0, -0.0, 0.0, -0.0):
        out, = fn(x, s)
        assert torch.equal(out.signbit(), shifted(x, s)[0].signbit()), s
    assert fn.variants == (2, 0)
    for _ in range(3):
        assert fn(x, float("nan"))[0].isnan().all()
    assert fn.variants == (3, 0)


def test_autocast_runs_the_graph_as_is():
    def f(x, w):
        return (x @ w,)

    gm = torch.fx.symbolic_trace(f)
    fn = framejit.backends.native(gm, [])
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(x, w)
        ref = f(x, w)
    assert out[0].dtype == torch.bfloat16 and same(out, ref)


def test_repeated_calls_keep_no_references():
    compiled = framejit.compile(lambda x: torch.relu(x) * 2 + 1, backend="native")
    x = torch.randn(16)
    compiled(x)
    before = sys.getrefcount(x)
    for _ in range(1000):
        compiled(x)
    assert sys.getrefcount(x) == before


def test_program_builder_rejects_unknown_ops():
    program = _C.NativeProgram(1)
    with pytest.raises(RuntimeError, match="no_such_op"):
        program.add_call("aten::no_such_op", "", [("r", 0)], [program.new_register()])


def test_python_calls_are_instructions_of_the_program(caplog):
    from framejit._native import PythonCall, _build_program

    def fused(a, b):
        return torch.addcmul(a, a, b), a - b

    call = PythonCall("fused_kernel_0", fused, num_outputs=2)
    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    pair = graph.call_function(call, (x, y))
    first = graph.call_function(operator.getitem, (pair, 0))
    second = graph.call_function(operator.getitem, (pair, 1))
    total = graph.call_function(torch.ops.aten.mul.Tensor, (first, second))
    graph.output((total, first))
    program = _build_program(torch.fx.GraphModule(torch.nn.Module(), graph))
    assert "%2, %3 = fused_kernel_0(%0, %1)" in program.text()
    fn = _C.make_native_function(lambda args: program, None)
    a, b = torch.randn(4), torch.randn(4)
    out = fn(a, b)
    ref = fused(a, b)
    assert same(out, (ref[0] * ref[1], ref[0]))
