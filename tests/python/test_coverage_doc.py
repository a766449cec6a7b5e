"""Keeps docs/coverage.md true: every row with an example is run here and its outcome compared
with the status the table claims (graph: no break; break: a region exit the runtime performs;
deopt: CPython finishes the frame from there).

Each example is a small function registered with @example("<the example text>"); it takes one
4x4 tensor unless the registration gives another input. The outcome is read from the regions of
that function's own code, so a callee that breaks shows as a break of the caller."""
import collections
import contextlib
import collections.abc
import dataclasses
import enum
import functools
import inspect
import math
import operator
import os
import re
import types
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree

import coverage_data_model
import framejit
from framejit.testing import CompileCounter, regions, same

DOC = Path(__file__).resolve().parents[2] / "docs" / "coverage.md"

EXAMPLES = {}  # example text -> (function, make its arguments)


def example(text, make=lambda: (torch.randn(4, 4),)):
    def register(fn):
        assert text not in EXAMPLES, text
        EXAMPLES[text] = (fn, make)
        return fn
    return register


coverage_data_model.register(example)  # the rows of "Python's data model"


# ---------------------------------------------------------------------------------------------
# Helpers the examples use
# ---------------------------------------------------------------------------------------------

def helper(x, scale=1, *rest, **opts):
    return x * scale


def countdown(x, n):
    return x if n == 0 else countdown(x + 1, n - 1)


def set_with_three(xs):
    s = set(xs)
    s.add(3)
    return s


def affine(x, w, b=0.0):
    return x * w + b


def gen(x):
    yield x
    yield x * 2


@torch.no_grad()
def frozen(x):
    return x * 2


@torch.inference_mode()
def inferred(x):
    return x + 1


class Clamped(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clamp(-1, 1)

    @staticmethod
    def backward(ctx, grad):
        return grad  # straight through


class Obj:
    sides = 4

    def method(self, x):
        return x + 1

    @classmethod
    def per_side(cls, x):
        return x / cls.sides

    def __call__(self, x):
        return x - 1


class Base:
    def scale(self, x):
        return x * 2


class Derived(Base):
    def scale(self, x):
        return super().scale(x) + 1


class Point:
    def __init__(self, t, k):
        self.t = t
        self.k = k


@dataclasses.dataclass
class Cfg:
    scale: float = 2.0


@dataclasses.dataclass
class Out:
    value: torch.Tensor
    scale: float = 1.0


class Scaled(Point):
    def __init__(self, t):
        super().__init__(t, 2.0)


class Hooked(nn.Module):
    def forward(self, x):
        return x * 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("offset", torch.arange(4.0))
        self.register_buffer("running", torch.zeros(4))
        self.conv = nn.Conv2d(1, 1, 3, padding=1)
        self.bn = nn.BatchNorm2d(1)
        self.mha = nn.MultiheadAttention(4, 2, batch_first=True)


OBJ, DERIVED, CFG, NET = Obj(), Derived(), Cfg(), Net()
HOOKED = Hooked()
HOOKED.register_forward_hook(lambda m, a, out: None)
HOOKED.register_forward_pre_hook(lambda m, a: (a[0] * 2,))
BW_HOOKED = Hooked()
BW_HOOKED.register_full_backward_hook(lambda m, grad_in, grad_out: None)
INPUTS, LOG, TABLE = {}, [], {}
SCALES = {"a": 1.0, "b": 2.0}
COUNT = 0




# ---------------------------------------------------------------------------------------------
# Calls
# ---------------------------------------------------------------------------------------------

example("helper(x, scale=2)")(lambda x: helper(x, scale=2))
example("obj.method(x)")(lambda x: OBJ.method(x))
example("[t * 2 for t in xs]", lambda: ([torch.randn(4)] * 2,))(
    lambda xs: torch.stack([t * 2 for t in xs]))
example("countdown(x, 3)")(lambda x: countdown(x, 3))
example("cfg.scale * x")(lambda x: CFG.scale * x)
example("obj.per_side(x)")(lambda x: OBJ.per_side(x * 2) + 1)
example("obj(x)")(lambda x: OBJ(x * 2) + 1)
example("partial(affine, w=2.0)(x)")(lambda x: functools.partial(affine, w=2.0)(x * 2) + 1)
example("s = set(xs); s.add(3)")(lambda x: x * len(set_with_three([1, 2])))
example("partial(torch.mul, w * 2)(x)")(lambda x: functools.partial(torch.mul, x * 2)(x) + 1)
example("sorted(ts, key=lambda t: t.shape[0])")(
    lambda x: sorted([x, x[:2], x[:3]], key=lambda t: t.shape[0])[0].sum() + 1)
example("super().scale(x)")(lambda x: DERIVED.scale(x * 2) + 1)
example("Point(x, 2.0)")(lambda x: Point(x * 2, 2.0).t + 1)
example("frozen(x)")(lambda x: frozen(x * 2) + inferred(x))
example("Clamped.apply(x)")(lambda x: Clamped.apply(x * 2) + 1)
example('partial(F.gelu, approximate="tanh")')(
    lambda x: functools.partial(F.gelu, approximate="tanh")(x * 2) + 1)
example("return Out(x * 2, 3.0)")(lambda x: Out(x * 2, 3.0))
example("super().__init__(t)")(lambda x: Scaled(x * 2).t + 1)
example('tree_map(fn, {"a": x, "b": [x]})')(
    lambda x: pytree.tree_map(lambda t: t * 2, {"a": x, "b": [x + 1]}))


@example("p = Point(x * 2, 2.0); print(p.k)")
def ex_object_across_break(x):
    p = Point(x * 2, 2.0)
    print(p.k)
    return p.t * p.k


@example("helper(*args, **kwargs)")
def ex_star_call(x):
    args, kwargs = (x, 2), {"unused": 1}
    return helper(*args, **kwargs)


@example("inner(x, scale=3)")
def ex_nested_def(x):
    count = 0

    def inner(t, scale=2):
        nonlocal count
        count += 1
        return t * scale + count
    return inner(x, scale=3)


# ---------------------------------------------------------------------------------------------
# nn.Module (NET's submodules are read from a global, as a forward reads them from self)
# ---------------------------------------------------------------------------------------------

example("self.layers[0](x)")(lambda x: NET.layers[0](x))
example("hooked(x)")(lambda x: HOOKED(x) + 1)
example("bw_hooked(x)")(lambda x: BW_HOOKED(x) + 1)


class _OwnForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.forward = self.doubled

    def doubled(self, x):
        return x * 2


OWN_FORWARD = _OwnForward()
example("own_forward(x)")(lambda x: OWN_FORWARD(x) + 1)
example("x @ self.weight - self.offset")(lambda x: x @ NET.weight - NET.offset)
example("self.bn(self.conv(x))", lambda: (torch.randn(2, 1, 4, 4),))(
    lambda x: NET.bn(NET.conv(x)))
example("self.mha(x, x, x, need_weights=False)", lambda: (torch.randn(2, 3, 4),))(
    lambda x: NET.mha(x, x, x, need_weights=False)[0] + 1)


@example("for layer in self.layers:")
def ex_modulelist_for(x):
    for layer in NET.layers:
        x = layer(x)
    return x


@example("enumerate(self.layers)")
def ex_modulelist_enumerate(x):
    for i, layer in enumerate(NET.layers):
        x = layer(x) * i
    return x


@example("self.heads.items()")
def ex_moduledict_items(x):
    out = x
    for name, head in NET.heads.items():
        out = out + head(x)
    return out


@example("self.parameters()")
def ex_parameters(x):
    for p in NET.parameters():
        x = x + p.sum()
    return x


@example("self.layers[1:3]")
def ex_modulelist_slice(x):
    for layer in NET.layers[1:3]:
        x = layer(x)
    return x


PAIRS = nn.ModuleList([nn.ModuleList([nn.LayerNorm(4), nn.Linear(4, 4)]), nn.ModuleList([nn.Identity(), None])])


@example("norm, block = self.pairs[0]")
def ex_modulelist_unpack(x):
    norm, block = PAIRS[0]
    _, missing = PAIRS[1]
    return block(norm(x)) if missing is None else x


@example("partial(self.block, scale=2.0)(x)")
def ex_partial_of_module(x):
    return functools.partial(NET.mha, need_weights=False)(x[None], x[None], x[None])[0] + 1


def _maybe_wrapped(fn):
    @functools.wraps(fn)
    def inner(t):
        return t if t is None else fn(t)
    return inner


@example("@functools.wraps(fn) def inner(...)")
def ex_wraps_in_trace(x):
    return _maybe_wrapped(NET.layers[0])(x) * 2


@example("if self.training:")
def ex_training(x):
    if NET.training:
        return x + 1
    return x - 1


# ---------------------------------------------------------------------------------------------
# Control flow and Python values
# ---------------------------------------------------------------------------------------------

example("len(xs)")(lambda x: x * len([x, x]))
example("max(x.shape) * min(3, 1)")(lambda x: x * (max(x.shape) * min(3, 1)))
example("math.sqrt(x.shape[-1])")(lambda x: x / math.sqrt(x.shape[-1]))
example("if self.emb_layer_norm_after:")(lambda x: NET.heads["a"](x) if NET.conv else x)
example("for t in set(config.layer_types):")(
    lambda x: sum(x * len(t) for t in set(["full", "sliding", "full"])))
example("dict.fromkeys(names, 0)")(
    lambda x: x * sum(len(k) + v for k, v in dict.fromkeys(("ab", "c"), 1).items()))
example("np.sqrt(self.d_model_size)")(lambda x: x * np.sqrt(OBJ.sides) + np.exp(0.0))
example("x.view(b, np.prod(x.shape[1:]))", make=lambda: (torch.randn(2, 3, 4),))(
    lambda x: x.view(x.shape[0], np.prod(x.shape[1:])) * int(np.sum([1, 2])))
example("sum(i * i for i in range(4))")(lambda x: x * sum(i * i for i in range(4)))
example("sum([x, x * 2])")(lambda x: sum([x, x * 2]))
example("getattr(obj, \"size\", 1)")(lambda x: x * getattr(OBJ, "size", 1))


class _Forwarding:
    def __init__(self):
        self.inner = types.SimpleNamespace(weight=2.0)

    def __getattr__(self, name):
        return getattr(self.inner, name)


FORWARDING = _Forwarding()
example("forwarded.weight")(lambda x: x * FORWARDING.weight)
example('hasattr(forwarded, "_hook")')(lambda x: x * (2 if hasattr(FORWARDING, "_hook") else 3))


class _RenamingConfig:
    attribute_map = {"width": "n_embd"}

    def __init__(self):
        self.n_embd = 2

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


CONFIG = _RenamingConfig()
example("getattr(config, \"use_cache\", None)")(
    lambda x: x * getattr(CONFIG, "width", 1) if getattr(CONFIG, "use_cache", None) is None else x)


class _Registry(collections.abc.Mapping):
    def __init__(self):
        self._table = {"sdpa": 1}

    def __getitem__(self, key):
        return self._table[key]

    def __iter__(self):
        return iter(self._table)

    def __len__(self):
        return len(self._table)


REGISTRY_MAPPING = _Registry()
example("len(layers)")(lambda x: x * len(REGISTRY_MAPPING))
example("if cache:")(lambda x: x + 1 if REGISTRY_MAPPING else x)
example("\"sdpa\" in registry")(lambda x: x + 1 if "sdpa" in REGISTRY_MAPPING else x)


class _Mode(str, enum.Enum):
    NONE = "none"
    NOTIFY = "notify"


MODE = _Mode.NOTIFY
example("mode == Mode.NONE")(lambda x: x + 1 if MODE == _Mode.NONE else x - 1)


class _Output(collections.OrderedDict):
    """ModelOutput's shape: a dataclass over OrderedDict, fields kept as items by __setattr__."""

    def __setattr__(self, name, value):
        if value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)


@dataclasses.dataclass
class _LMOut(_Output):
    logits: torch.Tensor = None
    loss: torch.Tensor = None


example("Out(logits=x)[\"logits\"]")(lambda x: _LMOut(logits=x * 2)["logits"] + 1)


class _IndexedOutput(_LMOut):
    def __getitem__(self, k):  # ModelOutput's: by name through items(), by index through values
        return dict(self.items())[k] if isinstance(k, str) else tuple(self.values())[k]


example('out["logits"] + out[0]', lambda: (_IndexedOutput(logits=torch.randn(4, 4)),))(
    lambda out: out["logits"] + out[0] + sum(v.sum() for v in out.values()))


def _with_registry(registry):
    def wrap(cls):
        def forward(self, x):  # the registry: a closure cell of a method set on the class
            return registry.get("scale", 1.0) * x
        cls.forward = forward
        return cls
    return wrap


class _Table:
    def __init__(self, **entries):
        self._entries = entries

    def get(self, key, default):
        return self._entries.get(key, default)


@_with_registry(_Table(scale=3.0))
class _Experts(nn.Module):
    pass


class _MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = _Experts()

    def forward(self, x):
        return self.experts(x) + 1


MOE = _MoE()
example("self.experts(x)")(lambda x: MOE(x * 2))


class _DictRegistry(dict):
    def get(self, key, default=None):
        return super().get(key) or default


DICT_REGISTRY = _DictRegistry(sdpa={"scale": 2.0})
example("super().get(key)")(lambda x: x * DICT_REGISTRY.get("sdpa", {})["scale"])


class _Cache:
    @property
    def is_compileable(self):
        return False


CACHE = _Cache()
example("getattr(cache, \"is_compileable\", False)")(
    lambda x: x * 2 if getattr(CACHE, "is_compileable", False) else x)


class _Strict:
    def __setattr__(self, name, value):
        super().__setattr__(name, float(value))


STRICT = _Strict()


def _stores_through_setattr(x):
    STRICT.scale = 3
    return x * STRICT.scale


example("config.scale = 3")(_stores_through_setattr)


class _Layer:
    def chunk(self, t):
        return t * 2


def _calls_a_bound_method(forward_fn, x):
    import inspect
    return forward_fn(x) if len(inspect.signature(forward_fn).parameters) == 1 else x


example("forward_fn(x)", make=lambda: (_Layer().chunk, torch.randn(4, 4)))(_calls_a_bound_method)
example("nn.CrossEntropyLoss()(x, y)", make=lambda: (torch.randn(4, 3), torch.tensor([0, 1, 2, 0])))(
    lambda x, y: torch.nn.CrossEntropyLoss()(x, y))


class _GELUActivation(nn.Module):
    def __init__(self, use_gelu_python=False):
        super().__init__()
        self.act = self._python if use_gelu_python else F.gelu

    def _python(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    def forward(self, x):
        return self.act(x)


class _ClassInstantier(collections.OrderedDict):
    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


ACT2FN = _ClassInstantier({"gelu": _GELUActivation, "gelu_python": (_GELUActivation, {"use_gelu_python": True})})
example("ACT2FN[\"gelu\"](x)")(lambda x: ACT2FN["gelu"](x) + ACT2FN["gelu_python"](x))


@functools.lru_cache
def is_torch_greater_or_equal(version):
    return tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= tuple(
        int(v) for v in version.split("."))


example("is_torch_greater_or_equal(\"2.9\")")(
    lambda x: x + 1 if is_torch_greater_or_equal("2.9") else x - 1)


def _small_builtins(x):
    d = dict(a=2, **{"b": 1})
    return helper(*(), **{"x": x[slice(None, 2)], "scale": d["a"]}) + int(torch.compiler.is_exporting())


example("dict(a=2)")(_small_builtins)
example("os.environ.get(\"FLAG\", \"0\")")(
    lambda x: x + 1 if os.environ.get("FRAMEJIT_COVERAGE_FLAG", "0") == "1" else x)
example("callable(mask_fn)")(lambda x: x * 2 if callable(lambda i: x[i]) and not callable(x) else x)


def _wrapped(x, scale=2):
    return x * scale


example("func.__code__.co_varnames")(
    lambda x: x * len(_wrapped.__code__.co_varnames) + len(_wrapped.__name__))


HOLDER = types.SimpleNamespace(n=0)


@example("setattr(obj, \"n\", 1)")
def setattr_builtin(x):
    setattr(HOLDER, "n", 1)
    return x * HOLDER.n
example("ks.index(3)")(lambda x: x * [1, 2, 3].index(3))


@example("for i, t in enumerate(xs)")
def ex_enumerate(x):
    out = x
    for i, t in enumerate([x, x]):
        out = out + t * i
    return out


class _RemappingConfig:
    attribute_map = {"hidden_size": "width"}

    def __init__(self):
        self.width = 3

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


_REMAPPING_CONFIG = _RemappingConfig()


@example("config.hidden_size")
def ex_custom_getattribute(x):
    config = _REMAPPING_CONFIG
    return x * config.hidden_size


@example("ks = d.keys()")
def ex_dict_view(x):
    d = {"a": x}
    ks = d.keys()
    d["b"] = x * 2  # the view sees it
    return [d[k] for k in ks], len(ks)


@example("except RuntimeError:")
def ex_raise_on_real_data(x):
    try:
        y = x.long().mul_(0.5)  # meta tensors accept it; the real kernel raises
    except RuntimeError:
        y = x + 1
    return y * 2


@example("while i < 4:")
def ex_while(x):
    i = 0
    while i < 4:
        i += 1
        if i == 2:
            continue
        x = x * 2
    return x


@example("[[t * j for j in range(2)] for t in xs]")
def ex_nested_comprehension(x):
    rows = [[t * j for j in range(2)] for t in [x, x + 1]]
    return torch.stack([torch.stack(r) for r in rows])


@example('d[f"layer{i}"]')
def ex_fstring(x):
    d, i = {"layer1": 2.0}, 1
    return x * d[f"layer{i}"] + len("{}-{}".format("a", "b").upper())


@example("out.append(x * 2)")
def ex_local_list(x):
    out = [x]
    out.append(x * 2)
    out.extend([x * 3])
    return torch.stack(out[1:]) * (1 if 2 in (1, 2) else 0) + {"a": 1}.get("b", 2)


@example("(a, b), c = pair, x")
def ex_nested_unpack(x):
    pair = (x, x + 1)
    (a, b), c = pair, x
    a, b = b, a
    return a * b - c * len([*pair, 3])


@example("for k, v in d.items():")
def ex_dict_items(x):
    for k, v in {"a": 1.0, "b": 2.0}.items():
        x = x * v
    return x


@example("for k in d:")
def ex_dict_iter(x):
    for k in SCALES:
        x = x * SCALES[k]
    return x


@example("enumerate(ks, start=1)")
def ex_enumerate_start(x):
    for i, k in enumerate([2.0, 3.0], start=1):
        x = x + i * k
    return x


@example("{i % 3 for i in range(7)}")
def ex_set_comprehension(x):
    return x * len({i % 3 for i in range(7)})


@example("isinstance(n, (int, float))", lambda: (torch.randn(4, 4), 3))
def ex_isinstance_tuple(x, n):
    return x * n if isinstance(n, (int, float)) else x


@example("isinstance(x, torch.Tensor)")
def ex_isinstance_tensor(x):
    return x * 2 if isinstance(x, torch.Tensor) else x


@example("[x] + [x * 2]")
def ex_list_concat(x):
    return torch.stack([x] + [x * 2])


@example("a, *rest = xs")
def ex_starred(x):
    a, *rest = [x, x * 2, x * 3]
    return a + rest[0]


# ---------------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------------

example("F.gelu(torch.add(x, 1, alpha=2)).sum(dim=0)")(
    lambda x: F.gelu(torch.add(x, 1, alpha=2)).sum(dim=0))
example("torch.zeros(4) + torch.arange(4)")(lambda x: torch.zeros(4) + torch.arange(4) + x)
example("x.shape[0] * x.ndim")(lambda x: x * (x.shape[0] * x.ndim))
example("x.T * x.numel() if x.dtype == torch.float32 else x")(
    lambda x: x.T * x.numel() if x.dtype == torch.float32 else x)
example("torch.max(x, dim=0).values")(lambda x: torch.max(x, dim=0).values)
example("x[..., None, ::2][idx]")(lambda x: x[..., None, ::2][torch.tensor([0, 2])])
example("x.reshape(x.shape[:-1] + (2, -1))")(lambda x: x.reshape(x.shape[:-1] + (2, -1)))


@example("for x_t in xs:")
def rows_loop(xs):
    h = torch.zeros(xs.size(1))
    for x_t in xs:
        h = torch.tanh(h + x_t)
    return h
example("x.view(x.size(0), -1)")(lambda x: x.view(x.size(0), -1) * 2)
example("if x.size(0) > 2:")(lambda x: x * 2 if x.size(0) > 2 else x)
example("x[:, : x.size(1) - 1]")(lambda x: x[:, : x.size(1) - 1] * 2)
_rotary = torch.randn(16, 8)


@example("f = table[pos : pos + 1]; assert f.shape == (1, 8)", make=lambda: (torch.randn(4, 8), 3))
def position_row(x, pos):
    f = _rotary[pos: pos + 1]
    assert f.shape == (1, 8)
    return x * f
_strided = torch.nn.Conv1d(4, 4, 3, stride=2)
example("if conv(x).shape[-1] > 1:")(lambda x: x * 2 if _strided(x[None]).shape[-1] > 1 else x)
example("if x.numel() * 2 > 2 ** 31:")(lambda x: x.contiguous() if x.numel() * 2 > 2 ** 31 else x * 2)


@example("if n + x.size(0) >= 10:", make=lambda: (torch.randn(4, 4), 3))
def linear_relation_row(x, n):
    return x * 2 if n + x.size(0) >= 10 else x - n


example('x.view(torch.div(x.size(0), 2, rounding_mode="trunc"), -1)')(
    lambda x: x.view(torch.div(x.size(0), 2, rounding_mode="trunc"), -1) * 2)
example("x[x > 0]")(lambda x: x[x > 0] * 2)
example("x.reshape(-1, *x.shape[1:])")(lambda x: x.reshape(-1, *x.shape[1:]) * 2)
example("s = x.sum().item()")(lambda x: x * x.sum().item())


@example("y = x * 2; y += 1; y[0] = 0")
def ex_inplace(x):
    y = x * 2
    y += 1
    y[0] = 0
    return y


@example('inputs["x"] + pair[1]')
def ex_inputs(x):
    inputs, pair = {"x": x}, (x, x + 1)
    return inputs["x"] + pair[1]


@example("y[y < 0] = 0.0")
def ex_mask_assign(x):
    y = x.clone()
    y[y < 0] = 0.0
    y[1:, :2] = 1.0
    return y


@example("if x.sum() > 0:")
def ex_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


@example("if s * 2 > 1:")
def ex_number_branch(x):
    s = x.sum().item()
    if s * 2 > 1:
        return x * 2
    return x


# ---------------------------------------------------------------------------------------------
# Context managers
# ---------------------------------------------------------------------------------------------

@example("with torch.no_grad():")
def ex_with(x):
    y = x + 1
    with torch.no_grad():
        y = y * 2
    return y


@example("with torch.enable_grad():")
def ex_enable_grad(x):
    with torch.enable_grad():
        y = x * 2
    return y


@example("with torch.set_grad_enabled(False):")
def ex_set_grad_enabled(x):
    with torch.set_grad_enabled(False):
        y = x * 2
    return y + x


@example("with torch.inference_mode():")
def ex_inference_mode(x):
    with torch.inference_mode():
        y = x * 2
    return y


@example('with torch.autocast("cpu", dtype=torch.bfloat16):')
def ex_autocast(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
    return y.float()


class Timer:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@example("with Timer():")
def ex_own_manager(x):
    with Timer():
        y = x * 2
    return y


@contextlib.contextmanager
def doubled():
    try:
        yield 2.0
    finally:
        pass


@example("with doubled() as k:")
def ex_generator_manager(x):
    with doubled() as k:
        y = x * k
    return y


@example("x * 2 if not x.is_xpu else x")
def ex_device_flag(x):
    return x * 2 if not x.is_xpu else x


@example("x * s` with `s = np.float32(0.5)", make=lambda: (torch.randn(4, 4), __import__("numpy").float32(0.5)))
def ex_numpy_scalar_argument(x, s):
    return x * s


@example("Categorical(probs).sample()", make=lambda: (torch.tensor([0.2, 0.8]),))
def ex_distribution_sample(probs):
    from torch.distributions import Categorical
    return Categorical(probs).sample()


@example("with scaled_here() as k:")
def ex_generator_manager_made_here(x):
    @contextlib.contextmanager
    def scaled_here():
        try:
            yield 3.0
        finally:
            pass

    with scaled_here() as k:
        y = x * k
    return y


@example("torch.nn.init._calculate_fan_in_and_fan_out(x)")
def ex_init_fans(x):
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(x)
    return x * (fan_in + fan_out)


@example("set(inspect.signature(fn).parameters.keys())")
def ex_signature_keys(x):
    return x * len(set(inspect.signature(ex_torch_assert).parameters.keys()))


@example('torch._assert(x.shape[0] == 4, "rows")')
def ex_torch_assert(x):
    torch._assert(x.shape[0] == 4, "rows")
    return x + 1


@example('x.to(torch.get_autocast_dtype("cpu"))')
def ex_autocast_dtype(x):
    return x.to(torch.get_autocast_dtype("cpu")) * 2


def walk(tree):
    if isinstance(tree, list):
        for child in tree:
            yield from walk(child)
    else:
        yield tree


@example("yield from walk(child)")
def ex_yield_from(x):
    return sum(walk([x, [x * 2, [x * 3]]]))


@example("groups = collections.defaultdict(list)")
def ex_defaultdict_made(x):
    groups = collections.defaultdict(list)
    groups[0].append(x * 2)
    return groups[0][0]


@example("d = collections.defaultdict(lambda: 0); d[k] += 1")
def ex_defaultdict_lambda(x):
    d = collections.defaultdict(lambda: 0)
    for k in "aba":
        d[k] += 1
    return x * d["a"]


@example("collections.Counter(names)")
def ex_counter_made(x):
    counts = collections.Counter(["a", "b", "a"])
    return x * counts["a"] + counts["missing"]


class _DecoderConfig:
    attribute_map = {"hidden_size": "d_model"}

    def __init__(self):
        self.d_model = 4
        self.decoder_layers = 2

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


@example("view = copy.deepcopy(config)", make=lambda: (torch.randn(4, 4), _DecoderConfig()))
def ex_deepcopy_config(x, config):
    import copy
    view = copy.deepcopy(config)
    view.d_model = 8
    return x * view.hidden_size + config.hidden_size


@example("vars(config)[\"d_model\"]", make=lambda: (torch.randn(4, 4), _DecoderConfig()))
def ex_vars(x, config):
    return x * vars(config)["d_model"] + len(vars(config))


@example("del view.decoder_layers")
def ex_del_attribute(x):
    view = _DecoderConfig()
    del view.decoder_layers
    return x * view.hidden_size + hasattr(view, "decoder_layers")


@example("def fact(n): return n * fact(n - 1)")
def ex_recursive_nested_function(x):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    return x * fact(4)


@example("c + c2")
def ex_counter_operator(x):
    c = collections.Counter("ab") + collections.Counter("a")
    return x * c["a"]


@example("with contextlib.ExitStack() as stack:")
def ex_untraced_manager(x):
    with contextlib.ExitStack():
        y = x * 2
    return y


@example("with contextlib.suppress(KeyError): y = d[k]")
def ex_suppress(x):
    y = x
    with contextlib.suppress(KeyError):
        y = {"a": x * 2}["b"]
    return y + 1


@example('with torch.profiler.record_function("step"):')
def ex_record_function(x):
    with torch.profiler.record_function("step"):
        y = x * 2
    return y


@example("torch.jit.annotate(List[torch.Tensor], [])")
def ex_jit_annotate(x):
    outs = torch.jit.annotate(typing.List[torch.Tensor], [])
    outs.append(x)
    return outs[0] * 2, (list[int], typing.Optional[int])


@example("typing.cast(torch.Tensor, x)")
def ex_cast(x):
    return typing.cast(torch.Tensor, x) * 2


# ---------------------------------------------------------------------------------------------
# Side effects
# ---------------------------------------------------------------------------------------------

def _leaf_with_grad():
    w = torch.ones(4, 4, requires_grad=True)
    (w * 2).sum().backward()
    return w


@example("p.grad = None", make=lambda: (_leaf_with_grad(),))
def ex_grad_set(p):
    g = p.grad * 2
    p.grad = None
    return g


_STATE = collections.defaultdict(dict)


@example("state[p]", make=lambda: (torch.nn.Parameter(torch.ones(4, 4)),))
def ex_state_by_parameter(p):
    entry = _STATE[p]
    if "sum" not in entry:
        entry["sum"] = torch.zeros_like(p)
    return entry["sum"] + p


_MODEL = nn.Linear(4, 4)
_GROUPS = [{"params": list(_MODEL.parameters())}]


@example('opt.param_groups[0]["params"][0]')
def ex_same_object_twice(x):
    with torch.no_grad():
        _GROUPS[0]["params"][0].mul_(1.0)
    return _MODEL(x)


_OPT_MODEL = nn.Linear(4, 4)
_OPT = torch.optim.AdamW(_OPT_MODEL.parameters(), lr=1e-3)


@example("opt.step()")
def ex_optimizer_step(x):
    loss = _OPT_MODEL(x).sum()
    loss.backward()
    _OPT.step()
    _OPT.zero_grad()
    return loss


BACKENDS = {torch.Tensor: "torch", list: "python"}


@example("BACKENDS.get(type(x))")
def ex_registry_by_class(x):
    name = BACKENDS.get(type(x))
    return x * 2 if name == "torch" else x


class _Speed(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


BY_MODE = {_Speed.FAST: 2.0, _Speed.SAFE: 1.0}
ACTIVE_MODE = _Speed.FAST
SKIPPED_DEVICES = frozenset({"mps", "npu"})


@example("BY_MODE[ACTIVE_MODE]")
def ex_registry_by_enum(x):
    return x * BY_MODE[ACTIVE_MODE]


@example("x.device.type in SKIPPED_DEVICES")
def ex_frozenset_global(x):
    return x.float() if x.device.type in SKIPPED_DEVICES else x * 2


_CHECKPOINTED = nn.Linear(4, 4)


@example("checkpoint(block, x, use_reentrant=False)",
         make=lambda: (torch.randn(4, 4, requires_grad=True),))
def ex_activation_checkpoint(x):
    y = torch.utils.checkpoint.checkpoint(_CHECKPOINTED, x, use_reentrant=False)
    return torch.relu(y)


@example("checkpoint(block, x, use_reentrant=True)",
         make=lambda: (torch.randn(4, 4, requires_grad=True),))
def ex_reentrant_checkpoint(x):
    y = torch.utils.checkpoint.checkpoint(_CHECKPOINTED, x, use_reentrant=True)
    return torch.relu(y)


@example("bias.requires_grad = True")
def ex_requires_grad_store(x):
    bias = torch.zeros(4)
    bias.requires_grad = True
    return x + bias


@functools.lru_cache(None)
def _say_once(self, message):
    return None


class _OnceSayer:
    say_once = _say_once


_SAYER = _OnceSayer()


@example('logger.warning_once("...")')
def ex_warning_once(x):
    _SAYER.say_once("compiling")
    return x * 2


class _Clipped(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)


_CLIPPED = _Clipped()
for _p in _CLIPPED.parameters():
    _p.grad = torch.ones_like(_p)


@example("clip_grad_norm_(model.parameters(), 1.0)")
def ex_clip_grad_norm(x):
    norm = torch.nn.utils.clip_grad_norm_(_CLIPPED.parameters(), 1e6)  # (nothing clipped)
    return x * norm


class _LearningRate:
    param_groups = [{"lr": 0.1}]


_SCHEDULED = _LearningRate()


@example('opt.param_groups[0]["lr"]')
def ex_varying_float(x):
    # (a scheduler changing it between calls: test_optimizers.py)
    return x * _SCHEDULED.param_groups[0]["lr"]


@example("dq = collections.deque(maxlen=2); dq.append(x)")
def ex_deque(x):
    dq = collections.deque(maxlen=2)
    for i in range(3):
        dq.append(x * i)
    dq.appendleft(x)
    return sum(dq), list(dq), type(dq) is collections.deque


_POSITION = {"start_pos": 3}


@example("freqs[start_pos : start_pos + seqlen]")
def ex_varying_int(x):
    # (a position changing between calls, one more compile then none: test_int_inputs.py)
    start_pos = _POSITION["start_pos"]
    return x[start_pos: start_pos + 2] * 2


def _double(self, t):
    return t * 2


class _HasDouble:
    pass


_HAS_DOUBLE = _HasDouble()


@example("func.__get__(opt, type(opt))(x)")
def ex_function_get(x):
    return _double.__get__(_HAS_DOUBLE, _HasDouble)(x)


@example("obj.attr = x")
def ex_setattr(x):
    y = x + 1
    OBJ.attr = y
    return y


@example("self.running.mul_(0.9)")
def ex_module_state(x):
    NET.running.mul_(0.9)
    NET.last = x.sum(0)
    return x - NET.running


@example("log.append(x)")
def ex_append(x):
    y = x + 1
    LOG.append(y)
    return y * 2


@example('inputs["k"] = x')
def ex_store_item(x):
    y = x + 1
    INPUTS["k"] = y
    return y


@example("del d[0]")
def ex_del_item(x):
    y = x + 1
    TABLE[0] = 1
    del TABLE[0]
    return y


@example("global count; count += 1")
def ex_global(x):
    global COUNT
    y = x + 1
    COUNT += 1
    return y


# ---------------------------------------------------------------------------------------------
# Other
# ---------------------------------------------------------------------------------------------

@example("print(x.shape)")
def ex_print(x):
    print(x.shape)
    return x + 1


@example("for t in gen(x)")
def ex_generator(x):
    out = 0
    for t in gen(x):
        out = out + t
    return out


@example("for t in it", make=lambda: (iter([torch.randn(4), torch.randn(4)]),))
def ex_foreign_iterator(it):
    out = 0
    for t in it:
        out = out + t
    return out


@example("registry.get(kind, None)")
def ex_mapping_get_missing(x):
    kind = "eager"
    fn = REGISTRY_MAPPING.get(kind, None)
    return x * 2 if fn is None else x * fn


@example("x.type(y.dtype)")
def ex_tensor_type(x):
    y = x.double()
    return x.type(y.dtype) + y


@example("q, k, v = map(lambda t: t.transpose(1, 2), (q, k, v))",
         make=lambda: tuple(torch.randn(2, 3, 4, 5) for _ in range(3)))
def ex_map(q, k, v):
    q, k, v = map(lambda t: t.transpose(1, 2), (q, k, v))
    return q + k + v


@example("next(iter(xs))", make=lambda: ([torch.randn(3), torch.randn(3)],))
def ex_next_iter(xs):
    it = iter(xs)
    first = next(it)
    return first + next(it, first)


@example('itemgetter("a", "b")(d)', make=lambda: ({"a": torch.randn(3), "b": 2},))
def ex_itemgetter(d):
    a, b = operator.itemgetter("a", "b")(d)
    return a * b


_Pair = collections.namedtuple("_Pair", "first second")


@example("Pair(x, 2).first")
def ex_namedtuple(x):
    pair = _Pair(x, 2)
    return pair.first * pair.second


@example("raise ValueError()")
def ex_raise(x):
    y = x + 1
    try:
        raise ValueError()
    except ValueError:
        return y


class _Owned:
    scale = 2.0


_OWNED = _Owned()
_OWNER_REF = __import__("weakref").ref(_OWNED)


@example("obj = self._owner_ref()")
def ex_weakref_call(x):
    obj = _OWNER_REF()
    return x * obj.scale


@example("if id(x) == id(y):", make=lambda: (torch.randn(4, 4), torch.randn(4, 4)))
def ex_id_compare(x, y):
    if id(x) == id(y):
        return x * 2
    return x + y


class _Point2:
    __slots__ = ("x", "y")

    def __init__(self, x, y):
        self.x = x
        self.y = y


@example("p = Point2(x, y)  # __slots__")
def ex_slots(x):
    p = _Point2(x, x * 2)
    return p.x + p.y


@example('Out = namedtuple("Out", ["loss", "logits"])')
def ex_namedtuple_call(x):
    Out = collections.namedtuple("Out", ["loss", "logits"])
    o = Out(x.sum(), x * 2)
    return o.loss + o.logits, o._fields


@example("out = OrderedDict()")
def ex_ordered_dict(x):
    out = collections.OrderedDict()
    out["feat"] = x * 2
    out.move_to_end("feat", last=False)
    return out


@example("raise ValueError() from None")
def ex_raise_from(x):
    y = x + 1
    try:
        raise ValueError() from None
    except ValueError:
        return y


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------

def table_rows():
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("construct", "status", "---"):
            continue
        example_text = re.sub(r"^`|`$", "", cells[1])
        if example_text:
            rows.append((cells[0], example_text, cells[2]))
    return rows


def outcome(fn):
    kinds = [(r["kind"], r["exit"]) for r in regions(fn)]
    if any(kind == "fallback" or exit == "deopt" for kind, exit in kinds):
        return "deopt"
    if all(exit == "return" for _, exit in kinds):
        return "graph"
    return "break"


@pytest.mark.parametrize("construct,example_text,status", table_rows(),
                         ids=lambda v: str(v)[:30])
def test_coverage_table_row(construct, example_text, status, capsys):  # capsys: quiet prints
    fn, make = EXAMPLES[example_text]
    compiled = framejit.compile(fn, backend=CompileCounter())
    args = make()
    out = compiled(*args)
    assert regions(fn), "the example's frame was never traced"
    assert outcome(fn) == status, [r["reason"] for r in regions(fn)]
    if example_text not in UNREPEATABLE:
        assert same(fields(out), fields(fn(*args)))


def fields(value):
    """A user object or dataclass as its type and attributes, so same() compares it field by
    field; any other value as it is."""
    if hasattr(value, "__dict__") and not isinstance(value, (torch.Tensor, nn.Module)):
        return type(value), dict(vars(value))
    return value


# Examples whose result depends on state their own call changes (a running buffer).
UNREPEATABLE = {"self.running.mul_(0.9)", "for t in it",  # (the iterator is used up)
                "p.grad = None", "opt.step()",  # (the first call cleared the grad, stepped)
                "nonlocal count; count += 1",  # (a counter in a closure)
                "Categorical(probs).sample()"}  # (a random draw)


def test_every_example_row_is_covered():
    assert {example_text for _, example_text, _ in table_rows()} == set(EXAMPLES)
