"""The check shared by the test_features_*.py files: compile one function, call it next to eager
on fresh copies of the same arguments, and hold the graph count to an exact number.

Each feature test names one Python construct and the number of graphs framejit makes for it
today: 1 when the construct traces, more (or 0) when it breaks the trace or falls back to
CPython. Either way the results, and the arguments after the call, must equal eager.
"""
import torch

import framejit
from framejit.testing import CompileCounter, regions, same


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def copy_args(value):
    """Fresh tensors inside fresh lists/tuples/dicts; any other object is shared as it is."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, dict):
        return {k: copy_args(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(copy_args(v) for v in value)
    return value


def tensor_flags(value):
    """(requires_grad, is_inference) of every tensor in a nested result, in order: same() does
    not compare them, and grad-mode and inference-mode blocks are about nothing else."""
    if isinstance(value, torch.Tensor):
        return [(value.requires_grad, value.is_inference())]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [flag for v in value for flag in tensor_flags(v)]
    return []


def _code_of(fn):
    return type(fn).forward if isinstance(fn, torch.nn.Module) else fn


def describe(fn):
    """One line per region of fn's code: kind/exit and the break reason."""
    return "\n".join(f"  {r['kind']}/{r['exit']}: {r['reason']}" for r in regions(_code_of(fn)))


def check(fn, *args, graphs, exits=None, calls=2, seed_rng=False):
    """Calls fn compiled and eager `calls` times with copies of args. After every call the
    results (values, dtypes, shapes, requires_grad, is_inference) and the arguments must equal
    eager's, and exactly `graphs` graphs must exist, so a second call must reuse what the first
    compiled.

    exits, when given, is the set of exit kinds of the regions of fn's code: {"return"} is one
    region without a break; "branch", "call", "iterate" and "with" are breaks the runtime
    performs (it takes the branch, makes the call, steps the loop, enters the with block);
    "deopt" means CPython runs the rest of the frame. seed_rng reseeds torch's RNG before each
    side, for functions that draw random numbers. Returns the counter."""
    counter = CompileCounter()
    _compare(fn, framejit.compile(fn, backend=counter), fn, args, counter, graphs, exits, calls,
             seed_rng)
    return counter


def check_module(make, *args, graphs, exits=None, calls=2, seed_rng=False):
    """Like check, for a module: make() is called twice under the same seed, one copy runs
    compiled and one eager, and after every call their state_dicts (parameters, buffers such
    as BatchNorm's running statistics) must be equal too. Returns (counter, compiled module)."""
    torch.manual_seed(0)
    eager_mod = make()
    torch.manual_seed(0)
    mod = make()
    counter = CompileCounter()
    compiled = framejit.compile(mod, backend=counter)
    _compare(mod, compiled, eager_mod, args, counter, graphs, exits, calls, seed_rng)
    return counter, compiled


def _compare(fn, compiled, eager, args, counter, graphs, exits, calls, seed_rng):
    """The loop of check and check_module: fn is the function or module that was compiled."""
    for call in range(1, calls + 1):
        eager_args, compiled_args = copy_args(args), copy_args(args)
        if seed_rng:
            torch.manual_seed(call)
        expected = eager(*eager_args)
        if seed_rng:
            torch.manual_seed(call)
        out = compiled(*compiled_args)
        where = f"call {call}"
        assert same(out, expected), (f"{where}: result differs from eager\n"
                                     f"compiled: {out!r}\neager: {expected!r}\n{describe(fn)}")
        assert tensor_flags(out) == tensor_flags(expected), (
            f"{where}: requires_grad/is_inference of the results differ\n{describe(fn)}")
        assert same(compiled_args, eager_args), (
            f"{where}: arguments after the call differ from eager\n"
            f"compiled: {compiled_args!r}\neager: {eager_args!r}\n{describe(fn)}")
        if isinstance(fn, torch.nn.Module):
            assert same(dict(fn.state_dict()), dict(eager.state_dict())), (
                f"{where}: module state differs from eager\n{describe(fn)}")
        assert counter.frame_count == graphs, (
            f"{where}: {counter.frame_count} graphs, expected {graphs}\n{describe(fn)}")
    if exits is not None:
        assert region_exits(fn) == exits, describe(fn)


def region_exits(fn):
    """The set of exit kinds of fn's regions: "return", "branch", "call", "iterate", "with",
    "deopt"."""
    return {r["exit"] for r in regions(_code_of(fn))}
