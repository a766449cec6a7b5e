"""Dynamic shapes for backends that do not run any size themselves (inductor, aot_eager, a user's
``backend(gm, example_inputs)``): the Python half of ``csrc/runtime/dynamic_shapes.h``.

- :func:`plan_symbolic_dims` decides which dims of a region's graph inputs are symbolic, from
  ``dynamic=``, the marks ``mark_dynamic`` / ``maybe_mark_dynamic`` / ``mark_static`` leave on a
  tensor (framejit's and ``torch._dynamo``'s are the same attributes), and the sizes each place
  compiled for before (automatic dynamic).
- :func:`compile_symbolic` hands the graph to the backend as torch.compile does with symbolic
  sizes: fake inputs of one ``FakeTensorMode`` with a ``ShapeEnv``, every node's ``meta["val"]``
  / ``meta["example_value"]`` a fake value of symbolic shape, inside torch's ``TracingContext``.
  The guards the ShapeEnv recorded meanwhile come back as one predicate the region checks.
"""
import re
import warnings

import torch

from .exc import FramejitWarning

_ARG = re.compile(r"L\['a(\d+)'\]")


def mark_dynamic(t, index, min=None, max=None):
    """Makes dim ``index`` (an int or a list of them) of tensor ``t`` symbolic from the first
    compile, for backends that compile per size; a size outside ``[min, max]`` compiles again.
    The same mark as ``torch._dynamo.mark_dynamic``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"framejit.mark_dynamic expects a tensor, got {type(t).__name__}")
    for dim in _dims(t, index, "mark_dynamic"):
        if not hasattr(t, "_dynamo_dynamic_indices"):
            t._dynamo_dynamic_indices = set()
        t._dynamo_dynamic_indices.add(dim)
        if min is not None or max is not None:
            ranges = t.__dict__.setdefault("_framejit_dynamic_range", {})
            ranges[dim] = (min, max)


def maybe_mark_dynamic(t, index):
    """Like :func:`mark_dynamic`, but the dim may still be specialised (no warning when it is)."""
    for dim in _dims(t, index, "maybe_mark_dynamic"):
        if not hasattr(t, "_dynamo_weak_dynamic_indices"):
            t._dynamo_weak_dynamic_indices = set()
        t._dynamo_weak_dynamic_indices.add(dim)


def mark_static(t, index):
    """Dim ``index`` of ``t`` is never made symbolic (automatic dynamic, ``dynamic=True``)."""
    for dim in _dims(t, index, "mark_static"):
        if not hasattr(t, "_dynamo_static_indices"):
            t._dynamo_static_indices = set()
        t._dynamo_static_indices.add(dim)


def _dims(t, index, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"framejit.{what} expects a tensor, got {type(t).__name__}")
    dims = [index] if isinstance(index, int) else list(index)
    for dim in dims:
        if not isinstance(dim, int) or not -t.dim() <= dim < t.dim():
            raise IndexError(f"framejit.{what}: dim {dim!r} out of range for a tensor of rank "
                             f"{t.dim()}")
    return [dim % t.dim() for dim in dims]


def _marks(t):
    strong = set(getattr(t, "_dynamo_dynamic_indices", ()))
    weak = set(getattr(t, "_dynamo_weak_dynamic_indices", ()))
    static = set(getattr(t, "_dynamo_static_indices", ()))
    return strong, weak, static


def _ranges(t):
    """dim -> (min, max) from framejit.mark_dynamic and torch._dynamo.mark_dynamic."""
    out = {}
    for r in getattr(t, "_dynamo_dynamic_range", ()):
        if r.min is not None or r.max is not None:
            out[r.dim] = (r.min, r.max)
    out.update(t.__dict__.get("_framejit_dynamic_range", {}))
    return out


def plan_symbolic_dims(values, names, pinned, own, dense, dynamic, seen, place):
    """Per graph input, the dims to make symbolic (a list, empty for none); None if no input
    has one. ``values``: the inputs' values at this compile (None: not read from a source);
    ``names``: their sources; ``pinned``: per input, the dims whose size Python read, or None:
    all of them; ``own``: whether the input is the frame's own (a local or an item of one:
    ``dynamic=True`` applies to those, not to module parameters and buffers); ``dense``: whether
    it is a dense strided tensor (the layout a guard checks in place of exact strides; others
    keep exact sizes); ``seen``: the code object's memory of the sizes each place (compile call,
    pc) compiled for, per input name and rank, updated here."""
    plan, any_dims = [], False
    for value, name, fixed, is_own, is_dense in zip(values, names, pinned, own, dense):
        dims = []
        if type(value) is int and name:
            # An int input (a number read by source that the trace saw change): the number
            # itself, [-1], a SymInt for the backend (_compile_with_fakes).
            dims = [-1]
            any_dims = True
        elif isinstance(value, torch.Tensor) and value.dim() > 0 and name:
            sizes = tuple(value.shape)
            # Remembered per rank: a function called with tensors of several ranks (einops'
            # rearrange) compiles once per rank, each with its own changed dims.
            key = (place, name, len(sizes))
            record = seen.get(key)
            if record is None:
                record = seen[key] = [sizes, set()]
            else:
                # Automatic dynamic: a dim that changed once is symbolic from then on.
                record[1].update(d for d, (a, b) in enumerate(zip(record[0], sizes)) if a != b)
            strong, weak, static = _marks(value)
            wanted = set(record[1]) | strong | weak
            if dynamic is True and is_own and not isinstance(value, torch.nn.Parameter):
                wanted |= set(range(value.dim()))
            wanted -= static
            if fixed is None:  # the trace pinned every size
                fixed = range(value.dim())
            lost = strong & set(fixed)
            if lost:
                warnings.warn(f"framejit: {name} dim(s) {sorted(lost)} were marked dynamic, but "
                              f"the code reads their size into Python, so they stay static",
                              FramejitWarning, stacklevel=2)
            wanted -= set(fixed)
            # Sizes 0 and 1 stay static (a backend specialises them, as torch.compile does).
            wanted = {d for d in wanted if sizes[d] > 1}
            if wanted and is_dense:
                dims = sorted(wanted)
                any_dims = True
        plan.append(dims)
    return plan if any_dims else None


def compile_symbolic(backend, gm, example_inputs, dims, names):
    """Compiles ``gm`` with ``backend`` with the dims in ``dims`` (per input) symbolic. Returns
    ``(compiled, check, explain, inputs, texts)``: ``check(*values)`` of the inputs numbered in
    ``inputs`` is true while the ShapeEnv's guards hold, ``explain(*values)`` names the first
    that fails, ``texts`` are the guards for the log (check is None when there are none).

    Where fake propagation or the backend fails with symbolic sizes, the graph is compiled for
    this call's sizes instead (the real example inputs), with guards that pin every planned dim,
    and one warning says so."""
    try:
        return _compile_with_fakes(backend, gm, example_inputs, dims, names)
    except Exception as error:  # noqa: BLE001 - a static compile is the answer, with a warning
        for node in gm.graph.nodes:
            node.meta.pop("val", None)
            node.meta.pop("example_value", None)
        where = getattr(gm, "meta", {}).get("framejit_name", "a graph")
        warnings.warn(f"framejit: {where} could not be compiled with symbolic sizes "
                      f"({type(error).__name__}: {str(error)[:300]}); it is compiled for these "
                      f"sizes instead", FramejitWarning, stacklevel=2)
        compiled = backend(gm, example_inputs)
        guards = [f"L['a{i}'] == {example_inputs[i]}" if d == -1 else
                  f"L['a{i}'].size()[{d}] == {example_inputs[i].size(d)}"
                  for i, planned in enumerate(dims) for d in planned]
        check, explain, inputs = _predicate(guards, names)
        return compiled, check, explain, inputs, [_display(g, names) for g in guards]


def _compile_with_fakes(backend, gm, example_inputs, dims, names):
    from torch._dynamo.source import LocalSource
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext,
                                                       StrictMinMaxConstraint)
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    # The fake kernels' cache is keyed on sizes, here symbols of this ShapeEnv only: entries
    # made for one graph are never met again, and making them was a third of the propagation.
    mode.cache_enabled = False
    fakes, tensors, sources = [], [], []
    for i, (value, symbolic) in enumerate(zip(example_inputs, dims)):
        if type(value) is int and symbolic == [-1]:
            # An int input: a SymInt of this ShapeEnv, 0 and 1 included (torch.compile does not
            # specialise an int argument's 0 and 1 as it does a size's).
            source = LocalSource(f"a{i}")
            fake = shape_env.create_unspecified_symint_and_symbol(value, source, DimDynamic.DYNAMIC)
            fakes.append(fake)
            tensors.append(fake)
            sources.append(source)
            continue
        if not isinstance(value, torch.Tensor):
            fakes.append(value)
            continue
        source = LocalSource(f"a{i}")
        ranges = _ranges(value)
        constraints = []
        for d in range(value.dim()):
            lo, hi = ranges.get(d, (None, None)) if d in symbolic else (None, None)
            constraints.append(None if lo is None and hi is None else StrictMinMaxConstraint(
                vr=ValueRanges(lower=0 if lo is None else lo, upper=int_oo if hi is None else hi),
                warn_only=False))
        context = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.DYNAMIC if d in symbolic else DimDynamic.STATIC
                           for d in range(value.dim())],
            constraint_sizes=constraints)
        fake = mode.from_tensor(value, source=source, symbolic_context=context)
        fakes.append(fake)
        tensors.append(fake)
        sources.append(source)
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]
    with tracing(TracingContext(mode)):
        compiled = backend(gm, fakes)
    guards = shape_env.produce_guards(tensors, sources)
    if not guards:
        return compiled, None, None, [], []
    check, explain, inputs = _predicate(guards, names)
    texts = [_display(g, names) for g in guards]
    return compiled, check, explain, inputs, texts


def _display(guard, names):
    return _ARG.sub(lambda m: names[int(m.group(1))] or f"input {m.group(1)}", guard)


def _predicate(guards, names):
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    inputs = sorted({int(i) for g in guards for i in _ARG.findall(g)})
    params = ", ".join(f"a{i}" for i in inputs)
    bodies = [_ARG.sub(lambda m: f"a{m.group(1)}", g) for g in guards]
    scope = dict(SYMPY_INTERP)
    check = eval(f"lambda {params}: " + " and ".join(f"({b})" for b in bodies), scope)
    each = [(eval(f"lambda {params}: {b}", scope), _display(g, names))
            for b, g in zip(bodies, guards)]

    def explain(*values):
        for fn, text in each:
            try:
                if not fn(*values):
                    return f"{text} failed"
            except Exception as error:  # noqa: BLE001 - described, not raised
                return f"{text} could not be evaluated: {error}"
        return ""

    return check, explain, inputs

