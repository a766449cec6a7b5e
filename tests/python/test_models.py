"""The model zoo (tests/models/zoo.py) compiled with framejit: forward and gradients equal eager,
in train and eval mode, one graph each, no recompile on a second call."""
import copy
import sys
from pathlib import Path

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions, same

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.zoo import ZOO, backward_and_compare_gradients  # noqa: E402
from models.zoo import run_seeded as run  # noqa: E402


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_model_forward_and_gradients_match_eager(name, training):
    torch.manual_seed(1)
    eager = ZOO[name]().train(training)
    model = copy.deepcopy(eager)
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    args = ZOO[name].example(batch=3)

    out = run(compiled, args)
    ref = run(eager, args)
    assert same(out, ref, rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1, [r["reason"] for r in regions(type(model).forward)]

    if any(p.requires_grad for p in model.parameters()):
        backward_and_compare_gradients(model, eager, out, ref)
    # buffers (BatchNorm running statistics) evolve as in eager
    for (bname, b), c in zip(model.named_buffers(), eager.buffers()):
        assert same(b, c, rtol=1e-5, atol=1e-6), bname

    again = ZOO[name].example(batch=3)
    assert same(run(compiled, again), run(eager, again), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1


# The LSTM loop's `xs.shape[1]` and the GPT block's `batch, time, channels = x.shape` flow into
# torch calls (new_zeros, view): they stay graph values. The GPT block's
# `split(channels, dim=2)` needs its number of results, which depends on x.size(2) (channels)
# and qkv's last size (the weight's): only those are guarded, so a new batch size runs the same
# graph. With dynamic=False each batch size traces again.


@pytest.mark.parametrize("dynamic", [None, False], ids=["default", "dynamic=False"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_model_new_batch_size(name, dynamic):
    model = ZOO[name]().eval()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter, dynamic=dynamic)
    for batch in (2, 5, 2, 7):
        args = ZOO[name].example(batch)
        assert same(run(compiled, args), run(model, args), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == (3 if dynamic is False else 1)


def test_gpt_block_graph_has_no_break_and_reads_parameters_by_source():
    model = ZOO["gpt_block"]().eval()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    compiled(*ZOO["gpt_block"].example(2))
    placeholders = [n.name for n in counter.graphs[0].graph.nodes if n.op == "placeholder"]
    assert "self_attn_qkv_weight" in placeholders and "self_ln1_weight" in placeholders
    assert [r["exit"] for r in regions(type(model).forward)] == ["return"]
