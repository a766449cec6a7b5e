"""A tensor sliced with bounds that differ by a constant or by sizes (`freqs[pos : pos + T]`,
`h[:, T - 1 : T]`) is that long while 0 <= start and stop <= the size it is taken from: Python
reading its size (`assert freqs.shape == (T, d)` in Meta's reference Llama) pins no position,
and those two conditions are guarded (as ranges of the position, `INT_RELATION L['pos'] <= 63`,
or with a length beside it as a linear relation, `L['pos'] + L['x'].size(0) <= 64`) only where a
size read relies on the length. A position outside them compiles again and gives
eager's result (a shorter slice). Each test compares with eager and counts graphs."""
import logging

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, same

table = torch.randn(64, 8)


def run(fn, argsets, backend=None):
    counter = CompileCounter(backend)
    compiled = framejit.compile(fn, backend=counter)
    for args in argsets:
        assert same(compiled(*args), fn(*args)), args
    return counter


def rotary_row(x, pos):
    f = table[pos: pos + 1]
    assert f.shape == (1, 8)
    return x * f


@pytest.mark.parametrize("backend", ["eager", "native"])
def test_a_size_read_of_a_position_slice_pins_no_position(backend):
    x = torch.randn(3, 8)
    counter = run(rotary_row, [(x, p) for p in range(10)], backend=getattr(framejit.backends, backend))
    assert counter.frame_count == 2


def table_rows(x, pos):
    f = table[pos: pos + x.shape[0]]
    if f.shape[0] == x.shape[0]:  # a branch on the length: Python reads it
        return x * f
    return x + f.sum()


def test_a_position_past_the_end_compiles_again_and_matches_eager(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    x = torch.randn(1, 8)
    # 62, 63: one row; 64, 70: none (past the end); then inside again.
    counter = run(table_rows, [(x, p) for p in (1, 2, 62, 63, 64, 70, 5)])
    assert "LINEAR_RELATION L['pos'] + L['x'].size(0) <= 64" in caplog.text  # x's size stays free
    assert "INT_RELATION L['pos'] >= 0" in caplog.text
    assert counter.frame_count == 4  # 1 pinned, 2-63 one graph, 64 and 70 pinned (no row)


def test_a_negative_position_wraps_as_in_eager():
    x = torch.randn(1, 8)
    run(table_rows, [(x, p) for p in (3, 4, -1, -2, -64, -70, 6)])


def test_a_slice_as_long_as_a_size_keeps_that_size_free():
    # freqs[start : start + T] with T the input's length: any T with the same start.
    counter = run(table_rows, [(torch.randn(t, 8), 0) for t in (2, 5, 7, 11, 16)])
    assert counter.frame_count == 1


def last_position(h):
    last = h[:, h.shape[1] - 1: h.shape[1]]
    return last * last.shape[1] + h.shape[1]


def test_the_last_position_of_a_sequence_is_one_long():
    counter = run(last_position, [(torch.randn(2, t, 4),) for t in (3, 5, 9, 17)])
    assert counter.frame_count == 1


def test_a_length_no_size_read_relies_on_adds_no_guard(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    cache = torch.zeros(2, 32, 4)

    def write_and_read(x, pos):
        c = cache.to(x)
        c[:, pos: pos + x.shape[1]] = x
        return c[:, : pos + x.shape[1]] * 2

    counter = run(write_and_read, [(torch.randn(2, t, 4), 0) for t in (3, 5, 8)])
    assert counter.frame_count == 1
    assert "a size used as a Python value" not in caplog.text


def test_a_stepped_slice_keeps_no_length():
    def stepped(x, pos):
        f = table[pos: pos + 4: 2]
        return x[: f.shape[0]] * f.shape[0]

    run(stepped, [(torch.randn(4, 8), p) for p in (1, 2, 3, 61, 62, 63)])


class Positional(torch.nn.Module):
    """A model written like Meta's reference Llama: `@torch.inference_mode()` on forward, a
    position argument slicing a rotary table and a KV cache."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.register_buffer("freqs", torch.randn(64, 8), persistent=False)
        self.cache = torch.zeros(2, 32, 8)

    @torch.inference_mode()
    def forward(self, tokens, start_pos: int):
        _, seqlen = tokens.shape
        h = self.emb(tokens)
        f = self.freqs[start_pos: start_pos + seqlen]
        assert f.shape == (h.shape[1], h.shape[-1])
        h = h * f
        self.cache[: h.shape[0], start_pos: start_pos + seqlen] = h
        keys = self.cache[: h.shape[0], : start_pos + seqlen]
        return h @ keys.transpose(1, 2)


class Graphs:
    """A backend that compiles per size (a user's callable, or inductor's compile_fx)."""

    def __init__(self, inner=None):
        self.inner, self.count = inner, 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return gm.forward if self.inner is None else self.inner(gm, example_inputs)


@pytest.mark.parametrize("backend_name", ["eager", "callable", "inductor"])
def test_a_decoding_loop_through_an_inference_mode_forward_compiles_twice(backend_name):
    # framejit's own backends enter inference mode inside the graph; for others the runtime
    # enters it between regions (inductor cannot compile a graph that enters it: torch.compile
    # fails on this model with "Cannot set version_counter for inference tensor"), and the
    # position, held in the wrapper's `args` across that break, is an int input all the same.
    torch.manual_seed(0)
    eager, model = Positional(), Positional()
    model.load_state_dict(eager.state_dict())
    model.freqs.copy_(eager.freqs)
    if backend_name == "eager":
        backend = CompileCounter()
    elif backend_name == "callable":
        backend = Graphs()
    else:
        from torch._inductor.compile_fx import compile_fx
        backend = Graphs(compile_fx)
    compiled = framejit.compile(model, backend=backend)
    tokens = torch.randint(0, 50, (2, 4))
    out = compiled(tokens, 0)
    assert same(out, eager(tokens, 0)) and out.is_inference()
    for pos in range(4, 14):
        tokens = torch.randint(0, 50, (2, 1))
        out = compiled(tokens, pos)
        assert same(out, eager(tokens, pos), rtol=1e-4, atol=1e-5) and out.is_inference()
    assert torch.equal(model.cache, eager.cache)
    if backend_name == "eager":
        assert backend.frame_count == 2
        graph = backend.graphs[0].code
        assert "_enter_inference_mode" in graph and "_exit_inference_mode" in graph
    else:
        assert backend.count == 2


def add_positions(x, positions):
    h = x + positions[:, : x.shape[1]]  # T long while T <= the table's length
    if h.shape[1] > 1:
        return h * 2
    return h


def test_a_prefix_of_a_table_is_as_long_as_the_input_under_a_size_relation(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    pos = torch.randn(1, 16, 4)
    counter = run(add_positions, [(torch.randn(2, t, 4), pos) for t in (5, 7, 9, 16, 1, 3)])
    assert counter.frame_count == 2  # length 1 takes the other branch
    assert "SIZE_RELATION L['positions'].size(1) >= L['x'].size(1)" in caplog.text
    assert "size(1) in [2, inf]" in caplog.text


def all_but_three(x):
    y = x[: x.shape[0] - 3]
    if y.shape[0] == 1:
        return y + 100
    return y - 100


def middle(x):
    y = x[2: x.shape[0] - 1]
    if y.shape[0] == 0:
        return x.sum() + 100
    return y.sum()


@pytest.mark.parametrize("fn", [all_but_three, middle])
def test_a_length_that_would_go_negative_is_guarded_not_assumed(fn):
    # [: T - 3] is T - 3 long only while T >= 3 (below, a negative stop counts from the end);
    # [2 : T - 1] only while 2 <= T - 1 (crossed bounds give nothing). Found in review: the
    # first version guarded 0 <= start and stop <= size only, and T = 2 took the wrong branch.
    run(fn, [(torch.randn(n),) for n in (6, 7, 4, 2, 3, 1, 9)])


def rotary_rows(x, pos):
    f = table[pos: pos + x.shape[0]]
    assert f.shape == (x.shape[0], 8)
    return x * f


def test_a_position_and_a_length_that_both_vary_pin_neither(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    steps = [(torch.randn(t, 8), pos) for pos, t in ((0, 4), (3, 4), (4, 5), (10, 2), (50, 14), (60, 3), (2, 7))]
    counter = run(rotary_rows, steps)
    assert counter.frame_count == 2  # pos pinned first; then pos + T <= 64 (both free)
    assert "LINEAR_RELATION L['pos'] + L['x'].size(0) <= 64" in caplog.text
    with pytest.raises(AssertionError):  # past the end: eager's assertion
        framejit.compile(rotary_rows)(torch.randn(5, 8), 62)
