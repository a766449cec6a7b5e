"""Helpers for tests of framejit and of code compiled with it."""
import contextlib
import os
import re

import torch


class CompileCounter:
    """A backend that counts the graphs handed to it and runs each as it is, or through
    ``backend`` (a name or callable; default: $FRAMEJIT_TEST_BACKEND, else as it is);
    ``compiled`` holds what that backend returned."""

    def __init__(self, backend=None):
        self.frame_count = 0
        self.op_count = 0
        self.graphs = []
        self.compiled = []
        self._backend = None
        # FRAMEJIT_TEST_BACKEND=native reruns a suite's counted graphs through another backend.
        backend = backend or os.environ.get("FRAMEJIT_TEST_BACKEND") or None
        if backend is not None:
            from .backends import lookup
            self._backend = lookup(backend)[0]
        inner = self._backend
        self.framejit_shape_generic = inner is None or getattr(inner, "framejit_shape_generic", False)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.frame_count += 1
        self.op_count += sum(n.op in ("call_function", "call_method") for n in gm.graph.nodes)
        self.graphs.append(gm)
        fn = gm.forward if self._backend is None else self._backend(gm, example_inputs)
        self.compiled.append(fn)
        return fn

    def clear(self):
        self.frame_count = 0
        self.op_count = 0
        self.graphs.clear()
        self.compiled.clear()


@contextlib.contextmanager
def inject_fault(site: str, n: int = 1):
    """Within the block, framejit's tracer (``"trace"``), the export of a region to a
    GraphModule (``"export"``) or the backend call (``"backend"``) fails at its n-th
    opportunity, once; yields a function telling whether the fault has fired. The same from the
    environment: ``FRAMEJIT_INJECT_FAULT=trace:5`` (armed at import)."""
    from . import _C
    _C._inject_fault(site, n)
    try:
        yield lambda: not _C._fault_armed()
    finally:
        _C._inject_fault("none", 0)


def regions(fn):
    """The regions of fn's code object: dicts with kind, graph, guards, hits, reason."""
    from . import _C
    return _C.code_stats(fn)["regions"]


def normalize_graph(text: str) -> str:
    """A printed graph with directory names removed from ``# File:`` lines, for expected text."""
    return re.sub(r"# File: (\S*/)?([^/:]+):", lambda m: f"# File: {m.group(2)}:", text)


def same(a, b, rtol=1e-5, atol=1e-6) -> bool:
    """Structural equality of nested outputs; tensors by value (allclose) and dtype."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.device == b.device and torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))
    if isinstance(a, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same(x, y, rtol, atol) for x, y in zip(a, b)))
    if isinstance(a, dict):
        return (type(a) is type(b) and list(a) == list(b)
                and all(same(a[k], b[k], rtol, atol) for k in a))
    return type(a) is type(b) and a == b
