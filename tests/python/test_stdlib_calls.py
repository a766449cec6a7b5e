"""Standard-library calls the tracer answers itself (csrc/trace/stdlib_calls.cpp): logging's
level checks, contextvars.ContextVar's get / set / reset, contextlib.suppress (and an exception
leaving a traced `with` block), weakref.ref calls and id(). A disabled `logger.debug(...)` is nothing in the graph and `logger.isEnabledFor`
a constant, each guarded by what it read, so a level changed between calls compiles again and
the record is logged; an enabled record ends the region (Python logs it), as under
torch.compile. A ContextVar's value is read by source on every call, and the value a region
leaves it with is set again at the region's exit."""
import contextlib
import contextvars
import logging
import weakref

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions, same

log = logging.getLogger("framejit_tests.stdlib")


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def setup_logger(level):
    log.setLevel(level)
    log.propagate = False
    log.handlers = [Records()]
    return log.handlers[0]


def logs_at_debug(x):
    y = x * 2
    log.debug("y has shape %s", tuple(y.shape))
    log.info("info %d", 3)
    if log.isEnabledFor(logging.DEBUG):
        y = y + 100
    log.log(logging.DEBUG, "through log()")
    return y + 1


def test_disabled_records_are_nothing_in_one_graph():
    records = setup_logger(logging.WARNING)
    x = torch.randn(4)
    counter = CompileCounter()
    compiled = framejit.compile(logs_at_debug, backend=counter)
    for _ in range(3):
        assert same(compiled(x), logs_at_debug(x))
    assert counter.frame_count == 1 and counter.op_count == 2
    explained = framejit.explain(logs_at_debug)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert records.messages == []


def test_a_level_changed_between_calls_compiles_again_and_logs():
    records = setup_logger(logging.WARNING)
    x = torch.randn(4)
    counter = CompileCounter()
    compiled = framejit.compile(logs_at_debug, backend=counter)
    assert same(compiled(x), x * 2 + 1)
    log.setLevel(logging.DEBUG)  # clears the logger's cache: its guard fails
    assert same(compiled(x), x * 2 + 101)  # the isEnabledFor branch taken
    assert records.messages == ["y has shape (4,)", "info 3", "through log()"]
    log.setLevel(logging.WARNING)
    assert same(compiled(x), x * 2 + 1)
    assert len(records.messages) == 3
    logging.disable(logging.CRITICAL)  # logging.disable too
    try:
        log.setLevel(logging.DEBUG)
        assert same(compiled(x), x * 2 + 1)
        assert len(records.messages) == 3
    finally:
        logging.disable(logging.NOTSET)
    assert same(compiled(x), x * 2 + 101)
    assert len(records.messages) == 6
    log.disabled = True  # the logger's own switch
    try:
        assert same(compiled(x), x * 2 + 1)
        assert len(records.messages) == 6
    finally:
        log.disabled = False


def test_an_enabled_record_is_logged_by_python():
    records = setup_logger(logging.INFO)

    def f(x):
        y = x * 2
        log.info("sum is %.1f", 4.0)
        return y + 1

    x = torch.randn(3)
    explained = framejit.explain(f)(x)
    mine = [r for r in explained.breaks if r.function.endswith("<locals>.f")]  # (not emit's)
    assert len(mine) == 1 and "Logger.info" in mine[0].reason
    compiled = framejit.compile(f, backend=CompileCounter())
    assert same(compiled(x), f(x))
    assert records.messages.count("sum is 4.0") == 3  # explain, compiled, eager


def test_get_logger_inside_the_function(caplog):
    setup_logger(logging.WARNING)

    def f(x):
        logger = logging.getLogger("framejit_tests.stdlib")
        logger.debug("not logged %s", x.dtype)
        return logging.getLogger().isEnabledFor(logging.CRITICAL), x + 1

    x = torch.randn(3)
    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    framejit.set_logs("guards", "recompiles", handler=False)
    try:
        with caplog.at_level(logging.INFO, logger="framejit"):
            assert same(compiled(x), f(x)) and same(compiled(x), f(x))
            log.setLevel(logging.DEBUG)
            assert same(compiled(x), f(x))
    finally:
        framejit.set_logs()
        log.setLevel(logging.WARNING)
    assert counter.frame_count == 2
    guards = "\n".join(r.getMessage() for r in caplog.records if r.name == "framejit.guards")
    assert "loggerDict['framejit_tests.stdlib']" in guards and "._cache" in guards
    recompiles = "\n".join(r.getMessage() for r in caplog.records if r.name == "framejit.recompiles")
    assert "_cache" in recompiles
    explained = framejit.explain(f)(x)
    assert explained.graph_break_count == 0, explained.break_reasons


def test_a_logger_getlogger_would_make_is_made_by_python():
    def f(x):
        return logging.getLogger("framejit_tests.made_at_run_time").isEnabledFor(logging.DEBUG), x + 1

    x = torch.randn(3)
    assert "framejit_tests.made_at_run_time" not in logging.Logger.manager.loggerDict
    compiled = framejit.compile(f, backend=CompileCounter())
    assert same(compiled(x), f(x))
    assert same(compiled(x), f(x))


# --- contextvars ---------------------------------------------------------------------------

scale = contextvars.ContextVar("framejit_tests_scale", default=1.0)
extra = contextvars.ContextVar("framejit_tests_extra")  # no default


def scaled_inside(x):
    token = scale.set(2.0)
    try:
        y = x * scale.get()
    finally:
        scale.reset(token)
    return y * scale.get()  # the value it had before


def sets_for_later(x):
    scale.set(3.0)  # the context keeps it after the call
    return x * scale.get()


def test_set_and_reset_inside_one_graph():
    x = torch.randn(4)
    for value in (1.0, 5.0):
        scale.set(value)
        counter = CompileCounter()
        compiled = framejit.compile(scaled_inside, backend=counter)
        assert same(compiled(x), x * 2.0 * value) and same(compiled(x), scaled_inside(x))
        assert scale.get() == value and counter.frame_count == 1
        explained = framejit.explain(scaled_inside)(x)
        assert explained.graph_break_count == 0, explained.break_reasons


def test_a_set_the_context_keeps_is_replayed_at_the_exit():
    x = torch.randn(4)
    counter = CompileCounter()
    compiled = framejit.compile(sets_for_later, backend=counter)
    for _ in range(2):
        scale.set(1.0)
        assert same(compiled(x), x * 3.0)
        assert scale.get() == 3.0
    assert counter.frame_count == 1
    # in another context: the set lands there, not here
    scale.set(1.0)
    context = contextvars.copy_context()
    assert same(context.run(compiled, x), x * 3.0)
    assert scale.get() == 1.0 and context[scale] == 3.0


def test_get_reads_the_value_on_every_call():
    x = torch.randn(3)

    def f(x):
        return x * scale.get() + extra.get()

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    scale.set(2.0)
    extra.set(torch.ones(3))  # a tensor: a graph input
    assert same(compiled(x), x * 2.0 + 1)
    extra.set(torch.full((3,), 4.0))
    assert same(compiled(x), x * 2.0 + 4)
    assert counter.frame_count == 1
    scale.set(-1.0)  # a number: guarded by value
    assert same(compiled(x), -x + 4)
    assert counter.frame_count == 2
    context = contextvars.Context()  # extra has no value there: LookupError, as in eager
    with pytest.raises(LookupError):
        context.run(compiled, x)
    scale.set(1.0)


def test_get_with_a_default_prefers_it_to_the_variables_own():
    x = torch.randn(3)

    def f(x):
        override = scale.get(None)  # None where the context has no value (not scale's 1.0)
        return (x, "unset") if override is None else (x * override, "set")

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    empty = contextvars.Context()
    assert same(empty.run(compiled, x), (x, "unset")) and same(empty.run(f, x), (x, "unset"))
    scale.set(3.0)
    assert same(compiled(x), (x * 3.0, "set"))
    assert same(empty.run(compiled, x), (x, "unset"))  # unset again: the first version's guards hold
    assert counter.frame_count == 1  # (the unset version has no op: no graph)
    assert len(regions(f)) == 2
    scale.set(1.0)


def test_a_token_that_outlives_the_region_is_made_by_python():
    kept = []

    def f(x):
        kept.append(scale.set(5.0))
        return x * scale.get()

    scale.set(1.0)
    x = torch.randn(3)
    compiled = framejit.compile(f, backend=CompileCounter())
    assert same(compiled(x), x * 5.0) and scale.get() == 5.0
    assert isinstance(kept[0], contextvars.Token)
    scale.reset(kept[0])  # a real token of this context
    assert scale.get() == 1.0
    explained = framejit.explain(f)(x)
    assert explained.graph_count == 1
    assert "outlives the region" in explained.break_reasons[0]
    scale.reset(kept[-1])


def test_reset_with_a_token_made_before_the_region():
    def f(x, token):
        scale.reset(token)
        return x * scale.get()

    scale.set(1.0)
    x = torch.randn(3)
    compiled = framejit.compile(f, backend=CompileCounter())
    assert same(compiled(x, scale.set(7.0)), x) and scale.get() == 1.0


# --- contextlib.suppress, and exceptions leaving a with block -------------------------------


def looks_up_with_suppress(x, table, key):
    y = x
    with contextlib.suppress(KeyError, IndexError):
        y = x * table[key]
        y = y + 100  # skipped where the lookup raised
    return y + 1


def test_suppress_swallows_a_missing_key_in_one_graph():
    counter = CompileCounter()
    compiled = framejit.compile(looks_up_with_suppress, backend=counter)
    x = torch.ones(3)
    for key in ("a", "b", "a"):
        table = {"a": 2.0}
        assert same(compiled(x, table, key), looks_up_with_suppress(x, table, key))
    assert counter.frame_count == 2  # key present, key absent (its absence guarded)
    assert all(r["exit"] == "return" for r in regions(looks_up_with_suppress))


def test_suppress_lets_other_exceptions_through():
    def f(x, table):
        with contextlib.suppress(IndexError):
            return x * table["missing"]

    compiled = framejit.compile(f, backend=CompileCounter())
    with pytest.raises(KeyError):
        compiled(torch.ones(2), {})


class Recording:
    """A manager of the user's whose __exit__ sees the block's exception and swallows it."""

    def __init__(self):
        self.seen = []

    def __enter__(self):
        return self

    def __exit__(self, typ, value, traceback):
        self.seen.append(None if typ is None else typ.__name__)
        return typ is ValueError


def raises_inside_a_user_manager(x, rec):
    with rec:
        if x.dim() == 1:
            raise ValueError("one dim")
        x = x * 2
    return x + 1


def test_an_exception_leaving_a_with_block_is_handed_to_the_traced_exit():
    rec, eager_rec = Recording(), Recording()
    compiled = framejit.compile(raises_inside_a_user_manager, backend=CompileCounter())
    x = torch.ones(3)
    assert same(compiled(x, rec), raises_inside_a_user_manager(x, eager_rec))
    assert rec.seen == eager_rec.seen == ["ValueError"]
    assert [r["exit"] for r in regions(raises_inside_a_user_manager)] == ["return"]


# --- weakref.ref and id() ----------------------------------------------------------------------


class Holder:
    def __init__(self, scale):
        self.scale = scale


def test_a_weakref_call_reads_its_referent_and_guards_it():
    held = Holder(3.0)
    ref = weakref.ref(held)

    def f(x):
        obj = ref()
        return x * (obj.scale if obj is not None else 1.0)

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x = torch.ones(2)
    assert same(compiled(x), x * 3.0) and counter.frame_count == 1
    held.scale = 5.0
    assert same(compiled(x), x * 5.0)
    del held  # dead: r() is None now, which the guard on r() sees
    assert same(compiled(x), x)
    assert counter.frame_count == 3


def same_tensor_twice(x, y):
    if id(x) == id(y):
        return x * 2
    return x + y


def test_id_of_two_tensor_inputs_compares_their_identity_guarded():
    counter = CompileCounter()
    compiled = framejit.compile(same_tensor_twice, backend=counter)
    a, b = torch.ones(2), torch.full((2,), 3.0)
    assert same(compiled(a, b), a + b)
    assert same(compiled(a, a), a * 2)
    assert same(compiled(b, torch.ones(2)), b + 1)
    assert counter.frame_count == 2
    assert all(r["exit"] == "return" for r in regions(same_tensor_twice))


def test_id_of_an_object_read_by_source_is_a_constant_guarded_by_identity():
    seen = {}
    layer = torch.nn.Linear(2, 2)

    def f(x, module):
        seen.setdefault(id(module), module)  # (a write into a dict made before: at the exit)
        return module(x)

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x = torch.randn(3, 2)
    assert same(compiled(x, layer), layer(x))
    other = torch.nn.Linear(2, 2)
    assert same(compiled(x, other), other(x))
    assert seen == {id(layer): layer, id(other): other}
    assert counter.frame_count == 2


def test_id_of_a_container_is_left_to_python():
    def f(x, xs):
        ys = [x * 2]
        same_list = id(xs) == id(xs)
        return ys[0] + (1 if same_list else 2), id(ys) == id(ys)

    compiled = framejit.compile(f, backend=CompileCounter())
    xs = [1, 2]
    assert same(compiled(torch.ones(2), xs), f(torch.ones(2), xs))
