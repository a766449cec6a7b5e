"""Guard property test: generated functions reading state of many kinds, compiled with framejit
and called between generated mutations of that state, must match eager on an identical copy of
the state at every call (return values, exceptions, side effects). See guard_cases.py.

FRAMEJIT_GUARD_CASES=N sets how many cases run (default 2000), FRAMEJIT_GUARD_SEED the first
seed (default 0), FRAMEJIT_GUARD_KNOWN=1 also generates the open bugs' constructs and tolerates
none of them (by default they are left out or tolerated; each has an xfail test below with its
minimal case). The cases run in worker processes, so a crash is caught, shrunk and reported
with its source.
"""
import math
import os
import sys
import time
import types

import pytest
import torch

import framejit
from framejit.testing import CompileCounter

import guard_cases as gc
from guard_cases import F


def test_guard_properties():
    count = int(os.environ.get("FRAMEJIT_GUARD_CASES", "2000"))
    start = int(os.environ.get("FRAMEJIT_GUARD_SEED", "0"))
    known = os.environ.get("FRAMEJIT_GUARD_KNOWN", "") not in ("", "0")
    t0 = time.time()
    res = gc.run_batches(start, count, known=known)
    summary = res.summary() + f"\n  wall time {time.time() - t0:.1f}s"
    print(summary)
    assert res.ok(), res.report() + "\n\n" + summary
    assert res.stats["cases"] == count
    # the cases must exercise the cache, not only compile: most calls after the first reuse a region
    assert res.stats["counts"].get("region calls reusing a cached region", 0) > count // 2, summary


# ---------------------------------------------------------------------------------------------
# The harness itself


def test_cases_are_deterministic_and_exclude_open_bugs():
    for seed in range(200):
        a, b = gc.generate(seed), gc.generate(seed)
        assert gc.render(a) == gc.render(b) and a.mutations == b.mutations
        assert not (a.tags & gc.EXCLUDED), (seed, a.tags & gc.EXCLUDED)
    known = set()
    for seed in range(3000):
        known |= gc.generate(seed, known=True).tags
    assert gc.EXCLUDED - gc.TOLERATED <= known, gc.EXCLUDED - gc.TOLERATED - known


def _stale(fn, backend):
    """A deliberately wrong 'compiler': the first call's result is returned forever."""
    memo = []

    def call(*args, **kwargs):
        if not memo:
            memo.append(fn(*args, **kwargs))
        return memo[0]
    return call


def test_runner_catches_a_stale_cache_and_shrinks_it():
    caught = []
    for seed in range(30):
        case = gc.generate(seed)
        m = gc.run_case(case, compile_fn=_stale)
        if m is not None:
            caught.append((case, m))
    assert len(caught) >= 15, len(caught)
    case, m = max(caught, key=lambda cm: len(cm[0].body) + len(cm[0].mutations))
    small, sm = gc.shrink_mismatch(case, m, compile_fn=_stale)
    assert sm.kind == m.kind
    assert len(small.mutations) == 1 and len(small.body) <= 3, gc.describe(small, sm.text)
    assert len(small.body) + len(small.mutations) < len(case.body) + len(case.mutations)
    assert len(small.features) <= len(case.features)
    assert "def f(" in gc.describe(small, sm.text)


def test_worker_crash_is_caught_shrunk_and_reported(monkeypatch):
    monkeypatch.setenv(gc._CRASH_AT, "3")
    res = gc.run_batches(0, 6)
    assert [c["seed"] for c in res.crashes] == [3]
    report = res.report()
    assert "crash" in report and "def f(" in report and "crashed" in report
    assert res.stats["cases"] == 6  # the cases after the crash ran in a new worker


# ---------------------------------------------------------------------------------------------
# Minimal cases of the bugs (those of the brief, and those this test found). An open bug's test
# is xfail(strict): when its fix lands the test passes, the xfail fails, the marker goes and the
# construct leaves guard_cases.EXCLUDED. The fixed ones stay as regression tests.

X0 = F(name="x0", param="x0", arg="mk_t(1, (4,))")

K_SRC = """\
class K:
    def __init__(self, w):
        self.w = w

    def meth(self, v):
        return v * self.w
"""

M_SRC = """\
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = mk_lin(7)

    def forward(self, v):
        return self.lin(v)
"""


def _case(features, body, mutations=(), backend="eager"):
    return gc.Case(-1, backend, [X0] + list(features), list(body), [(m, "manual") for m in mutations])


def _check(case, tolerate=()):
    for backend in ("eager", "native"):
        c = case.replace(backend=backend)
        m = gc.run_case(c, excluded=set(tolerate))
        assert m is None, gc.describe(c, m.text)


# open ------------------------------------------------------------------------------------------

def test_new_bug_c_side_effect_before_an_exception_lost():
    _check(_case([F(name="o0", setup=K_SRC, param="o0", arg="K(1.0)", defines=["K"])],
                 ["o0.last = acc", "acc = acc.double() @ torch.ones(4, 4)"]))


def test_new_bug_e_try_except_around_an_op_that_raises_at_run_time():
    _check(_case([F(name="x1", param="x1", arg="mk_t(2, (4,), 'int64')")],
                 ["try:\n    x1.mul_(0.5)\nexcept RuntimeError:\n    py = py + 1"]))


def test_new_bug_g_guards_fail_on_own_state_after_instance_forward_replaced():
    _check(_case([F(name="m0", setup=M_SRC, param="m0", arg="M()", defines=["M"])],
                 ["acc = m0(acc)"], ["A['m0'].forward = types.MethodType(alt_forward, A['m0'])", "pass"]))


# fixed -----------------------------------------------------------------------------------------

def test_known_bug_1_objects_aliased_at_run_time():
    k = F(name="o0", setup=K_SRC, param="o0", arg="K(0.0)", defines=["K"])
    _check(_case([k, F(name="o1", param="o1", arg="K(1.0)")],
                 ["o0.w = acc * 2", "acc = acc + o1.w"], ["A['o1'] = A['o0']"]))


def test_known_bug_2_plain_class_method_replaced():
    _check(_case([F(name="o0", setup=K_SRC, param="o0", arg="K(1.5)", defines=["K"])],
                 ["acc = o0.meth(acc)"], ["K.meth = alt_meth"]))


def test_known_bug_2_class_forward_replaced():
    _check(_case([F(name="m0", setup=M_SRC, param="m0", arg="M()", defines=["M"])],
                 ["acc = m0(acc)"], ["M.forward = alt_forward"]))


def test_known_bug_3_globals_with_the_same_name():
    x = torch.ones(3)
    mods = []
    for value in (1.0, 5.0):
        m = types.ModuleType("guard_same_name")
        exec("G = 0.0\nW = None\ndef g(x):\n    global W\n    W = x + G\n    return x + G\n", m.__dict__)
        m.G = value
        mods.append(m)
    sys.modules["guard_same_name"] = mods[0]
    try:
        compiled = [framejit.compile(m.g) for m in mods]
        for m, c in zip(mods, compiled):
            assert torch.equal(c(x), x + m.G) and torch.equal(m.W, x + m.G)
        shared = framejit.compile(types.FunctionType(mods[0].g.__code__, mods[1].__dict__))
        assert torch.equal(shared(x), x + 5.0)
    finally:
        sys.modules.pop("guard_same_name", None)


def test_known_bug_4_inference_tensor():
    _check(_case([], ["if x0.is_inference():\n    py = py + 100"], ["A['x0'] = as_inference(A['x0'])"]))


def test_known_bug_5_instance_forward_replaced():
    _check(_case([F(name="m0", setup=M_SRC, param="m0", arg="M()", defines=["M"])],
                 ["acc = m0(acc)"], ["A['m0'].forward = types.MethodType(alt_forward, A['m0'])"]))


def test_known_bug_6_float_argument_negative_zero():
    _check(_case([F(name="r0", param="r0", arg="0.0")],
                 ["py = py + math.copysign(1.0, r0)"], ["A['r0'] = -0.0"]))


def test_known_bug_6_float_argument_nan_compiles_once():
    counter = CompileCounter()

    def fn(x, r):
        return x * 2 if math.isnan(r) else x

    compiled = framejit.compile(fn, backend=counter)
    for _ in range(4):
        assert torch.equal(compiled(torch.ones(2), float("nan")), torch.full((2,), 2.0))
    assert counter.frame_count == 1


def test_new_bug_a_function_code_replaced():
    helpers = "def ha(v):\n    return v * 2\n\n\ndef hb(v):\n    return v - 1\n\n\nG_f = ha\n"
    _check(_case([F(name="G_f", setup=helpers, defines=["ha", "hb"])],
                 ["py = py + G_f(1)"], ["ha.__code__ = hb.__code__"]))


def test_new_bug_b_list_concatenation_shared_between_calls():
    _check(_case([F(name="G_l", setup="G_l = []\n")], ["G_l = G_l + [0.5]"], ["G_l.clear()"]))


def test_new_bug_d_instance_attribute_shadows_method():
    _check(_case([F(name="o0", setup=K_SRC, param="o0", arg="K(1.5)", defines=["K"])],
                 ["acc = o0.meth(acc)"], ["A['o0'].meth = lambda v: v - 1"]))


def test_new_bug_f_is_inference_inside_inference_mode():
    # x1 is first read inside the block (x0 is read before it, by `acc = x0 * 1`)
    _check(_case([F(name="x1", param="x1", arg="mk_t(2, (4,))")],
                 ["with torch.inference_mode():\n    if x1.is_inference():\n        py = py + 100"]))
