"""Code written with einops (rearrange / repeat / reduce / einsum / pack / unpack and its layers),
traced through as torch.compile traces it (einops 0.8.2 registers nothing for torch >= 2.8):
one graph, eager's results, a new batch size without a compile for framejit's own backends, and
as many graphs as torch.compile."""
import pytest
import torch
import torch.nn as nn

einops = pytest.importorskip("einops")
from einops import pack, rearrange, reduce, repeat, unpack  # noqa: E402
from einops.layers.torch import Rearrange, Reduce  # noqa: E402

import framejit  # noqa: E402
from framejit.testing import CompileCounter, regions, same  # noqa: E402


def attention(x, w, heads):
    q, k, v = rearrange(x @ w, "b n (three h d) -> three b h n d", three=3, h=heads)
    scores = einops.einsum(q, k, "b h i d, b h j d -> b h i j").softmax(-1)
    out = rearrange(scores @ v, "b h n d -> b n (h d)")
    pooled = reduce(out, "b n c -> b c", "mean")
    return pooled + repeat(out[:, 0], "b c -> b r c", r=2).sum(1)


def packed(x, cls):
    tokens, shapes = pack([cls, x], "b * c")
    tokens = tokens * 2
    cls_out, x_out = unpack(tokens, shapes, "b * c")
    return cls_out.squeeze(1) + x_out.mean(1)


def torch_compile_graphs(fn, calls):
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter as DynamoCounter
    torch._dynamo.reset()
    counter = DynamoCounter()
    compiled = torch.compile(fn, backend=counter)
    for args in calls:
        compiled(*args)
    torch._dynamo.reset()
    return counter.frame_count


def test_rearrange_repeat_reduce_and_einsum_are_one_graph():
    w = torch.randn(16, 48)
    calls = [(torch.randn(2, 5, 16), w, 4), (torch.randn(2, 5, 16), w, 4), (torch.randn(3, 5, 16), w, 4)]
    counter = CompileCounter()
    # (framejit.compile makes einops' torch backend first, as torch.compile does: traced, its
    # first call would break where einops makes it.)
    compiled = framejit.compile(attention, backend=counter)
    for args in calls:
        assert same(compiled(*args), attention(*args), atol=1e-5)
    # One graph, which the new batch size runs too (torch.compile: a second, symbolic one).
    assert counter.frame_count == 1 < torch_compile_graphs(attention, calls)
    assert [r["exit"] for r in regions(attention)] == ["return"]
    code = counter.graphs[0].code
    assert "einops" not in code and ("permute" in code or "transpose" in code)


def test_pack_and_unpack_are_one_graph():
    x, cls = torch.randn(2, 6, 8), torch.randn(2, 8)
    counter = CompileCounter()
    assert same(framejit.compile(packed, backend=counter)(x, cls), packed(x, cls))
    assert counter.frame_count == 1


def test_einops_layers_in_a_module_are_one_graph():
    torch.manual_seed(0)
    model = nn.Sequential(
        Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=2, p2=2),
        nn.Linear(12, 16),
        Reduce("b n c -> b c", "max"),
        nn.Linear(16, 4),
    )
    images = torch.randn(2, 3, 8, 8)
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    assert same(compiled(images), model(images), atol=1e-6)
    assert same(compiled(torch.randn(5, 3, 8, 8)).shape, torch.Size([5, 4]))
    assert counter.frame_count == 1
