"""Wrong or stale results and crashes found as a new user would meet them (issue #15), each
compared with eager; every test here failed before its fix."""
import warnings

import pytest
import torch
import torch.nn as nn

import framejit
from framejit.testing import CompileCounter, same


def no_framejit_warnings(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    messages = [str(w.message) for w in caught if issubclass(w.category, framejit.FramejitWarning)]
    assert not messages, messages
    return out


def test_an_int_plus_equals_a_tensor_is_the_plain_add_in_the_graph_code():
    # T5's relative position buckets: `n = 0; n += tensor`. The graph read `0 += mul`.
    def f(x):
        n = 0
        n += x * 2
        return n

    codes = []

    def reads_code(gm, example_inputs):
        codes.append(gm.code)
        return gm.forward

    x = torch.randn(3)
    assert same(no_framejit_warnings(framejit.compile(f, backend=reads_code), x), f(x))
    assert "0 + mul" in codes[0] or "add(0, mul)" in codes[0]


def test_a_backend_returning_none_is_named_in_the_warning_and_the_call_still_runs():
    def returns_none(gm, example_inputs):
        return None

    def f(x):
        return x + 1

    x = torch.randn(3)
    with pytest.warns(framejit.FramejitWarning, match="returns_none.*returned None, not a callable"):
        out = framejit.compile(f, backend=returns_none)(x)
    assert same(out, f(x))


def test_float_arguments_are_guarded_by_bits():
    def f(x, v):
        return x / v

    ones = torch.ones(1)
    compiled = framejit.compile(f, backend="eager")
    assert compiled(ones, 0.0).item() == float("inf")
    assert compiled(ones, -0.0).item() == float("-inf")  # reused the 0.0 graph before
    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    for _ in range(4):
        assert torch.isnan(compiled(ones, float("nan"))).all()
    assert counter.frame_count == 1  # NaN != NaN recompiled on every call


class Fresh:
    def __init__(self):
        self.a = 1


def test_two_objects_made_in_the_trace_are_not_the_same_object():
    def f(x):
        a, b = Fresh(), Fresh()
        return x + (1 if a is b else 0) + (10 if a is a else 0)

    x = torch.zeros(2)
    assert same(no_framejit_warnings(framejit.compile(f, backend="eager"), x), f(x))


def test_a_method_wins_over_a_submodule_of_the_same_name():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)  # kept in _modules; the class's method shadows it

        def lin(self, x):  # noqa: F811
            return x * 100

        def forward(self, x):
            return self.lin(x)

    m = M()
    x = torch.randn(2, 3)
    assert same(no_framejit_warnings(framejit.compile(m, backend="eager"), x), m(x))


class InplaceBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Sequential(nn.Conv2d(4, 8, 1, bias=False), nn.BatchNorm2d(8))

    def forward(self, x):
        out = self.bn(self.conv(self.relu(x * 1)))
        out += self.shortcut(x)
        out.div_(2)
        out[0] = out[0] * 3
        return self.relu(out)


def test_in_place_ops_on_memoised_meta_results_in_training_stay_in_one_graph():
    # The second model hits the meta memo for every op; a replayed result was a leaf, so
    # `out += ...`, ReLU(inplace=True), div_ and item assignment broke the graph in train mode.
    for _ in range(2):
        torch.manual_seed(0)
        model = InplaceBlock().train()
        reference = InplaceBlock().train()
        reference.load_state_dict(model.state_dict())
        counter = CompileCounter()
        compiled = framejit.compile(model, backend=counter)
        x = torch.randn(2, 4, 6, 6)
        out = no_framejit_warnings(compiled, x)
        expected = reference(x)
        assert same(out, expected, atol=1e-5)
        out.sum().backward()
        expected.sum().backward()
        assert same(model.conv.weight.grad, reference.conv.weight.grad, atol=1e-5)
        assert counter.frame_count == 1
        assert framejit.explain(InplaceBlock().train())(x).graph_break_count == 0


def test_globals_dicts_with_the_same_module_name_are_two_sources():
    # Code made with exec: two globals dicts named alike. h2 read K from h1's dict before.
    first, second = {"__name__": "generated", "K": 1.0}, {"__name__": "generated", "K": 2.0}
    exec("def h(x):\n    return x * K", first)
    exec("def h(x):\n    return x * K", second)
    h1, h2 = first["h"], second["h"]

    def f(x):
        return h1(x) + h2(x)

    x = torch.ones(2)
    compiled = framejit.compile(f, backend="eager")
    assert same(compiled(x), f(x))
    second["K"] = 5.0
    assert same(compiled(x), f(x))


class Scaler:
    def scale(self, x):
        return x * 2


def test_a_method_replaced_on_the_class_compiles_again():
    def f(o, x):
        return o.scale(x)

    x = torch.ones(2)
    o = Scaler()
    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    assert same(compiled(o, x), f(o, x))
    original = Scaler.scale
    try:
        Scaler.scale = lambda self, x: x * 3
        assert same(compiled(o, x), f(o, x))  # ran the old method before
        assert counter.frame_count == 2
    finally:
        Scaler.scale = original


class Made:
    def __init__(self, x):
        self.x = x

    def double(self):
        return self.x * 2


def test_methods_of_an_object_made_in_the_trace_follow_the_class():
    def f(x):
        return Made(x).double()

    x = torch.ones(2)
    compiled = framejit.compile(f, backend="eager")
    assert same(compiled(x), f(x))
    original = Made.double
    try:
        Made.double = lambda self: self.x * 5
        assert same(compiled(x), f(x))
    finally:
        Made.double = original


class Holder:
    pass


def test_the_same_object_passed_twice_sees_its_own_write():
    def f(o, p, x):
        o.a = x * 2
        return x + p.a

    compiled = framejit.compile(f, backend="eager")
    x = torch.ones(2)
    o, p = Holder(), Holder()
    o.a = p.a = torch.zeros(2)
    assert same(compiled(o, p, x), f(o, p, x))
    q, q_eager = Holder(), Holder()
    q.a = q_eager.a = torch.zeros(2)
    assert same(compiled(q, q, x), f(q_eager, q_eager, x))  # read the value before the write
    assert same(q.a, q_eager.a)


def test_an_inference_tensor_does_not_reuse_the_graph_of_an_ordinary_one():
    def f(x):
        return x * 2

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    compiled(torch.ones(2))
    with torch.inference_mode():
        t = torch.ones(2)
    assert same(compiled(t), f(t))
    assert counter.frame_count == 2


def test_forward_replaced_on_a_module_instance_or_class_compiles_again():
    class M(nn.Module):
        def forward(self, x):
            return x + 1

    x = torch.ones(2)
    m = M()
    compiled = framejit.compile(m, backend="eager")
    assert same(compiled(x), m(x))
    m.forward = lambda x: x - 1
    assert same(compiled(x), m(x))
    n = M()
    compiled = framejit.compile(n, backend="eager")
    assert same(compiled(x), n(x))
    M.forward = lambda self, x: x * 7
    assert same(compiled(x), n(x))
