"""The GraphModule backends receive: forward runs framejit's IR (no FX code made) until the FX
form is asked for; then it is an ordinary GraphModule. Every result is compared with eager."""
import copy
import pickle
import sys
import weakref

import pytest
import torch

import framejit
from framejit.testing import same


class Keep:
    """A pass-through backend that keeps the GraphModules it was given."""

    def __init__(self):
        self.gms = []

    def __call__(self, gm, example_inputs):
        self.gms.append(gm)
        return gm.forward


def mixed(x, y):
    # call_function with a list argument and keywords, call_method with keywords, a getitem of
    # a tuple result, several outputs
    a = torch.cat([x, y], dim=1)
    b = a.sum(dim=0, keepdim=True)
    parts = torch.split(a, 2, dim=1)
    return torch.relu(parts[0]) * 2 + 1, b, x.transpose(0, 1)


def inputs():
    return torch.randn(3, 4), torch.randn(3, 2)


def graph_module_of(fn, *args):
    """Compiles fn with a Keep backend, checks one call on args against eager, and returns the
    one GraphModule the backend was given and the compiled function."""
    keep = Keep()
    compiled = framejit.compile(fn, backend=keep)
    assert same(compiled(*args), fn(*args))
    (gm,) = keep.gms
    return gm, compiled


def test_forward_runs_without_building_the_fx_graph():
    args = inputs()
    gm, compiled = graph_module_of(mixed, *args)
    assert same(compiled(*args), mixed(*args))
    assert isinstance(gm, torch.fx.GraphModule)
    assert "_graph" not in gm.__dict__ and "_code" not in gm.__dict__
    assert type(gm.forward.__func__).__name__ == "GraphRunner"
    assert gm.meta["framejit_name"].startswith("__compiled_fn_")


def test_reading_the_graph_makes_an_ordinary_graph_module():
    args = inputs()
    gm, compiled = graph_module_of(mixed, *args)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.cat in targets and torch.relu in targets
    assert all("example_value" in n.meta for n in gm.graph.nodes if n.op != "output")
    assert "def forward(self, " in gm.code
    assert "_framejit_runner" not in gm.__dict__
    assert type(type(gm).__dict__["forward"]).__name__ == "function"  # FX's generated code
    assert same(gm(*args), mixed(*args))
    assert same(compiled(*args), mixed(*args))  # the runner bound before still works


def test_a_backend_that_edits_the_graph_and_recompiles():
    def sin_to_cos(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.target is torch.sin:
                node.target = torch.cos
        gm.recompile()
        return gm.forward

    def f(x):
        return torch.sin(x) + 1

    compiled = framejit.compile(f, backend=sin_to_cos)
    x = torch.randn(5)
    assert same(compiled(x), torch.cos(x) + 1)


def test_any_fx_attribute_materialises():
    gm, _ = graph_module_of(mixed, *inputs())
    assert gm._create_node_hooks == []
    assert "_graph" in gm.__dict__
    assert "torch.cat" in str(gm)


def test_deepcopy_and_pickle_before_and_after_materialising():
    args = inputs()
    gm, _ = graph_module_of(mixed, *args)
    copied = copy.deepcopy(gm)  # materialises gm first
    assert "_graph" in gm.__dict__ and "_graph" in copied.__dict__
    assert same(copied(*args), mixed(*args))
    assert same(pickle.loads(pickle.dumps(gm))(*args), mixed(*args))


def test_wrong_number_of_inputs_is_a_clear_type_error():
    gm, _ = graph_module_of(mixed, *inputs())
    with pytest.raises(TypeError, match="takes 2 positional inputs after the module, got 1"):
        gm.forward(torch.randn(3, 4))


def test_an_error_inside_the_graph_propagates_and_leaks_no_intermediate():
    def boom(x):
        raise ValueError("boom")

    def f(x):
        return torch.sin(x) * 2

    x = torch.randn(4)
    gm, _ = graph_module_of(f, x)
    runner = gm.forward.__func__
    before = sys.getrefcount(x)
    with pytest.raises(TypeError):
        runner(gm, x, x)
    assert sys.getrefcount(x) == before


def test_the_runner_keeps_no_input_or_output_alive():
    def f(x):
        y = torch.sin(x)
        z = y * 2
        return z + 1

    keep = Keep()
    compiled = framejit.compile(f, backend=keep)
    x = torch.randn(4)
    out = compiled(x)
    assert same(out, f(x))
    (gm,) = keep.gms
    assert gm.forward.__func__.num_steps == 3
    x_ref, out_ref = weakref.ref(x), weakref.ref(out)
    del x, out
    assert x_ref() is None and out_ref() is None


def test_repeated_calls_keep_refcounts_flat():
    compiled = framejit.compile(mixed, backend="eager")
    x, y = inputs()
    compiled(x, y)
    before = (sys.getrefcount(x), sys.getrefcount(y))
    for _ in range(1000):
        compiled(x, y)
    assert (sys.getrefcount(x), sys.getrefcount(y)) == before


def test_fx_symbolic_trace_of_the_graph_module_materialises_it_first():
    args = inputs()
    gm, _ = graph_module_of(mixed, *args)
    retraced = torch.fx.symbolic_trace(gm)  # Tracer.trace reads type(gm).forward.__code__
    assert same(retraced(*args), mixed(*args))
    assert "_graph" in gm.__dict__


@pytest.mark.parametrize("first_use", ["code", "str", "pickle"])
def test_code_str_and_pickle_materialise_a_fresh_graph_module(first_use):
    args = inputs()
    gm, _ = graph_module_of(mixed, *args)
    assert "_graph" not in gm.__dict__
    if first_use == "code":
        assert "torch.cat" in gm.code
    elif first_use == "str":
        assert "torch.cat" in str(gm)
    else:
        assert same(pickle.loads(pickle.dumps(gm))(*args), mixed(*args))
    assert "_graph" in gm.__dict__ and "_framejit_runner" not in gm.__dict__
    assert same(gm(*args), mixed(*args))


def test_modules_share_a_class_until_materialised():
    keep = Keep()
    compiled = framejit.compile(mixed, backend=keep, dynamic=False)
    for shape in [(3, 4), (5, 4)]:  # two sizes: two graphs
        x, y = torch.randn(*shape), torch.randn(shape[0], 2)
        assert same(compiled(x, y), mixed(x, y))
    first, second = keep.gms
    assert type(first) is type(second) and repr(first) == "GraphModule()"
    first.recompile()  # FX's generated forward goes on a class of first's own
    assert type(first) is not type(second) and type(first).__name__ == "GraphModule"
    assert "forward" not in first.__dict__ and type(first).__dict__["forward"].__name__ == "forward"
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    assert same(first(x, y), mixed(x, y))
    x, y = torch.randn(5, 4), torch.randn(5, 2)
    assert same(second.forward(x, y), mixed(x, y))  # still the runner
    assert type(second.forward.__func__).__name__ == "GraphRunner"


def test_a_deepcopy_of_a_materialised_module_has_its_own_class():
    def f(x):
        return torch.sin(x) + 1

    x = torch.randn(4)
    gm, _ = graph_module_of(f, x)
    gm.recompile()
    copied = copy.deepcopy(gm)
    assert type(copied) is not type(gm)
    for node in copied.graph.nodes:
        if node.target is torch.sin:
            node.target = torch.cos
    copied.recompile()
    assert same(gm(x), (torch.sin(x) + 1,)) and same(copied(x), (torch.cos(x) + 1,))


def test_a_forward_set_by_the_backend_survives_materialisation():
    args = inputs()
    gm, _ = graph_module_of(mixed, *args)
    inner = gm.forward
    wrapper = lambda *a: inner(*a)  # noqa: E731
    gm.forward = wrapper
    gm.graph  # materialises
    assert gm.__dict__["forward"] is wrapper
    assert same(gm.forward(*args), mixed(*args))
