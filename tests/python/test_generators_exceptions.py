"""Generator functions and exceptions inside the trace (issue #16): a generator called in the
trace runs in the tracer (a `for` loop interleaves with its frame as Python does; zip and
next() step it one item at a time, list() and sum() run it to its end), and `raise` caught by a try/except in the trace unwinds there. Each is
compiled next to eager with its graph count; transformers' DynamicCache iterates a Sequence
through collections.abc's generator __iter__, which ends on an IndexError."""
from collections.abc import Mapping, Sequence

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions, same


def compiled_and_eager(fn, *args):
    counter = CompileCounter()
    out = framejit.compile(fn, backend=counter)(*args)
    assert same(out, fn(*args))
    return counter.frame_count, [r["exit"] for r in regions(fn)]


def multiples(x, n):
    for i in range(n):
        yield x * (i + 1)


class LayerView(Sequence):
    """A Sequence whose __getitem__ raises IndexError past its end (transformers'
    _PerLayerConfigView): iterated through collections.abc's generator __iter__."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i < 0 or i >= self.n:
            raise IndexError("list index out of range")
        return i + 1


def loops(x):
    out = []
    for v in multiples(x, 3):
        out.append(v + 1)
    return out


def consumers(x):
    total = sum(multiples(x, 4))
    parts = list(multiples(x, 2))
    first, second = multiples(x, 2)
    scaled = [a * b for a, b in zip([1.0, 2.0], multiples(x, 5))]
    return total, parts, first + second, scaled


def sequences(x):
    kinds = [k for k in LayerView(3)]
    paired = [x * k for k, _ in zip(LayerView(4), ["a", "b"])]
    return x * sum(kinds), paired


def calls_helper(fn):
    def outer(x):
        return fn(x)

    return outer


@pytest.mark.parametrize("fn", [loops, consumers, sequences])
@pytest.mark.parametrize("inlined", [False, True])
def test_generator_functions_run_in_the_trace_as_one_graph(fn, inlined):
    target = calls_helper(fn) if inlined else fn
    graphs, exits = compiled_and_eager(target, torch.randn(4))
    assert graphs == 1 and exits == ["return"]


def test_a_for_loop_interleaves_with_the_generator_frame():
    # Python runs the generator between the loop's iterations: each sees the other's appends.
    def gen(log, x):
        for i in range(3):
            log.append(("gen", len(log)))
            yield x + i

    def f(x):
        log = []
        outs = []
        for v in gen(log, x):
            log.append(("loop", len(log)))
            outs.append(v * len(log))
        return outs, log

    graphs, exits = compiled_and_eager(calls_helper(f), torch.randn(2))
    assert graphs == 1 and exits == ["return"]


def logged_steps(x, log, n=5):
    for i in range(n):
        log.append(i)  # a side effect per step: how far the generator ran
        yield x * i


def zips_a_generator_with_a_shorter_list(x):
    log = []
    pairs = [a + b for a, b in zip(logged_steps(x, log), [x, x])]
    return pairs, log


def zips_a_shorter_list_first(x):
    log = []
    pairs = [a + b for a, b in zip([x, x], logged_steps(x, log))]
    return pairs, log


def counts_and_cycles(x, xs):
    import itertools
    scaled = [t * i for i, t in zip(itertools.count(1), xs)]  # count() never ends
    signs = [t * s for t, s in zip(xs, itertools.cycle([1.0, -1.0]))]
    return scaled, signs


@pytest.mark.parametrize("fn, log", [(zips_a_generator_with_a_shorter_list, [0, 1, 2]),
                                     (zips_a_shorter_list_first, [0, 1])])
def test_zip_runs_a_generator_no_further_than_python(fn, log):
    x = torch.randn(3)
    counter = CompileCounter()
    out = framejit.compile(fn, backend=counter)(x)
    assert same(out, fn(x)) and out[1] == log  # (ran ahead to its end before: [0, 1, 2, 3, 4])
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(fn)] == ["return"]


def test_itertools_count_and_cycle_step_in_the_trace():
    x = torch.randn(3)
    xs = [x, x * 2, x * 3]
    assert compiled_and_eager(counts_and_cycles, x, xs) == (1, ["return"])


CLOSED = []


def closes_with_a_finally(x):
    try:
        yield x
        yield x * 2
    finally:
        CLOSED.append("closed")  # runs when Python closes it half run


def steps_a_generator_by_hand(x):
    g = multiples(x, 3)
    first, second = next(g), next(g)  # left half run in a local at the return
    return first + second


def steps_one_with_a_finally(x):
    g = closes_with_a_finally(x)
    return next(g) + 1


def test_a_generator_half_run_in_a_local_at_the_return_is_dropped_if_closing_it_does_nothing():
    x = torch.randn(3)
    assert compiled_and_eager(steps_a_generator_by_hand, x) == (1, ["return"])
    # a finally block would run when Python closes it: that generator is Python's to make
    CLOSED.clear()
    compiled = framejit.compile(steps_one_with_a_finally, backend=CompileCounter())
    assert same(compiled(x), x + 1) and CLOSED == ["closed"]
    assert "call" in [r["exit"] for r in regions(steps_one_with_a_finally)]


def test_a_generator_reads_what_changes_between_calls():
    # What the generator's frame reads is guarded like any inlined frame's: a stale count would
    # be the worst bug.
    state = {"n": 2}

    def gen(x):
        for i in range(state["n"]):
            yield x * i

    def f(x):
        return list(gen(x))

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x), f(x)) and counter.frame_count == 1
    state["n"] = 3
    assert same(compiled(x), f(x)) and len(compiled(x)) == 3
    assert counter.frame_count == 2


def test_a_generator_half_run_where_a_region_ends_is_made_by_python():
    # A branch on a tensor inside the loop ends the region with the generator suspended: the
    # trace starts again with the generator made by Python, and the results stay eager's.
    def f(x):
        acc = x
        for v in multiples(x, 3):
            if v.sum() > 0:
                acc = acc + v
            else:
                acc = acc - v
        return acc

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    for x in (torch.ones(3), -torch.ones(3), torch.tensor([1.0, -2.0, 0.5])):
        assert same(compiled(x), f(x))
    assert "branch" in {r["exit"] for r in regions(f)}


def test_a_generator_with_try_finally_and_a_return_value():
    def gen(x):
        try:
            yield x
            yield x * 2
        finally:
            pass
        return "done"

    def f(x):
        return [t + 1 for t in gen(x)]

    graphs, exits = compiled_and_eager(calls_helper(f), torch.randn(2))
    assert graphs == 1 and exits == ["return"]


def two_then_seven(x):
    yield x
    yield x + 1
    return x * 7


def delegates(x):
    r = yield from two_then_seven(x)  # the inner generator's return value
    yield r
    yield from [x - 1, x - 2]
    yield from (t * 3 for t in (x, x))


def leaves(tree):
    if isinstance(tree, list):
        for t in tree:
            yield from leaves(t)
    else:
        yield tree


def yields_from(x):
    total = x
    for v in delegates(x):  # interleaved with the loop
        total = total + v
    flat = list(leaves([x, [x * 2, [x * 3]], x * 4]))  # recursive, drained
    return list(delegates(x)), total, next(delegates(x)), sum(flat)


def test_yield_from_delegates_to_generators_and_iterables_in_one_graph():
    graphs, exits = compiled_and_eager(yields_from, torch.randn(2))
    assert graphs == 1 and exits == ["return"]


def test_yield_from_a_generator_that_breaks_is_made_by_python():
    def branchy(x):
        yield x
        if x.sum() > 0:  # a branch inside the delegated generator: not inlinable
            yield x * 2

    def outer(x):
        yield from branchy(x)

    def f(x):
        return [t + 1 for t in outer(x)]

    for x in (torch.ones(2), -torch.ones(2)):
        assert same(framejit.compile(f, backend=CompileCounter())(x), f(x))


def raises_and_catches(x):
    try:
        raise ValueError("boom")
    except ValueError as e:
        x = x * len(e.args[0])
    try:
        LayerView(2)[5]
    except (KeyError, IndexError):
        x = x - 1
    try:
        try:
            raise KeyError("k")
        except KeyError:
            raise  # bare: the same exception, to the outer handler
    except LookupError:
        x = x + 2
    return x


@pytest.mark.parametrize("inlined", [False, True])
def test_raise_caught_inside_the_trace_is_one_graph(inlined):
    target = calls_helper(raises_and_catches) if inlined else raises_and_catches
    graphs, exits = compiled_and_eager(target, torch.randn(3))
    assert graphs == 1 and exits == ["return"]


def test_an_exception_nothing_catches_reaches_the_caller_as_in_eager():
    def strict(x):
        if x.dim() != 2:
            raise ValueError(f"expected 2 dims, got {x.dim()}")
        return x * 2

    def f(x):
        return strict(x) + 1

    compiled = framejit.compile(f, backend=CompileCounter())
    assert same(compiled(torch.ones(2, 2)), f(torch.ones(2, 2)))
    with pytest.raises(ValueError, match="expected 2 dims, got 1"):
        compiled(torch.ones(3))


def test_an_except_clause_that_does_not_match_lets_the_exception_through():
    def inner(x):
        try:
            raise KeyError("k")
        except ValueError:
            return x * 100
        return x

    def f(x):
        try:
            return inner(x)
        except KeyError:
            return x - 1

    graphs, exits = compiled_and_eager(f, torch.randn(3))
    assert graphs == 1 and exits == ["return"]


def test_an_attribute_error_raised_by_a_getattribute_gives_getattrs_default():
    class Strict:
        def __getattribute__(self, key):
            if key == "missing":
                raise AttributeError(key)
            return object.__getattribute__(self, key)

    def f(x, obj):
        return x * getattr(obj, "missing", 3)

    graphs, exits = compiled_and_eager(f, torch.randn(2), Strict())
    assert graphs == 1 and exits == ["return"]


def test_an_except_block_left_open_where_the_region_ends_is_pythons():
    # The except block holds a branch on a tensor: the region cannot end inside it (CPython's
    # exception state), so the raise is left to CPython and the results stay eager's.
    def f(x):
        try:
            raise ValueError("v")
        except ValueError:
            if x.sum() > 0:
                return x + 1
            return x - 1

    compiled = framejit.compile(f, backend=CompileCounter())
    for x in (torch.ones(2), -torch.ones(2)):
        assert same(compiled(x), f(x))


class Interface(Mapping):
    """transformers' GeneralInterface, small: a Mapping whose get() is collections.abc's
    (`try: return self[key] except KeyError: return default`) over a dict read by source."""

    _global_mapping = {"sdpa": torch.nn.functional.scaled_dot_product_attention}

    def __getitem__(self, key):
        return self._global_mapping[key]

    def __iter__(self):
        return iter(self._global_mapping)

    def __len__(self):
        return len(self._global_mapping)


INTERFACE = Interface()


def attention_of(x, kind):
    fn = INTERFACE.get(kind, None)
    if fn is None:  # the eager path: no registered function
        return torch.softmax(x, -1)
    return fn(x, x, x)


def test_a_missing_key_raises_keyerror_in_the_trace_for_mapping_get():
    x = torch.randn(1, 2, 4, 8)
    graphs, exits = compiled_and_eager(attention_of, x, "eager")
    assert graphs == 1 and exits == ["return"]
    # The key's absence is guarded: registering it compiles again, with the registered function.
    counter = CompileCounter()
    compiled = framejit.compile(attention_of, backend=counter)
    assert same(compiled(x, "eager"), attention_of(x, "eager"))
    Interface._global_mapping["eager"] = torch.nn.functional.scaled_dot_product_attention
    try:
        assert same(compiled(x, "eager"), attention_of(x, "eager"))
        assert counter.frame_count == 2
    finally:
        del Interface._global_mapping["eager"]


def test_tensor_type_with_a_dtype_is_a_cast_in_the_graph():
    def f(x, y):
        return (x * 2).type(y.dtype) + y

    graphs, exits = compiled_and_eager(f, torch.randn(3), torch.ones(3, dtype=torch.float64))
    assert graphs == 1 and exits == ["return"]


def scan_in(h, acc_dtype: torch.dtype = torch.float32):  # RecurrentGemma's _rnn_scan
    return h.type(acc_dtype) * 2


def test_tensor_type_with_a_default_argument_dtype_or_a_legacy_class():
    def f(x):
        return scan_in(x.half()), x.type(torch.DoubleTensor)

    graphs, exits = compiled_and_eager(f, torch.randn(3))
    assert graphs == 1 and exits == ["return"]


def test_next_of_a_generator_only_the_call_holds():
    # next(gen(x)): nothing but the call's arguments holds the generator while its frame runs.
    def two(x):
        yield x + 1
        yield x + 2

    def f(x):
        return next(two(x)) + next(iter(two(x)), 0) + next(two(x) if False else iter(()), 5)

    graphs, exits = compiled_and_eager(calls_helper(f), torch.randn(3))
    assert graphs == 1 and exits == ["return"]


def test_next_past_the_end_raises_stopiteration_inside_the_trace():
    def f(x):
        it = iter([x])
        first = next(it)
        try:
            next(it)
        except StopIteration:
            return first * 2
        return first

    graphs, exits = compiled_and_eager(calls_helper(f), torch.randn(3))
    assert graphs == 1 and exits == ["return"]


class OwnText(Exception):
    def __str__(self):
        return "own text"


def reads_the_message(x):
    y = x + 1
    try:
        raise ValueError("bad size")
    except ValueError as e:
        msg = str(e) + repr(e)
    return y * len(msg)


def reads_an_own_message(x):
    try:
        raise OwnText("bad")
    except OwnText as e:
        msg = str(e)
    return x * len(msg)


def test_str_and_repr_of_a_caught_exception_are_its_text():
    counter = CompileCounter()
    compiled = framejit.compile(reads_the_message, backend=counter)
    x = torch.ones(2)
    assert same(compiled(x), reads_the_message(x)) and counter.frame_count == 1
    assert [r["exit"] for r in regions(reads_the_message)] == ["return"]
    # A class's own __str__ is Python code of its own: left to Python, with eager's result.
    assert same(framejit.compile(reads_an_own_message, backend=CompileCounter())(x), x * 8)


def wraps_the_error(x):
    try:
        try:
            raise KeyError("k")
        except KeyError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as e:
        cause = e.__cause__
        x = x + len(str(e)) + (1 if isinstance(cause, KeyError) else 100)
        x = x * (2 if e.__suppress_context__ else 3)
    try:
        raise ValueError("no cause") from None
    except ValueError as e:
        x = x - (1 if e.__cause__ is None and e.__suppress_context__ else 50)
    return x


def test_raise_from_inside_the_trace_sets_the_cause():
    graphs, exits = compiled_and_eager(wraps_the_error, torch.randn(3))
    assert graphs == 1 and exits == ["return"]


def keeps_the_error(x):
    try:
        try:
            raise KeyError("k")
        except KeyError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as e:
        err = e
    return x * 2, err


def test_an_exception_raised_from_another_leaves_the_trace_with_its_cause():
    compiled = framejit.compile(keeps_the_error, backend=CompileCounter())
    out, err = compiled(torch.ones(2))
    assert same(out, torch.ones(2) * 2)
    assert type(err) is RuntimeError and str(err) == "wrapped"
    assert type(err.__cause__) is KeyError and err.__suppress_context__


def test_raise_from_that_nothing_catches_reaches_the_caller_with_its_cause():
    def f(x):
        y = x * 2
        try:
            {}["missing"]
        except KeyError as e:
            raise ValueError("bad key") from e
        return y

    compiled = framejit.compile(f, backend=CompileCounter())
    with pytest.raises(ValueError, match="bad key") as info:
        compiled(torch.ones(2))
    assert type(info.value.__cause__) is KeyError


class _Recipe:
    def __init__(self, order):
        self.order = list(order)
        self.rank = len(order)  # a generator has no len(): Python raises TypeError


def len_of_an_iterator(x):
    try:
        n = len(c for c in "abc")
    except TypeError:
        n = -1
    try:
        rank = _Recipe(int(c) for c in "210").rank
    except TypeError as e:
        rank = -10 if "generator" in str(e) else -20
    return x + n + rank


def test_len_of_an_iterator_raises_type_error_as_python_does():
    # It counted the items (3, and 0 for the one list() had used up), a result Python never
    # gives.
    counter = CompileCounter()
    x = torch.zeros(2)
    assert same(framejit.compile(len_of_an_iterator, backend=counter)(x), len_of_an_iterator(x))
    assert len_of_an_iterator(x).tolist() == [-11.0, -11.0] and counter.frame_count == 1


def one_item(k):
    yield k * 2


def next_past_the_end(x):
    g = one_item(3)
    k = next(g)
    try:
        next(g)
    except StopIteration:
        k = k + 1
    return x * k


class GeneratorManager:
    """contextlib's _GeneratorContextManager, as a user's class: __exit__ steps the generator past
    its end and catches StopIteration."""

    def __init__(self, gen):
        self.gen = gen

    def __enter__(self):
        return next(self.gen)

    def __exit__(self, typ, value, traceback):
        try:
            next(self.gen)
        except StopIteration:
            return False
        raise RuntimeError("generator didn't stop")


def scaled(k, events):
    events.append("enter")
    yield k * 2
    events.append("exit")


def with_generator_manager(x, events):
    with GeneratorManager(scaled(3, events)) as k:
        y = x * k
    return y


@pytest.mark.parametrize("fn, args", [(next_past_the_end, ()), (with_generator_manager, ([],))])
def test_next_past_a_generators_end_raises_stop_iteration_into_the_trace(fn, args):
    # StopIteration at the consumer's next(), caught by its except block in the same graph (it
    # once wrote into the generator's freed frame: malloc abort).
    x = torch.ones(2)
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    for _ in range(3):
        fresh = [list(a) if isinstance(a, list) else a for a in args]
        eager_args = [list(a) if isinstance(a, list) else a for a in args]
        assert same(compiled(x, *fresh), fn(x, *eager_args)) and fresh == eager_args
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(fn)] == ["return"]


def next_past_the_end_uncaught(x):
    g = one_item(3)
    k = next(g)
    k = k + next(g, 1)  # a default: no StopIteration
    return x * k + next(g)  # StopIteration, caught by nothing: Python's to raise


def test_next_past_a_generators_end_with_no_handler_is_pythons_stop_iteration():
    compiled = framejit.compile(next_past_the_end_uncaught, backend=CompileCounter())
    with pytest.raises(StopIteration):
        compiled(torch.ones(2))
