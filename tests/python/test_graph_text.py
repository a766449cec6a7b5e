"""Printed graphs compared with expected text (tests/python/expected/*.txt).

After a deliberate change to the printer or the tracer, rewrite the expected files on every
installed Python with `bash scripts/accept_goldens.sh` and review the diff (goldens.py: a version
whose text differs gets a file of its own)."""

import os

import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit.testing import CompileCounter, normalize_graph, regions, same

from goldens import check_expected


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


def test_seed_demo_prints_the_expected_graphs_on_every_version():
    # The README's first command: the demo's printed graphs and breaks, the same text on every
    # supported Python (a version whose bytecode changes them gets its own expected file).
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(root / "examples" / "seed.py")], capture_output=True,
        text=True, timeout=300, cwd=root,
        env={**os.environ, "FRAMEJIT_LOGS": "graph_code,graph_breaks"})
    assert done.returncode == 0, done.stderr[-2000:]
    text = (done.stdout + done.stderr).replace(str(root) + os.sep, "")
    assert text.count("===== __compiled_fn_") >= 4
    check_expected("seed_demo", text)


def test_a_version_file_overrides_the_shared_one_and_accept_keeps_only_differences(
        tmp_path, monkeypatch):
    import goldens
    monkeypatch.setattr(goldens, "EXPECTED", tmp_path)
    shared, own = goldens.expected_paths("g")
    monkeypatch.setenv("FRAMEJIT_ACCEPT", "1")
    check_expected("g", "shared text")
    monkeypatch.setenv("FRAMEJIT_ACCEPT", "own")
    check_expected("g", "shared text")
    assert shared.read_text() == "shared text" and not own.exists()
    check_expected("g", "this version's text")
    assert own.read_text() == "this version's text" and own.name == f"g.{goldens.VERSION_TAG}.txt"
    monkeypatch.delenv("FRAMEJIT_ACCEPT")
    check_expected("g", "this version's text")
    with pytest.raises(AssertionError):
        check_expected("g", "shared text")
    own.unlink()
    check_expected("g", "shared text")
