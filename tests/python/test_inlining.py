"""Calls traced into (inlined): user functions, methods, closures, lambdas, comprehensions,
defaults and *args/**kwargs, properties, static/class methods, nn.Module containers, and what
happens when a callee breaks. Each result is compared with eager and its graph count asserted."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import framejit
from framejit.testing import CompileCounter, regions, same


def scale(x, factor=2.0, *, shift=0.0):
    return x * factor + shift


def many(*args, **kwargs):
    total = args[0]
    for a in args[1:]:
        total = total + a
    return total * kwargs.get("w", 1.0)


def recursive(x, n):
    if n == 0:
        return x
    return recursive(x + 1, n - 1)


class Counter:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return self.helper(x) * self.k

    def helper(self, x):
        return x + self.k

    @property
    def double(self):
        return self.k * 2

    @staticmethod
    def stat(x):
        return x - 1

    @classmethod
    def make(cls, x):
        return x * 3


def f_defaults(x):
    return scale(x) + scale(x, 3.0) + scale(x, shift=1.0)


def f_varargs(x, y):
    return many(x, y, x, w=0.5) + many(y)


def f_recursion(x):
    return recursive(x, 4)


def f_methods(x, c):
    return c.apply(x) + c.double + Counter.stat(x) + c.make(x)


def f_closure(x, k):
    def inner(y):
        return y * k + x
    return inner(x) + inner(x * 2)


def f_lambda(x):
    g = lambda a, b=2: a * b + 1  # noqa: E731
    return g(x) - g(x, 3)


def f_comprehensions(xs):
    doubled = [t * 2 for t in xs]
    by_index = {i: t for i, t in enumerate(doubled)}
    return torch.stack(doubled).sum(0) + by_index[1]


def f_zip_reversed(xs, ys):
    out = 0
    for a, b in zip(xs, reversed(ys)):
        out = out + a * b
    return out


def f_escaping_closure(x):
    s = 3

    def times(y):
        return y * s
    return times(x), times


CASES = [
    (f_defaults, lambda: (torch.randn(3),)),
    (f_varargs, lambda: (torch.randn(3), torch.randn(3))),
    (f_recursion, lambda: (torch.randn(3),)),
    (f_methods, lambda: (torch.randn(3), Counter(2))),
    (f_closure, lambda: (torch.randn(3), 4)),
    (f_lambda, lambda: (torch.randn(3),)),
    (f_comprehensions, lambda: ([torch.randn(2) for _ in range(3)],)),
    (f_zip_reversed, lambda: ([torch.randn(2) for _ in range(3)], [torch.randn(2) for _ in range(3)])),
]


@pytest.mark.parametrize("fn,make_args", CASES, ids=[c[0].__name__ for c in CASES])
def test_inlined_calls_make_one_graph(fn, make_args):
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    args = make_args()
    assert same(compiled(*args), fn(*args))
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(fn)] == ["return"], [r["reason"] for r in regions(fn)]
    args = make_args()
    assert same(compiled(*args), fn(*args))
    assert counter.frame_count == 1


def test_escaping_closure_is_rebuilt_with_its_cells():
    compiled = framejit.compile(f_escaping_closure, backend=CompileCounter())
    x = torch.randn(3)
    out, times = compiled(x)
    assert same(out, x * 3)
    assert same(times(torch.ones(2)), torch.full((2,), 3.0))
    assert times.__qualname__ == "f_escaping_closure.<locals>.times"
    assert times.__closure__[0].cell_contents == 3


def prints_inside(x):
    print("inside", tuple(x.shape))
    return x + 1


def calls_breaking_helper(x):
    y = x * 2
    z = prints_inside(y)
    return z - 1


def test_callee_that_breaks_is_called_not_inlined(capsys):
    counter = CompileCounter()
    compiled = framejit.compile(calls_breaking_helper, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x), calls_breaking_helper(x))
    assert capsys.readouterr().out == "inside (3,)\ninside (3,)\n"
    outer = regions(calls_breaking_helper)
    assert [r["exit"] for r in outer] == ["call", "return"]
    assert "prints_inside, which breaks inside" in outer[0]["reason"]
    # the callee's own frame met the hook: y * 2, then its own regions around the print
    assert [r["exit"] for r in regions(prints_inside)] == ["call", "return"]
    assert counter.frame_count == 3  # mul; + 1 in the callee; - 1


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(4) * i) for i in range(3)])

    def forward(self, x):
        for layer, s in zip(self.layers, self.scales):
            x = torch.tanh(layer(x)) * s
        x = x + self.layers[-1](x)
        return {name: head(x) for name, head in self.heads.items()} if False else \
            self.heads["a"](x) + self.heads["b"](x) + len(self.layers)


def test_module_containers_iterate_and_index_by_source():
    model = Stack()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    x = torch.randn(2, 4)
    assert same(compiled(x), model(x))
    assert counter.frame_count == 1
    with torch.no_grad():
        model.layers[1].weight.add_(1.0)  # parameters are read each call, not baked in
    assert same(compiled(x), model(x))
    assert counter.frame_count == 1


class WithHook(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x):
        return self.inner(x) * 2


def test_module_with_forward_hooks_is_traced_through_them():
    model = WithHook()
    seen = []
    model.inner.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    x = torch.randn(2, 3)
    assert same(compiled(x), model(x))
    assert seen == [torch.Size([2, 3]), torch.Size([2, 3])]  # the hook ran in both
    assert [r["exit"] for r in regions(WithHook.forward)] == ["return"] and counter.frame_count == 1


class HookedPair(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x, scale=1.0):
        return self.b(self.a(x) * scale)


def test_forward_hooks_and_pre_hooks_replace_arguments_and_results_as_eager():
    model = HookedPair()
    handles = [
        model.a.register_forward_pre_hook(lambda mod, args: (args[0] + 1,)),
        model.a.register_forward_hook(lambda mod, args, out: out * 2),
        model.b.register_forward_pre_hook(lambda mod, args, kwargs: ((args[0].relu(),), kwargs),
                                          with_kwargs=True),
        model.b.register_forward_hook(lambda mod, args, kwargs, out: out + len(kwargs) + len(args),
                                      with_kwargs=True),
        model.b.register_forward_hook(lambda mod, args, out: None),  # None keeps the output
    ]
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    x = torch.randn(2, 3)
    assert same(compiled(x), model(x)) and same(compiled(x), model(x))
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(HookedPair.forward)] == ["return"]
    handles[1].remove()  # the hook dict's keys are guarded: a removed hook compiles again
    assert same(compiled(x), model(x)) and counter.frame_count == 2


def test_a_module_with_a_backward_hook_is_called_by_the_runtime():
    model = HookedPair()
    grads = []
    model.a.register_full_backward_hook(lambda mod, grad_in, grad_out: grads.append(grad_out[0].shape))
    compiled = framejit.compile(model, backend=CompileCounter())
    x = torch.randn(2, 3, requires_grad=True)
    compiled(x).sum().backward()
    model(x).sum().backward()
    assert grads == [torch.Size([2, 3]), torch.Size([2, 3])]
    assert [r["exit"] for r in regions(HookedPair.forward)][0] == "call"


def test_hook_added_later_is_noticed_by_the_guards():
    model = WithHook()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    x = torch.randn(2, 3)
    assert same(compiled(x), model(x))
    assert counter.frame_count == 1
    seen = []
    model.inner.register_forward_hook(lambda mod, args, out: seen.append(1))
    assert same(compiled(x), model(x))
    assert seen == [1, 1]


class Registry:
    """A mapping object kept in a decorator's closure (transformers' ExpertsInterface)."""

    def __init__(self):
        self._local = {"double": lambda x: x * 2, "neg": lambda x: -x}

    def get(self, key, default):
        return self._local.get(key, default)


def dispatched(registry, key):
    def wrap(cls):
        plain = cls.forward

        def forward(self, x):  # closure: registry (an object), key (a str), plain (a function)
            found = registry.get(key, None)
            return (plain(self, x) if found is None else found(x)) + 1

        cls.forward = forward
        cls.scaled = lambda self, x: registry.get("neg", None)(x) * 3
        return cls
    return wrap


REGISTRY = Registry()


@dispatched(REGISTRY, "double")
class Dispatched(nn.Module):
    def forward(self, x):
        return x - 1


class CallsDispatched(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Dispatched()

    def forward(self, x):
        return self.inner(x) + self.inner.scaled(x)


def test_closure_of_a_method_set_by_a_decorator_is_read_through_its_class():
    # The forward and method a decorator put on the class reach the trace without a source;
    # the registry object in their closure is read through the class, so it is traced (one
    # graph) and its state is guarded: a change to it compiles again, never a stale result.
    model = CallsDispatched()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    x = torch.randn(4)
    assert same(compiled(x), model(x))
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(CallsDispatched.forward)] == ["return"]
    assert same(compiled(x), model(x))
    assert counter.frame_count == 1
    REGISTRY._local["double"] = lambda x: x * 5
    try:
        assert same(compiled(x), model(x))
        assert counter.frame_count == 2
        del REGISTRY._local["double"]  # forward's own x - 1
        assert same(compiled(x), model(x))
        assert counter.frame_count == 3
    finally:
        REGISTRY._local["double"] = lambda x: x * 2
