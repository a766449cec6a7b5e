"""Every internal fault falls back to plain Python with one warning and eager's result: faults
injected into the tracer (at several points of the trace), the export of a region to a
GraphModule and the backend call, over the model zoo (framejit.testing.inject_fault)."""
import sys
import warnings
from pathlib import Path

import pytest
import torch

import framejit
from framejit.testing import inject_fault, same

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.zoo import ZOO, run_seeded  # noqa: E402

FAULTS = [("trace", 1), ("trace", 7), ("trace", 40), ("export", 1), ("backend", 1)]


@pytest.mark.parametrize("site,n", FAULTS, ids=[f"{s}{n}" for s, n in FAULTS])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_an_injected_fault_falls_back_with_one_warning(name, site, n):
    cls = ZOO[name]
    torch.manual_seed(0)
    model = cls().eval()
    args = cls.example(2)
    expected = run_seeded(model, args)
    compiled = framejit.compile(model, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with inject_fault(site, n) as fired:
            out = run_seeded(compiled, args)
            did_fire = fired()
    ours = [w for w in caught if issubclass(w.category, framejit.FramejitWarning)]
    assert same(out, expected, atol=1e-5)
    assert len(ours) == (1 if did_fire else 0), [str(w.message) for w in ours]
    if did_fire:
        assert "plain Python" in str(ours[0].message)
    # And later calls (the fallback is sticky, or the next trace compiles): still eager's.
    assert same(run_seeded(compiled, args), expected, atol=1e-5)


def test_the_environment_variable_arms_a_fault():
    import subprocess

    program = ("import warnings, torch, framejit\n"
               "warnings.simplefilter('always')\n"
               "f = framejit.compile(lambda x: x * 2 + 1, backend='eager')\n"
               "with warnings.catch_warnings(record=True) as w:\n"
               "    warnings.simplefilter('always')\n"
               "    print(f(torch.ones(2)).tolist(), len(w))\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={**__import__("os").environ, "FRAMEJIT_INJECT_FAULT": "backend:1"},
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[3.0, 3.0] 1"
