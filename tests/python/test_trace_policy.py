"""The trace policy (which files framejit traces) and what libraries ask of a compiler: third-party
packages traced, the standard library and torch internals not, user rules, is_compiling(),
imports inside functions (issue #16)."""
import importlib
import math
import os
import sys
import sysconfig
import textwrap

import pytest
import torch

import framejit
from framejit import _skip
from framejit.testing import CompileCounter, regions, same


def _site_packages():
    return sysconfig.get_paths()["purelib"]


def test_the_policy_traces_third_party_packages_and_leaves_the_rest():
    site = _site_packages()
    assert _skip.is_traced(os.path.join(site, "transformers", "models", "gpt2", "modeling_gpt2.py"))
    assert _skip.is_traced(os.path.join(site, "some_new_library", "layers.py"))
    assert not _skip.is_traced(os.path.join(site, "numpy", "_core", "fromnumeric.py"))
    assert not _skip.is_traced(os.path.join(site, "typing_extensions.py"))
    assert not _skip.is_traced(textwrap.__file__)  # the standard library
    assert not _skip.is_traced(torch.nn.functional.__file__)  # torch: inlined by name only
    assert not _skip.is_traced(framejit.__file__)
    assert _skip.is_traced("/home/user/project/model.py")
    assert _skip.is_traced("<string>")  # dataclass-generated methods


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A package on sys.path with a helper that has Python of its own."""
    pkg = tmp_path / "fj_policy_lib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        def scale(v):
            out = v * 2
            return out + 1
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("fj_policy_lib")
    yield module
    sys.modules.pop("fj_policy_lib", None)
    _skip._user_rules.clear()
    _skip.apply()


def test_skip_files_and_trace_files_change_what_is_inlined(library):
    def f(x):
        return library.scale(x).relu()

    x = torch.randn(4)
    counter = CompileCounter()
    assert same(framejit.compile(f, backend=counter)(x), f(x))
    assert counter.frame_count == 1 and counter.op_count == 3  # scale's ops inlined

    framejit.skip_files(library)
    framejit.reset()
    counter = CompileCounter()
    assert same(framejit.compile(f, backend=counter)(x), f(x))
    assert counter.op_count < 3  # the call to scale ends the graph and runs as plain Python
    assert regions(library.scale) == []

    framejit.trace_files(library.__file__)  # a longer (more specific) rule wins
    framejit.reset()
    counter = CompileCounter()
    assert same(framejit.compile(f, backend=counter)(x), f(x))
    assert counter.frame_count == 1 and counter.op_count == 3


def test_is_compiling_answers_true_while_traced_as_under_torch_compile():
    def f(x):
        if torch.compiler.is_compiling():  # libraries take their compile-friendly path
            return x + 1
        return x - 1

    counter = CompileCounter()
    x = torch.zeros(3)
    assert same(framejit.compile(f, backend=counter)(x), x + 1)
    assert same(f(x), x - 1)  # outside a compiled call it is False
    assert counter.frame_count == 1
    assert same(torch.compile(f, backend="eager")(x), x + 1)  # what torch.compile does


def _mask_made_only_in_eager(x, mask=None):
    # switch_transformers' encoder: under compile the mask is left None, then indexed.
    if mask is None and not torch.compiler.is_compiling():
        mask = torch.ones_like(x)
    return x * mask[None]


def _raises_only_in_eager(x):
    if not torch._dynamo.is_compiling():
        raise ValueError("eager only")
    return x + 1


def _raises_in_both(x, mask=None):
    if torch.compiler.is_compiling():
        x = x * 2
    return x * mask[None]


def test_a_compile_path_that_raises_is_traced_again_as_eager_runs_it():
    counter = CompileCounter()
    x = torch.randn(3)
    # The compile path (is_compiling() True) raises where eager's does not: traced again with
    # the flag False, in one graph, with eager's result.
    assert same(framejit.compile(_mask_made_only_in_eager, backend=counter)(x),
                _mask_made_only_in_eager(x))
    assert counter.frame_count == 1 and counter.op_count == 3  # ones_like, getitem, mul
    # Where the compile path does not raise, True stands.
    assert same(framejit.compile(_raises_only_in_eager, backend=CompileCounter())(x), x + 1)
    # Where eager raises too, the error is eager's.
    with pytest.raises(TypeError, match="not subscriptable"):
        framejit.compile(_raises_in_both, backend=CompileCounter())(x)


def test_imports_inside_a_function_of_modules_already_imported_stay_in_the_graph():
    def f(x):
        import math as m
        from torch.nn import functional as fn
        import torch.nn
        return fn.relu(x) * m.pi + torch.nn.functional.gelu(x)

    counter = CompileCounter()
    x = torch.randn(4)
    assert same(framejit.compile(f, backend=counter)(x), f(x))
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(f)] == ["return"]


class _Config:
    """transformers' PreTrainedConfig in small: names remapped by its own __getattribute__."""

    attribute_map = {"hidden_size": "n_embd"}

    def __init__(self):
        self.n_embd = 3
        self.scale = 2.0

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def test_a_class_with_its_own_getattribute_is_read_through_it_in_one_graph():
    def f(x, config):
        return x * config.hidden_size + config.scale

    config = _Config()
    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x = torch.ones(2)
    assert same(compiled(x, config), f(x, config))
    assert counter.frame_count == 1 and [r["exit"] for r in regions(f)] == ["return"]
    config.n_embd = 5  # read through the remapped name: a guard sees the change
    assert same(compiled(x, config), f(x, config))
    _Config.attribute_map = {"hidden_size": "scale"}  # and the class's own map
    try:
        assert same(compiled(x, config), f(x, config))
    finally:
        _Config.attribute_map = {"hidden_size": "n_embd"}


def test_hasattr_on_a_class_with_its_own_getattribute_asks_python():
    class Hides:
        def __getattribute__(self, key):
            if key == "secret":
                raise AttributeError(key)
            return super().__getattribute__(key)

    h = Hides()
    h.secret = 1

    def f(x, obj):
        return x + (1 if hasattr(obj, "secret") else 2)

    x = torch.zeros(1)
    assert same(framejit.compile(f, backend="eager")(x, h), f(x, h))  # 2: __getattribute__ hides it


def test_from_a_package_import_a_submodule_not_imported_yet_imports_it_as_python_does(tmp_path,
                                                                                     monkeypatch):
    # einops' backend does `from . import _torch_specific` on its first use: the import system
    # imports the submodule (running its code) before IMPORT_FROM reads it. The trace found the
    # package in sys.modules, read the attribute the submodule did not set yet, and the program
    # raised ImportError where Python succeeds.
    pkg = tmp_path / "fj_lazy_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        def late(x):
            from . import extra
            return extra.twice(x) + 1
    """))
    (pkg / "extra.py").write_text("def twice(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("fj_lazy_pkg")
    try:
        counter = CompileCounter()
        x = torch.randn(3)
        compiled = framejit.compile(module.late, backend=counter)
        assert same(compiled(x), x * 2 + 1)  # the first call imports fj_lazy_pkg.extra
        assert "fj_lazy_pkg.extra" in sys.modules
        assert same(compiled(x), x * 2 + 1)
        # Imported now: the import reads sys.modules, one graph for the whole function.
        framejit.reset()
        counter = CompileCounter()
        assert same(framejit.compile(module.late, backend=counter)(x), x * 2 + 1)
        assert counter.frame_count == 1
    finally:
        for name in ("fj_lazy_pkg", "fj_lazy_pkg.extra"):
            sys.modules.pop(name, None)


def _rowwise(x, y, *, factor):
    # Python that, traced, would unroll over the rows (its graph pinned to this batch size):
    # allowed in the graph, it is one node that runs it, at any batch size.
    return torch.stack([x[i] * y[i] * factor for i in range(x.shape[0])])


def test_allow_in_graph_makes_a_function_one_node_of_the_graph():
    assert framejit.allow_in_graph(_rowwise) is _rowwise

    def f(x, y):
        return _rowwise(x.abs() + 1, y, factor=2.0).sum(0)

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    assert same(compiled(x, y), f(x, y))
    assert counter.frame_count == 1
    code = counter.graphs[0].code
    assert "_rowwise" in code and "factor = 2.0" in code and "getitem" not in code
    assert regions(_rowwise) == []  # its body was never traced
    x, y = torch.randn(6, 3), torch.randn(6, 3)
    assert same(compiled(x, y), f(x, y))
    assert counter.frame_count == 1  # a new batch: the node runs at any size


def test_allow_in_graph_of_torch_compiler_is_honoured_and_decorates():
    @torch.compiler.allow_in_graph
    def outer_product(a, b):
        return a[:, None] * b[None, :]

    @framejit.allow_in_graph
    def halves(t):
        return t[: t.shape[0] // 2], t[t.shape[0] // 2:]

    def f(a, b):
        lo, hi = halves(outer_product(a, b))
        return lo + hi

    counter = CompileCounter()
    a, b = torch.randn(4), torch.randn(3)
    assert same(framejit.compile(f, backend=counter)(a, b), f(a, b))
    assert counter.frame_count == 1
    assert "outer_product" in counter.graphs[0].code and "halves" in counter.graphs[0].code
    assert regions(outer_product) == [] and regions(halves) == []
    first, second = (lambda t: t + 1), (lambda t: t * 3)
    assert framejit.allow_in_graph([first, second]) == [first, second]
    counter = CompileCounter()
    assert same(framejit.compile(lambda t: second(first(t)), backend=counter)(a), (a + 1) * 3)
    assert counter.frame_count == 1 and counter.op_count == 2 and "mul" not in counter.graphs[0].code
    with pytest.raises(TypeError, match="callable"):
        framejit.allow_in_graph(3)


def test_compiling_a_torch_layer_on_its_own_changes_nothing_elsewhere():
    """framejit.compile(nn.Linear) hooks Linear.forward as that compile's own frame only: a
    Linear that a break runs in plain Python under another compiled function (checkpoint's
    call) is not compiled as a frame of its own, before or after reset()."""
    import torch.utils.checkpoint
    x = torch.randn(2, 3)
    layer, other = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

    def checkpointed(x):
        return torch.utils.checkpoint.checkpoint(other, x, use_reentrant=False) * 2

    for _ in range(2):
        layers = CompileCounter()
        compiled_layer = framejit.compile(layer, backend=layers)
        assert same(compiled_layer(x), layer(x)) and layers.frame_count == 1
        counter = CompileCounter()
        assert same(framejit.compile(checkpointed, backend=counter)(x), checkpointed(x))
        assert counter.frame_count == 1  # `* 2`; other's forward ran as eager runs it
        framejit.reset()
        assert same(compiled_layer(x), layer(x)) and layers.frame_count == 2  # hooked again
