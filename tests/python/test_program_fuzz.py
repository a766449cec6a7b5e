"""The program fuzzer (tests/python/fuzz_programs.py) as a test: random functions mixing tensor
ops, data-dependent branches, loops, .item(), containers, closures, in-place ops, attribute and
global writes, try/except, early returns and print, each run eagerly and compiled with the
"eager" and the "native" backend (three calls: twice on the same inputs, once on others), and
compared call by call. Programs run in forked children of a subprocess, so a crash is found,
isolated and reported with its program; every failure is shrunk to a small program that the
failure message shows.

FRAMEJIT_FUZZ_PROGRAMS=N sets the number of programs (each run with both backends; default
2000), FRAMEJIT_FUZZ_SEED the first seed (default 0), FRAMEJIT_FUZZ_JOBS how many subprocesses
run side by side (default 1). FRAMEJIT_FUZZ_ALL=1 also generates the constructs left out
because of known bugs (fuzz_programs.EXCLUDE). By hand, with a report on stdout:
``python3 tests/python/fuzz_programs.py --count 10000 --jobs 2``.
"""
import os
import time

import pytest

import fuzz_programs as fuzz

BACKENDS = ("eager", "native")
DEFAULT_PROGRAMS = 2000


def _env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value else default


@pytest.fixture(scope="module")
def campaign():
    count = _env_int("FRAMEJIT_FUZZ_PROGRAMS", DEFAULT_PROGRAMS)
    seed = _env_int("FRAMEJIT_FUZZ_SEED", 0)
    jobs = _env_int("FRAMEJIT_FUZZ_JOBS", 1)
    started = time.monotonic()
    c = fuzz.Campaign(range(seed, seed + count), BACKENDS, jobs=jobs).run()
    c.seconds = time.monotonic() - started
    return c


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_programs_match_eager(campaign, backend):
    failures = campaign.for_backend(backend)
    if failures:
        groups = {}
        for f in failures:
            groups.setdefault(f.sig, []).append(f)
        text = [f"{len(failures)} of {len(campaign.seeds)} programs fail with backend {backend!r} "
                f"(seeds {campaign.seeds[0]}..{campaign.seeds[-1]}); one line per distinct "
                "failure, then its program shrunk (rerun one seed: FRAMEJIT_FUZZ_SEED=s "
                "FRAMEJIT_FUZZ_PROGRAMS=1):"]
        for sig, group in groups.items():
            text.append(f"\n== {sig}: seeds {[f.seed for f in group][:20]}")
            text.append(group[0].report())
        pytest.fail("\n".join(text), pytrace=False)
    assert campaign.ok + campaign.invalid == len(campaign.seeds)
    # The generated programs are meant to run: eager timing out is a generator fault.
    assert campaign.invalid <= len(campaign.seeds) // 100 + 1


def test_generator_is_deterministic_and_valid():
    for seed in range(300):
        source = fuzz.generate(seed)
        assert source == fuzz.generate(seed)
        compile(source, f"<fuzz {seed}>", "exec")
    assert len({fuzz.generate(s) for s in range(50)}) == 50


def test_a_wrong_result_is_found_and_shrunk():
    """The comparison and the shrinker on a backend that is wrong for one op: graphs with
    a `mul` get their first output off by one."""
    import torch

    def off_by_one(gm, example_inputs):
        muls = any("mul" in str(n.target) for n in gm.graph.nodes)

        def run(*args):
            out = gm.forward(*args)
            if muls and isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor):
                out = type(out)([out[0] + 1, *out[1:]])
            return out
        return run

    source = fuzz.PRELUDE + (
        "\ndef f(x, y, obj):\n"
        "    global G_n, G_f, G_t, G_list\n"
        "    t1 = torch.sin(x)\n"
        "    obj.count += 1\n"
        "    print('a')\n"
        "    t2 = t1 * 2.0\n"
        "    v3 = y + 1\n"
        "    return t2 + v3\n")
    status, failures = fuzz.check_program(source, 0, [off_by_one])
    assert status == "fail" and "mismatch:return" in failures[0]["sig"]
    sig = failures[0]["sig"]

    def still_fails(src):
        _, found = fuzz.check_program(src, 0, [off_by_one])
        return any(f["sig"] == sig for f in found)

    minimal, _ = fuzz.shrink(source, still_fails)
    body = fuzz.function_text(minimal)
    assert "*" in body and "obj.count" not in body and "print" not in body, body


def test_a_crash_is_isolated_and_shrunk():
    """A child that dies on one program of a batch: the campaign names that seed, the others
    still run, and a program that segfaults shrinks to the statement that does it."""
    c = fuzz.Campaign(range(6), BACKENDS, batch=6, inject_crash=3).run()
    assert [(f.seed, f.sig) for f in c.failures] == [(3, "crash")]
    assert "SIGSEGV" in c.failures[0].detail
    assert c.ok + c.invalid == 5

    source = fuzz.PRELUDE + (
        "\ndef f(x, y, obj):\n"
        "    t1 = x + 1\n"
        "    print('before')\n"
        "    if t1.sum() > -100:\n"
        "        __import__('ctypes').string_at(0)\n"
        "    return t1\n")
    zygote = fuzz.Zygote()
    try:
        def still_fails(src):
            _, _, ended = zygote.run({"source": src, "seed": 0, "backends": ["eager"]})
            return ended is not None and ended.startswith("crash")
        assert still_fails(source)
        minimal, _ = fuzz.shrink(source, still_fails)
    finally:
        zygote.close()
    body = fuzz.function_text(minimal)
    assert "string_at" in body and "print" not in body, body
