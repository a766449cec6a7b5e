"""Per-dimension size guards: a size read into Python pins only the input sizes it is computed
from (DESIGN.md, "Shapes, guards"). Each case runs a function on several input shapes, checks
every result against eager and counts graphs: a shape that keeps the pinned sizes runs the same
graph, one that changes them traces again (and must, or the result would be wrong)."""
import logging

import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit.testing import CompileCounter, same


def count_graphs(fn, calls):
    """Compiles fn and calls it once per entry of `calls` (a tuple of argument shapes each; an
    int shape stands for a tensor of that many random integers below 10), each result checked
    against eager. Returns the number of graphs traced."""
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    for shapes in calls:
        args = [torch.randint(0, 10, (s,)) if isinstance(s, int) else torch.randn(*s)
                for s in shapes]
        assert same(compiled(*args), fn(*args)), shapes
    return counter.frame_count


def loop_over(n, y):
    for i in range(n):  # range() needs the number: the size is pinned
        y = y + i
    return y


def range_of_dim1(x):
    return loop_over(x.size(1), x.relu())


def view_rest_then_branch(x):
    y = x.view(2, -1)  # the -1 is x.numel() / 2: every size of x
    return y * 2 if y.size(1) > 5 else y


def broadcast_rows(x, b):
    y = x + b
    return loop_over(y.size(0), y)


def broadcast_cols(x, b):
    y = x + b
    return loop_over(y.size(1), y)


def linear_out(x, w):
    y = F.linear(x, w)
    return loop_over(y.size(-1), y)


def matmul_rows(a, b):
    y = a @ b
    return loop_over(y.size(-2), y)


def transposed(x):
    y = x.transpose(0, 1)
    return loop_over(y.size(0), y)


def permuted(x):
    y = x.permute(2, 0, 1)
    return loop_over(y.size(0), y)


def last_step(x):
    y = x[:, -1]
    return loop_over(y.size(0), y)


def new_axis_sliced(x):
    y = x[..., None, 1:]
    return loop_over(y.size(-1), y)


def concatenated(x):
    y = torch.cat([x, x], 0)
    return loop_over(y.size(0), y)


def stacked(x):
    y = torch.stack([x, x], 1)
    return loop_over(y.size(1), y)


def split_pieces(x):
    return sum(piece.sum() for piece in x.split(2, dim=1))


def unbound(x):
    return [row * 2 for row in x.unbind(1)]


def chunk_width(x):
    a, b = x.chunk(2, dim=1)
    return loop_over(a.size(1), a - b)


def unsqueezed_in_place(x):
    y = x.clone()
    y.unsqueeze_(0)  # y's sizes are no longer those of the node that made it
    return loop_over(y.size(1), y)


def expanded(x):
    y = x.expand(4, -1)
    return loop_over(y.size(0), y) + loop_over(y.size(1), y)


def reshaped_by_size(x):
    y = x.reshape(x.size(0) * 2, -1)
    return loop_over(y.size(0), y)


def attention_length(q, k, v):
    y = F.scaled_dot_product_attention(q, k, v)
    return loop_over(y.size(-2), y)


def embedded(idx, weight):
    y = F.embedding(idx, weight)
    return loop_over(y.size(-1), y)


def numel_branch(x):
    return x * 2 if x.numel() > 12 else x * 3


CASES = [
    # (function, calls, graphs): the shapes in each call, the number of graphs traced
    (range_of_dim1, [((2, 3),), ((5, 3),), ((5, 4),)], 2),
    (view_rest_then_branch, [((4, 6),), ((8, 6),), ((4, 6),), ((4, 3),)], 3),
    (broadcast_rows, [((3, 5), (1, 5)), ((4, 5), (1, 5)), ((3, 5), (3, 5))], 3),
    (broadcast_cols, [((3, 5), (1, 5)), ((7, 5), (1, 5)), ((7, 6), (1, 6))], 2),
    (linear_out, [((2, 4), (3, 4)), ((7, 4), (3, 4)), ((7, 4), (5, 4))], 2),
    (matmul_rows, [((2, 3, 4), (4, 5)), ((6, 3, 4), (4, 7)), ((6, 2, 4), (4, 7))], 2),
    (transposed, [((2, 3),), ((4, 3),), ((4, 5),)], 2),
    (permuted, [((2, 3, 4),), ((5, 6, 4),), ((5, 6, 3),)], 2),
    (last_step, [((2, 3, 4),), ((2, 5, 6),), ((3, 5, 6),)], 2),
    (new_axis_sliced, [((2, 3, 4),), ((5, 6, 4),), ((5, 6, 7),)], 2),
    (concatenated, [((2, 3),), ((2, 7),), ((3, 7),)], 2),
    (stacked, [((2, 3),), ((5, 7),)], 1),
    (split_pieces, [((3, 4),), ((6, 4),), ((3, 5),), ((6, 5),)], 2),
    (unbound, [((2, 3),), ((5, 3),), ((5, 4),)], 2),
    (chunk_width, [((2, 4),), ((3, 4),), ((3, 6),)], 2),
    (unsqueezed_in_place, [((2, 3),), ((4, 3),)], 2),
    (expanded, [((1, 3),), ((1, 5),)], 2),
    (reshaped_by_size, [((2, 6),), ((2, 8),), ((3, 6),)], 2),
    (attention_length, [((2, 2, 3, 4),) * 3, ((5, 2, 3, 4),) * 3,
                        ((2, 2, 4, 4), (2, 2, 3, 4), (2, 2, 3, 4))], 2),
    (embedded, [(3, (10, 4)), (7, (10, 4)), (7, (10, 6))], 2),
    # numel() <= 12 holds on the box size(0) <= 2, size(1) <= 6: (2, 5) runs the first graph
    (numel_branch, [((2, 6),), ((3, 6),), ((2, 5),)], 2),
]


@pytest.mark.parametrize("fn, calls, graphs", CASES, ids=[c[0].__name__ for c in CASES])
def test_only_the_sizes_read_are_guarded(fn, calls, graphs):
    assert count_graphs(fn, calls) == graphs


def test_dynamic_false_still_guards_every_size():
    counter = CompileCounter()
    compiled = framejit.compile(range_of_dim1, backend=counter, dynamic=False)
    for shape in ((2, 3), (5, 3)):
        x = torch.randn(*shape)
        assert same(compiled(x), range_of_dim1(x))
    assert counter.frame_count == 2


def test_module_weight_size_is_guarded_not_the_batch():
    layer = torch.nn.Linear(4, 3)

    def fn(x):
        y = layer(x)
        return loop_over(y.size(-1), y)

    assert count_graphs(fn, [((2, 4),), ((9, 4),), ((1, 4),)]) == 1


def test_guards_log_names_the_pinned_dimension(caplog):
    framejit.set_logs("guards", "recompiles", handler=False)
    try:
        with caplog.at_level(logging.INFO, logger="framejit"):
            assert count_graphs(range_of_dim1, [((2, 3),), ((5, 3),), ((5, 4),)]) == 2
    finally:
        framejit.set_logs()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "(any sizes of this rank with size(1) = 3)" in text
    assert "size(1) changed: expected 3, got 4" in text
    assert "sizes specialised where shown" in text


def arange_after_break(x, n):
    y = x + 1
    print("", end="")  # a break: the next region starts mid-frame, where n is not specialised
    z = torch.arange(n * 0.5)  # a run-time float decides z's size
    return loop_over(len(z), y), z


def test_run_time_float_that_decides_a_read_size_is_guarded():
    counter = CompileCounter()
    compiled = framejit.compile(arange_after_break, backend=counter)
    x = torch.randn(3)
    for n in (4, 4, 7, 4):
        assert same(compiled(x, n), arange_after_break(x, n)), n
    # the first region once, the second once per value of n (the float is a graph input)
    assert counter.frame_count == 3


def split_by_keyword(x):
    return x * len(torch.split(x, split_size_or_sections=x.size(0), dim=1))


def chunks_by_keyword(x):
    return x * len(x.chunk(chunks=x.size(0), dim=1))


def out_argument(a, b):
    x = torch.empty(0)
    torch.add(a, b, out=x)  # x is resized to a + b's shape
    return x + 1 if x.size(0) > 3 else x - 1


def squeezed_then_broadcast(x, w):
    z = x.squeeze(0) + w  # z's rank depends on x's first size
    return z + 1 if z.size(0) > 2 else z - 1


def squeezed_matmul(x, w):
    z = torch.matmul(w, x.squeeze(0))
    return z + 1 if z.size(0) > 2 else z - 1


def unsqueezed_in_place_then_broadcast(inp, w):
    x = inp * 2
    x.unsqueeze_(-1)
    z = x + w
    return z + 1 if z.size(0) > 3 else z - 1


# Found in review: each of these reused a graph whose pinned size had changed.
REVIEW_CASES = [
    (split_by_keyword, [((2, 6),), ((3, 6),)], 2),
    (chunks_by_keyword, [((2, 6),), ((3, 6),)], 2),
    (out_argument, [((4,), (4,)), ((2,), (2,))], 2),
    (squeezed_then_broadcast, [((1, 5), (1, 1)), ((3, 5), (1, 1))], 2),
    (squeezed_matmul, [((1, 4, 5), (1, 3, 4)), ((3, 4, 5), (1, 3, 4))], 2),
    (unsqueezed_in_place_then_broadcast, [((4,), (1, 5)), ((2,), (1, 5))], 2),
]


@pytest.mark.parametrize("fn, calls, graphs", REVIEW_CASES, ids=[c[0].__name__ for c in REVIEW_CASES])
def test_sizes_behind_keywords_out_and_rank_changes_are_guarded(fn, calls, graphs):
    assert count_graphs(fn, calls) == graphs


def rms_normalised_rows(x):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    z = y.sum(dim=(0, 2))  # reduced away: z's only size is x's dim 1
    return loop_over(y.size(1), y) + loop_over(z.size(0), z).sum()


def test_reductions_keep_the_input_sizes_they_keep():
    assert count_graphs(rms_normalised_rows, [((2, 3, 4),), ((5, 3, 6),), ((5, 4, 6),)]) == 2


# Library code (transformers' attention, rotary, MoE and cache code) reads sizes of tensors made
# from a module's parameters and buffers. Those sizes change only when the model does, so a
# product or sum of sizes may take them as the constants they are (pinned, and guarded): the
# batch and sequence sizes stay free. Each module below is one such pattern.
class HeadsView(torch.nn.Module):  # OPT: view(bsz, -1, heads, head_dim), then a length test
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        bsz = x.shape[0]
        q = self.q_proj(x).view(bsz, -1, 2, 4).transpose(1, 2)  # -1: T * 8 / (2 * 4)
        return q * 2 if q.shape[2] > 1 else q


class HeadsMerged(HeadsView):  # XGLM: reshape(bsz * heads, -1, head_dim) and a shape check
    def forward(self, x):
        b, t, _ = x.size()
        k = self.q_proj(x).view(b, t, 2, 4).transpose(1, 2).reshape(b * 2, -1, 4)
        if k.size() != (b * 2, t, 4):
            raise ValueError(f"unexpected {k.size()}")
        return k * 2 if k.shape[1] > 1 else k


class ShapeAsserted(HeadsView):  # ProphetNet, Longformer: list(size()) == [b, t, h] asserted
    def forward(self, x):
        b, t, h = x.size()
        assert list(x.size()) == [b, t, h], "unexpected shape"
        q = self.q_proj(x)
        return q * 2 if list(q.size()) != [b, t, 8] else q


def streams_chunked(x):  # ProphetNet: the main and predicted streams, cat along T, chunked back
    streams = torch.cat([x, x * 2, x * 3], dim=1).chunk(3, dim=1)  # 3 pieces, whatever T is
    main, rest = streams[0], streams[1:]
    return main + sum(rest), len(streams)


def streams_divided(x):  # ProphetNet's next layer: the length back as ngram_length // (1 + n)
    h = torch.cat([x, x * 2, x * 3], dim=1)
    t = h.size(1) // 3
    return [c.sum() for c in h.view(x.size(0), 3 * t, x.size(2)).chunk(3, dim=1)]


def length_chunked(x):  # chunk(3) of a length T: as many pieces as T allows (up to 3)
    return [p.sum() for p in x.chunk(3, dim=1)]


class QkvChunks(torch.nn.Module):  # DeBERTa: position table slice, view(size()[:-1] + (h, -1)), chunk
    def __init__(self):
        super().__init__()
        self.in_proj = torch.nn.Linear(8, 24)
        self.positions = torch.nn.Embedding(32, 8)
        self.register_buffer("position_ids", torch.arange(32).expand((1, -1)), persistent=False)

    def forward(self, x):
        h = x + self.positions(self.position_ids[:, : x.shape[1]])
        qp = self.in_proj(h)
        q, k, v = qp.view(qp.size()[:-1] + (2, -1)).permute(0, 2, 1, 3).chunk(3, dim=-1)
        return q * k + v


class Rotary(torch.nn.Module):  # Helium, GLM, Cohere: repeat_interleave'd frequencies, rotate_half
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4)))

    def forward(self, x):
        t = torch.arange(x.shape[1], dtype=torch.float32)
        emb = (t[:, None] * self.inv_freq[None, :]).repeat_interleave(2, dim=-1)
        y = x * emb.cos()
        rotated = torch.stack((-y[..., 1::2], y[..., 0::2]), dim=-1).flatten(-2)
        out = y + rotated * emb.sin()
        if out.shape[-1] == x.shape[-1] <= 256:  # sdpa's head-size test
            return out
        return out * 0


class Experts(torch.nn.Module):  # MoE: weights picked per token, bmm, squeeze, chunk into gate, up
    def __init__(self):
        super().__init__()
        self.gate_up = torch.nn.Parameter(torch.randn(4, 6, 8))

    def forward(self, x):
        idx = torch.zeros(x.shape[0], dtype=torch.long)
        out = torch.bmm(self.gate_up[idx], x.unsqueeze(-1)).squeeze(-1)
        gate, up = out.chunk(2, dim=-1)
        return gate.sigmoid() * up


class CacheFirstUpdate(torch.nn.Module):  # T5's cache: keys cat onto torch.tensor([]), numel() == 0
    def __init__(self):
        super().__init__()
        self.k = torch.nn.Linear(4, 4)

    def forward(self, x):
        keys = torch.cat([torch.tensor([]), self.k(x)], dim=-2)
        if keys.numel() == 0:
            return x
        return keys * 2


class PositionTable(torch.nn.Module):  # XGLM: grows its table when 2 + T passes its length
    def __init__(self):
        super().__init__()
        self.register_buffer("weights", torch.randn(16, 4))

    def forward(self, x):
        max_pos = 2 + x.shape[1]
        if not torch.is_tensor(max_pos) and max_pos > self.weights.size(0):
            return x * 2
        return x + self.weights[2:max_pos]


def padded_mask(x):  # BioGPT: a mask of ones, padded by a walrus-assigned length
    b, t = x.shape[:2]
    mask = torch.ones(b, 0 + t)
    if (pad := t - mask.shape[-1]) > 0:
        mask = F.pad(mask, (0, pad))
    return x * mask[..., None]


def numpy_flatten(x):  # older model code: x.view(x.size(0), np.prod(x.shape[1:])) before a Linear
    import numpy as np
    n = np.prod(x.shape[1:])
    assert type(n) is np.int64  # NumPy's scalar, as eager's
    return x.view(x.size(0), n) * 2


def input_heads_view(x):  # the input's own sizes are never taken as constants
    q = x.view(x.shape[0], -1, 4, 2).transpose(1, 2)  # -1: T * H / 8, H an input size
    return q * 2 if q.shape[2] > 1 else q


SEQUENCES = [((2, 5, 8),), ((3, 9, 8),), ((4, 7, 8),)]
LIBRARY_CASES = [
    (HeadsView(), SEQUENCES + [((4, 1, 8),)], 2),  # T = 1 takes the other branch
    (HeadsMerged(), SEQUENCES + [((4, 1, 8),)], 2),
    (ShapeAsserted(), SEQUENCES, 1),
    (streams_chunked, SEQUENCES + [((2, 0, 8),)], 1),
    (streams_divided, SEQUENCES, 1),
    (length_chunked, [((2, 5, 8),), ((2, 2, 8),), ((2, 5, 8),), ((2, 9, 8),)], 3),
    (QkvChunks(), SEQUENCES, 1),
    (Rotary(), [((2, 5, 4),), ((3, 9, 4),), ((1, 2, 4),)], 1),
    (Experts(), [((3, 8),), ((5, 8),), ((9, 8),)], 1),
    (CacheFirstUpdate(), [((2, 3, 4),), ((5, 7, 4),)], 1),
    (PositionTable(), [((2, 3, 4),), ((3, 9, 4),), ((2, 14, 4),), ((2, 15, 4),)], 2),
    (padded_mask, SEQUENCES, 1),
    (input_heads_view, SEQUENCES, 3),
    (numpy_flatten, [((2, 5, 8),), ((3, 5, 8),), ((3, 6, 8),)], 2),  # the batch is free
]


@pytest.mark.parametrize("fn, calls, graphs", LIBRARY_CASES,
                         ids=[getattr(c[0], "__name__", type(c[0]).__name__) for c in LIBRARY_CASES])
def test_module_state_sizes_leave_batch_and_length_free(fn, calls, graphs):
    assert count_graphs(fn, calls) == graphs


def test_a_module_state_size_taken_as_a_constant_is_guarded(caplog):
    model = HeadsView()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    framejit.set_logs("guards", handler=False)
    try:
        with caplog.at_level(logging.INFO, logger="framejit"):
            x = torch.randn(2, 1, 8)  # one row per head: the `else` branch, with a range guard on T
            assert same(compiled(x), model(x))
    finally:
        framejit.set_logs()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "_parameters['weight'].size(0): a module's parameter or buffer size" in text
    # A wider projection: view(bsz, -1, 2, 4) now makes 2 rows per head for the same input, so
    # the `> 1` branch; only the pinned weight size tells the graph is stale.
    model.q_proj.weight = torch.nn.Parameter(torch.randn(16, 8))
    model.q_proj.bias = torch.nn.Parameter(torch.randn(16))
    assert same(compiled(x), model(x))
    assert counter.frame_count == 2


# A custom op (torch.library) has no rule of framejit's: its fake implementation says how its
# result's sizes follow from its arguments' (run once on symbolic sizes).
@torch.library.custom_op("framejit_test::rows_times", mutates_args=())
def rows_times(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w if x.size(1) > 2 else x[:1] @ w


@rows_times.register_fake
def _(x, w):
    assert x.size(1) == w.size(0)
    return x.new_empty(x.size(0) if x.size(1) > 2 else 1, w.size(1))  # its rows: x's, if wide


def chunks_a_custom_op(x, w):
    a, b = rows_times(x, w).chunk(2, dim=-1)  # the count needs w.size(1) only
    return a * b


def chunks_custom_op_rows(x, w):
    return [t.sum() for t in rows_times(x, w).chunk(2, dim=0)]  # x.size(0), if x.size(1) > 2


def test_a_custom_op_takes_its_size_rule_from_its_fake_implementation():
    w = torch.randn(4, 6)
    assert count_graphs(lambda x: chunks_a_custom_op(x, w), [((2, 4),), ((3, 4),), ((5, 4),)]) == 1
    # The rows chunked are x's: a new batch chunks differently (a new graph) ...
    assert count_graphs(lambda x: chunks_custom_op_rows(x, w), [((2, 4),), ((4, 4),), ((2, 4),)]) == 2
    # ... and the width the fake implementation compared is pinned with them.
    w2 = torch.randn(2, 6)
    assert count_graphs(lambda x: chunks_custom_op_rows(x, w2), [((4, 2),), ((4, 2),)]) == 1


def test_a_custom_op_prints_as_its_operator():
    from framejit.testing import regions
    compiled = framejit.compile(chunks_a_custom_op, backend=CompileCounter())
    x, w = torch.randn(2, 4), torch.randn(4, 6)
    assert same(compiled(x, w), chunks_a_custom_op(x, w))
    graph = regions(chunks_a_custom_op)[0]["graph"]
    assert 'rows_times: "f32[2, 6]" = torch.ops.framejit_test.rows_times.default(x, w)' in graph, graph
