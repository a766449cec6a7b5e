"""Repeated calls leak nothing: RSS and gc-tracked objects stay flat over 100,000 calls, and the
cache keeps no input tensor alive (the example inputs of the first compile included)."""
import gc
import sys
import weakref

import torch

import framejit
from framejit.testing import CompileCounter, same


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def straight(inputs, n):
    x = inputs["x"]
    return {"out": torch.add(x, n) * inputs["y"], "shape": x.shape}


def with_fallback(x):
    y = x + 1
    if y.sum() > 0:  # not traceable yet: the frame runs in CPython through the hook
        return y
    return -y


def measure(fn, make_args, calls, windows=5):
    """RSS growth (KiB) over the last three windows of `calls` calls, and gc-object growth over
    all of them. Allocators grow in steps for a while after start-up; a leak grows in every
    window, so the last windows tell the two apart (any leaked object is >= 16 bytes a call)."""
    for _ in range(10_000):  # warm-up: caches, allocator pools, interned objects
        fn(*make_args())
    gc.collect()
    objects_before = len(gc.get_objects())
    growth = []
    for _ in range(windows):
        before = rss_kib()
        for _ in range(calls // windows):
            fn(*make_args())
        gc.collect()
        growth.append(rss_kib() - before)
    return sum(growth[-3:]), len(gc.get_objects()) - objects_before


def test_100k_calls_keep_rss_and_gc_objects_flat():
    compiled = framejit.compile(straight, backend=CompileCounter())
    inputs = {"x": torch.randn(8), "y": torch.randn(8)}
    assert same(compiled(inputs, 2), straight(inputs, 2))
    rss_growth, object_growth = measure(compiled, lambda: (inputs, 2), 100_000)
    assert rss_growth < 512, f"RSS grew by {rss_growth} KiB over the last 60,000 calls"
    assert object_growth < 50, f"{object_growth} more gc-tracked objects"


def test_100k_fallback_calls_leak_nothing():
    compiled = framejit.compile(with_fallback, backend=CompileCounter())
    x = torch.ones(4)
    assert same(compiled(x), with_fallback(x))
    rss_growth, object_growth = measure(compiled, lambda: (x,), 100_000)
    assert rss_growth < 512, f"RSS grew by {rss_growth} KiB over the last 60,000 calls"
    assert object_growth < 50, f"{object_growth} more gc-tracked objects"


def test_input_refcounts_unchanged_by_calls():
    compiled = framejit.compile(straight, backend=CompileCounter())
    inputs = {"x": torch.randn(8), "y": torch.randn(8)}
    compiled(inputs, 1)
    before = (sys.getrefcount(inputs), sys.getrefcount(inputs["x"]), sys.getrefcount(inputs["y"]))
    for _ in range(1000):
        compiled(inputs, 1)
    after = (sys.getrefcount(inputs), sys.getrefcount(inputs["x"]), sys.getrefcount(inputs["y"]))
    assert before == after


def test_cache_keeps_no_input_alive_including_first_compile_examples():
    compiled = framejit.compile(straight, backend=CompileCounter())
    refs = []
    for call in range(3):  # call 0 compiles (its tensors are the backend's example inputs)
        inputs = {"x": torch.randn(8), "y": torch.randn(8)}
        refs += [weakref.ref(inputs["x"]), weakref.ref(inputs["y"])]
        out = compiled(inputs, 1)
        refs.append(weakref.ref(out["out"]))
        del inputs, out
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


def test_inductor_cache_keeps_no_input_alive():
    def fn(x):
        return x.sin() * 2

    compiled = framejit.compile(fn, backend="inductor")
    x = torch.randn(16)
    ref = weakref.ref(x)
    assert same(compiled(x), fn(x))
    del x
    gc.collect()
    assert ref() is None


def test_code_state_dies_with_its_function():
    def make():
        def fn(x):
            return x * 3
        return fn

    fn = make()
    compiled = framejit.compile(fn, backend=CompileCounter())
    compiled(torch.ones(2))
    code_ref = weakref.ref(fn)
    del fn, compiled
    gc.collect()
    assert code_ref() is None
    framejit.reset()  # the registry must not hold a dangling entry
