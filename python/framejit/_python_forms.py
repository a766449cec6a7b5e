"""Python forms of builtins and itertools that the tracer runs in their place (and of
collections._count_elements, heapq.nlargest / nsmallest and a defaultdict's __missing__).

map, filter, functools.reduce and the itertools below are C code, which the tracer cannot run
over traced values. Called in a traced frame, each is replaced by its form here, which the
tracer inlines like user code (trace/calls.cpp, Tracer::call): the generator functions give
generators the tracer runs lazily (trace/generators.cpp), so `q, k, v = map(f, (q, k, v))` is
three traced calls of f. Each yields what the C original yields, in the same order, and reads
its arguments as lazily where that can be seen (map, filter, chain); the ones that must see
every item first (product, combinations, zip_longest) read them at the first step, as the C
versions do. Nothing here is called outside a trace.
"""
import collections
import contextlib
import copy
import functools
import heapq
import itertools
import operator
import os
import types
import typing
import weakref

import torch

from . import _C


def trace_map(function, *iterables):
    for args in zip(*iterables):
        yield function(*args)


def trace_filter(function, iterable):
    for item in iterable:
        if function is None:
            if item:
                yield item
        elif function(item):
            yield item


def trace_reduce(function, iterable, *initial):
    items = list(iterable)
    if not initial and not items:
        raise TypeError("reduce() of empty iterable with no initial value")
    if initial:
        value = initial[0]
        rest = items
    else:
        value = items[0]
        rest = items[1:]
    for item in rest:
        value = function(value, item)
    return value


def trace_chain(*iterables):
    for iterable in iterables:
        for item in iterable:
            yield item


def trace_chain_from_iterable(iterables):
    for iterable in iterables:
        for item in iterable:
            yield item


def _product_rows(pools):
    rows = [()]
    for pool in pools:
        grown = []
        for row in rows:
            for item in pool:
                grown.append(row + (item,))
        rows = grown
    return rows


def trace_product(*iterables, repeat=1):
    pools = [tuple(iterable) for iterable in iterables]
    repeated = []
    for _ in range(repeat):
        repeated.extend(pools)
    for row in _product_rows(repeated):
        yield row


def _pick(pool, start, left):
    """The combinations of `left` items of pool[start:], in lexicographic order of position."""
    if left == 0:
        return [()]
    picked = []
    for i in range(start, len(pool) - left + 1):
        for rest in _pick(pool, i + 1, left - 1):
            picked.append((pool[i],) + rest)
    return picked


def trace_combinations(iterable, r):
    pool = tuple(iterable)
    for combination in _pick(pool, 0, r):
        yield combination


def trace_zip_longest(*iterables, fillvalue=None):
    pools = [list(iterable) for iterable in iterables]
    longest = 0
    for pool in pools:
        if len(pool) > longest:
            longest = len(pool)
    for i in range(longest):
        row = []
        for pool in pools:
            row.append(pool[i] if i < len(pool) else fillvalue)
        yield tuple(row)


def trace_accumulate(iterable, func=None, *, initial=None):
    total = initial
    started = initial is not None
    if started:
        yield total
    for item in iterable:
        if not started:
            total = item
            started = True
        elif func is None:
            total = total + item
        else:
            total = func(total, item)
        yield total


_END = object()


def _islice_bound(value, what):
    if value is None:
        return None
    if isinstance(value, int) and value >= 0:
        return value
    raise ValueError(f"{what} argument for islice() must be None or an integer: 0 <= x <= sys.maxsize.")


def trace_islice(iterable, *args):
    """itertools.islice: skips to each index it yields, as the C version does, and reads nothing
    past the last one (nor past `start` when the slice is empty)."""
    if not 1 <= len(args) <= 3:
        raise TypeError(f"islice expected at most 4 arguments, got {len(args) + 1}")
    if len(args) == 1:
        start, stop, step = 0, _islice_bound(args[0], "Stop"), 1
    else:
        start = _islice_bound(args[0], "Indices") or 0
        stop = _islice_bound(args[1], "Stop")
        step = 1 if len(args) < 3 or args[2] is None else args[2]
        if not isinstance(step, int) or step < 1:
            raise ValueError("Step for islice() must be a positive integer or None.")
    iterator = iter(iterable)
    count = 0
    wanted = start
    while True:
        while count < wanted:
            if next(iterator, _END) is _END:
                return
            count += 1
        if stop is not None and count >= stop:
            return
        item = next(iterator, _END)
        if item is _END:
            return
        count += 1
        wanted += step
        if stop is not None and wanted > stop:
            wanted = stop
        yield item


def trace_repeat(obj, times=None):
    """itertools.repeat. Without a count it never ends: its consumer takes what it needs."""
    if times is None:
        while True:
            yield obj
    for _ in range(times):
        yield obj


def trace_count(start=0, step=1):
    """itertools.count: it never ends; its consumer takes what it needs (zip stops at its
    shortest iterable, a loop at its break)."""
    value = start
    while True:
        yield value
        value += step


def trace_cycle(iterable):
    """itertools.cycle: the items once, as they come, then the saved ones over and over."""
    seen = []
    for item in iterable:
        yield item
        seen.append(item)
    while seen:
        yield from seen


def trace_pairwise(iterable):
    iterator = iter(iterable)
    previous = next(iterator, _END)
    if previous is _END:
        return
    for item in iterator:
        yield previous, item
        previous = item


# itertools.groupby: one state shared by the outer generator and its groups, as the C
# iterator keeps it: [current item, its key, number of the current group, ended]. A group
# yields only while it is the current one and the items keep its key; the outer generator
# skips what its group left unread.
def _groupby_step(iterator, key, state):
    item = next(iterator, _END)
    if item is _END:
        state[3] = True
        return
    state[0] = item
    state[1] = item if key is None else key(item)


def _same_key(a, b):
    return a is b or a == b  # (as PyObject_RichCompareBool compares)


def _groupby_group(iterator, key, state, target, number):
    while state[2] == number and not state[3] and _same_key(state[1], target):
        yield state[0]
        _groupby_step(iterator, key, state)


def trace_groupby(iterable, key=None):
    iterator = iter(iterable)
    state = [None, None, 0, False]
    _groupby_step(iterator, key, state)
    while not state[3]:
        target = state[1]
        state[2] += 1
        yield target, _groupby_group(iterator, key, state, target, state[2])
        while not state[3] and _same_key(state[1], target):
            _groupby_step(iterator, key, state)


def trace_starmap(function, iterable):
    for args in iterable:
        yield function(*args)


def trace_takewhile(predicate, iterable):
    for item in iterable:
        if not predicate(item):
            return
        yield item


def trace_dropwhile(predicate, iterable):
    iterator = iter(iterable)
    for item in iterator:
        if not predicate(item):
            yield item
            break
    for item in iterator:
        yield item


def trace_filterfalse(predicate, iterable):
    for item in iterable:
        if predicate is None:
            if not item:
                yield item
        elif not predicate(item):
            yield item


def trace_compress(data, selectors):
    for item, selected in zip(data, selectors):
        if selected:
            yield item


def trace_methodcaller(name, /, *args, **kwargs):
    """operator.methodcaller: a function of the trace calling obj.<name>(*args, **kwargs)."""
    if not isinstance(name, str):
        raise TypeError("method name must be a string")

    def call_method(obj):
        return getattr(obj, name)(*args, **kwargs)

    return call_method


def trace_getenv(key, default=None):
    """os.getenv: os.environ.get, which the tracer reads (and guards) by source."""
    return os.environ.get(key, default)


def trace_namedtuple_replace(self, /, **changes):
    """A namedtuple's _replace."""
    values = []
    for name, value in zip(self._fields, self):
        values.append(changes.pop(name) if name in changes else value)
    if changes:
        raise ValueError(f"Got unexpected field names: {list(changes)!r}")
    return type(self)(*values)


def trace_namedtuple_asdict(self):
    """A namedtuple's _asdict."""
    return dict(zip(self._fields, self))


def trace_mark_static_address(t, guard=True):
    """torch._dynamo.mark_static_address inside a traced frame (transformers' caches mark their
    buffers while compiling): a hint for CUDA graphs, which framejit's graphs do not capture;
    nothing."""
    return None


def trace_sorted(iterable, /, *, key=None, reverse=False):
    # A stable insertion sort asking only `<`, as list.sort does: equal keys keep their order,
    # also with reverse=True.
    # (Loops, not comprehensions: on 3.11 a comprehension is a function of framejit's own.)
    items = list(iterable)
    keys = items
    if key is not None:
        keys = []
        for item in items:
            keys.append(key(item))
    order = []
    for i in range(len(items)):
        at = len(order)
        while at > 0 and ((keys[order[at - 1]] < keys[i]) if reverse else (keys[i] < keys[order[at - 1]])):
            at -= 1
        order.insert(at, i)
    result = []
    for i in order:
        result.append(items[i])
    return result


def _extreme(name, args, key, default, has_default, largest):
    if len(args) == 1:
        items = list(args[0])
    elif not args:
        raise TypeError(f"{name} expected at least 1 argument, got 0")
    elif has_default:
        raise TypeError(f"Cannot specify a default for {name}() with multiple positional arguments")
    else:
        items = list(args)
    if not items:
        if has_default:
            return default
        raise ValueError(f"{name}() iterable argument is empty")
    best = items[0]
    best_key = best if key is None else key(best)
    for item in items[1:]:
        item_key = item if key is None else key(item)
        if (item_key > best_key) if largest else (item_key < best_key):  # the first one kept
            best, best_key = item, item_key
    return best


def _arguments(first, last):
    return f"argument {first}" if first == last else f"arguments {first}-{last}"


def trace_zip(*iterables, strict=False):
    iterators = [iter(iterable) for iterable in iterables]
    if not iterators:
        return
    while True:
        items = []
        for i, iterator in enumerate(iterators):
            try:
                items.append(next(iterator))
            except StopIteration:
                if strict and i > 0:
                    raise ValueError(f"zip() argument {i + 1} is shorter than {_arguments(1, i)}")
                if strict:
                    for j in range(1, len(iterators)):
                        try:
                            next(iterators[j])
                        except StopIteration:
                            continue
                        raise ValueError(f"zip() argument {j + 1} is longer than {_arguments(1, j)}")
                return
        yield tuple(items)


def trace_cast(typ, val):
    return val  # typing.cast only tells a type checker


_NO_DEFAULT = object()


def trace_min(*args, key=None, default=_NO_DEFAULT):
    return _extreme("min", args, key, default, default is not _NO_DEFAULT, False)


def trace_max(*args, key=None, default=_NO_DEFAULT):
    return _extreme("max", args, key, default, default is not _NO_DEFAULT, True)


class _GeneratorManager:
    """What a @contextlib.contextmanager function returns, in the trace: its generator runs in
    the trace, to its yield at __enter__ and on to its end at __exit__, as contextlib's
    _GeneratorContextManager runs it. (A block that raises is contextlib's to handle: its
    __exit__ is called, which the tracer does not trace, so the region is traced again with
    the manager made by contextlib. So is one a region ends inside: the half-run generator
    cannot leave the trace.)"""

    def __init__(self, func, args, kwds):
        self.gen = func(*args, **kwds)

    def __enter__(self):
        value = next(self.gen, _NOT_YIELDED)
        if value is _NOT_YIELDED:
            raise RuntimeError("generator didn't yield")
        return value

    def __exit__(self, typ, value, traceback):
        if typ is None:
            if next(self.gen, _NOT_YIELDED) is _NOT_YIELDED:
                return False
            raise RuntimeError("generator didn't stop")
        return contextlib._GeneratorContextManager.__exit__(self, typ, value, traceback)


class _Suppress:
    """contextlib.suppress(*exceptions) in the trace: the block's exception is swallowed where
    it is an instance of one of them. (An exception group is contextlib's to split: its own
    __exit__, which the trace does not run, then ends the region. Rebuilt where a region ends
    inside the block, this class runs in plain Python the same way.)"""

    def __init__(self, exceptions):
        self.exceptions = exceptions

    def __enter__(self):
        return None

    def __exit__(self, typ, value, traceback):
        if typ is None:
            return False
        if issubclass(typ, BaseExceptionGroup):
            return contextlib.suppress(*self.exceptions).__exit__(typ, value, traceback)
        return issubclass(typ, self.exceptions)


def trace_suppress(*exceptions):
    return _Suppress(exceptions)


_NOT_YIELDED = object()
# Made in the trace like a user's class (plain_class_init).
FORM_CLASSES = (_GeneratorManager, _Suppress)
# A function @contextlib.contextmanager returns: its code is every decorated function's.
_SAMPLE_MANAGER = contextlib.contextmanager(lambda: (yield))
_CONTEXTMANAGER_CODE = _SAMPLE_MANAGER.__code__
_MANAGER_FORMS = weakref.WeakKeyDictionary()


def _manager_form(helper):
    """The form of one @contextmanager function: makes the trace's manager over its generator
    function (the decorated one, held by the helper's closure)."""
    form = _MANAGER_FORMS.get(helper)
    if form is None:
        cells = dict(zip(helper.__code__.co_freevars, helper.__closure__ or ()))
        func = cells["func"].cell_contents

        def trace_contextmanager(*args, **kwds):
            return _GeneratorManager(func, args, kwds)

        form = _MANAGER_FORMS[helper] = trace_contextmanager
    return form


def trace_contextmanager(func):
    """contextlib.contextmanager(func) called in the trace (a manager defined inside the compiled
    function): the helper it returns, whose calls make the trace's manager over func's
    generator, as a @contextmanager function defined outside does (_manager_form)."""

    @functools.wraps(func)
    def helper(*args, **kwds):
        return _GeneratorManager(func, args, kwds)

    return helper


def trace_group_tensors_by_device_and_dtype(tensorlistlist, with_indices=False):
    """torch._C._group_tensors_by_device_and_dtype (C++; clip_grad_norm_ and the foreach helpers
    group their tensor lists with it): the lists split by the device and dtype of the first
    list's tensors, which the trace knows (their metadata is guarded). Groups come in the order
    first met; each holds the lists' entries at those positions (None where a later list has
    None), and the positions themselves where asked for."""
    groups = {}
    if not tensorlistlist:
        return groups
    for position, first in enumerate(tensorlistlist[0]):
        if first is None:
            raise RuntimeError(
                "Tensors of the first list of nested Tensor lists are supposed to be defined "
                f"but the {position}-th Tensor is not.")
        key = (first.device, first.dtype)
        if key not in groups:
            groups[key] = ([[] for _ in tensorlistlist], [])
        lists, positions = groups[key]
        for into, source in zip(lists, tensorlistlist):
            into.append(source[position])
        if with_indices:
            positions.append(position)
    return groups


# torch functions (C++) that have a Python form: not graph ops (_support.classify_callable).
TORCH_FORMS = {torch._C._group_tensors_by_device_and_dtype: trace_group_tensors_by_device_and_dtype}

# Builtins the tracer answers itself unless called with a key function.
# (zip with strict=: its checks.)
_KEYED_FORMS = {sorted: trace_sorted, min: trace_min, max: trace_max, zip: trace_zip}

_FORMS = {
    map: trace_map,
    filter: trace_filter,
    functools.reduce: trace_reduce,
    itertools.chain: trace_chain,
    itertools.chain.from_iterable: trace_chain_from_iterable,
    itertools.product: trace_product,
    itertools.combinations: trace_combinations,
    itertools.zip_longest: trace_zip_longest,
    itertools.accumulate: trace_accumulate,
    typing.cast: trace_cast,
    itertools.islice: trace_islice,
    itertools.repeat: trace_repeat,
    itertools.count: trace_count,
    itertools.cycle: trace_cycle,
    itertools.pairwise: trace_pairwise,
    itertools.starmap: trace_starmap,
    itertools.groupby: trace_groupby,
    itertools.takewhile: trace_takewhile,
    itertools.dropwhile: trace_dropwhile,
    itertools.filterfalse: trace_filterfalse,
    itertools.compress: trace_compress,
    operator.methodcaller: trace_methodcaller,
    os.getenv: trace_getenv,
    contextlib.suppress: trace_suppress,
    contextlib.contextmanager: trace_contextmanager,
    **TORCH_FORMS,
}



def trace_count_elements(mapping, iterable):
    """collections._count_elements (Counter.update's counting loop, C code)."""
    for item in iterable:
        mapping[item] = mapping.get(item, 0) + 1


def trace_nlargest(n, iterable, key=None):
    """heapq.nlargest: documented as sorted(iterable, key=key, reverse=True)[:n]."""
    return sorted(iterable, key=key, reverse=True)[:n]


def trace_nsmallest(n, iterable, key=None):
    """heapq.nsmallest: documented as sorted(iterable, key=key)[:n]."""
    return sorted(iterable, key=key)[:n]


def trace_jit_annotate(the_type, the_value):
    """torch.jit.annotate: the value (the type is TorchScript's)."""
    return the_value


_FORMS.update({
    torch.jit.annotate: trace_jit_annotate,
    collections._count_elements: trace_count_elements,
    heapq.nlargest: trace_nlargest,
    heapq.nsmallest: trace_nsmallest,
})


def trace_defaultdict_missing(mapping, factory, key):
    """defaultdict.__missing__, for a factory the trace calls (Tracer::missing_key)."""
    value = factory()
    mapping[key] = value
    return value


# copy.deepcopy's own dispatch (copy._deepcopy_atomic): values it returns as they are.
_DEEPCOPY_ATOMIC = frozenset({
    type(None), type(Ellipsis), type(NotImplemented), int, float, bool, complex, bytes, str,
    types.CodeType, type, range, types.BuiltinFunctionType, types.FunctionType, weakref.ref,
    property,
})


def deepcopy_kind(cls):
    """How copy.deepcopy copies an instance of cls, as its form below repeats it: "atomic"
    (itself), "list" / "tuple" / "dict" (exact builtins, item by item), "self" (an Enum
    member: Enum.__deepcopy__ gives itself; also torch.dtype / device / layout / memory_format,
    which reduce to themselves or to an equal constant), "object" (an instance of a plain
    Python class that copy rebuilds from its __reduce_ex__(4): object.__new__ and a deep copy
    of its __dict__ set as its state, no __slots__ / __getstate__ / __setstate__ /
    __getnewargs__ / __copy__ of its own, no copyreg entry), or None: anything else (a tensor,
    a class with its own __deepcopy__ or reduction), which the trace does not copy. Called by
    the tracer at trace time on a constant class (a pure builtin, see _support)."""
    if cls in _DEEPCOPY_ATOMIC:
        return "atomic"
    if cls is list or cls is tuple or cls is dict:
        return cls.__name__
    import copyreg
    import enum
    import torch
    if cls in (torch.dtype, torch.device, torch.layout, torch.memory_format) or (
            isinstance(cls, enum.EnumMeta) and getattr(cls, "__deepcopy__", None) is enum.Enum.__deepcopy__):
        return "self"
    if cls in copyreg.dispatch_table or not isinstance(cls, type) or not cls.__flags__ & (1 << 9):
        return None  # not a class statement's (a builtin, a C extension type)
    if issubclass(cls, (dict, list, set, frozenset, tuple, BaseException, torch.Tensor, torch.nn.Module)):
        return None
    if type(cls) is not type or cls.__new__ is not object.__new__ or not cls.__dictoffset__:
        return None
    if (cls.__reduce_ex__ is not object.__reduce_ex__ or cls.__reduce__ is not object.__reduce__
            or getattr(cls, "__getstate__", object.__getstate__) is not object.__getstate__):
        return None
    for name in ("__deepcopy__", "__setstate__", "__getnewargs__", "__getnewargs_ex__"):
        if hasattr(cls, name):
            return None
    for klass in cls.__mro__[:-1]:
        if "__slots__" in vars(klass):
            return None
    return "object"


def deepcopy_untraced(x, memo):
    """copy.deepcopy of a value its form does not copy (framejit's file: never traced, so the
    call is a graph break and Python copies it)."""
    import copy
    return copy.deepcopy(x, memo)


def trace_deepcopy(x, memo=None, _nil=None):
    """copy.deepcopy, for the values deepcopy_kind names. Its memo is a list of
    (original, copy) pairs compared by identity (copy's own keys id()s, which a value made in
    the trace does not have yet); a memo passed in is copy's to use."""
    if memo is not None:
        return deepcopy_untraced(x, memo)
    return _deepcopy_into(x, [])


def _deepcopy_into(x, made):
    kind = deepcopy_kind(type(x))
    if kind == "atomic" or kind == "self":
        return x
    for original, copied in made:
        if original is x:
            return copied
    if kind == "list":
        y = []
        made.append((x, y))
        for item in x:
            y.append(_deepcopy_into(item, made))
        return y
    if kind == "tuple":
        items = [_deepcopy_into(item, made) for item in x]
        for original, copied in made:  # the tuple held itself through a list: copy's answer
            if original is x:
                return copied
        for item, copied in zip(x, items):
            if item is not copied:
                y = tuple(items)
                made.append((x, y))
                return y
        return x  # nothing inside needed a copy
    if kind == "dict":
        y = {}
        made.append((x, y))
        for key, value in x.items():
            y[_deepcopy_into(key, made)] = _deepcopy_into(value, made)
        return y
    if kind == "object":
        y = object.__new__(type(x))
        made.append((x, y))
        for name, value in x.__dict__.items():
            object.__setattr__(y, name, _deepcopy_into(value, made))
        return y
    return deepcopy_untraced(x, None)


_FORMS[copy.deepcopy] = trace_deepcopy

# copy.copy's own dispatch (copy._copy_immutable): values it returns as they are.
_COPY_ATOMIC = frozenset({
    type(None), int, float, bool, complex, str, tuple, bytes, frozenset, type, range, slice,
    property, types.BuiltinFunctionType, type(Ellipsis), type(NotImplemented),
    types.FunctionType, weakref.ref,
})


def copy_kind(cls):
    """How copy.copy copies an instance of cls, as its form below repeats it: "atomic"
    (itself), "copy" (an exact list, dict, set or bytearray: its copy() method), "object" (an
    instance of a plain Python class, rebuilt as copy does from __reduce_ex__(4):
    object.__new__ and its __dict__'s items, see deepcopy_kind; no __copy__ of its own), or None
    (anything else: left to copy.copy). Called by the tracer at trace time on a constant class
    (a pure builtin, see _support)."""
    if cls in _COPY_ATOMIC:
        return "atomic"
    if cls in (list, dict, set, bytearray):
        return "copy"
    if deepcopy_kind(cls) == "object" and not hasattr(cls, "__copy__"):
        return "object"
    return None


def copy_untraced(x):
    """copy.copy of a value its form does not copy (framejit's file: never traced, so the call
    is a graph break and Python copies it)."""
    return copy.copy(x)


def trace_copy(x):
    """copy.copy, for the values copy_kind names."""
    kind = copy_kind(type(x))
    if kind == "atomic":
        return x
    if kind == "copy":
        return x.copy()
    if kind == "object":
        y = object.__new__(type(x))
        for name, value in x.__dict__.items():
            object.__setattr__(y, name, value)
        return y
    return copy_untraced(x)


_FORMS[copy.copy] = trace_copy


def trace_operator(a, b, attempts, failure):
    """`a <op> b` where a class of a or b defines the operator in Python: the methods Python
    tries, in its order, as the tracer found them on the classes (Tracer::inline_operator):
    (method, reflected: called as method(b, a), negated: `!=` answered by `__eq__`). The first
    answer that is not NotImplemented wins; if none, `==` / `!=` are identity ("is" / "is not")
    and anything else raises the TypeError Python raises, whose text `failure` is."""
    for method, reflected, negated in attempts:
        result = method(b, a) if reflected else method(a, b)
        if result is not NotImplemented:
            return (not result) if negated else result
    if failure == "is":
        return a is b
    if failure == "is not":
        return a is not b
    raise TypeError(failure)


def trace_module_call(module, forward, args, kwargs):
    """nn.Module.__call__ of a module with forward pre-hooks or forward hooks (and no backward
    or global hooks: Tracer::inline_module_call), as torch's Module._call_impl runs them: each
    pre-hook in order may replace the arguments, forward runs, each hook in order may replace
    the result."""
    for hook_id, hook in module._forward_pre_hooks.items():
        if hook_id in module._forward_pre_hooks_with_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                if isinstance(result, tuple) and len(result) == 2:
                    args, kwargs = result
                else:
                    raise RuntimeError(f"a forward pre-hook taking kwargs returned {result!r}; "
                                       "it may return None or a pair (args, kwargs)")
        else:
            result = hook(module, args)
            if result is not None:
                if not isinstance(result, tuple):
                    result = (result,)
                args = result
    out = forward(module, *args, **kwargs)
    for hook_id, hook in module._forward_hooks.items():
        if hook_id in module._forward_hooks_with_kwargs:
            result = hook(module, args, kwargs, out)
        else:
            result = hook(module, args, out)
        if result is not None:
            out = result
    return out


# The helpers the forms call are traced too (framejit's own files otherwise are not).
for _helper in (trace_defaultdict_missing, trace_module_call, _islice_bound, _deepcopy_into, _product_rows, _pick, _extreme, _arguments, _GeneratorManager.__init__,
                _groupby_step, _same_key, _groupby_group,
                _GeneratorManager.__enter__, _GeneratorManager.__exit__,
                _Suppress.__init__, _Suppress.__enter__, _Suppress.__exit__,
                _manager_form(_SAMPLE_MANAGER)):
    _C.allow_code(_helper.__code__)
del _helper
# collections.Counter's methods: Python over its dict storage, traced like a user class's
# (counting itself is collections._count_elements, C code: its form above).
for _member in vars(collections.Counter).values():
    _function = getattr(_member, "__func__", _member)
    if isinstance(_function, types.FunctionType):
        _C.allow_code(_function.__code__)
del _member, _function


# A namedtuple class's own methods (made by collections.namedtuple from one template, so one
# code object for all classes), by that code.
_SAMPLE_NAMEDTUPLE = collections.namedtuple("_SAMPLE_NAMEDTUPLE", "a")
_NAMEDTUPLE_FORMS = {
    _SAMPLE_NAMEDTUPLE._replace.__code__: trace_namedtuple_replace,
    _SAMPLE_NAMEDTUPLE._asdict.__code__: trace_namedtuple_asdict,
}
_NAMEDTUPLE_MAKE_CODE = _SAMPLE_NAMEDTUPLE._make.__func__.__code__
_MAKE_FORMS = weakref.WeakKeyDictionary()


def trace_namedtuple_make(cls, iterable):
    """A namedtuple class's _make (its classmethod's function, called with the class)."""
    values = tuple(iterable)
    if len(values) != len(cls._fields):
        raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(values)}")
    return cls(*values)


_C.allow_code(trace_namedtuple_make.__code__)  # (called by the bound form below)


def _namedtuple_make_form(cls):
    """cls._make(iterable) of a namedtuple class: cls(*iterable)."""
    form = _MAKE_FORMS.get(cls)
    if form is None:
        def trace_bound_namedtuple_make(iterable):
            return trace_namedtuple_make(cls, iterable)

        form = _MAKE_FORMS[cls] = trace_bound_namedtuple_make
    return form


def tuple_method(cls, name):
    """The function the tracer inlines for `t.<name>(...)` on a tuple of class cls (a
    namedtuple, a typing.NamedTuple, a structseq) that the trace holds item by item: the form
    of a namedtuple's own method, or a Python function the class defines (a NamedTuple's
    method); None for anything else."""
    for klass in cls.__mro__:
        if klass is tuple:
            return None
        function = vars(klass).get(name)
        if function is None:
            continue
        code = getattr(function, "__code__", None)
        if code in _NAMEDTUPLE_FORMS:
            return _NAMEDTUPLE_FORMS[code]
        return function if isinstance(function, types.FunctionType) else None
    return None


def python_form(fn, keyed=False):
    """The Python form the tracer runs for `fn` (called with a `key=` or `strict=` argument:
    `keyed`), or None."""
    try:
        form = _FORMS.get(fn) or (_KEYED_FORMS.get(fn) if keyed else None)
    except TypeError:  # unhashable
        return None
    if form is None and getattr(fn, "__code__", None) is _NAMEDTUPLE_MAKE_CODE:
        return trace_namedtuple_make  # (read off the class: the class comes first)
    if (form is None and isinstance(fn, types.MethodType) and isinstance(fn.__self__, type)
            and getattr(fn.__func__, "__code__", None) is _NAMEDTUPLE_MAKE_CODE):
        return _namedtuple_make_form(fn.__self__)
    if (form is None and getattr(fn, "__name__", None) == "mark_static_address"
            and getattr(fn, "__module__", None) == "torch._dynamo.decorators"):
        return trace_mark_static_address  # (named: importing torch._dynamo here costs a second)
    if form is None and getattr(fn, "__code__", None) is _CONTEXTMANAGER_CODE:
        return _manager_form(fn)
    return form


def trace_missing_attribute(obj, name):
    """`obj.name` that the instance and its class lack, where no __getattr__ makes it up (the
    absence guarded): the AttributeError Python raises, raised in the trace, so a hasattr /
    getattr default or an `except AttributeError` around it catches it there."""
    raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")
