"""Symbolic sizes: a size that only flows into torch calls is a graph value (`x.size(0)`), so a
new batch size runs the same graph; a size Python needs (a branch, range, a slice bound, a
string) guards the input sizes it comes from (test_size_guards.py). Each test compares with eager and counts graphs."""
import logging
import math

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, normalize_graph, regions, same


def run_sizes(fn, shapes, backend=None, **kwargs):
    """Compiles fn, calls it on a random tensor of each shape, checks each result against eager;
    returns the counter."""
    counter = CompileCounter(backend)
    compiled = framejit.compile(fn, backend=counter, **kwargs)
    for shape in shapes:
        x = torch.randn(*shape)
        assert same(compiled(x), fn(x)), shape
    return counter


def graph_text(fn):
    return "".join(normalize_graph(r["graph"]) for r in regions(fn) if r["graph"])


def flatten_rows(x):
    return x.view(x.size(0), -1) * 2


def test_size_passed_to_view_is_a_graph_value():
    counter = run_sizes(flatten_rows, [(2, 3, 4), (5, 3, 4), (7, 3, 4)])
    assert counter.frame_count == 1
    assert graph_text(flatten_rows) == (
        'def forward(self, x: "f32[2, 3, 4]"):\n'
        "    # File: test_symbolic_sizes.py:30 in flatten_rows, code: return x.view(x.size(0), -1) * 2\n"
        '    size: "Sym(i64)" = x.size(0)\n'
        '    view: "f32[2, 12]" = x.view(size, -1)\n'
        '    mul: "f32[2, 12]" = view * 2\n'
        "    return (mul,)\n"
    )


def heads(x):
    batch, time, channels = x.shape
    q = x.view(batch, time, 2, channels // 2).transpose(1, 2)
    att = q @ q.transpose(-2, -1) / math.sqrt(q.size(-1))
    return (att.softmax(-1) @ q).transpose(1, 2).reshape(x.shape[:-1] + (-1,))


def test_shape_unpacked_divided_and_joined_stays_symbolic():
    counter = run_sizes(heads, [(2, 4, 8), (3, 4, 8), (3, 6, 8)])
    assert counter.frame_count == 1
    text = graph_text(heads)
    assert "floordiv: \"Sym(i64)\" = size_2 // 2" in text
    assert "math.sqrt(size_3)" in text
    assert "reshape((size, size_1, -1))" in text


def test_an_input_size_compared_with_a_constant_is_guarded_by_a_range():
    # `x.size(0) > 2` decided at trace time keeps x's size free on the side of 2 it was on: one
    # graph for sizes 3 and 4, one for 2 and below.
    def branchy(x):
        if x.size(0) > 2:
            return x * 2
        return x + 1

    counter = run_sizes(branchy, [(2, 3), (3, 3), (2, 3), (4, 3), (1, 3), (9, 3)])
    assert counter.frame_count == 2


def test_a_size_compared_after_arithmetic_specialises_and_equality_excludes_one_value():
    def derived(x):
        if x.size(0) * 2 > 5:  # not an input's own size: pinned
            return x * 2
        return x + 1

    def equal(x):
        if x.size(0) == 3:  # True: pinned to 3; False: any size but 3
            return x * 2
        return x + 1

    assert run_sizes(derived, [(2, 3), (3, 3), (4, 3)]).frame_count == 3
    assert run_sizes(equal, [(2, 3), (3, 3), (4, 3), (9, 3), (3, 3)]).frame_count == 2


def test_two_input_sizes_compared_are_guarded_as_their_relation():
    # transformers' sdpa_attention_forward: `if kv_length > q_length: key = key[:, :, :q_length]`
    def crop(q, k):
        if k.size(1) > q.size(1):
            k = k[:, : q.size(1)]
        return q + k

    counter = CompileCounter()
    compiled = framejit.compile(crop, backend=counter)
    for n, m in ((3, 3), (5, 5), (4, 2), (6, 6), (7, 3), (2, 9), (2, 5), (3, 7)):
        q, k = torch.randn(2, n), torch.randn(2, m)
        if m >= n:
            assert same(compiled(q, k), crop(q, k)), (n, m)
        else:
            with pytest.raises(RuntimeError):
                compiled(q, k)
    # k <= q: one graph for all such sizes (q + k raises where they differ, as in eager);
    # k > q: one more, whose slice `k[:, :q.size(1)]` takes any q size
    assert counter.frame_count == 2


def test_the_range_a_comparison_kept_shows_in_the_guards_log(caplog):
    def checked(x, limit=8):
        assert x.size(1) <= limit, "too long"
        return x.sum(1)

    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    try:
        compiled = framejit.compile(checked, backend="eager")
        compiled(torch.ones(2, 4))
        compiled(torch.ones(3, 8))
        with pytest.raises(AssertionError, match="too long"):
            compiled(torch.ones(2, 9))
    finally:
        framejit.set_logs()
    err = "\n".join(r.getMessage() for r in caplog.records)
    assert err.count("GUARDS") == 1 and "size(1) in [-inf, 8]" in err


def test_size_in_range_and_fstring_specialises():
    def unrolled(x):
        out = x
        for i in range(x.shape[0]):
            out = out + x[i]
        return out, f"{x.shape}"

    counter = run_sizes(unrolled, [(2, 3), (3, 3), (2, 3)])
    assert counter.frame_count == 2


def crop(x):
    return x[:, : x.size(1) - 1] * 2


def test_a_slice_bound_from_a_size_stays_a_graph_value():
    # The slice is a graph value made from the size expression: a tensor sliced with it takes
    # any size. A list sliced with it needs the number: pinned.
    counter = run_sizes(crop, [(2, 4), (2, 5), (3, 9)])
    assert counter.frame_count == 1
    text = graph_text(crop)
    assert 'slice_1: "Sym(slice)" = slice(None, sub)' in text
    assert 'getitem: "f32[2, 3]" = x[(slice(None, None, None), slice_1)]' in text

    def pick(x):
        return x * len([1, 2, 3, 4, 5, 6][: x.size(0)])

    counter = run_sizes(pick, [(2, 3), (3, 3), (2, 3)])
    assert counter.frame_count == 2


def test_returned_sizes_are_read_at_run_time():
    def with_sizes(x):
        return x * 2, x.shape[0], x.size(), len(x) + 1

    counter = CompileCounter()
    compiled = framejit.compile(with_sizes, backend=counter)
    for n in (2, 5, 3):
        x = torch.randn(n, 3)
        out = compiled(x)
        assert same(out, with_sizes(x))
        assert type(out[2]) is torch.Size
    assert counter.frame_count == 1


def test_sizes_in_factories_and_builtins():
    def factories(x):
        rows = max(x.size(0), 1)
        return torch.zeros(rows, 3) + torch.arange(x.shape[1]).float() + x.new_ones(x.shape)

    counter = run_sizes(factories, [(2, 3), (4, 3), (6, 3)])
    assert counter.frame_count == 1
    assert "max(size, 1)" in graph_text(factories)


def test_size_methods_need_the_numbers():
    def numel_scale(x):
        return x / x.shape.numel()

    counter = run_sizes(numel_scale, [(2, 3), (4, 3)])
    assert counter.frame_count == 2


def test_size_kept_across_a_break():
    def across(x):
        n = x.size(0)
        print("batch")  # a break: n lives on in the frame
        return x.reshape(n, -1) + n

    counter = run_sizes(across, [(2, 3, 2), (4, 3, 2)])
    assert counter.frame_count == 2  # the region after the print specialises on n


def test_size_operand_of_a_break_retraces_with_constant_sizes(capsys):
    def printed(x):
        y = x * 2
        print(y.size(0))
        return y + 1

    run_sizes(printed, [(2, 3), (3, 3)])
    assert capsys.readouterr().out.split() == ["2", "2", "3", "3"]
    kinds = [r["exit"] for r in regions(printed)]
    assert kinds[0] == "call"


def test_a_backend_that_is_not_shape_generic_gets_constants():
    graphs = []

    def fixed_backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    compiled = framejit.compile(flatten_rows, backend=fixed_backend)
    x = torch.randn(2, 3, 4)
    assert same(compiled(x), flatten_rows(x))
    assert "size" not in [n.target for n in graphs[0].graph.nodes]


def test_dynamic_false_gets_constants():
    counter = run_sizes(flatten_rows, [(2, 3, 4), (5, 3, 4)], dynamic=False)
    assert counter.frame_count == 2
    assert all(n.target != "size" for g in counter.graphs for n in g.graph.nodes)


@pytest.mark.parametrize("backend", ["eager", "native"])
def test_backends_run_symbolic_sizes(backend):
    counter = CompileCounter(getattr(framejit.backends, backend))
    compiled = framejit.compile(heads, backend=counter)
    for shape in [(2, 4, 8), (5, 4, 8), (2, 4, 8)]:
        x = torch.randn(*shape)
        assert same(compiled(x), heads(x), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1


# Review findings, each once silently wrong (or a crash) for a second batch size.
def read_then_unsqueeze_(x):
    y = x * 2
    n = y.size(0)
    y.unsqueeze_(0)  # n stays the size it was read as
    return torch.zeros(n), y.size(0)


def read_then_t_(x):
    y = x * 2
    n = y.size(0)
    y.t_()
    return torch.zeros(n, y.size(0))


def split_count_from_size(x):
    return torch.stack([p.sum() for p in x.split(x.size(0) // 2)])


def split_count_from_constant(x):
    return torch.stack([p.sum() for p in x.split(2)])  # how many pieces depends on the size


def chunk_count(x):
    return x * len(torch.chunk(x, x.size(0)))


def keepdim_from_size(x):
    return x.sum(1, keepdim=x.size(0) > 2) * 2


def size_times_item(x):
    s = x.sum().item()  # a break: s is a run-time number in the next region
    return x * (x.size(0) * s)


def size_as_query_argument(x):
    return x * x.stride(min(len(x), 2) - 1) + x.to(torch.result_type(x, x.size(0)))


@pytest.mark.parametrize("fn", [read_then_unsqueeze_, read_then_t_, split_count_from_size,
                                split_count_from_constant, chunk_count, keepdim_from_size,
                                size_times_item, size_as_query_argument],
                         ids=lambda fn: fn.__name__)
def test_sizes_whose_value_decides_the_graph_are_specialised(fn):
    compiled = framejit.compile(fn, backend=CompileCounter())
    for shape in [(2, 3), (5, 3), (4, 3), (2, 3)]:
        x = torch.randn(*shape)
        assert same(compiled(x.clone()), fn(x.clone())), shape


def empty_or_doubled(x):
    if x.numel() == 0:  # DynamicLayer.get_seq_length's test: x is not empty
        return x + 1
    return x * x.numel()


def test_numel_compared_with_zero_guards_each_size_at_least_one():
    # numel() is the product of the sizes: `== 0` answered False guards each size >= 1 and pins
    # none, so new sizes share the graph; an empty tensor fails that guard and compiles again.
    counter = run_sizes(empty_or_doubled, [(2, 3), (4, 5), (1, 7)])
    assert counter.frame_count == 1
    counter = run_sizes(empty_or_doubled, [(2, 3), (0, 3), (5, 0), (4, 4)])
    assert counter.frame_count == 3  # (4, 4) runs the first graph; an empty one pins its sizes


def split_heads_and_positions(x):
    # transformers' mask and attention code: sizes of tensors the graph makes, compared.
    q = x.view(x.size(0), x.size(1), 2, -1).transpose(1, 2)  # (B, 2, T, C / 2)
    positions = torch.arange(0, 0 + q.shape[2])
    if positions.shape[0] == 1:  # T == 1? False: guarded T != 1
        return q.sum()
    if q.shape[2] > 1 and q.shape[-2] == x.shape[1]:  # T > 1: a range; T == T: no guard
        return (q * positions[:, None]).sum(1)
    return q


def test_sizes_of_tensors_the_graph_makes_compare_as_the_input_sizes_they_are(caplog):
    # q.shape[2] is exactly x's size 1 (a transpose of a view taking x.size(1)), arange's length
    # is its bound: the comparisons guard ranges of x's size 1, and a new batch size or length
    # runs the same graph. A length of 1 is outside the range: it compiles again.
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    try:
        counter = run_sizes(split_heads_and_positions, [(2, 5, 8), (3, 7, 8), (4, 9, 8), (1, 2, 8)])
        assert counter.frame_count == 1
        counter = run_sizes(split_heads_and_positions, [(2, 5, 8), (2, 1, 8), (3, 1, 8)])
        assert counter.frame_count == 2
    finally:
        framejit.set_logs()
    err = "\n".join(r.getMessage() for r in caplog.records)
    assert "size(1) outside [1, 1], size(1) in [2, inf])" in err


def grow_cache(cache, new):
    # DynamicLayer.update: the keys so far and the new ones, joined along the sequence.
    keys = torch.cat([cache, new], dim=-2)
    if keys.shape[-2] > new.shape[-2]:  # past + T > T: cache.size(1) >= 1
        return keys * 2
    return keys + 1


def first_keys(new):
    # The first update: the cache starts as torch.tensor([]), which cat skips.
    keys = torch.cat([torch.tensor([]), new], dim=-2)
    if keys.shape[-2] > new.shape[-2]:  # 0 + T > T: False for every T, no guard
        return keys * 2
    return keys + 1


def test_a_concatenated_cache_compares_as_the_sum_of_its_pieces():
    counter = CompileCounter()
    compiled = framejit.compile(grow_cache, backend=counter)
    for past, new in [(3, 2), (5, 4), (1, 7), (0, 3), (0, 5), (2, 2)]:
        cache, x = torch.randn(2, past, 4), torch.randn(2, new, 4)
        assert same(compiled(cache, x), grow_cache(cache, x)), (past, new)
    assert counter.frame_count == 2  # an empty cache takes the other branch
    counter = run_sizes(first_keys, [(2, 3, 4), (3, 5, 4), (1, 1, 4)])
    assert counter.frame_count == 1


def broadcast_then_compare(a, b):
    c = a + b
    if c.shape[0] > 2:  # a's size 0, or b's where a's is 1: not one input size
        return c * 2
    return c - 1


def test_a_broadcast_of_two_input_sizes_pins_both():
    # With b's size 1 the result's size is a's, but b may grow: the comparison cannot be
    # guarded as a range of one input size, so both sizes are pinned (each pair compiles).
    counter = CompileCounter()
    compiled = framejit.compile(broadcast_then_compare, backend=counter)
    for n, m in [(4, 1), (1, 4), (4, 4), (4, 1), (2, 1)]:
        a, b = torch.randn(n, 3), torch.randn(m, 3)
        assert same(compiled(a, b), broadcast_then_compare(a, b)), (n, m)
    assert counter.frame_count == 4


def add_positions(x, table):
    # A stepped slice: its size is ceil(min(2T, 16) / 2), not exactly T. (A slice `[:, :T]`
    # is T long while T <= 16, guarded where relied on: test_slice_lengths.py.)
    positions = table[:, : x.shape[1] * 2: 2]
    h = x + positions  # broadcast: x's size 1, as long as that is not 1
    if h.shape[1] > 1:
        return h * 2
    return h


def test_a_broadcast_with_a_size_not_known_exactly_is_the_others_while_not_one(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    counter = CompileCounter()
    compiled = framejit.compile(add_positions, backend=counter)
    table = torch.randn(1, 16, 4)
    try:
        for t in (5, 7, 8, 1, 3):
            x = torch.randn(2, t, 4)
            assert same(compiled(x, table), add_positions(x, table)), t
    finally:
        framejit.set_logs()
    assert counter.frame_count == 2  # length 1 takes the other branch
    err = "\n".join(r.getMessage() for r in caplog.records)
    assert "size(1) outside [1, 1], size(1) in [2, inf]" in err


class _Downsampler(torch.nn.Module):
    """A vision stage that reads its feature map's height and width into Python (MobileNet's
    'same' padding, Swin's window check): only those sizes are guarded, not the batch."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = torch.nn.ConvTranspose2d(8, 4, 2, stride=2)

    def forward(self, images):
        x = self.conv(images)
        x = torch.nn.functional.max_pool2d(x, 2)
        height, width = x.shape[-2:]
        if height % 2 or width % 2:  # odd: pad to even, as 'same' padding code does
            x = torch.nn.functional.pad(x, (0, width % 2, 0, height % 2))
        x = torch.nn.functional.adaptive_avg_pool2d(x, (4, 4))
        x = torch.nn.functional.interpolate(self.up(x), scale_factor=2.0, mode="nearest")
        return x.flatten(1) if x.shape[1] == 4 else x


def compiles_for(model, shapes):
    """Compiles the model, runs it on a random input of each shape against eager; the number
    of graphs compiled after each call."""
    torch.manual_seed(0)
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    counts = []
    for shape in shapes:
        x = torch.randn(*shape)
        assert same(compiled(x), model(x), atol=1e-5), shape
        counts.append(counter.frame_count)
    return counts


def test_conv_pool_pad_and_interpolate_keep_the_batch_free_where_python_reads_the_spatial_sizes():
    torch.manual_seed(0)
    # New batch sizes: no compile; another height and width (those sizes were read): one.
    shapes = [(2, 3, 20, 20), (3, 3, 20, 20), (5, 3, 20, 20), (2, 3, 28, 28)]
    assert compiles_for(_Downsampler(), shapes) == [1, 1, 1, 2]


class _AudioEncoder(torch.nn.Module):
    """wav2vec2 in small: a GroupNorm'd conv feature encoder, heads split with
    view(*x.shape[:-1], -1, d), a class token split off with split([1, n]), and the attention's
    `q.shape[2] > 1` check (transformers' sdpa_attention): the sequence length is read into
    Python, the batch never is."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 16, 10, stride=5)
        self.norm = torch.nn.GroupNorm(16, 16)
        self.q = torch.nn.Linear(16, 16)

    def forward(self, audio):
        h = torch.nn.functional.gelu(self.norm(self.conv(audio[:, None]))).transpose(1, 2)
        cls, rest = torch.split(h, [1, h.shape[1] - 1], 1)
        q = self.q(rest).view(*rest.shape[:-1], -1, 4).transpose(1, 2)
        if q.shape[2] > 1:
            return q.mean(2) + cls.mean(1)[:, None, :4]
        return q.sum(2)


def test_group_norm_split_sections_and_a_views_rest_keep_the_batch_free():
    torch.manual_seed(0)
    # New batch sizes: no compile; a longer signal (its length was read): one.
    assert compiles_for(_AudioEncoder(), [(2, 160), (3, 160), (4, 160), (2, 200)]) == [1, 1, 1, 2]
