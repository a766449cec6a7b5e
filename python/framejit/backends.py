"""The backend registry: names to callables with torch.compile's backend contract,
``backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> callable``."""
from typing import Callable, Dict, Optional, Tuple

_REGISTRY: Dict[str, Callable] = {}


def register(name: Optional[str] = None, fn: Optional[Callable] = None):
    """``@framejit.backends.register("mine")`` or ``register("mine", fn)``."""
    def decorate(backend: Callable) -> Callable:
        _REGISTRY[name or backend.__name__] = backend
        return backend

    return decorate(fn) if fn is not None else decorate


def list_backends():
    return sorted(_REGISTRY)


def lookup(backend) -> Tuple[Callable, str]:
    """The callable and display name for a backend given by name or as a callable."""
    if callable(backend):
        return backend, getattr(backend, "__name__", type(backend).__name__)
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a name or a callable, got {type(backend).__name__}")
    if backend in _REGISTRY:
        return _REGISTRY[backend], backend
    # Any backend registered with torch.compile works too (aot_eager, cudagraphs, ...).
    from torch._dynamo.backends.registry import list_backends as torch_backends
    from torch._dynamo.backends.registry import lookup_backend
    if backend in torch_backends(exclude_tags=()):
        return lookup_backend(backend), backend
    raise ValueError(f"unknown framejit backend {backend!r}; framejit has {list_backends()}, "
                     f"torch.compile has {torch_backends(exclude_tags=())}")


@register("eager")
def eager(gm, example_inputs):
    """Runs the captured graph as it is (GraphModule.forward)."""
    return gm.forward


# Backends whose callables run any input sizes (the graph's ops recompute every shape at run
# time) carry this mark; framejit then guards ranks, not sizes, where a trace read no size.
eager.framejit_shape_generic = True


@register("inductor")
def inductor(gm, example_inputs):
    """torch.compile's default compiler."""
    from torch._inductor.compile_fx import compile_fx
    return compile_fx(gm, example_inputs)


@register("native")
def native(gm, example_inputs):
    """aten operators run from C++ through the c10 dispatcher (framejit/_native.py)."""
    from ._native import native as lower_native
    return lower_native(gm, example_inputs)


native.framejit_shape_generic = True  # it keys its lowered programs on sizes itself


@register("cuda")
def cuda(gm, example_inputs):
    """native, with element-wise chains on CUDA tensors fused into generated kernels compiled
    at run time by NVRTC (framejit/_cuda/)."""
    from ._cuda.backend import cuda as lower_cuda
    return lower_cuda(gm, example_inputs)


cuda.framejit_shape_generic = True  # programs keyed on sizes, as native's
