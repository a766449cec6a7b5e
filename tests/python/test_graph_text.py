"""Printed graphs compared with expected text (tests/python/expected/*.txt).

After a deliberate change to the printer or the tracer, rewrite the expected files with
    FRAMEJIT_ACCEPT=1 bash scripts/run_tests.sh tests/python/test_graph_text.py
and review the diff."""
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit.testing import CompileCounter, normalize_graph, regions, same

EXPECTED = Path(__file__).parent / "expected"


def check_expected(name: str, text: str) -> None:
    path = EXPECTED / f"{name}.txt"
    if os.environ.get("FRAMEJIT_ACCEPT") == "1":
        path.write_text(text)
        return
    assert path.exists(), f"{path} missing: run with FRAMEJIT_ACCEPT=1 to create it"
    assert text == path.read_text()


def seed_straight_line(inputs):
    x = inputs["x"]
    y = inputs["y"]
    x = torch.add(x, 0.5)
    z = x * y
    return z, x.mean() > 0.5


def mlp_block(x, w1, b1, w2):
    h = F.gelu(F.linear(x, w1, b1))
    parts = h.chunk(2, dim=-1)
    out = torch.cat([parts[1], parts[0]], dim=-1) @ w2
    out += 1
    return {"out": out, "norm": out.norm(dim=-1, keepdim=True)}


@pytest.mark.parametrize("fn,make_args", [
    (seed_straight_line, lambda: ({"x": torch.randn(4, 4), "y": torch.randn(4, 4)},)),
    (mlp_block, lambda: (torch.randn(2, 8), torch.randn(6, 8), torch.randn(6), torch.randn(6, 3))),
], ids=["seed_straight_line", "mlp_block"])
def test_printed_graph_matches_expected_text(fn, make_args):
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    args = make_args()
    assert same(compiled(*args), fn(*args))
    assert counter.frame_count == 1
    check_expected(fn.__name__, normalize_graph(regions(compiled)[0]["graph"]))


def test_printed_graph_is_the_logged_graph(caplog):
    import logging
    framejit.set_logs("graph_code", handler=False)
    compiled = framejit.compile(seed_straight_line, backend=CompileCounter())
    with caplog.at_level(logging.INFO, logger="framejit"):
        compiled({"x": torch.randn(4, 4), "y": torch.randn(4, 4)})
    logged = [r.getMessage() for r in caplog.records if r.name == "framejit.graph_code"]
    assert len(logged) == 1
    assert logged[0].startswith("TRACED GRAPH\n ===== __compiled_fn_")
    assert logged[0].endswith(regions(compiled)[0]["graph"])


def test_fx_code_of_the_exported_graph_runs_the_same_ops():
    counter = CompileCounter()
    compiled = framejit.compile(seed_straight_line, backend=counter)
    compiled({"x": torch.randn(4, 4), "y": torch.randn(4, 4)})
    gm = counter.graphs[0]
    ops = [n.op for n in gm.graph.nodes]
    assert ops == ["placeholder", "placeholder", "call_function", "call_function",
                   "call_method", "call_function", "output"]
    assert all("example_value" in n.meta for n in gm.graph.nodes if n.op != "output")
    gm.graph.lint()
