"""Ints read by source that change between calls (automatic dynamic for ints, as torch.compile
does for int arguments): the first compile of a place specialises an int argument, attribute or
dict item; a compile that finds another value makes it a graph input (`Sym(i64)`) wherever a
size may be one (operators, shapes, slice bounds, factory sizes), guards a comparison with a
constant as a range (`INT_RELATION`), and pins it where Python needs the number itself (a list
index, an f-string). Only for backends that run any size (eager, native); not with
dynamic=False. Each test compares with eager and counts graphs."""
import logging

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions, same


def calls(fn, argsets, backend=None, **kwargs):
    """Compiles fn, calls it with each argument tuple, checks each result against eager;
    returns the counter."""
    counter = CompileCounter(backend)
    compiled = framejit.compile(fn, backend=counter, **kwargs)
    for args in argsets:
        assert same(compiled(*args), fn(*args)), args
    return counter


def scaled(x, n):
    return x * n + n // 2


@pytest.mark.parametrize("backend", ["eager", "native"])
def test_an_int_argument_that_varies_is_a_graph_input_after_one_more_compile(backend):
    x = torch.randn(4)
    counter = calls(scaled, [(x, n) for n in range(1, 12)], backend=getattr(framejit.backends, backend))
    assert counter.frame_count == 2
    placeholders = [n for n in counter.graphs[1].graph.nodes if n.op == "placeholder"]
    assert [n.name for n in placeholders] == ["x", "n"]


def test_the_second_graph_takes_the_int_as_a_sym_input(caplog):
    x = torch.randn(4)
    framejit.set_logs("graph_code", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    calls(scaled, [(x, 1), (x, 2)])
    assert 'n: "Sym(i64)"' in caplog.text


class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        return self.lin(x) * self.steps


def test_a_module_step_counter_compiles_twice_and_is_written_back():
    torch.manual_seed(0)
    eager = Counting()
    model = Counting()
    model.load_state_dict(eager.state_dict())
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    x = torch.randn(2, 4)
    for _ in range(10):
        assert same(compiled(x), eager(x))
    assert model.steps == eager.steps == 10
    assert counter.frame_count == 2


def branches(x, n):
    if n > 3:
        return x * n
    return x - n


def test_a_comparison_with_a_constant_is_guarded_as_a_range(caplog):
    x = torch.randn(4)
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    counter = calls(branches, [(x, n) for n in range(8)])
    # n=0: specialised; n=1: an input, guarded n <= 3; n=4: the other side, n > 3.
    assert counter.frame_count == 3
    assert "INT_RELATION L['n'] <= 3" in caplog.text
    assert "INT_RELATION L['n'] > 3" in caplog.text


freqs = torch.randn(64, 8)


def llama_style(x, cache, start_pos):
    # Meta's reference Llama: a position argument slices the rotary table and the cache, and
    # sizes the mask (torch.compile: one more compile, then none).
    seqlen = x.shape[0]
    f = freqs[start_pos: start_pos + seqlen]
    cache[0, start_pos: start_pos + seqlen] = x
    mask = torch.triu(torch.full((seqlen, seqlen), float("-inf")), diagonal=1)
    mask = torch.hstack([torch.zeros((seqlen, start_pos)), mask])
    keys = cache[0, : start_pos + seqlen]
    return (x * f) @ keys.T + mask


@pytest.mark.parametrize("backend", ["eager", "native"])
def test_a_position_argument_in_slices_and_factory_sizes_runs_one_graph(backend):
    counter = CompileCounter(getattr(framejit.backends, backend))
    compiled = framejit.compile(llama_style, backend=counter)
    cache, eager_cache = torch.zeros(2, 32, 8), torch.zeros(2, 32, 8)
    for pos in range(0, 12):
        x = torch.randn(1 if pos else 3, 8)
        assert same(compiled(x, cache, pos), llama_style(x, eager_cache, pos))
        assert torch.equal(cache, eager_cache)
    assert counter.frame_count == 2


layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])


def indexes(x, i):
    return layers[i](x) + i


def test_an_int_python_needs_is_pinned_per_value_without_a_break():
    x = torch.randn(2, 4)
    counter = calls(indexes, [(x, i % 3) for i in range(6)])
    assert counter.frame_count == 3
    assert all(r["exit"] == "return" for r in regions(indexes))


def reshapes(x, rows):
    return x.reshape(rows, -1).sum(0)


def test_an_int_in_a_view_shape_is_a_graph_value():
    counter = calls(reshapes, [(torch.randn(24), rows) for rows in (1, 2, 3, 4, 6, 8, 12)])
    assert counter.frame_count == 2


def test_dynamic_true_takes_ints_as_graph_inputs_from_the_first_call():
    x = torch.randn(4)
    counter = calls(scaled, [(x, n) for n in range(1, 6)], dynamic=True)
    assert counter.frame_count == 1
    placeholders = [n.name for n in counter.graphs[0].graph.nodes if n.op == "placeholder"]
    assert placeholders == ["x", "n"]


def test_dynamic_false_specialises_every_value_and_a_callable_backend_gets_a_symint():
    x = torch.randn(4)
    assert calls(scaled, [(x, n) for n in range(1, 4)], dynamic=False).frame_count == 3
    got = []

    def plain_backend(gm, example_inputs):  # compiles per size: the int comes as a SymInt
        got.append(example_inputs)
        return gm.forward

    assert calls(scaled, [(x, n) for n in range(1, 6)], backend=plain_backend).frame_count == 2
    assert isinstance(got[1][1], torch.SymInt)


def truthy(x, n):
    if n:
        return x * n
    return x - 1


def test_the_truth_of_an_int_input_is_guarded_as_not_zero(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    x = torch.randn(3)
    counter = calls(truthy, [(x, n) for n in (1, 2, 3, 0, 4, 0, 5)])
    # n=1: specialised; n=2: an input, guarded n != 0; n=0: the other side, pinned (n == 0)
    assert counter.frame_count == 3
    assert "INT_RELATION L['n'] != 0" in caplog.text


def printed(x, n):
    y = x * n
    print(n + 1)
    return y + n


def test_an_int_input_operand_of_a_break_is_pinned_there(capsys):
    x = torch.randn(3)
    counter = calls(printed, [(x, 1), (x, 2), (x, 3)])
    assert capsys.readouterr().out.split() == ["2", "2", "3", "3", "4", "4"]
    assert counter.frame_count >= 2


def flattens(x, start):
    return x.flatten(start).shape


def test_an_int_that_decides_a_results_rank_is_pinned():
    # flatten(start_dim) gives another rank for each start: the trace read the rank as a
    # constant, so the int is pinned there (a graph input it would return the wrong shape).
    x = torch.randn(6, 1, 4)
    counter = calls(flattens, [(x, start) for start in (1, 0, 2, 1, 0)])
    assert counter.frame_count == 3


def window(x, n):
    # transformers' sliding-window mask: `kv_length >= local_attention_size` with kv_length the
    # cache's length (an int attribute) plus the query's length (a size)
    if n + x.shape[0] >= 10:
        return x * 2
    return x - n


def test_an_int_and_a_size_compared_are_guarded_as_a_linear_relation(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    steps = [(torch.randn(t, 3), n) for t, n in ((1, 0), (1, 1), (1, 2), (2, 3), (3, 6), (1, 8), (1, 9), (4, 9), (1, 2))]
    counter = calls(window, steps)
    # n=0 pinned; then n + T < 10 one graph (T and n free within it); n + T >= 10 another
    assert counter.frame_count == 3
    assert "LINEAR_RELATION L['n'] + L['x'].size(0) < 10" in caplog.text
    assert "LINEAR_RELATION L['n'] + L['x'].size(0) >= 10" in caplog.text


def two_ints(x, a, b):
    return x * a if 2 * a - b > 5 else x + b


def test_two_ints_compared_are_a_linear_relation_too():
    x = torch.randn(3)
    argsets = [(x, a, b) for a, b in ((1, 1), (2, 1), (3, 2), (4, 2), (5, 4), (6, 1), (9, 13), (10, 14), (3, 0))]
    counter = calls(two_ints, argsets)
    # (1, 1) pinned; (2, 1) a varies (b pinned); (3, 2) both vary: 2a - b <= 5; (4, 2) the other
    # side; the rest on one of the last two
    assert counter.frame_count == 4


def sizes_summed(x, y):
    return x.sum() if x.shape[0] + 2 * y.shape[0] > 12 else y.sum()


def test_three_sizes_compared_are_a_linear_relation_not_pins(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    argsets = [(torch.randn(a), torch.randn(b)) for a, b in ((2, 3), (3, 4), (4, 2), (8, 3), (10, 2), (1, 6), (20, 1))]
    counter = calls(sizes_summed, argsets)
    assert counter.frame_count == 2
    assert "L['x'].size(0) + 2 * L['y'].size(0) <= 12" in caplog.text


def every_third(x, n):
    return x * 2 if n % 3 == 0 else x + 1


def test_an_int_modulo_a_constant_is_guarded_as_that(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    x = torch.randn(3)
    counter = calls(every_third, [(x, n) for n in range(20)])
    assert counter.frame_count == 3  # n=0 pinned; then one graph per answer
    assert "LINEAR_RELATION (L['n']) % 3 == 0" in caplog.text
    assert "LINEAR_RELATION (L['n']) % 3 != 0" in caplog.text


def multiple_of_four(x):
    # diffusers' UNet2DConditionModel: forward the upsample size when a side is no multiple
    for dim in x.shape[-2:]:
        if dim % 4 != 0:
            return x * 2
    return x + 1


def test_a_size_modulo_a_constant_pins_no_size():
    shapes = [(8, 8), (16, 12), (8, 9), (7, 8), (12, 16), (5, 5), (4, 40), (40, 41)]
    counter = calls(multiple_of_four, [(torch.randn(1, h, w),) for h, w in shapes])
    assert counter.frame_count == 3  # both multiples; the width not; the height not


def huge_modulo(x, n):
    return x * 2 if (2 * n) % 3 == 0 else x + 1


def test_a_modulo_of_a_huge_int_pins_it_and_warns_nothing():
    # 2 * n past int64 cannot be the guard's sum: such a value is pinned, as before
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls(huge_modulo, [(torch.ones(3), n) for n in (1, 2, 2 ** 63 - 1, 2 ** 62 + 1, 5)])
    assert not [w for w in caught if "framejit" in str(w.message)]
