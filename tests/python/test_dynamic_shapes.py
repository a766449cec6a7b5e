"""Dynamic shapes for backends that compile per size (inductor, aot_eager, a user's callable):
automatic dynamic, dynamic=True/False, mark_dynamic / maybe_mark_dynamic / mark_static, and
the backend contract torch.compile has with symbolic sizes (fake example inputs of one
ShapeEnv, symbolic meta on every node, a TracingContext). Every result is compared with eager,
and compile counts with torch.compile's in the same process where the two should agree."""
import logging
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import framejit
from framejit.testing import same

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.zoo import ZOO, backward_and_compare_gradients  # noqa: E402
from models.zoo import run_seeded as run  # noqa: E402

BATCHES = (2, 5, 7, 11, 16)


class Recording:
    """A backend that compiles per size (no framejit_shape_generic mark): keeps what it got."""

    def __init__(self, inner=None):
        self.inner = inner
        self.calls = []  # (example_inputs, graph module)
        self.contexts = []

    def __call__(self, gm, example_inputs):
        from torch._guards import TracingContext
        self.calls.append((list(example_inputs), gm))
        self.contexts.append(TracingContext.try_get())
        return gm.forward if self.inner is None else self.inner(gm, example_inputs)

    @property
    def count(self):
        return len(self.calls)


def torch_compile_count(fn, inputs_list):
    """How many graphs torch.compile compiles for these calls (a fresh Dynamo cache)."""
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    compiled = torch.compile(fn, backend=backend)
    for inputs in inputs_list:
        compiled(*inputs)
    torch._dynamo.reset()
    return len(seen)


def mlp_step(x, w):
    h = torch.relu(x @ w) * 2
    return h.view(x.size(0), -1).sum(1) + 1


def test_new_batch_sizes_compile_twice_as_under_torch_compile():
    backend = Recording()
    compiled = framejit.compile(mlp_step, backend=backend)
    w = torch.randn(8, 3)
    calls = [(torch.randn(b, 8), w) for b in BATCHES]
    for args in calls:
        assert same(compiled(*args), mlp_step(*args))
    assert backend.count == 2 == torch_compile_count(mlp_step, calls)
    static, symbolic = backend.calls[0][0][0], backend.calls[1][0][0]
    assert type(static) is torch.Tensor and static.shape == (2, 8)  # the first call: static
    assert isinstance(symbolic.shape[0], torch.SymInt) and symbolic.shape[1] == 8


def doubled(x):
    return x * 2 + 1


def test_a_function_called_with_tensors_of_several_ranks_keeps_each_ranks_sizes():
    # einops' rearrange gets tensors of any rank at one place: the sizes remembered for one
    # rank (dim 1 changed) were applied to a tensor of another (IndexError, an internal error
    # and plain Python for the rest of the frame).
    backend = Recording()
    compiled = framejit.compile(doubled, backend=backend)
    calls = [torch.randn(2, 3), torch.randn(2, 4), torch.randn(5), torch.randn(6), torch.randn(2, 9)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no framejit warning
        for x in calls:
            assert same(compiled(x), doubled(x))
    # rank 2: static, then dim 1 symbolic (which takes (2, 9) as well); rank 1: the same two.
    # (torch.compile: 3, its first rank-1 graph symbolic already.)
    assert backend.count == 4
    assert torch_compile_count(doubled, [(x,) for x in calls]) == 3


def test_the_backend_gets_fake_inputs_of_one_shape_env_and_symbolic_meta():
    from torch._subclasses.fake_tensor import FakeTensor

    backend = Recording()
    compiled = framejit.compile(mlp_step, backend=backend, dynamic=True)
    w = torch.randn(8, 3)
    x = torch.randn(4, 8)
    assert same(compiled(x, w), mlp_step(x, w))
    example_inputs, gm = backend.calls[0]
    assert all(isinstance(x, FakeTensor) for x in example_inputs)
    modes = {x.fake_mode for x in example_inputs}
    assert len(modes) == 1 and modes.pop().shape_env is not None
    assert backend.contexts[0] is not None and backend.contexts[0].fake_mode is example_inputs[0].fake_mode
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "call_function", "call_method"):
            assert "val" in node.meta and "example_value" in node.meta, node
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0][0]
    assert isinstance(out.meta["val"].shape[0], torch.SymInt)
    # dynamic=True: w, the frame's own argument too, is symbolic from the first call
    assert all(isinstance(d, torch.SymInt) for d in example_inputs[1].shape)
    for b in BATCHES:
        x = torch.randn(b, 8)
        assert same(compiled(x, w), mlp_step(x, w))
    assert backend.count == 1


def test_batch_one_after_four_specialises_as_torch_compile_does():
    backend = Recording()
    compiled = framejit.compile(mlp_step, backend=backend)
    w = torch.randn(8, 3)
    calls = [(torch.randn(b, 8), w) for b in (4, 1, 4, 7, 1, 9)]
    for args in calls:
        assert same(compiled(*args), mlp_step(*args))
    # 4 static, 1 static (0/1 are specialised), 7 symbolic (covers 9)
    assert backend.count == 3 == torch_compile_count(mlp_step, calls)


def test_dynamic_false_compiles_per_size_and_true_once():
    for dynamic, expected in ((False, len(BATCHES)), (True, 1)):
        backend = Recording()
        compiled = framejit.compile(mlp_step, backend=backend, dynamic=dynamic)
        w = torch.randn(8, 3)
        for b in BATCHES:
            x = torch.randn(b, 8)
            assert same(compiled(x, w), mlp_step(x, w))
        assert backend.count == expected, dynamic


def add_rows(x, y):
    return (x * 2 + y).sum(1)


def test_mark_dynamic_compiles_once_from_the_first_call_within_its_range(caplog):
    backend = Recording()
    compiled = framejit.compile(add_rows, backend=backend)
    framejit.set_logs("guards", "recompiles", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    try:
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        framejit.mark_dynamic(x, 0, min=2, max=10)
        framejit.mark_dynamic(y, 0)
        assert same(compiled(x, y), add_rows(x, y))
        assert backend.count == 1 and isinstance(backend.calls[0][0][0].shape[0], torch.SymInt)
        for b in (5, 9, 10):
            x, y = torch.randn(b, 3), torch.randn(b, 3)
            assert same(compiled(x, y), add_rows(x, y))
        assert backend.count == 1
        x, y = torch.randn(12, 3), torch.randn(12, 3)  # past max: compiles again
        assert same(compiled(x, y), add_rows(x, y))
        assert backend.count == 2
    finally:
        framejit.set_logs()
    err = "\n".join(r.getMessage() for r in caplog.records)
    assert "sizes symbolic: L['x'] dims [0]" in err
    assert "SHAPE_GUARD 2 <= L['x'].size()[0] and L['x'].size()[0] <= 10" in err
    # x + y: y's size equals x's
    assert "SHAPE_GUARD L['y'].size()[0] == L['x'].size()[0]" in err
    recompile = err[err.index("Recompiling"):]
    assert "SHAPE_GUARD 2 <= L['x'].size()[0] and L['x'].size()[0] <= 10 failed" in recompile


def test_shape_guards_keep_equal_sizes_equal():
    backend = Recording()
    compiled = framejit.compile(add_rows, backend=backend, dynamic=True)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    assert same(compiled(x, y), add_rows(x, y))
    x, y = torch.randn(5, 3), torch.randn(1, 3)  # broadcasting y: not the graph's sizes
    assert same(compiled(x, y), add_rows(x, y))
    assert backend.count == 2


def test_maybe_mark_dynamic_and_mark_static():
    backend = Recording()
    compiled = framejit.compile(add_rows, backend=backend)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    framejit.maybe_mark_dynamic(x, 0)
    compiled(x, y)
    assert isinstance(backend.calls[-1][0][0].shape[0], torch.SymInt)

    backend = Recording()
    compiled = framejit.compile(add_rows, backend=backend, dynamic=True)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    framejit.mark_static(x, 1)
    compiled(x, y)
    fake = backend.calls[-1][0][0]
    assert isinstance(fake.shape[0], torch.SymInt) and fake.shape[1] == 3
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    assert same(compiled(x, y), add_rows(x, y))
    assert backend.count == 2  # the static dim's new size compiles again


def test_torch_dynamo_marks_are_honoured():
    backend = Recording()
    compiled = framejit.compile(add_rows, backend=backend)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    torch._dynamo.mark_dynamic(x, 0)
    compiled(x, y)
    assert isinstance(backend.calls[-1][0][0].shape[0], torch.SymInt)


def test_a_size_python_reads_stays_pinned_and_a_marked_one_warns():
    def rows(x):
        return [x[i] * 2 for i in range(x.size(0))]  # range() needs the number

    backend = Recording()
    compiled = framejit.compile(rows, backend=backend)
    x = torch.randn(3, 2)
    framejit.mark_dynamic(x, 0)
    with pytest.warns(framejit.FramejitWarning, match="marked dynamic.*stay static"):
        out = compiled(x)
    assert same(out, rows(x)) and type(backend.calls[0][0][0]) is torch.Tensor


def test_a_non_contiguous_input_changes_the_layout_guard():
    backend = Recording()
    compiled = framejit.compile(add_rows, backend=backend, dynamic=True)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    compiled(x, y)
    xt = torch.randn(3, 4).t()  # same sizes, column-major
    assert same(compiled(xt, y), add_rows(xt, y))
    assert backend.count == 2
    x, y = torch.randn(6, 3), torch.randn(6, 3)
    assert same(compiled(x, y), add_rows(x, y))
    assert backend.count == 2  # the first graph, dense row-major again


class TinyLM(nn.Module):
    """A nanoGPT-shaped language model: `b, t = idx.size()`, an assert on the block size,
    positions from torch.arange(t)."""

    def __init__(self, vocab=50, block=64, dim=16):
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        self.attn = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        b, t = idx.size()
        assert t <= self.block, f"sequence of {t} is longer than the block ({self.block})"
        x = self.tok(idx) + self.pos(torch.arange(0, t, dtype=torch.long, device=idx.device))
        q, k, v = self.attn(x).split(x.size(-1), dim=2)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(x)


def generate(model, idx, steps):
    for _ in range(steps):
        logits = model(idx)
        idx = torch.cat((idx, logits[:, -1, :].argmax(-1, keepdim=True)), dim=1)
    return idx


@pytest.mark.parametrize("backend_name", ["eager", "callable", "inductor"])
def test_a_generate_loop_of_16_tokens_compiles_at_most_twice(backend_name):
    torch.manual_seed(0)
    model = TinyLM().eval()
    if backend_name == "eager":
        from framejit.testing import CompileCounter
        backend = CompileCounter()
    elif backend_name == "callable":
        backend = Recording()
    else:
        from torch._inductor.compile_fx import compile_fx
        backend = Recording(compile_fx)
    compiled = framejit.compile(model, backend=backend)
    start = torch.zeros(1, 3, dtype=torch.long)
    with torch.no_grad():
        out = generate(compiled, start, 16)
        ref = generate(model, start, 16)
    assert torch.equal(out, ref)
    count = backend.frame_count if backend_name == "eager" else backend.count
    assert count <= (1 if backend_name == "eager" else 2)
    with torch.no_grad(), pytest.raises(AssertionError, match="longer than the block"):
        compiled(torch.zeros(1, 65, dtype=torch.long))


def test_inductor_takes_new_batch_sizes_with_two_compiles():
    from torch._inductor.compile_fx import compile_fx

    backend = Recording(compile_fx)
    compiled = framejit.compile(mlp_step, backend=backend)
    w = torch.randn(8, 3)
    for b in BATCHES:
        x = torch.randn(b, 8)
        assert same(compiled(x, w), mlp_step(x, w), rtol=1e-4, atol=1e-5)
    assert backend.count == 2


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_models_take_new_batch_sizes_through_aot_autograd(name, training):
    # aot_eager: the same fake-input, ShapeEnv and TracingContext contract as inductor (inductor
    # itself runs in benchmarks/ section 6), with the backward graph in training.
    import copy

    from functorch.compile import nop
    from torch._dynamo.backends.common import aot_autograd

    torch.manual_seed(1)
    eager = ZOO[name]().train(training)
    model = copy.deepcopy(eager)
    backend = Recording(aot_autograd(fw_compiler=nop))
    compiled = framejit.compile(model, backend=backend)
    calls = [ZOO[name].example(batch=b) for b in BATCHES]
    for args in calls:
        out, ref = run(compiled, args), run(eager, args)
        assert same(out, ref, rtol=1e-4, atol=1e-5)
        if training:
            backward_and_compare_gradients(model, eager, out, ref)
    if not training:
        # 2, or what torch.compile needs too: the convolutions' ShapeEnv guard `batch <= 15`
        # (the CPU convolution picks its algorithm by batch size) splits the graph at 16.
        assert backend.count == max(2, torch_compile_count(eager, calls)) <= 3, name
    else:
        assert backend.count <= 3, name


def test_a_backend_that_cannot_take_fake_inputs_gets_static_sizes_with_one_warning():
    def needs_real_values(gm, example_inputs):
        for x in example_inputs:
            x.numpy()  # a fake tensor has no data
        return gm.forward

    compiled = framejit.compile(mlp_step, backend=needs_real_values)
    w = torch.randn(8, 3)
    x = torch.randn(2, 8)
    assert same(compiled(x, w), mlp_step(x, w))
    with pytest.warns(framejit.FramejitWarning, match="could not be compiled with symbolic sizes"):
        x = torch.randn(5, 8)
        assert same(compiled(x, w), mlp_step(x, w))
    for b in (5, 7, 5):  # 7: pinned to 5, so it compiles again, correctly
        x = torch.randn(b, 8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert same(compiled(x, w), mlp_step(x, w)), b


# Ints that change between calls (a position, a step): a graph input after one more compile, as
# with framejit's own backends, handed to the backend as a SymInt of the ShapeEnv; its guards
# (ranges from the ops, 0 and 1 as ints guarded equal) join the region's.

def shifted(x, n):
    return x * n + n // 2


def int_backend(name):
    if name == "callable":
        return Recording()
    from torch._inductor.compile_fx import compile_fx
    return Recording(compile_fx)


@pytest.mark.parametrize("backend_name", ["callable", "inductor"])
def test_an_int_that_varies_is_a_symint_input_for_a_backend_that_compiles_per_size(backend_name, caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    backend = int_backend(backend_name)
    compiled = framejit.compile(shifted, backend=backend)
    x = torch.randn(4)
    calls = [(x, n) for n in range(2, 13)]
    try:
        for args in calls:
            assert same(compiled(*args), shifted(*args)), args
    finally:
        framejit.set_logs()
    assert backend.count == 2 == torch_compile_count(shifted, calls)
    example = backend.calls[1][0][1]
    assert isinstance(example, torch.SymInt)
    assert "sizes symbolic: L['n'] (an int)" in caplog.text


def test_an_int_input_takes_0_and_1_as_torch_compile_does():
    # (unlike a size, an int argument's 0 and 1 are not specialised)
    backend = Recording()
    compiled = framejit.compile(shifted, backend=backend)
    x = torch.randn(4)
    calls = [(x, n) for n in (2, 3, 0, 1, 4, 0, 7)]
    for args in calls:
        assert same(compiled(*args), shifted(*args)), args
    assert backend.count == 2 == torch_compile_count(shifted, calls)


rotary_table = torch.randn(64, 8)


def rotate(x, pos):
    # A decoding step of Meta's reference Llama: a position slices the rotary table, whose
    # shape is asserted (a Python read of the slice's length).
    f = rotary_table[pos: pos + x.shape[0]]
    assert f.shape == x.shape
    return x * f


@pytest.mark.parametrize("backend_name", ["callable", "inductor"])
def test_a_decoding_position_compiles_twice_with_a_backend_that_compiles_per_size(backend_name):
    backend = int_backend(backend_name)
    compiled = framejit.compile(rotate, backend=backend)
    calls = [(torch.randn(4 if pos == 0 else 1, 8), pos) for pos in [0] + list(range(4, 20))]
    for args in calls:
        assert same(compiled(*args), rotate(*args)), args[1]
    assert backend.count == 2 <= torch_compile_count(rotate, calls)
    with pytest.raises(AssertionError):  # past the table's end: eager's assertion
        compiled(torch.randn(1, 8), 64)
