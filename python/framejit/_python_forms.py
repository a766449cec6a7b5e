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
import functools
import heapq
import itertools
import types
import typing
import weakref

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


_NOT_YIELDED = object()
FORM_CLASSES = (_GeneratorManager,)  # made in the trace like a user's class (plain_class_init)
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


_FORMS.update({
    collections._count_elements: trace_count_elements,
    heapq.nlargest: trace_nlargest,
    heapq.nsmallest: trace_nsmallest,
})


def trace_defaultdict_missing(mapping, factory, key):
    """defaultdict.__missing__, for a factory the trace calls (Tracer::missing_key)."""
    value = factory()
    mapping[key] = value
    return value


# The helpers the forms call are traced too (framejit's own files otherwise are not).
for _helper in (trace_defaultdict_missing, _product_rows, _pick, _extreme, _arguments, _GeneratorManager.__init__,
                _GeneratorManager.__enter__, _GeneratorManager.__exit__,
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


def python_form(fn, keyed=False):
    """The Python form the tracer runs for `fn` (called with a `key=` or `strict=` argument:
    `keyed`), or None."""
    try:
        form = _FORMS.get(fn) or (_KEYED_FORMS.get(fn) if keyed else None)
    except TypeError:  # unhashable
        return None
    if form is None and getattr(fn, "__code__", None) is _CONTEXTMANAGER_CODE:
        return _manager_form(fn)
    return form
