"""The cached call path: a compiled module skips nn.Module.__call__ only while no hook of any kind
exists, and sources read through dicts see every change to those dicts (their lookups are
reused only while the dict's version tag is unchanged). Each result is compared with eager."""
import torch
from torch import nn

import framejit
from framejit.testing import CompileCounter, same


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x):
        return x * self.w + 1


def test_hooks_added_after_compiling_run_on_the_next_call():
    mod = Scale()
    compiled = framejit.compile(mod, backend=CompileCounter())
    x = torch.ones(3)
    assert same(compiled(x), mod(x))
    calls = []

    def record(name):
        def hook(*args):
            calls.append(name)
        return hook

    handles = [mod.register_forward_pre_hook(record("pre")), mod.register_forward_hook(record("post"))]
    assert same(compiled(x), mod(x))
    assert calls == ["pre", "post", "pre", "post"]  # compiled, then eager
    for h in handles:
        h.remove()
    calls.clear()

    handle = compiled.register_forward_hook(record("wrapper"))
    compiled(x)
    assert calls == ["wrapper"]
    handle.remove()
    calls.clear()

    handle = nn.modules.module.register_module_forward_hook(record("global"))
    try:
        compiled(x)
    finally:
        handle.remove()
    assert calls == ["global", "global"]  # the wrapper and the module are both modules
    calls.clear()
    compiled(x)
    assert calls == []


def test_a_forward_replaced_on_the_instance_or_the_class_is_the_one_called():
    mod = Scale()
    compiled = framejit.compile(mod, backend=CompileCounter())
    x = torch.ones(3)
    compiled(x)
    mod.forward = lambda x: x - 5  # nn.Module.__call__ would call this one
    assert same(compiled(x), x - 5)
    del mod.forward

    class Other(Scale):
        def forward(self, x):
            return x * self.w * 10

    mod.__class__ = Other
    assert same(compiled(x), x * 20)


def test_a_parameter_replaced_in_place_of_another_is_read_again():
    mod = Scale()
    counter = CompileCounter()
    compiled = framejit.compile(mod, backend=counter)
    x = torch.ones(3)
    assert same(compiled(x), mod(x))
    mod.w = nn.Parameter(torch.full((3,), 7.0))  # same metadata: same graph, new input
    assert same(compiled(x), x * 7 + 1)
    mod.w.data.fill_(3.0)
    assert same(compiled(x), x * 3 + 1)
    assert counter.frame_count == 1


OFFSET = torch.ones(2)


def add_global(x):
    return x + OFFSET


def reads_item(d):
    return d["a"] * 2


def test_globals_and_dict_items_rebound_between_calls_are_read_again():
    global OFFSET
    compiled = framejit.compile(add_global, backend=CompileCounter())
    x = torch.zeros(2)
    assert same(compiled(x), torch.ones(2))
    OFFSET = torch.full((2,), 4.0)
    try:
        assert same(compiled(x), torch.full((2,), 4.0))
    finally:
        OFFSET = torch.ones(2)

    compiled = framejit.compile(reads_item, backend=CompileCounter())
    d = {"a": torch.ones(2)}
    assert same(compiled(d), reads_item(d))
    d["a"] = torch.full((2,), 5.0)  # the same dict object, changed
    assert same(compiled(d), reads_item(d))
    d = {"a": torch.full((2,), 6.0)}  # a new dict, perhaps at the old one's address
    assert same(compiled(d), reads_item(d))


def test_a_compiled_call_impl_set_on_the_module_is_honoured():
    mod = Scale()
    compiled = framejit.compile(mod, backend=CompileCounter())
    x = torch.ones(3)
    compiled(x)
    mod._compiled_call_impl = lambda *args: "compiled elsewhere"  # what Module.compile() sets
    assert compiled(x) == "compiled elsewhere"
    mod._compiled_call_impl = None
    assert same(compiled(x), mod(x))


class Loud(Scale):
    def __call__(self, *args):  # a class that changes what calling it does
        return super().__call__(*args) * 100


class Outer(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) - 1


def test_a_submodule_not_called_through_module_call_is_not_inlined_as_its_forward():
    for inner in (Loud(), Scale()):
        if isinstance(inner, Scale) and not isinstance(inner, Loud):
            inner._compiled_call_impl = lambda x: x * 0 + 42  # what Module.compile() sets
        model = Outer(inner)
        compiled = framejit.compile(model, backend=CompileCounter())
        x = torch.ones(3)
        assert same(compiled(x), model(x))
