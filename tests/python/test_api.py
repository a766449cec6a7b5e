"""The public API: compile forms, modules, backends, reset/disable, fullgraph, fallbacks,
guards and recompiles, logs. Every compiled result is compared with eager."""
import functools
import logging
import threading

import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit import _C
from framejit.testing import CompileCounter, regions, same


def add_mul(x, y):
    return torch.add(x, 1.0) * y


def test_decorator_forms_and_wrapper_attributes():
    counter = CompileCounter()

    @framejit.compile
    def bare(x):
        return x.sin() + 1

    @framejit.compile(backend=counter)
    def with_args(x):
        return x.cos() * 2

    direct = framejit.compile(add_mul, backend=counter)
    x, y = torch.randn(3), torch.randn(3)
    assert same(bare(x), x.sin() + 1)
    assert same(with_args(x), x.cos() * 2)
    assert same(direct(x, y), add_mul(x, y))
    assert counter.frame_count == 2
    assert direct.__name__ == "add_mul" and direct.__wrapped__ is add_mul
    assert len(regions(bare)) == 1 and regions(bare)[0]["kind"] == "compiled"


def test_compiled_method_binds_self():
    counter = CompileCounter()

    class Scaler:
        def __init__(self):
            self.scale = 3.0

        @framejit.compile(backend=counter)
        def apply(self, x):
            return x * self.scale

    s = Scaler()
    x = torch.randn(4)
    assert same(s.apply(x), x * 3.0)
    assert same(s.apply(x), x * 3.0)
    assert counter.frame_count == 1
    s.scale = 4.0  # a constant the trace used: its guard fails, one recompile
    assert same(s.apply(x), x * 4.0)
    assert counter.frame_count == 2


class TinyLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 3))
        self.bias = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("offset", torch.ones(4))

    def forward(self, x):
        return F.relu(F.linear(x, self.weight, self.bias)) + self.offset


def test_module_shares_parameters_and_reads_them_each_call():
    counter = CompileCounter()
    mod = TinyLinear()
    compiled = framejit.compile(mod, backend=counter)
    assert isinstance(compiled, torch.nn.Module)
    assert [p is q for p, q in zip(compiled.parameters(), mod.parameters())] == [True, True]
    x = torch.randn(2, 3)
    assert same(compiled(x), mod(x))
    with torch.no_grad():
        mod.weight.mul_(2)  # parameters are graph inputs, not constants baked into the graph
    assert same(compiled(x), mod(x))
    assert counter.frame_count == 1
    graph = regions(type(mod).forward)[0]["graph"]
    assert "self_weight" in graph and "self_offset" in graph


def test_module_gradients_match_eager():
    torch.manual_seed(0)
    mod = TinyLinear()
    ref = TinyLinear()
    ref.load_state_dict(mod.state_dict())
    compiled = framejit.compile(mod, backend=CompileCounter())
    x = torch.randn(5, 3)
    compiled(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(mod.parameters(), ref.parameters()):
        assert same(p.grad, q.grad)


def test_input_gradients_match_eager():
    compiled = framejit.compile(add_mul, backend=CompileCounter())
    x1 = torch.randn(3, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    y = torch.randn(3)
    compiled(x1, y).sum().backward()
    add_mul(x2, y).sum().backward()
    assert same(x1.grad, x2.grad)


def test_grad_mode_is_guarded():
    counter = CompileCounter()
    compiled = framejit.compile(add_mul, backend=counter)
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3)
    with torch.no_grad():
        out = compiled(x, y)
    assert not out.requires_grad
    out = compiled(x, y)
    assert out.requires_grad and counter.frame_count == 2


def test_backend_registry_names_and_errors():
    seen = []

    @framejit.backends.register("recording_test_backend")
    def recording(gm, example_inputs):
        seen.append([tuple(t.shape) for t in example_inputs])
        return gm.forward

    compiled = framejit.compile(add_mul, backend="recording_test_backend")
    x, y = torch.randn(2, 2), torch.randn(2, 2)
    assert same(compiled(x, y), add_mul(x, y))
    assert seen == [[(2, 2), (2, 2)]]
    assert "recording_test_backend" in framejit.backends.list_backends()
    with pytest.raises(ValueError, match="unknown framejit backend"):
        framejit.compile(add_mul, backend="no_such_backend")


def test_torch_compile_backend_by_name():
    compiled = framejit.compile(add_mul, backend="aot_eager")
    x, y = torch.randn(4), torch.randn(4)
    assert same(compiled(x, y), add_mul(x, y))
    assert regions(compiled)[0]["kind"] == "compiled"


def test_inductor_backend():
    compiled = framejit.compile(add_mul, backend="inductor")
    x, y = torch.randn(8), torch.randn(8)
    assert same(compiled(x, y), add_mul(x, y))
    assert same(compiled(x, y), add_mul(x, y))
    assert regions(compiled)[0]["kind"] == "compiled"


def test_reset_drops_every_cache():
    counter = CompileCounter()
    compiled = framejit.compile(add_mul, backend=counter)
    x, y = torch.randn(3), torch.randn(3)
    compiled(x, y)
    compiled(x, y)
    assert counter.frame_count == 1
    framejit.reset()
    assert regions(compiled) == []
    compiled(x, y)
    assert counter.frame_count == 2


def helper_inner(x):
    return x.exp() - 1


def outer_calls_helper(x):
    return helper_inner(x) * 2


def test_nested_user_call_is_inlined_and_disable_keeps_it_out():
    global helper_inner
    counter = CompileCounter()
    compiled = framejit.compile(outer_calls_helper, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x), outer_calls_helper(x))
    # helper_inner is traced into: one graph with exp, sub and mul, and no frame of its own.
    assert counter.frame_count == 1
    assert [n.target.__name__ for n in counter.graphs[0].graph.nodes
            if n.op == "call_function"] == ["sub", "mul"]
    assert [(r["kind"], r["exit"]) for r in regions(outer_calls_helper)] == [("compiled", "return")]
    assert regions(helper_inner) == []

    framejit.reset()
    counter.clear()
    original = helper_inner
    helper_inner = framejit.disable(original)
    try:
        assert same(compiled(x), outer_calls_helper(x))
        # The disabled helper is a call the runtime makes, in plain Python: the outer frame
        # compiles around it (only `* 2` has a tensor op).
        outer = regions(outer_calls_helper)
        assert [(r["kind"], r["exit"]) for r in outer] == [("compiled", "call"),
                                                            ("compiled", "return")]
        assert counter.frame_count == 1
        assert regions(original) == []
    finally:
        helper_inner = original


def _disabled_helper(x):
    return x.exp() * 2


def _calls_a_torch_disabled_helper(x):
    return torch_disabled(x) + 1


torch_disabled = torch.compiler.disable(_disabled_helper)


def test_torch_compiler_disable_keeps_the_function_and_its_callees_out_as_torch_compile_does():
    # The trace breaks at the call; the wrapper's frame and everything it calls then run with
    # the hook off (the helper was compiled as a frame of its own before: a graph torch.compile
    # does not make).
    counter = CompileCounter()
    compiled = framejit.compile(_calls_a_torch_disabled_helper, backend=counter)
    x = torch.randn(3)
    for _ in range(2):
        assert same(compiled(x), _calls_a_torch_disabled_helper(x))
    assert counter.frame_count == 1
    assert "exp" not in counter.graphs[0].code
    assert regions(_disabled_helper) == []


def test_torch_and_stdlib_frames_are_skipped():
    counter = CompileCounter()

    def uses_python_torch_function(x):
        return F.gelu(F.softmax(x, dim=-1))  # F.softmax is Python code inside torch

    compiled = framejit.compile(uses_python_torch_function, backend=counter)
    x = torch.randn(2, 5)
    assert same(compiled(x), uses_python_torch_function(x))
    assert counter.frame_count == 1
    assert regions(F.softmax) == []


def test_hook_is_on_only_while_a_compiled_function_runs():
    observed = []

    @framejit.disable
    def probe():
        observed.append(_C.hook_installed())

    def fn(x):
        probe()
        return x + 1

    compiled = framejit.compile(fn, backend=CompileCounter())
    assert not _C.hook_installed()
    assert same(compiled(torch.ones(2)), torch.ones(2) + 1)
    assert observed == [True]
    assert not _C.hook_installed()


def test_fullgraph_raises_with_reason_and_line():
    def branches(x):
        if x.sum() > 0:
            return x + 1
        return x - 1

    compiled = framejit.compile(branches, backend=CompileCounter(), fullgraph=True)
    with pytest.raises(framejit.Unsupported) as info:
        compiled(torch.ones(3))
    message = str(info.value)
    assert "data_dependent" in message
    assert f"test_api.py:{branches.__code__.co_firstlineno + 1}" in message
    assert "if x.sum() > 0:" in message


def test_untraceable_frame_runs_in_python_with_one_log_line(caplog, capsys):
    framejit.set_logs("graph_breaks", handler=False)

    def prints(x):
        y = x * 2
        print("value", y.shape)
        return y + 1

    compiled = framejit.compile(prints, backend=CompileCounter())
    with caplog.at_level(logging.INFO, logger="framejit"):
        out = compiled(torch.ones(2))
        compiled(torch.ones(2))  # the fallback is cached: no second log line
    assert same(out, torch.ones(2) * 2 + 1)
    assert capsys.readouterr().out == "value torch.Size([2])\nvalue torch.Size([2])\n"
    records = [r for r in caplog.records if r.name == "framejit.graph_breaks"]
    assert len(records) == 1
    line = prints.__code__.co_firstlineno + 2
    assert f"test_api.py:{line}" in records[0].getMessage()
    assert "print" in records[0].getMessage()


def test_errors_of_the_user_program_surface_as_in_eager():
    def bad_matmul(x, y):
        return torch.matmul(x, y)

    compiled = framejit.compile(bad_matmul, backend=CompileCounter())
    with pytest.raises(RuntimeError) as compiled_error:
        compiled(torch.ones(2, 3), torch.ones(2, 3))
    with pytest.raises(RuntimeError) as eager_error:
        bad_matmul(torch.ones(2, 3), torch.ones(2, 3))
    assert str(compiled_error.value) == str(eager_error.value)
    assert compiled_error.traceback[-1].name == "bad_matmul"


def test_recompiles_log_says_which_guard_failed(caplog):
    framejit.set_logs("recompiles", "guards", handler=False)
    counter = CompileCounter()
    compiled = framejit.compile(add_mul, backend=counter, dynamic=False)
    with caplog.at_level(logging.INFO, logger="framejit"):
        compiled(torch.ones(2), torch.ones(2))
        compiled(torch.ones(3), torch.ones(3))
    assert counter.frame_count == 2
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "framejit.recompiles")
    assert "sizes changed: expected [2], got [3]" in text
    guards = [r.getMessage() for r in caplog.records if r.name == "framejit.guards"]
    assert len(guards) == 2 and "TENSOR_MATCH L['x']" in guards[0]


def test_recompile_limit_then_plain_python_with_one_warning():
    counter = CompileCounter()
    compiled = framejit.compile(add_mul, backend=counter, options={"recompile_limit": 2},
                                dynamic=False)
    for n in (1, 2):
        compiled(torch.ones(n), torch.ones(n))
    with pytest.warns(framejit.FramejitWarning, match="recompile_limit"):
        out = compiled(torch.ones(5), torch.ones(5))
    assert same(out, add_mul(torch.ones(5), torch.ones(5)))
    out = compiled(torch.ones(6), torch.ones(6))  # no second warning (filterwarnings=error)
    assert same(out, add_mul(torch.ones(6), torch.ones(6)))
    assert counter.frame_count == 2


class Settings:
    def __init__(self):
        self.scale, self.shift, self.depth = 2.0, 1.0, 3

    def __getattribute__(self, name):  # a config's remapping hook, keyed on the name
        return object.__getattribute__(self, {"alias": "scale"}.get(name, name))


def reads_settings(settings, names):
    return [getattr(settings, name) for name in names]  # calls the hook from here


def test_a_helper_that_makes_no_graph_goes_to_plain_python_at_the_limit_without_a_warning(caplog):
    # Settings.__getattribute__ is entered with a new name each call, keyed on it: after
    # recompile_limit versions with no graph among them it runs as plain Python, silently.
    framejit.set_logs("recompiles", handler=False)
    counter = CompileCounter()
    compiled = framejit.compile(reads_settings, backend=counter, options={"recompile_limit": 2})
    settings = Settings()
    names = ["scale", "shift", "depth", "alias", "scale"]
    with caplog.at_level(logging.INFO, logger="framejit"):
        for _ in range(2):  # (filterwarnings=error: a warning fails the test)
            assert compiled(settings, names) == reads_settings(settings, names)
    assert counter.frame_count == 0
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "framejit.recompiles")
    assert "Settings.__getattribute__" in text and "made no graph" in text


def test_sizes_not_read_into_python_are_not_guarded(caplog):
    framejit.set_logs("guards", "recompiles", handler=False)
    counter = CompileCounter()
    compiled = framejit.compile(add_mul, backend=counter)
    with caplog.at_level(logging.INFO, logger="framejit"):
        for n in (2, 3, 7):
            x, y = torch.randn(n), torch.randn(n)
            assert same(compiled(x, y), add_mul(x, y))
        assert counter.frame_count == 1
        x, y = torch.randn(2, 2), torch.randn(2, 2)  # a new rank traces again
        assert same(compiled(x, y), add_mul(x, y))
    assert counter.frame_count == 2
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "(any sizes of this rank)" in text and "rank changed: expected 1, got 2" in text


def test_sizes_read_into_python_are_specialised():
    def per_row(x):
        if x.shape[0] > 2:  # a branch needs the number: this size is specialised
            return x * 2
        return x * x.shape[0] + x.size(1)  # only into torch ops: graph values

    counter = CompileCounter()
    compiled = framejit.compile(per_row, backend=counter)
    for n in (2, 3, 2):
        x = torch.randn(n, 4)
        assert same(compiled(x), per_row(x))
    assert counter.frame_count == 2


def test_a_backend_without_the_shape_generic_mark_compiles_per_size():
    graphs = []

    def my_backend(gm, example_inputs):  # e.g. one that specialises on example_inputs' sizes
        graphs.append(gm)
        return gm.forward

    compiled = framejit.compile(add_mul, backend=my_backend)
    for n in (2, 3):
        compiled(torch.ones(n), torch.ones(n))
    assert len(graphs) == 2


def test_python_number_arguments_are_guarded_by_value():
    counter = CompileCounter()

    def scale(x, n):
        return x * n + n

    compiled = framejit.compile(scale, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x, 2), scale(x, 2))
    assert same(compiled(x, 2), scale(x, 2))
    assert counter.frame_count == 1
    assert same(compiled(x, 3), scale(x, 3))
    assert counter.frame_count == 2


GLOBAL_WEIGHT = torch.randn(3)
GLOBAL_SCALE = 2.0


def uses_globals(x):
    return x * GLOBAL_WEIGHT * GLOBAL_SCALE


def test_globals_tensor_is_an_input_and_constant_is_guarded():
    global GLOBAL_WEIGHT, GLOBAL_SCALE
    counter = CompileCounter()
    compiled = framejit.compile(uses_globals, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x), uses_globals(x))
    old_weight, old_scale = GLOBAL_WEIGHT, GLOBAL_SCALE
    try:
        GLOBAL_WEIGHT = torch.randn(3)
        assert same(compiled(x), uses_globals(x))
        assert counter.frame_count == 1
        GLOBAL_SCALE = 5.0
        assert same(compiled(x), uses_globals(x))
        assert counter.frame_count == 2
    finally:
        GLOBAL_WEIGHT, GLOBAL_SCALE = old_weight, old_scale


def test_returned_inputs_keep_their_identity():
    def passthrough(inputs, x):
        return inputs, x, x + 1

    counter = CompileCounter()
    compiled = framejit.compile(passthrough, backend=counter)
    inputs = {"a": 1}
    x = torch.randn(2)
    out = compiled(inputs, x)
    assert out[0] is inputs and out[1] is x
    assert same(out[2], x + 1)


def test_function_without_tensor_ops_calls_no_backend():
    counter = CompileCounter()

    def no_ops(x, n):
        return (x, n * 2, x.shape)

    compiled = framejit.compile(no_ops, backend=counter)
    x = torch.randn(2, 3)
    out = compiled(x, 4)
    assert out[0] is x and out[1] == 8 and out[2] == torch.Size([2, 3])
    assert counter.frame_count == 0
    assert regions(compiled)[0]["kind"] == "compiled"


def test_generators_run_uncompiled_and_correctly():
    def gen(x):
        yield x + 1
        yield x + 2

    compiled = framejit.compile(gen, backend=CompileCounter())
    x = torch.zeros(2)
    assert same(list(compiled(x)), [x + 1, x + 2])
    assert regions(gen) == []


def test_failing_backend_falls_back_with_one_warning():
    def broken(gm, example_inputs):
        raise RuntimeError("backend exploded")

    compiled = framejit.compile(add_mul, backend=broken)
    x, y = torch.randn(3), torch.randn(3)
    with pytest.warns(framejit.FramejitWarning, match="backend exploded"):
        assert same(compiled(x, y), add_mul(x, y))
    assert same(compiled(x, y), add_mul(x, y))  # sticky: no retry, no second warning
    assert regions(compiled)[0]["kind"] == "fallback"


def test_compiled_function_works_from_threads():
    counter = CompileCounter()
    compiled = framejit.compile(add_mul, backend=counter)
    results, errors = [], []

    def worker():
        try:
            for _ in range(50):
                x, y = torch.randn(4), torch.randn(4)
                results.append(same(compiled(x, y), add_mul(x, y)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(results) and len(results) == 150
    assert not _C.hook_installed()


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="unknown option"):
        framejit.compile(add_mul, options={"bogus": 1})
    with pytest.raises(TypeError):
        framejit.compile(42)
    with pytest.raises(TypeError, match="expects a tensor"):
        framejit.mark_dynamic([1, 2], 0)
    with pytest.raises(IndexError, match="out of range"):
        framejit.mark_dynamic(torch.ones(2), 1)


def test_log_environment_parsing():
    from framejit import _logging
    assert _logging._parse("graph_code, guards,,dynamo", strict=False) == {"graph_code", "guards"}


def test_bytecode_artifact(caplog):
    framejit.set_logs(bytecode=True, handler=False)
    compiled = framejit.compile(add_mul, backend=CompileCounter())
    with caplog.at_level(logging.INFO, logger="framejit"):
        compiled(torch.ones(2), torch.ones(2))
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "framejit.bytecode")
    assert "BYTECODE add_mul" in text and "BINARY_OP" in text


def test_untraceable_reads_do_not_recompile_on_every_call():
    counter = CompileCounter()

    def missing_global(x):
        return x + NOT_DEFINED_ANYWHERE  # noqa: F821

    def stores_into_input(inputs, x):
        inputs["y"] += x  # same tensor stored back: no side effect to replay
        inputs["z"] = x * 2  # a real write into the caller's dict: written back at the exit
        return inputs

    compiled = framejit.compile(missing_global, backend=counter)
    for _ in range(3):
        with pytest.raises(NameError):
            compiled(torch.ones(2))
    assert len(regions(missing_global)) == 1

    compiled = framejit.compile(stores_into_input, backend=counter)
    for _ in range(3):
        inputs = {"y": torch.ones(2)}
        out = compiled(inputs, torch.ones(2))
        assert out is inputs and same(inputs["z"], torch.full((2,), 2.0))
        assert same(inputs["y"], torch.full((2,), 2.0))
    # One region to the return: the dict's new contents are written into it at the exit, and
    # the next calls (the same keys) reuse it.
    assert [(r["kind"], r["exit"]) for r in regions(stores_into_input)] == [("compiled", "return")]


class LoggingTensor(torch.Tensor):
    calls = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_tensor_subclass_with_torch_function_is_not_traced_with_meta():
    def fn(x):
        return x * 2 + 1

    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    x = torch.ones(3).as_subclass(LoggingTensor)
    LoggingTensor.calls.clear()
    out = compiled(x)
    assert type(out) is LoggingTensor and same(out.as_subclass(torch.Tensor), torch.full((3,), 3.0))
    assert LoggingTensor.calls == ["mul", "add"]  # the subclass saw its ops, as in eager
    assert counter.frame_count == 0
    assert "overrides __torch_function__" in regions(fn)[0]["reason"]


def test_meta_stats_count_hits_after_a_reset_and_misses_after_clearing():
    from framejit import _C

    def two_ops(x):
        return torch.sin(x) * 3

    x = torch.randn(5, 7)
    counter = CompileCounter()
    compiled = framejit.compile(two_ops, backend=counter)
    _C.clear_meta_cache()
    before = _C.meta_stats()
    assert same(compiled(x), two_ops(x))
    cold = _C.meta_stats()
    assert cold["misses"] - before["misses"] == 2 and cold["hits"] == before["hits"]
    framejit.reset()  # regions go, the meta memo stays
    assert same(compiled(x), two_ops(x))
    warm = _C.meta_stats()
    assert warm["hits"] - cold["hits"] == 2 and warm["misses"] == cold["misses"]
    assert counter.frame_count == 2
