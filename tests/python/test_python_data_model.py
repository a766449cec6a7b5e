"""Python's data model as library code uses it (issue #16), each construct compiled next to eager
with its graph and break counts (torch.compile makes one graph and no break for each): list and
dict operations on containers the trace made or read, sequence comparisons, enums, namedtuples,
`match` statements, itertools / operator / copy / os helpers, closures written with `nonlocal`,
and version checks. State that the trace answers at compile time is guarded: a change compiles
again."""
import collections
import collections.abc
import copy
import enum
import itertools
import operator
import os
import sys
import typing
from typing import NamedTuple

import pytest
import torch
from torch import nn

import framejit
from framejit.testing import CompileCounter, same


def compile_and_compare(fn, *args, calls=2):
    """fn compiled, called `calls` times against eager; the counter and the explained run."""
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    for _ in range(calls):
        assert same(compiled(*args), fn(*args))
    return counter, framejit.explain(fn)(*args)


def assert_one_graph(fn, *args, ops=None):
    counter, explained = compile_and_compare(fn, *args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert counter.frame_count == 1
    if ops is not None:
        assert counter.op_count == ops
    return counter


# --- lists and dicts -----------------------------------------------------------------------


def fills_a_list(x):
    outs = [None] * 3  # a list value of the trace, not a constant
    for i in range(3):
        outs[i] = x * i
    outs[-1] = outs[-1] + 1
    parts = [x, x, x, x]
    parts[1:3] = [x * 2, x * 3, x * 4]  # a slice replaced by more items
    del parts[::2]
    return outs, parts


def repeats_and_searches(x):
    xs = [x] * 2 + [x * 2]
    ys = 2 * (x, x + 1)
    xs.remove(xs[0])  # by identity, as list.remove finds it first
    # (an item before the one sought that is another tensor would be compared: eager raises)
    return xs, ys, xs.index(xs[0]), [x, x].count(x), ys.index(ys[0]), [1, x].index(1)


def test_item_and_slice_stores_into_lists_made_in_the_trace_are_one_graph():
    assert_one_graph(fills_a_list, torch.randn(3))


def test_sequence_repetition_and_identity_searches_are_one_graph():
    assert_one_graph(repeats_and_searches, torch.randn(3))


def updates_dicts(x, kw):
    out = {}
    out.update({"h": x})
    out.update(k=x.sum())
    out.update([("z", x * 0)])
    out.update(zip(["a", "b"], x.unbind(0)[:2]))
    merged = {"alpha": 1.0, "beta": 2.0} | kw
    merged |= {"gamma": 3.0}
    copied = kw.copy()
    copied["alpha"] = 9.0  # the copy only
    return out, list(out), sorted(out), x * merged["alpha"] + merged["gamma"], copied


def test_dict_update_merge_copy_and_iteration_of_trace_dicts_are_one_graph():
    kw = {"alpha": 0.5}
    assert_one_graph(updates_dicts, torch.randn(4), kw)
    assert kw == {"alpha": 0.5}


def picks_by_key(x, scores):
    best = max(scores, key=scores.get)  # a dict's method read as a value
    ordered = [v * len(k) for k, v in sorted({"ab": x, "a": x + 1}.items(), reverse=True)]
    return x * scores[best], best, ordered


def test_a_bound_dict_method_as_a_key_and_sorting_items_holding_tensors_are_one_graph():
    assert_one_graph(picks_by_key, torch.randn(3), {"a": 1.0, "b": 3.0})


def compares_tuples(x):
    shape = x.shape
    small = shape < (4, 9)
    pairs = [("b", x), ("a", x * 2)]
    return x * int(small), min(pairs)[1], (1, x) == (2, x), (1, x) == (1, x)


def test_tuples_holding_tensors_compare_by_their_first_differing_item():
    assert_one_graph(compares_tuples, torch.randn(3, 5))


def compares_tensors_inside_tuples(x, y):
    return (1, x) < (1, y)


def test_a_comparison_reaching_two_tensors_needs_their_data_as_in_eager():
    x, y = torch.randn(1), torch.randn(1)
    counter = CompileCounter()
    assert same(framejit.compile(compares_tensors_inside_tuples, backend=counter)(x, y),
                compares_tensors_inside_tuples(x, y))
    reasons = framejit.explain(compares_tensors_inside_tuples)(x, y).break_reasons
    assert any("inside sequences" in reason for reason in reasons)


# --- enums ----------------------------------------------------------------------------------


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Act(enum.IntEnum):
    RELU = 1
    GELU = 2


def reads_members(x, mode, act):
    by_value = Mode("eval")
    names = [m.name for m in Mode]
    width = sum(len(m.value) for m in Mode)
    return x * len(mode.value) + int(act) * width, mode.name, by_value, names


def test_enum_values_names_lookups_and_iteration_are_one_graph_guarded_by_member():
    counter = CompileCounter()
    compiled = framejit.compile(reads_members, backend=counter)
    x = torch.randn(3)
    for mode, act in [(Mode.TRAIN, Act.GELU), (Mode.TRAIN, Act.GELU), (Mode.EVAL, Act.GELU),
                      (Mode.EVAL, Act.RELU)]:
        assert same(compiled(x, mode, act), reads_members(x, mode, act))
    assert counter.frame_count == 3  # one per (mode, act) pair met: the members are guarded
    assert framejit.explain(reads_members)(x, Mode.TRAIN, Act.RELU).graph_break_count == 0


# --- namedtuples ----------------------------------------------------------------------------


Pair = collections.namedtuple("Pair", "a b")


class ModelOut(NamedTuple):
    hidden: torch.Tensor
    aux: typing.Optional[torch.Tensor] = None

    def total(self):
        return self.hidden + (0 if self.aux is None else self.aux)


def uses_namedtuples(x, p):
    q = p._replace(b=p.b - 1)
    r = Pair._make([x, x * 3])
    out = ModelOut(x * 2)
    return q, r[0] + r[-1], len(r), out._asdict()["hidden"], out.total(), Pair._fields, p.a


def test_namedtuple_methods_and_namedtuples_passed_in_are_one_graph():
    x = torch.randn(3)
    assert_one_graph(uses_namedtuples, x, Pair(x + 1, x * 2))


def test_a_namedtuple_passed_in_is_guarded_by_its_class_and_length():
    x = torch.randn(3)
    counter = CompileCounter()
    compiled = framejit.compile(uses_namedtuples, backend=counter)
    Other = collections.namedtuple("Other", "a b")
    for p in [Pair(x + 0, x + 1), Pair(x + 2, x + 3), Other(x + 0, x + 1)]:
        assert same(compiled(x, p), uses_namedtuples(x, p))
    assert counter.frame_count == 2


# --- match statements ------------------------------------------------------------------------


class Point:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x = x
        self.y = y


def matches(x, spec):
    match spec:
        case {"scale": s, **rest}:
            x = x * s + len(rest)
        case [a, b, *others]:
            x = x + a * b + len(others)
        case Point(x=px, y=0) | Point(px, 1):
            x = x - px
        case int(n) if n > 2:
            x = x * n
        case str() as name:
            x = x + len(name)
        case _:
            x = -x
    match (x, x + 1):
        case (t, u):
            return t * u


@pytest.mark.parametrize("spec", [{"scale": 2.0, "other": 1}, [1, 2, 3, 4], (5, 6),
                                  Point(3.0, 0), Point(2.0, 1), 7, 1, "abc", None],
                         ids=lambda s: type(s).__name__)
def test_match_statements_are_decided_in_the_trace(spec):
    assert_one_graph(matches, torch.randn(3), spec)


# --- itertools, operator, copy, os ------------------------------------------------------------


def iterates(x):
    xs = [x, x * 2, x * 3, x * 4]
    head = sum(itertools.islice(xs, 1, None, 2))
    pairs = [a - b for a, b in itertools.pairwise(xs)]
    repeated = list(itertools.repeat(x, 2))
    starred = list(itertools.starmap(operator.mul, [(x, 2), (x, 3)]))
    taken = list(itertools.takewhile(lambda t: t is not xs[2], xs))
    dropped = list(itertools.dropwhile(lambda t: t is not xs[2], xs))
    kept = list(itertools.compress(xs, [1, 0, 1, 0]))
    summed = operator.methodcaller("sum", dim=0)(torch.stack(xs))
    return head, pairs, repeated, starred, taken, dropped, kept, summed


def test_itertools_and_methodcaller_forms_are_one_graph():
    assert_one_graph(iterates, torch.randn(3))


def groups(x):
    scaled = {k: sum(x * len(k) for _ in g) for k, g in itertools.groupby("aabccc")}
    names = [k for k, _ in itertools.groupby(["q", "q", "k", "v", "v"])]
    held = [(k, g) for k, g in itertools.groupby([1, 1, 2, 3, 3], key=lambda v: v % 2)]
    return scaled, names, [(k, list(g)) for k, g in held]  # groups left behind are empty


def test_itertools_groupby_is_one_graph():
    assert_one_graph(groups, torch.randn(3))


def copies(x, xs, d):
    ys = copy.copy(xs)
    ys.append(x)
    e = copy.copy(d)
    e["k"] = x
    return ys, e, copy.copy((x * 2, 1)), len(xs), len(d)


def test_copy_copy_of_lists_dicts_and_atoms_is_one_graph_and_leaves_the_originals():
    xs, d = [1, 2], {"a": 1}
    assert_one_graph(copies, torch.randn(2), xs, d)
    assert xs == [1, 2] and d == {"a": 1}


def reads_getenv(x):
    return x * int(os.getenv("FRAMEJIT_TEST_SCALE", "3"))


def test_os_getenv_is_one_graph_and_guarded_on_the_variable(monkeypatch):
    monkeypatch.delenv("FRAMEJIT_TEST_SCALE", raising=False)
    counter = CompileCounter()
    compiled = framejit.compile(reads_getenv, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x), x * 3)
    monkeypatch.setenv("FRAMEJIT_TEST_SCALE", "5")
    assert same(compiled(x), x * 5)
    assert same(compiled(x), x * 5)
    assert counter.frame_count == 2


# --- modules, closures, classes -----------------------------------------------------------------


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        outs = []
        for i, layer in enumerate(reversed(self.layers)):
            x = layer(x) * (i + 1)
            outs.append(x)
        return outs


def test_reversed_module_list_is_one_graph():
    model = Tower()
    counter, explained = compile_and_compare(model, torch.randn(2, 4))
    assert counter.frame_count == 1 and explained.graph_break_count == 0
    model.layers.append(nn.Linear(4, 4))  # its length is guarded
    assert same(framejit.compile(model, backend=counter)(torch.ones(2, 4)), model(torch.ones(2, 4)))


def make_counter():
    count = 0
    history = []

    def step(x):
        nonlocal count, history
        count += 1
        history = history + [count]
        return x * count

    return step


def test_nonlocal_stores_into_a_closure_are_replayed_at_the_exit():
    eager, compiled_fn = make_counter(), make_counter()
    compiled = framejit.compile(compiled_fn, backend=CompileCounter())
    x = torch.randn(3)
    for _ in range(3):
        assert same(compiled(x), eager(x))
    cells = lambda f: [c.cell_contents for c in f.__closure__]  # noqa: E731
    assert cells(compiled_fn) == cells(eager) == [3, [1, 2, 3]]
    explained = framejit.explain(make_counter())(x)
    assert explained.graph_break_count == 0


def checks_versions_and_types(x, v):
    dev = torch.device("cpu")
    y = x.type(torch.float64) + x.type("torch.DoubleTensor")
    if sys.version_info >= (3, 10) and torch.__version__ >= "2.0":
        y = y * 2
    if isinstance(v, typing.Mapping):
        return y
    if isinstance(v, typing.Sequence):
        return torch.ones(3, device=dev) + y * len(v), dev == x.device
    return y


def test_version_checks_devices_legacy_types_and_typing_aliases_are_one_graph():
    assert_one_graph(checks_versions_and_types, torch.randn(3), [1, 2])
    assert_one_graph(checks_versions_and_types, torch.randn(3), {"a": 1})


class Frozen:
    def __init__(self, d):
        object.__setattr__(self, "d", d)  # as a frozen dataclass's __init__ stores
        object.__setattr__(self, "half", d // 2)


def makes_frozen(x):
    spec = Frozen(x.shape[-1])
    return x * spec.half + spec.d


def test_object_setattr_on_an_object_made_in_the_trace_is_one_graph():
    assert_one_graph(makes_frozen, torch.randn(4))


def splits_heads(x):
    new_shape = x.size()[:-1] + (4, 2)
    y = x.view(*new_shape)  # a torch.Size pinned to its numbers under a backend per size
    return y.permute(0, 2, 1, 3).reshape(*x.shape)


def test_star_arguments_of_a_pinned_torch_size_are_one_graph_under_a_static_backend():
    def static(gm, example_inputs):  # not shape-generic: sizes are constants in its graphs
        return gm.forward

    x = torch.randn(2, 3, 8)
    explained = framejit.explain(splits_heads, backend=static)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    assert same(explained.result, splits_heads(x))


class Settings:
    def __init__(self, scale):
        self.scale = scale
        self.names = ["a"]


def copies_an_object(x, settings):
    view = copy.copy(settings)
    view.scale = 3.0  # the copy only; its list is the original's, as copy.copy shares it
    return x * view.scale + settings.scale, view.names is settings.names


def test_copy_copy_of_a_plain_object_is_one_graph_and_shares_its_items():
    settings = Settings(2.0)
    assert_one_graph(copies_an_object, torch.randn(3), settings)
    assert settings.scale == 2.0


class LayerView(collections.abc.Sequence):
    """A Sequence made in the trace (transformers' per-layer config view)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(i)
        return i * 2


def zips_a_sequence_made_here(x):
    total = x
    for kind, scale in zip(["a", "b"], LayerView(2)):
        total = total + scale * len(kind)
    return total


def test_zip_over_a_sequence_object_made_in_the_trace_iterates_it_not_its_class():
    assert_one_graph(zips_a_sequence_made_here, torch.randn(3))


def divides_sizes(x):
    chunks = torch.div(x.size(1), 4, rounding_mode="trunc") - 1  # a tensor, as in eager
    torch._check(x.size(0) > 0)
    return x * chunks


def test_torch_div_of_numbers_and_torch_check_of_sizes_are_one_graph():
    assert_one_graph(divides_sizes, torch.randn(2, 12))


class Switch:
    def __init__(self, on):
        self.on = on

    def __bool__(self):
        return self.on


def truths(x):
    return x * int(bool(Switch(False))) + int(bool(Switch(True)))


def test_bool_of_an_object_made_in_the_trace_runs_its_classs_bool():
    # (bool() once saw the object's class, which is always true)
    assert_one_graph(truths, torch.randn(3))


class ByKind(nn.Module):
    """Gemma 4's text model: a mask per kind of layer, for the kinds in a set it keeps."""

    def __init__(self):
        super().__init__()
        self.kinds = set(["full", "sliding", "full"])
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        masks = {}
        for kind in self.kinds:
            masks[kind] = self.proj(x) * len(kind)
        return masks


def test_iterating_a_set_passed_in_is_one_graph_and_guards_its_order():
    model = ByKind()
    counter, explained = compile_and_compare(model, torch.randn(2, 4))
    assert counter.frame_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    model.kinds = {"local"}  # another set: its items (and their order) are guarded
    assert same(framejit.compile(model, backend=counter)(torch.ones(2, 4)), model(torch.ones(2, 4)))
    assert counter.frame_count == 2


class PerLayer:
    """transformers' heterogeneous config: a per-layer attribute read globally raises."""

    def __init__(self):
        self.spec = {"w"}
        self.w = 3

    def __getattribute__(self, key):
        spec = super().__getattribute__("__dict__").get("spec")
        if spec is not None and key in spec:
            raise AttributeError(f"ambiguous {key}")
        return super().__getattribute__(key)


def layer_view(config):
    out = copy.copy(config)
    out.__dict__.pop("spec", None)  # the copy's own dict (a region ends here: made real first)
    return out


def reads_a_layer_view(x, config):
    return x * layer_view(config).w


def test_a_dict_of_an_object_made_in_the_trace_left_to_python_is_that_objects_own():
    config = PerLayer()
    counter = CompileCounter()
    compiled = framejit.compile(reads_a_layer_view, backend=counter)
    for _ in range(2):
        assert same(compiled(torch.ones(2), config), torch.full((2,), 3.0))
    assert "spec" in config.__dict__


def updates_a_dict_of_an_object_made_here(x):
    p = PerLayer()
    p.__dict__.update(w=5, spec=set())  # left to Python: its own dict, not a copy
    return x * p.w


def test_other_changes_of_the_dict_of_an_object_made_in_the_trace_reach_the_object():
    counter, _ = compile_and_compare(updates_a_dict_of_an_object_made_here, torch.ones(2))
    assert same(framejit.compile(updates_a_dict_of_an_object_made_here, backend=counter)(torch.ones(2)),
                torch.full((2,), 5.0))


# --- tensors computed from numbers ---------------------------------------------------------


def chunks_by_a_torch_div(h, w):
    # Longformer's _chunk: a size computed with torch.div on ints, then a view by that 0-d tensor
    h = h.view(h.size(0), torch.div(h.size(1), w * 2, rounding_mode="trunc"), w * 2, h.size(2))
    scale = torch.tensor(h.size(-1)).sqrt().item()
    if torch.tensor(w) > 1:
        h = h * 2
    return h / scale, int(torch.tensor(w) * 3)


def test_a_tensor_computed_from_numbers_is_known_where_its_value_is_needed():
    counter = CompileCounter()
    compiled = framejit.compile(chunks_by_a_torch_div, backend=counter)
    for n in (8, 8, 12):
        h = torch.randn(2, n, 4)
        assert same(compiled(h, 2), chunks_by_a_torch_div(h, 2))
    assert counter.frame_count == 2  # the view pins the sequence length: one graph per length
    explained = framejit.explain(chunks_by_a_torch_div)(torch.randn(2, 8, 4), 2)
    assert explained.graph_break_count == 0, explained.break_reasons
    code = explained.graphs[0].code
    assert "h.view(2, 2, 4, 4)" in code
    assert "torch.div" not in code and "torch.tensor" not in code  # used as numbers: dropped


def test_a_random_scalar_is_never_known():
    def f(x):
        return x * torch.rand(()).item()

    explained = framejit.explain(f)(torch.ones(2))
    assert explained.graph_break_count == 1
    assert "needs the tensor's data" in explained.break_reasons[0]


def counts_in_place(x):
    step = torch.tensor(0.0)  # known: 0.0
    step += 1  # changed in place: unknown from here (torch.optim's step counter)
    step.add_(1)
    return x * float(step), step


def keeps_the_maximum_in_place(x, best):
    torch.maximum(best, x, out=best)  # its result unused: the write is its effect
    return x + 1


def test_a_known_tensor_changed_in_place_is_not_known_and_writes_stay():
    x = torch.randn(3)
    counter, _ = compile_and_compare(counts_in_place, x)
    assert same(framejit.compile(counts_in_place, backend=counter)(x)[0], x * 2.0)
    best = torch.full((3,), -1.0)
    compiled = framejit.compile(keeps_the_maximum_in_place, backend=CompileCounter())
    compiled(x, best)
    assert same(best, torch.maximum(torch.full((3,), -1.0), x))


class Forwarding(nn.Module):
    """A wrapper whose __getattr__ tries nn.Module's lookup first and then the wrapped module
    (PEFT's models forward to their base model this way)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.scale = 2.0

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, x):
        return nn.functional.linear(x, self.weight, self.bias) * self.scale + self.inner(x)


def test_a_class_getattr_forwarding_to_a_wrapped_module_is_inlined():
    model = Forwarding()
    counter, explained = compile_and_compare(model, torch.randn(2, 4))
    assert counter.frame_count == 1 and explained.graph_break_count == 0


def test_an_attribute_a_getattr_made_is_read_again_once_the_instance_has_it():
    model = Forwarding()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    x = torch.randn(2, 4)
    assert same(compiled(x), model(x))
    # Now found on the class, without __getattr__: the guard that it was missing fails.
    Forwarding.weight = property(lambda self: self.inner.weight * 0)
    try:
        assert same(compiled(x), model(x))
        assert counter.frame_count == 2
    finally:
        del Forwarding.weight


class _Settings:
    def __init__(self):
        self.scale = 3.0


class _Wrapper:
    """Forwards to what it wraps: a name the settings lack raises AttributeError there."""

    def __init__(self):
        self.settings = _Settings()

    def __getattr__(self, name):
        return getattr(self.settings, name)


def asks_missing_attributes(x, wrapper, settings):
    try:
        shift = settings.shift
    except AttributeError:
        shift = 1.0
    y = x * wrapper.scale + shift + getattr(wrapper, "bias", 0.5)
    return y if hasattr(wrapper, "missing") else y * 2


def test_a_missing_attribute_raises_attributeerror_in_the_trace_and_is_guarded():
    wrapper, settings = _Wrapper(), _Settings()
    counter, explained = compile_and_compare(asks_missing_attributes, torch.randn(2), wrapper, settings)
    assert counter.frame_count == 1 and explained.graph_break_count == 0
    compiled = framejit.compile(asks_missing_attributes, backend=counter)
    x = torch.randn(2)
    for name, value in (("shift", 5.0), ("bias", 7.0), ("missing", 1)):
        target = settings if name == "shift" else wrapper.settings
        setattr(target, name, value)  # now present: the guard on its absence fails
        assert same(compiled(x, wrapper, settings), asks_missing_attributes(x, wrapper, settings))
    assert counter.frame_count == 4


def keeps_accepted_kwargs(module, x, **kwargs):
    import inspect
    accepted = set(inspect.signature(module.forward).parameters)
    kw = {k: v for k, v in kwargs.items() if k in accepted}
    return module(x, **kw)


def test_the_parameter_names_of_a_signature_are_a_set_in_the_trace():
    counter, explained = compile_and_compare(keeps_accepted_kwargs, nn.Linear(4, 4), torch.randn(2, 4))
    assert counter.frame_count == 1 and explained.graph_break_count == 0


class LayerGetter(nn.Module):
    """torchvision's IntermediateLayerGetter pattern: the outputs of some layers collected in
    an OrderedDict made in the forward."""

    def __init__(self):
        super().__init__()
        self.body = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.ReLU(), "c": nn.Linear(4, 2)})
        self.return_layers = {"a": "feat0", "c": "out"}

    def forward(self, x):
        out = collections.OrderedDict()
        for name, module in self.body.items():
            x = module(x)
            if name in self.return_layers:
                out[self.return_layers[name]] = x
        return out


def test_an_ordered_dict_made_in_the_trace_leaves_it_as_one():
    model = LayerGetter()
    counter, explained = compile_and_compare(model, torch.randn(3, 4))
    assert counter.frame_count == 1 and explained.graph_break_count == 0
    out = framejit.compile(model, backend=CompileCounter())(torch.randn(3, 4))
    assert type(out) is collections.OrderedDict and list(out) == ["feat0", "out"]


def reorders(x):
    od = collections.OrderedDict.fromkeys(["a", "b", "c"], 0)
    od["a"] = x * 2
    od.move_to_end("a")
    od.move_to_end("c", last=False)
    first = od.popitem(last=False)
    last = od.popitem()
    return list(od.keys()), first, last, od, type(od.keys()).__name__


def test_ordered_dict_reordering_in_one_graph():
    assert_one_graph(reorders, torch.ones(2))
    out = framejit.compile(reorders, backend=CompileCounter())(torch.ones(2))
    assert out[0] == ["b"] and type(out[3]) is collections.OrderedDict


class Slotted:
    __slots__ = ("a", "b", "__private")

    def __init__(self, a):
        self.a = a
        setattr(self, "b", a * 2)
        self.__private = 3

    def total(self):
        return self.a + self.b * self.__private


def builds_a_slotted_object(x):
    p = Slotted(x)
    return p.total(), p.b


def returns_a_slotted_object(x):
    return Slotted(x * 3)


def test_an_instance_of_a_slots_class_made_in_the_trace():
    assert_one_graph(builds_a_slotted_object, torch.ones(2))
    p = framejit.compile(returns_a_slotted_object, backend=CompileCounter())(torch.ones(2))
    assert type(p) is Slotted and not hasattr(p, "__dict__")
    assert same(p.b, torch.ones(2) * 6) and same(p.total(), torch.ones(2) * 21)


def stores_past_the_slots(x):
    p = Slotted(x)
    p.c = 1  # AttributeError in Python: no such slot and no __dict__
    return p.a


def test_a_store_past_a_slots_class_slots_raises_as_in_python():
    compiled = framejit.compile(stores_past_the_slots, backend=CompileCounter())
    with pytest.raises(AttributeError):
        compiled(torch.ones(2))


def compares_ordered_dicts(x):
    a = collections.OrderedDict([("p", 1), ("q", 2)])
    b = collections.OrderedDict([("q", 2), ("p", 1)])
    plain = {"q": 2, "p": 1}
    return x * (1 if a == b else 2) + (10 if a == plain else 20), type(a).__name__


def test_ordered_dicts_compare_in_order_against_each_other():
    assert_one_graph(compares_ordered_dicts, torch.ones(2))


def makes_a_namedtuple_class(x):
    Out = collections.namedtuple("Out", ["loss", "logits"], defaults=[None])
    o = Out(x.sum())
    return o.loss + 1, o._fields, o.logits is None, tuple(o)


def returns_a_namedtuple_made_inside(x):
    Out = collections.namedtuple("Out", ["loss", "logits"])
    return Out(x.sum(), x * 2)


def test_a_namedtuple_class_made_in_the_trace_is_made_at_trace_time():
    assert_one_graph(makes_a_namedtuple_class, torch.ones(2))
    # (one class per compile, not per call as in eager: compared by name, module and fields)
    o = framejit.compile(returns_a_namedtuple_made_inside, backend=CompileCounter())(torch.ones(2))
    e = returns_a_namedtuple_made_inside(torch.ones(2))
    assert (type(o).__name__, type(o).__module__, o._fields) == (type(e).__name__, type(e).__module__, e._fields)
    assert same(tuple(o), tuple(e))
