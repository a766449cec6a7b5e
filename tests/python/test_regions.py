"""The region runtime end to end: the seed function, warm_branches, explain, numbers that come
out of a break, deopt mid-frame, exceptions at performed instructions, and the logs."""
import contextlib
import typing
import logging
import sys
import traceback
from pathlib import Path

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions, same


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from seed import my_function as seed  # noqa: E402  (the demo's function is the one tested)


def seed_inputs(take_true: bool):
    x = torch.rand(4, 4) + (0.5 if take_true else -1.0)
    return {"x": x, "y": torch.rand(4, 4)}


def test_seed_compiles_prefix_and_each_tail_once():
    counter = CompileCounter()
    compiled = framejit.compile(seed, backend=counter)
    for take_true in (True, False):
        inputs = seed_inputs(take_true)
        assert same(compiled(inputs), seed(inputs))
    assert counter.frame_count == 3  # prefix (add, mean, gt), true tail, false tail
    prefix_ops = [n.target for n in counter.graphs[0].graph.nodes if n.op != "placeholder"]
    assert [getattr(t, "__name__", t) for t in prefix_ops] == ["add", "mean", "gt", "output"]
    for _ in range(3):
        for take_true in (True, False):
            inputs = seed_inputs(take_true)
            assert same(compiled(inputs), seed(inputs))
    assert counter.frame_count == 3
    assert sorted(r["exit"] for r in regions(seed)) == ["branch", "return", "return"]


def test_seed_warm_branches_compiles_everything_at_the_first_call():
    counter = CompileCounter()
    compiled = framejit.compile(seed, backend=counter, warm_branches=True)
    inputs = seed_inputs(True)
    assert same(compiled(inputs), seed(inputs))
    assert counter.frame_count == 3
    assert [r["warmed"] for r in regions(seed)].count(True) == 1
    for take_true in (False, True, False):
        inputs = seed_inputs(take_true)
        assert same(compiled(inputs), seed(inputs))
    assert counter.frame_count == 3


def nested_branches(x, y):
    x = x + 1
    if x.sum() > 0:
        if y.mean() > 0:
            z = x * y
        else:
            z = x - y
    else:
        z = x / 2
        if z.max() > 10:
            z = z * 0
    return z


def test_warm_branches_reaches_branches_behind_untaken_sides():
    counter = CompileCounter()
    compiled = framejit.compile(nested_branches, backend=counter, warm_branches=True)
    ones = torch.ones(3)
    assert same(compiled(ones, ones), nested_branches(ones, ones))
    first = counter.frame_count
    assert first == 6  # prefix, two inner branch regions, and four tails - one tail without ops
    for x, y in ((ones, -ones), (-ones, ones), (-ones * 100, ones), (ones * 5, ones)):
        assert same(compiled(x, y), nested_branches(x, y))
    assert counter.frame_count == first


def test_explain_reports_graphs_breaks_and_regions():
    out = framejit.explain(seed)(seed_inputs(True))
    assert same(out.result, None) is False or out.result is not None
    assert out.graph_count == 2 and len(out.graphs) == 2
    assert out.graph_break_count == 1
    assert len(out.break_reasons) == 1
    line = seed.__code__.co_firstlineno + 4
    assert f"seed.py:{line}): if x.mean() > 0.5:" in out.break_reasons[0]
    assert "data_dependent" in out.break_reasons[0]
    text = str(out)
    assert "Graph count: 2" in text and "Graph break count: 1" in text
    assert "ran 1x" in text and "__compiled_fn_" in text
    warm = framejit.explain(seed, warm_branches=True)(seed_inputs(False))
    assert warm.graph_count == 3
    assert sum(r.warmed for r in warm.regions) == 1 and "warm_branches" in str(warm)


def item_then_scale(x):
    s = x.sum().item()
    scale = s * 2 + 1
    return x * scale, scale


def test_numbers_from_item_do_not_recompile_per_value():
    counter = CompileCounter()
    compiled = framejit.compile(item_then_scale, backend=counter)
    for value in (1.0, 2.0, 3.5, -4.0):
        x = torch.full((3,), value)
        assert same(compiled(x), item_then_scale(x))
    assert counter.frame_count == 2  # sum before the break; x * scale (scale a graph input) after
    assert len(regions(item_then_scale)) == 2
    graph = [r["graph"] for r in regions(item_then_scale) if r["entry_pc"] > 0][0]
    assert 'Sym(f64)' in graph


def slices_after_a_break(x, lengths):
    slen = x.size(1)
    if lengths.max().item() > slen:  # breaks: the rest starts mid-frame, slen a local there
        raise ValueError("a length past the sequence")  # (XLM asserts it)
    positions = torch.arange(16)[:slen]  # a slice bound from that local (XLM's position_ids)
    return x[:, : slen - 1] * 2 + positions[: slen - 1]


def test_a_slice_bound_read_from_a_local_mid_frame_is_pinned_not_a_deopt():
    counter = CompileCounter()
    compiled = framejit.compile(slices_after_a_break, backend=counter)
    for length in (6, 6, 9):
        x, lengths = torch.randn(2, length), torch.tensor([3, length])
        assert same(compiled(x, lengths), slices_after_a_break(x, lengths))
    exits = [r["exit"] for r in regions(slices_after_a_break)]
    assert "deopt" not in exits and exits.count("return") == 2  # one tail per length
    tails = [r for r in regions(slices_after_a_break) if r["exit"] == "return"]
    assert all(r["graph_id"] >= 0 for r in tails)


class RepeatsLayer(torch.nn.Module):
    def __init__(self, loops):
        super().__init__()
        self.loops = loops
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        loops = self.loops
        if x.sum().item() > 1e9:  # breaks: the rest starts mid-frame, `loops` a local there
            x = x * 0
        for i in range(loops):  # (Dory's recurrent loop: range(n_loops) of a config int)
            x = self.lin(x) * (0.5 if i < loops - 1 else 1.0)
        return x


def test_an_int_local_mid_frame_is_pinned_where_python_needs_its_value():
    counter = CompileCounter()
    model = RepeatsLayer(3)
    compiled = framejit.compile(model, backend=counter)
    for _ in range(3):
        x = torch.randn(2, 4)
        assert same(compiled(x), model(x))
    assert counter.frame_count == 2  # the sum, then the whole unrolled loop
    tail = [r for r in regions(model.forward) if r["entry_pc"] > 0 and r["graph_id"] >= 0]
    assert [r["exit"] for r in tail] == ["return"]
    assert tail[0]["graph"].count("= torch.nn.functional.linear(") == 3
    assert "L['loops']" in tail[0]["guards"]  # its value, guarded


def repeats_by_count(x, counts):
    loops = counts.sum().item()  # breaks: an int local where the rest starts
    for i in range(loops):
        x = x * 0.5 + i
    return x


def test_an_int_local_seen_with_another_value_stays_a_run_time_number_there():
    counter = CompileCounter()
    compiled = framejit.compile(repeats_by_count, backend=counter)
    x = torch.randn(3)
    for loops in (2, 2, 3, 4, 5, 3):
        counts = torch.tensor([loops, 0])
        assert same(compiled(x, counts), repeats_by_count(x, counts))
    # Pinned to 2 by the first compile of the rest; 3 fails that guard, and from then on the
    # loop is Python's at that place (an iterate exit per step): no compile per count.
    compiles = counter.frame_count
    for loops in (6, 7):
        counts = torch.tensor([loops, 0])
        assert same(compiled(x, counts), repeats_by_count(x, counts))
    assert counter.frame_count == compiles
    pinned = [r for r in regions(repeats_by_count) if "S[0] == 2" in r["guards"]]  # (.item()'s result)
    assert len(pinned) == 1 and pinned[0]["exit"] == "return"


def branch_on_number(x):
    n = x.sum().item()
    if n > 2:
        return x * 2
    return x - 1


def test_branch_on_a_number_is_decided_at_run_time():
    counter = CompileCounter()
    compiled = framejit.compile(branch_on_number, backend=counter)
    for value in (1.0, 5.0, 0.0, 7.0):
        x = torch.full((2,), value)
        assert same(compiled(x), branch_on_number(x))
    assert counter.frame_count == 3
    assert [r["exit"] for r in regions(branch_on_number)].count("branch") == 1


def uses_with(x):
    y = x * 2
    with torch.no_grad():  # the runtime enters it; the body is traced with grad mode off
        z = y + 1
    return z


def raises_in_with(x):
    y = x * 2
    try:
        with torch.no_grad():
            z = y + 1
            raise ValueError("inside")
    except ValueError as e:
        return z, str(e), torch.is_grad_enabled()


def run_grad_off(fn):
    """Compiles fn and calls it 3 times against eager: its result must not require grad, and
    grad mode is on again after each call. Returns the counter."""
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    x = torch.ones(2, requires_grad=True)
    for _ in range(3):
        out = compiled(x)
        assert same(out, fn(x)) and not out.requires_grad and torch.is_grad_enabled()
    return counter


def test_no_grad_block_is_one_graph_with_grad_mode_switches():
    counter = run_grad_off(uses_with)
    assert [(r["kind"], r["exit"]) for r in regions(uses_with)] == [("compiled", "return")]
    assert counter.frame_count == 1
    code = counter.graphs[0].code
    assert code.count("torch._C._set_grad_enabled(False)") == 1
    assert code.count("torch._C._set_grad_enabled(True)") == 1


def switches_then_breaks(x):
    torch.set_grad_enabled(False)
    torch._dynamo.graph_break()  # (torch.optim's step() breaks like this inside its no_grad)
    y = x * 2
    torch.set_grad_enabled(True)
    return y


def test_a_region_that_only_switches_grad_mode_gives_no_graph_and_the_runtime_switches():
    counter = run_grad_off(switches_then_breaks)
    kinds = [(r["kind"], r["exit"], r["graph_ops"]) for r in regions(switches_then_breaks)]
    assert kinds == [("compiled", "call", 0), ("compiled", "return", 2)]
    assert counter.frame_count == 1  # the first region's switch went to no backend
    assert "torch._C._set_grad_enabled(True)" in counter.graphs[0].code


class EventLog:
    """A context manager of the user's, entered and exited once per call (its events go into
    the list it is given, else its own)."""

    def __init__(self, events=None):
        self.events = [] if events is None else events

    def __enter__(self):
        self.events.append("enter")
        return self

    def __exit__(self, *exc):
        self.events.append("exit")
        return False


RECORDER = EventLog()


def uses_own_manager(x):
    y = x * 2
    with RECORDER:
        z = y + 1
    return z


def test_own_with_blocks_are_traced_with_their_enter_and_exit():
    counter = CompileCounter()
    compiled = framejit.compile(uses_own_manager, backend=counter)
    x = torch.ones(2)
    for _ in range(3):
        RECORDER.events.clear()  # (a list read by source is guarded by its items)
        assert same(compiled(x), uses_own_manager(x))
        assert RECORDER.events == ["enter", "exit"] * 2  # the trace's appends, replayed
    assert [(r["kind"], r["exit"]) for r in regions(uses_own_manager)] == [("compiled", "return")]
    assert counter.frame_count == 1


def breaks_inside_own_block(x, log):
    with EventLog(log) as cm:
        y = x + 1
        if y.sum() > 0:  # a break inside the block: the runtime gets the bound __exit__
            y = y * 3
        y = y - 1
    return y, cm.events


def test_a_region_ending_inside_an_own_block_leaves_its_exit_to_the_next():
    counter = CompileCounter()
    compiled = framejit.compile(breaks_inside_own_block, backend=counter)
    for sign in (1, -1, 1):
        log, ref_log = [], []
        x = torch.ones(3) * sign
        out, seen = compiled(x, log)
        ref, _ = breaks_inside_own_block(x, ref_log)
        assert same(out, ref) and log == ref_log == ["enter", "exit"] and seen is log
    assert [r["exit"] for r in regions(breaks_inside_own_block)][0] == "branch"
    assert counter.frame_count == 3  # before the branch; each side with the exit inlined


def uses_null_contexts(x):
    with torch.autograd.profiler.record_function("outer"):
        y = x * 2
        with contextlib.nullcontext(y) as z:
            y = z + 1
    return typing.cast(torch.Tensor, y)


def test_profiler_ranges_and_nullcontext_leave_nothing_in_the_graph():
    counter = CompileCounter()
    compiled = framejit.compile(uses_null_contexts, backend=counter)
    x = torch.ones(2)
    assert same(compiled(x), uses_null_contexts(x))
    assert counter.frame_count == 1 and regions(uses_null_contexts)[0]["exit"] == "return"
    code = counter.graphs[0].code
    assert "mul" in code and "add" in code and "record_function" not in code


@contextlib.contextmanager
def scaled_block(k, events):
    events.append("enter")
    try:
        yield k * 2
    finally:
        events.append("exit")


@contextlib.contextmanager
def grad_off():
    before = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        yield
    finally:
        torch.set_grad_enabled(before)


def uses_generator_managers(x, events):
    with scaled_block(3, events) as k:
        y = x * k
    with grad_off():
        z = y + 1
    return y, z


def test_contextmanager_functions_run_their_generator_in_the_trace():
    counter = CompileCounter()
    compiled = framejit.compile(uses_generator_managers, backend=counter)
    x = torch.ones(2, requires_grad=True)
    for _ in range(3):
        events, ref_events = [], []
        out = compiled(x, events)
        ref = uses_generator_managers(x, ref_events)
        assert same(out, ref) and events == ref_events == ["enter", "exit"]
        assert out[0].requires_grad and not out[1].requires_grad and torch.is_grad_enabled()
    assert [r["exit"] for r in regions(uses_generator_managers)] == ["return"]
    assert counter.frame_count == 1
    code = counter.graphs[0].code
    assert "x * 6" in code and "torch._C._set_grad_enabled(False)" in code


def breaks_inside_a_generator_manager(x, events):
    with scaled_block(2, events) as k:
        print("inside")  # the region ends here: the generator cannot leave the trace half run
        y = x * k
    return y


@contextlib.contextmanager
def catches_value_error(events):
    try:
        yield
    except ValueError as e:
        events.append(str(e))


def raises_inside_a_generator_manager(x, events):
    y = x * 2
    with catches_value_error(events):
        y = y + 1
        raise ValueError("inside")
    return y


@contextlib.contextmanager
def never_yields():
    if False:
        yield


@contextlib.contextmanager
def yields_twice():
    yield 1
    yield 2


def enters(manager_fn, x):
    with manager_fn():
        x = x + 1
    return x


def test_a_generator_manager_the_trace_cannot_finish_is_contextlibs_and_matches_eager(capsys):
    # A break inside the block, and an exception the generator catches: the call is traced
    # again left to contextlib, whose manager the runtime enters; results and events as eager's.
    for fn in (breaks_inside_a_generator_manager, raises_inside_a_generator_manager):
        compiled = framejit.compile(fn, backend=CompileCounter())
        for _ in range(2):
            events, ref_events = [], []
            assert same(compiled(torch.ones(2), events), fn(torch.ones(2), ref_events))
            assert events == ref_events and events, fn.__name__
        assert "with" in [r["exit"] for r in regions(fn)], fn.__name__
    # A generator that does not yield, or yields twice: contextlib's RuntimeError.
    compiled = framejit.compile(enters, backend=CompileCounter())
    for manager_fn, message in ((never_yields, "didn't yield"), (yields_twice, "didn't stop")):
        with pytest.raises(RuntimeError, match=message):
            compiled(manager_fn, torch.ones(2))


def defines_its_manager(x, events, brk=False):
    @contextlib.contextmanager
    def block(k):
        events.append("enter")
        try:
            yield k * 2
        finally:
            events.append("exit")

    with block(3) as k:
        if brk:
            print("inside")  # a break inside: the manager made in the trace runs as plain Python
        y = x * k
    return y + 1


def test_a_contextmanager_defined_inside_the_compiled_function_is_traced(recwarn, capsys):
    # contextlib.contextmanager called in the trace: its manager runs the generator in the trace
    # (one graph, no recompile per call, though the function is made anew by every call).
    for brk, graphs in ((False, 1), (True, 2)):
        counter = CompileCounter()
        compiled = framejit.compile(defines_its_manager, backend=counter)
        for _ in range(3):
            events, ref_events = [], []
            out = compiled(torch.ones(2), events, brk)
            assert same(out, defines_its_manager(torch.ones(2), ref_events, brk))
            assert events == ref_events == ["enter", "exit"]
        assert counter.frame_count == graphs, brk
        framejit.reset()
    assert not [w for w in recwarn if issubclass(w.category, framejit.FramejitWarning)]


def uses_inference_mode(x):
    y = x * 2
    with torch.inference_mode():
        z = y + 1
        if z.sum() > 0:  # a break inside: the block is left to the runtime
            z = z * 3
    return z


def test_inference_mode_block_with_a_break_inside_is_entered_by_the_runtime():
    compiled = framejit.compile(uses_inference_mode, backend=CompileCounter())
    x = torch.ones(2)
    for _ in range(2):
        out = compiled(x)
        assert same(out, uses_inference_mode(x)) and out.is_inference()
        assert not torch.is_inference_mode_enabled()
    assert "with" in [r["exit"] for r in regions(uses_inference_mode)]


def test_exception_inside_with_runs_exit_and_handler():
    compiled = framejit.compile(raises_in_with, backend=CompileCounter())
    x = torch.ones(2, requires_grad=True)
    z, message, grad_inside_handler = compiled(x)
    assert same(z, x * 2 + 1) and not z.requires_grad
    assert (message, grad_inside_handler) == ("inside", True) and torch.is_grad_enabled()
    assert regions(raises_in_with)[-1]["exit"] == "deopt"  # raise: CPython unwinds from there


def check_positive(t):
    if (t < 0).any():
        raise ValueError("negative entries")
    return t


def catches_from_performed_call(x):
    y = x - 1
    try:
        y = check_positive(y)
        status = "ok"
    except ValueError as e:
        status = str(e)
        y = y.abs()
    finally:
        y = y + 10
    return y, status


def test_exception_in_performed_call_runs_the_frames_own_handlers():
    compiled = framejit.compile(catches_from_performed_call, backend=CompileCounter())
    for x in (torch.ones(2) * 3, torch.zeros(2)):
        assert same(compiled(x), catches_from_performed_call(x))


def fails_after_break(x):
    if x.sum() > 0:
        x = x * 2
    return x.view(3, 3)


def test_exception_after_break_has_the_users_traceback_line():
    compiled = framejit.compile(fails_after_break, backend=CompileCounter())
    with pytest.raises(RuntimeError) as compiled_error:
        compiled(torch.ones(4))
    with pytest.raises(RuntimeError) as eager_error:
        fails_after_break(torch.ones(4))
    assert str(compiled_error.value) == str(eager_error.value)
    got = traceback.extract_tb(compiled_error.value.__traceback__)[-1]
    want = traceback.extract_tb(eager_error.value.__traceback__)[-1]
    assert (got.name, got.lineno, got.line) == (want.name, want.lineno, want.line)


def loop_with_break(x, n):
    for i in range(n):
        x = x * 2
        if x.abs().sum() > 50:
            x = x / 4
    return x


def test_break_inside_loop_reenters_cached_regions():
    counter = CompileCounter()
    compiled = framejit.compile(loop_with_break, backend=counter)
    x = torch.ones(3)
    assert same(compiled(x, 20), loop_with_break(x, 20))
    graphs, count = counter.frame_count, len(regions(loop_with_break))
    assert graphs <= 5
    assert same(compiled(x, 20), loop_with_break(x, 20))
    assert same(compiled(torch.ones(3) * 2, 20), loop_with_break(torch.ones(3) * 2, 20))
    assert (counter.frame_count, len(regions(loop_with_break))) == (graphs, count)
    body = [r for r in regions(loop_with_break) if r["hits"] >= 20]
    assert body, "the loop body region is re-entered on every iteration"


def test_fullgraph_raises_at_the_first_break():
    compiled = framejit.compile(seed, backend=CompileCounter(), fullgraph=True)
    with pytest.raises(framejit.Unsupported, match=r"graph break: branch on the value of a tensor"):
        compiled(seed_inputs(True))


def test_graph_breaks_and_regions_logs(caplog):
    framejit.set_logs("graph_breaks", "regions", handler=False)
    compiled = framejit.compile(seed, backend=CompileCounter())
    with caplog.at_level(logging.INFO, logger="framejit"):
        compiled(seed_inputs(True))
    breaks = [r.getMessage() for r in caplog.records if r.name == "framejit.graph_breaks"]
    region_lines = [r.getMessage() for r in caplog.records if r.name == "framejit.regions"]
    assert len(breaks) == 1 and "if x.mean() > 0.5:" in breaks[0]
    assert len(region_lines) == 2
    assert "-> branch" in region_lines[0] and "-> return" in region_lines[1]


def prints_between(x):
    y = x + 1
    print("sum", int(y.sum()))
    logging.getLogger("framejit_test_user").warning("y has %d elements", y.numel())
    return y * 3


def test_print_and_logging_in_the_middle(capsys, caplog):
    compiled = framejit.compile(prints_between, backend=CompileCounter())
    x = torch.ones(4)
    with caplog.at_level(logging.WARNING, logger="framejit_test_user"):
        out = compiled(x)
        expected = prints_between(x)
    assert same(out, expected)
    assert capsys.readouterr().out == "sum 8\nsum 8\n"
    records = [r for r in caplog.records if r.name == "framejit_test_user"]
    assert len(records) == 2
    # logging saw the user's frame as the caller, as in eager
    assert records[0].funcName == records[1].funcName == "prints_between"
    assert records[0].lineno == records[1].lineno


class Recorder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        self.last = y              # replayed after the graph runs
        self.note = "seen"
        if y.sum() > 0:            # a break: the writes before it are replayed at that exit
            self.positive = True
        return self.last * 2       # read back from the trace, not from the object


def test_attribute_writes_are_replayed_in_order_without_a_break():
    torch.manual_seed(0)
    model, ref = Recorder(), Recorder()
    ref.load_state_dict(model.state_dict())
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    for x in (torch.ones(2, 3), -torch.ones(2, 3) * 5, torch.ones(2, 3)):
        for m in (model, ref):
            m.__dict__.pop("positive", None)
        assert same(compiled(x), ref(x))
        assert same(model.last, ref.last) and model.note == ref.note == "seen"
        assert model.__dict__.get("positive") == ref.__dict__.get("positive")
    exits = [r["exit"] for r in regions(Recorder.forward)]
    assert "deopt" not in exits and exits.count("branch") == 1


def sums_items(d):
    out = 0
    for key, value in d.items():
        out = out + value * len(key)
    return out


def test_iterating_an_input_dict_guards_its_keys_in_order():
    counter = CompileCounter()
    compiled = framejit.compile(sums_items, backend=counter)
    ones, twos = torch.ones(2), torch.full((2,), 2.0)  # distinct tensors: aliasing is guarded too
    for d in ({"a": ones, "bb": twos}, {"a": ones * 2, "bb": twos}):
        assert same(compiled(d), sums_items(d))
    assert counter.frame_count == 1
    for d in ({"a": ones, "bb": twos, "ccc": ones * 4}, {"bb": twos, "a": ones * 3}):
        assert same(compiled(d), sums_items(d))  # a new key, then the same keys reordered
    assert counter.frame_count == 3
    assert "DICT_KEYS" in regions(sums_items)[0]["guards"]


def gathers_without_grad(x, idx):
    with torch.no_grad():
        y = x[idx] * 2
    return y + x.sum()


def test_a_graph_that_raises_inside_no_grad_leaves_grad_mode_as_it_was():
    compiled = framejit.compile(gathers_without_grad, backend=CompileCounter())
    x = torch.randn(4, requires_grad=True)
    good = torch.tensor([0, 3])
    assert same(compiled(x, good), gathers_without_grad(x, good))
    bad = torch.tensor([0, 9])  # out of range: only the graph's run finds out
    with pytest.raises(IndexError) as compiled_error:
        compiled(x, bad)
    assert torch.is_grad_enabled()
    with pytest.raises(IndexError) as eager_error:
        gathers_without_grad(x, bad)
    assert str(compiled_error.value) == str(eager_error.value)


def positives_scaled(x, mask_source):
    y = x * 2
    z = y[mask_source > 0]  # data-dependent size: the runtime reads it between two graphs
    return z.sum() + x.mean(), z


def test_a_bool_mask_read_is_a_subscript_exit_between_two_graphs():
    counter = CompileCounter()
    compiled = framejit.compile(positives_scaled, backend=counter)
    for seed in range(4):  # a different number of positives each time
        torch.manual_seed(seed)
        x, m = torch.randn(6), torch.randn(6)
        assert same(compiled(x, m), positives_scaled(x, m))
    assert [r["exit"] for r in regions(positives_scaled)] == ["subscript", "return"]
    assert counter.frame_count == 2  # the second graph runs any size of z
    with pytest.raises(IndexError) as raised:  # the mask's shape is wrong: raised as in eager
        compiled(torch.randn(6), torch.randn(5))
    assert raised.traceback[-1].lineno + 1 == positives_scaled.__code__.co_firstlineno + 2


def test_a_frame_of_64_regions_reenters_each_one_per_call():
    # 63 branches on a tensor: 64 regions at 64 entry pcs, each found again on later calls
    # (the runtime indexes regions by entry pc) and none compiled twice.
    body = "".join("    if x.sum() > -1e9:\n        x = x * 0.5\n" for _ in range(63))
    namespace = {}
    exec("def many(x):\n" + body + "    return x + 1\n", namespace)
    many = namespace["many"]
    counter = CompileCounter()
    compiled = framejit.compile(many, backend=counter)
    for _ in range(3):
        x = torch.randn(3)
        assert same(compiled(x), many(x))
    found = regions(many)
    assert len(found) == 64 and len({r["entry_pc"] for r in found}) == 64
    assert counter.frame_count == 64
    assert all(r["hits"] == 3 for r in found)
