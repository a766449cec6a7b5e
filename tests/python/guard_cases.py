"""Guard property cases: a seeded generator of small functions that read state of many kinds,
sequences of mutations of that state applied between calls, a runner comparing framejit with
eager on two identical copies of the state, a shrinker, and a worker process for crash isolation.

A case is data (``Case``): a list of features (each a piece of state: a tensor argument, a global
list, a closure cell, an object of a user class, an nn.Module, ...), the statements of the
function body, and the mutations (source snippets) run between calls. ``render`` turns it into the
source of a module; ``run_case`` executes that source twice in two fresh modules registered in
``sys.modules`` (one copy called eagerly, one through ``framejit.compile``), then calls both, applies
each mutation to both, calls again, ..., and after every call compares return values, exception
types and a snapshot of all state the function can reach (module globals, arguments, closure
cells, defaults, classes of the case). ``shrink`` drops mutations, statements and unused features
while the case keeps failing the same way.

Command line (the pytest entry runs ``worker`` processes through ``run_batches``):
  python3 guard_cases.py run --start S --count N [--known]   what the test does, with a report
  python3 guard_cases.py one --seed S [--known]              run one case, shrink it if it fails
  python3 guard_cases.py show --seed S [--known]             print the rendered case
  python3 guard_cases.py crash-shrink --seed S [--hang]      shrink a crashing case (fork per try)
  python3 guard_cases.py worker --start S --count N          run cases, protocol lines on stdout
"""
import argparse
import collections
import json
import logging
import math
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
import types
import warnings

import torch
import torch.nn as nn

import framejit

# ---------------------------------------------------------------------------------------------
# Bugs. Every construct the generator makes carries a tag (the mutation kinds, a few statement
# kinds). The constructs of a bug that is open are left out of the default run (EXCLUDED), or,
# for a bug that run_case recognises when it compares (TOLERATED), tolerated there; each open bug
# has an xfail(strict) test with its minimal case in test_guard_properties.py, each fixed one a
# regression test. known=True (FRAMEJIT_GUARD_KNOWN=1, --known) generates everything and
# tolerates nothing, e.g. to check a fix.

# The bugs listed in the brief of this test, all fixed on the build this test was last run
# against (2026-12-01, commit 82a28f0; 1, 3 and 6 and 2 for plain classes in a95b438/287cadf).
KNOWN_BUGS = {
    # (1) run-time aliasing: a trace for two distinct objects that writes an attribute of one
    # and reads one of the other, reused when both arguments are the same object.
    "alias_obj_write": "known bug 1: object arguments aliased at run time after the trace wrote "
                       "an attribute of one of them",
    # (2) a function replaced on the class after compiling kept running the old one (a plain
    # class's method, property or staticmethod; forward of an nn.Module subclass).
    "class_method_replaced": "known bug 2: method replaced on the class after compiling",
    "class_forward_replaced": "known bug 2: forward replaced on the nn.Module class after compiling",
    # (3) two functions whose globals have the same __name__ read globals from the first: every
    # module copy made here has a unique name, so only its regression test builds this.
    "same_globals_name": "known bug 3: two modules with the same __name__",
    # (4) a graph traced for an ordinary tensor was reused for an inference tensor.
    "inference_tensor": "known bug 4: inference tensor passed where an ordinary one was traced",
    # (5) forward replaced on a module instance after compiling did not compile again.
    "instance_forward_replaced": "known bug 5: forward replaced on a module instance",
    # (6) floats guarded with ==: -0.0 reused the graph traced for 0.0, NaN never matched.
    "float_eq_guard": "known bug 6: float constant guarded with == (-0.0 / NaN)",
}

# Bugs this test found (not in the brief's list). A, B, D and F are fixed in 82a28f0, G in
# fc57da0, C and E in the commit that made a graph that raised rerun as Python.
NEW_BUGS = {
    # (A) a function's __code__ replaced after compiling: the function object was guarded by
    # identity only, and the trace had inlined the old code.
    "replace_code": "new bug A: a global function's __code__ replaced after compiling keeps "
                    "running the old code",
    # (B) `l + [0.5]`: the list it made was built once, when the region was traced, and every
    # later call handed out that same list object (mutating it changed later results).
    "list_concat_shared": "new bug B: the list made by `l + [...]` is one object shared by all calls",
    # (C, fixed) writes (setattr on an argument, a global, also inside an inlined callee such as
    # module.train(False)) made before an op that raises in the same compiled region were lost:
    # they are replayed only after the graph ran. Now a graph that raised and wrote into no
    # input is run again as Python from the region's start.
    "side_effects_lost_on_raise": "new bug C: side effects before an exception raised inside a "
                                  "compiled region are not performed",
    # (D) an instance attribute set after compiling that shadows a method of the class
    # (`o.meth = lambda v: ...`) was not seen: the compiled code kept calling the class's method.
    "instance_shadows_method": "new bug D: instance attribute shadowing a method, set after "
                               "compiling, is ignored",
    # (E, fixed with C) an exception raised while a compiled region's graph runs (an op whose
    # check only the real kernel makes: an in-place op whose result type cannot be cast, linear
    # with mixed dtypes, batch norm of one sample in training) skipped the frame's own
    # try/except and left the function.
    "try_skipped_on_graph_error": "new bug E: a RuntimeError raised by a graph op inside try/except "
                                  "is not caught by the function's handler",
    # (F) x.is_inference() of an ordinary tensor argument that the trace first read inside
    # `with torch.inference_mode():` answered True (eager: False), inside the block and after
    # it, on the first call already.
    "is_inference_in_inference_mode": "new bug F: x.is_inference() of an ordinary tensor first read "
                                      "inside inference_mode answers True",
    # (G, fixed; a regression of 82a28f0) after forward was replaced on a module instance, the
    # retrace warned "internal error: guards fail on the state they were traced from" and that
    # part ran in plain Python (results were right).
    "guards_fail_own_state": "new bug G: internal error 'guards fail on the state they were traced "
                             "from' after forward is replaced on a module instance",
}

# open bugs whose constructs the default run does not generate (none at the moment)
EXCLUDED_CONSTRUCTS = set()
# open bugs run_case tolerates when it compares
TOLERATED = set()
EXCLUDED = EXCLUDED_CONSTRUCTS | TOLERATED

D = 4  # last dimension of every generated tensor an op combines with the accumulator
SHAPES = [(4,), (2, 4), (3, 4), (2, 3, 4), (1, 4)]
DTYPES = ["float32"] * 6 + ["float64", "float64", "bfloat16", "int64"]
INTS = [0, 1, 2, 3, 5, -1, 7]
FLOATS = [0.5, 1.5, -2.0, 3.25, 0.0, 2.0, 1e-3, float("inf")]
KNOWN_FLOATS = [-0.0, float("nan")]
STRS = ["a", "b", "ab", "", "ba"]
DICT_KEYS = ["a", "bb", "ccc"]

PRELUDE = '''\
import dataclasses
import math
import types
import torch
import torch.nn as nn


def mk_t(seed, shape, dtype="float32", rg=False, inf=False, nc=False):
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    if nc and len(shape) >= 2:
        t = torch.randn(shape[:-2] + (shape[-1], shape[-2]), generator=g).transpose(-1, -2)
    elif nc:
        t = torch.randn((shape[0] * 2,), generator=g)[::2]
    else:
        t = torch.randn(shape, generator=g)
    if dtype == "int64":
        t = (t * 3).round()
    t = t.to(getattr(torch, dtype))
    if inf:
        with torch.inference_mode():
            t = t.clone()
    elif rg:
        t.requires_grad_(True)
    return t


def copy_t(t):
    c = t.detach().clone()
    if t.requires_grad:
        c.requires_grad_(True)
    return c


def as_inference(t):
    with torch.inference_mode():
        return t.detach().clone()


def mk_lin(seed, n=4):
    lin = nn.Linear(n, n)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, n, generator=g) * 0.5)
        lin.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return lin


def set_default(fn, name, value):
    code = fn.__code__
    names = code.co_varnames[:code.co_argcount]
    defaults = list(fn.__defaults__)
    defaults[names.index(name) - (len(names) - len(defaults))] = value
    fn.__defaults__ = tuple(defaults)


def get_default(fn, name):
    code = fn.__code__
    names = code.co_varnames[:code.co_argcount]
    return fn.__defaults__[names.index(name) - (len(names) - len(fn.__defaults__))]


def set_kwdefault(fn, name, value):
    kw = dict(fn.__kwdefaults__)
    kw[name] = value
    fn.__kwdefaults__ = kw


def hook_double(mod, args, out):
    return out * 2


def prehook_neg(mod, args):
    return (-args[0],)


def alt_meth(self, v):
    return v - self.w


def alt_forward(self, v):
    return v * 3


'''

_PRELUDE_NAMES = None


def prelude_names():
    global _PRELUDE_NAMES
    if _PRELUDE_NAMES is None:
        ns = {}
        exec(compile(PRELUDE, "<guard_prelude>", "exec"), ns)
        _PRELUDE_NAMES = frozenset(ns)
    return _PRELUDE_NAMES


# ---------------------------------------------------------------------------------------------
# Cases


def F(name=None, setup=None, param=None, arg=None, cell=None, kwonly=False, defines=()):
    """One feature: a piece of state. ``setup``: module-level source; ``param``: its entry in the
    signature (``"x0"``, ``"d0=3"``); ``arg``: source of its value in ``A`` (the call's
    arguments); ``cell``: source of its initial value as a closure cell of f; ``defines``:
    further names its setup defines (classes, helpers) that others may use."""
    return {"name": name, "setup": setup, "param": param, "arg": arg, "cell": cell,
            "kwonly": kwonly, "defines": list(defines)}


class Case:
    def __init__(self, seed, backend, features, body, mutations, tags=(), options=None):
        self.options = dict(options or {})  # dynamic, warm_branches (compile), kw (call form)
        self.seed = seed
        self.backend = backend
        self.features = features      # list of F dicts
        self.body = body              # list of statement sources (may span lines)
        self.mutations = mutations    # list of (source, tag)
        self.tags = set(tags)         # constructs in the case (for known-bug filtering)

    def replace(self, **kw):
        c = Case(self.seed, self.backend, self.features, self.body, self.mutations, self.tags, self.options)
        for k, v in kw.items():
            setattr(c, k, v)
        return c

    def to_json(self):
        return {"seed": self.seed, "backend": self.backend, "features": self.features,
                "body": self.body, "mutations": [list(m) for m in self.mutations],
                "tags": sorted(self.tags), "options": self.options}

    @staticmethod
    def from_json(d):
        return Case(d["seed"], d["backend"], d["features"], d["body"],
                    [tuple(m) for m in d["mutations"]], d.get("tags", ()), d.get("options"))


_GLOBAL_WRITE = re.compile(r"^\s*(G_\w+)\s*(?:=(?!=)|\+=)", re.M)
_CELL_WRITE = re.compile(r"^\s*(c[a-z]\d+)\s*(?:=(?!=)|\+=)", re.M)


def _indent(src, n):
    pad = " " * n
    return "\n".join(pad + line if line.strip() else line for line in src.split("\n"))


def render(case):
    """The module source of a case (without PRELUDE, which precedes it when run)."""
    out = []
    for feat in case.features:
        if feat["setup"]:
            out.append(feat["setup"].rstrip() + "\n")
    plain, with_default, kwonly = [], [], []
    for feat in case.features:
        if feat["param"] is None:
            continue
        if feat["kwonly"]:
            kwonly.append(feat["param"])
        elif "=" in feat["param"]:
            with_default.append(feat["param"])
        else:
            plain.append(feat["param"])
    sig = plain + with_default + (["*"] + kwonly if kwonly else [])
    cells = [f for f in case.features if f["cell"] is not None]
    body = "\n".join(case.body)
    gw = sorted(set(_GLOBAL_WRITE.findall(body)))
    cw = sorted(set(_CELL_WRITE.findall(body)) & {f["name"] for f in cells})
    out.append("def _make():")
    for c in cells:
        out.append(f"    {c['name']} = {c['cell']}")
    out.append(f"    def f({', '.join(sig)}):")
    if gw:
        out.append(f"        global {', '.join(gw)}")
    if cw:
        out.append(f"        nonlocal {', '.join(cw)}")
    out.append("        acc = x0 * 1")
    out.append("        py = 0")
    out.append("        ex = None")
    for stmt in case.body:
        out.append(_indent(stmt, 8))
    out.append("        return acc, py, ex")
    getters = []
    for c in cells:
        n = c["name"]
        out.append(f"    def _get_{n}():\n        return {n}")
        out.append(f"    def _set_{n}(v):\n        nonlocal {n}\n        {n} = v")
        getters.append(f"{n!r}: (_get_{n}, _set_{n})")
    out.append(f"    return f, {{{', '.join(getters)}}}")
    out.append("")
    out.append("f, CELLS = _make()")
    out.append("A = {}")
    for feat in case.features:
        if feat["arg"] is not None:
            out.append(f"A[{feat['name']!r}] = {feat['arg']}")
    out.append(f"PARAMS = {plain!r}")
    out.append("GRAD = True")
    out.append("DTYPE = 'float32'")
    out.append(f"KW = {bool(case.options.get('kw'))}")
    return "\n".join(out) + "\n"


def describe(case, reason=None):
    """A failure report: the case's source (after guard_cases.PRELUDE), its calls and mutations."""
    lines = []
    if reason:
        lines.append(f"failure: {reason}")
    opts = {k: v for k, v in case.options.items() if k != "kw"}
    lines.append(f"seed {case.seed}, framejit.compile(f, backend={case.backend!r}"
                 + "".join(f", {k}={v!r}" for k, v in opts.items()) + "); module source (after guard_cases.PRELUDE):")
    lines.append(_indent(render(case).rstrip(), 4))
    lines.append("calls: cf(*[A[n] for n in PARAMS]) (by keyword when KW) under torch.set_grad_enabled(GRAD) "
                 "and default dtype DTYPE, then `.sum().backward()` of the result when it requires grad; "
                 "then each mutation (exec'd in the module) and a call:")
    for i, (src, tag) in enumerate(case.mutations):
        lines.append(f"  mutation {i + 1} [{tag}]:")
        lines.append(_indent(src, 6))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The generator

PREFIX = {
    ("tensor", "arg"): "x", ("tensor", "global"): "G_t", ("tensor", "cell"): "ct", ("tensor", "default"): "dt",
    ("int", "arg"): "n", ("int", "global"): "G_n", ("int", "cell"): "cn", ("int", "default"): "dn",
    ("int", "kwdefault"): "kn",
    ("float", "arg"): "r", ("float", "global"): "G_r", ("float", "cell"): "cr", ("float", "default"): "dr",
    ("float", "kwdefault"): "kr",
    ("str", "arg"): "s", ("str", "global"): "G_s", ("str", "cell"): "cs", ("str", "default"): "ds",
    ("str", "kwdefault"): "ks",
    ("bool", "arg"): "b", ("bool", "global"): "G_b", ("bool", "cell"): "cb", ("bool", "default"): "db",
    ("bool", "kwdefault"): "kb",
    ("opt", "arg"): "z", ("opt", "global"): "G_z", ("opt", "cell"): "cz", ("opt", "default"): "dz",
    ("opt", "kwdefault"): "kz",
    ("list", "arg"): "ll", ("list", "global"): "G_l", ("list", "cell"): "cl", ("list", "default"): "dl",
    ("dict", "arg"): "dd", ("dict", "global"): "G_d", ("dict", "cell"): "cd", ("dict", "default"): "dm",
    ("fn", "arg"): "fa", ("fn", "global"): "G_f", ("fn", "cell"): "cf", ("fn", "default"): "df",
    ("obj", "arg"): "o", ("obj", "global"): "G_o",
    ("module", "arg"): "m", ("module", "global"): "G_m",
}

# value types with weights, and the bindings each may take (with weights)
VTYPES = [("tensor", 5), ("int", 3), ("float", 3), ("str", 1), ("bool", 2), ("opt", 1), ("list", 2),
          ("dict", 3), ("fn", 2), ("obj", 5), ("module", 3)]
BINDS = {
    "tensor": [("arg", 5), ("global", 2), ("cell", 1), ("default", 1)],
    "int": [("arg", 3), ("global", 2), ("cell", 1), ("default", 1), ("kwdefault", 1)],
    "float": [("arg", 3), ("global", 2), ("cell", 1), ("default", 1), ("kwdefault", 1)],
    "str": [("arg", 2), ("global", 1), ("cell", 1), ("default", 1), ("kwdefault", 1)],
    "bool": [("arg", 2), ("global", 1), ("cell", 1), ("default", 1), ("kwdefault", 1)],
    "opt": [("arg", 2), ("global", 1), ("cell", 1), ("default", 1), ("kwdefault", 1)],
    "list": [("arg", 2), ("global", 2), ("cell", 1), ("default", 1)],
    "dict": [("arg", 2), ("global", 2), ("cell", 1), ("default", 1)],
    "fn": [("arg", 1), ("global", 3), ("cell", 1), ("default", 1)],
    "obj": [("arg", 4), ("global", 1)],
    "module": [("arg", 3), ("global", 1)],
}


def _pick(rng, weighted):
    total = sum(w for _, w in weighted)
    r = rng.random() * total
    for item, w in weighted:
        r -= w
        if r < 0:
            return item
    return weighted[-1][0]


def _float_src(v):
    if math.isnan(v):
        return "float('nan')"
    if math.isinf(v):
        return "float('inf')" if v > 0 else "float('-inf')"
    return repr(v)


class Feat:
    """Generator-side view of a feature: its value type, binding and helpers for templates."""

    def __init__(self, vtype, bind, name, idx):
        self.vtype, self.bind, self.name, self.idx = vtype, bind, name, idx
        self.cls = None        # obj/module: the class its value is made from
        self.helpers = None    # fn: the names (a, b, c, global read by c, d: a closure, its setter)
        self.spec = None

    def ref(self):
        """Source reading the current value, in a mutation."""
        if self.bind == "arg":
            return f"A[{self.name!r}]"
        if self.bind == "cell":
            return f"CELLS[{self.name!r}][0]()"
        if self.bind == "default":
            return f"get_default(f, {self.name!r})"
        if self.bind == "kwdefault":
            return f"f.__kwdefaults__[{self.name!r}]"
        return self.name

    def assign(self, value):
        """Source binding a new value, in a mutation."""
        if self.bind == "arg":
            return f"A[{self.name!r}] = {value}"
        if self.bind == "cell":
            return f"CELLS[{self.name!r}][1]({value})"
        if self.bind == "default":
            return f"set_default(f, {self.name!r}, {value})"
        if self.bind == "kwdefault":
            return f"set_kwdefault(f, {self.name!r}, {value})"
        return f"{self.name} = {value}"


_PLAIN_CLASS = '''\
KG{C} = 2.0


{head}    ca = 1.5

{init}{getattr}    def __len__(self):
        return 2 if self.flag else 1

    def meth2(self, v):
        return v * KG{C}

    def meth(self, v):
        return v * self.w

    @property
    def prop(self):
        return self.t * 2

    @staticmethod
    def stat(v):
        return v + 1

    @classmethod
    def cm(cls, v):
        return v * cls.ca


class {C}b({C}):
    ca = -0.5

    def meth2(self, v):
        return super().meth2(v) + 1

    def meth(self, v):
        return v + self.w
'''

_MODULE_CLASS = '''\
class {C}(nn.Module):
    def __init__(self, seed):
        super().__init__()
        self.lin = mk_lin(seed)
        self.register_buffer('buf', mk_t(seed + 1, (4,)))
        self.p = nn.Parameter(mk_t(seed + 2, (4,)))
        self.bn = nn.BatchNorm1d(4)
        self.scale = 0.5
        self.calls = 0
        self.layers = nn.ModuleList([mk_lin(seed + 3), nn.Identity()])
        self.md = nn.ModuleDict({{'a': nn.Tanh()}})

    def forward(self, v):
        v = self.lin(v) * self.scale
        if self.training:
            v = v + self.p
        return v + self.buf
'''

_HELPERS = '''\
def hf{i}a(v, k=2):
    return v * k


def hf{i}b(v):
    return v - 1


HK{i} = 0.5


def hf{i}c(v):
    return v + HK{i}


def _mk_hf{i}d(k):
    def hf{i}d(v):
        return v * k

    def setk(v):
        nonlocal k
        k = v
    return hf{i}d, setk


hf{i}d, hf{i}d_set = _mk_hf{i}d(3.0)
'''


class Gen:
    def __init__(self, seed, known=False):
        self.seed = seed
        self.rng = random.Random(seed)
        self.known = known
        self.tseed = (seed % 100003) * 1000
        self.feats = []
        self.counts = {}
        self.n_classes = 0
        self.tags = set()

    def allowed(self, tag):
        return self.known or tag not in EXCLUDED

    def choose(self, options):
        """A random option (a source, or (source, tag)); options whose tag names an open bug are
        left out unless known=True. The chosen tag joins the case's tags."""
        pool = [o for o in options if not (isinstance(o, tuple) and not self.allowed(o[1]))]
        pick = self.rng.choice(pool)
        if isinstance(pick, tuple):
            self.tags.add(pick[1])
        return pick

    # values -------------------------------------------------------------------------------
    def ts(self):
        self.tseed += 1
        return self.tseed

    def tensor_src(self, shape=None, dtype=None, rg=None, nc=None):
        rng = self.rng
        shape = shape if shape is not None else rng.choice(SHAPES)
        dtype = dtype if dtype is not None else rng.choice(DTYPES)
        if rg is None:
            rg = dtype != "int64" and rng.random() < 0.25
        if nc is None:
            nc = rng.random() < 0.1
        extra = (", rg=True" if rg else "") + (", nc=True" if nc else "")
        return f"mk_t({self.ts()}, {tuple(shape)!r}, {dtype!r}{extra})"

    def small_tensor_src(self):
        return self.tensor_src(shape=(4,), dtype=self.rng.choice(["float32"] * 4 + ["float64"]), nc=False)

    def float_val(self):
        pool = FLOATS + (KNOWN_FLOATS if self.allowed("float_eq_guard") else [])
        v = self.rng.choice(pool)
        if math.isnan(v) or (v == 0.0 and math.copysign(1, v) < 0):
            self.tags.add("float_eq_guard")
        return _float_src(v)

    def elem_src(self):
        return self.small_tensor_src() if self.rng.random() < 0.4 else self.float_val()

    def value_src(self, feat):
        rng, vt = self.rng, feat.vtype
        if vt == "tensor":
            return self.tensor_src()
        if vt == "int":
            return repr(rng.choice(INTS))
        if vt == "float":
            return self.float_val()
        if vt == "str":
            return repr(rng.choice(STRS))
        if vt == "bool":
            return repr(rng.random() < 0.5)
        if vt == "opt":
            return "None" if rng.random() < 0.5 else self.small_tensor_src()
        if vt == "list":
            return "[" + ", ".join(self.elem_src() for _ in range(rng.randint(0, 3))) + "]"
        if vt == "dict":
            keys = [k for k in DICT_KEYS if rng.random() < 0.6]
            rng.shuffle(keys)
            return "{" + ", ".join(f"{k!r}: {self.elem_src()}" for k in keys) + "}"
        if vt == "fn":
            a, b, c, _, d, _ = feat.helpers
            return rng.choice([a, a, b, c, d])
        if vt == "obj":
            cls = feat.cls if rng.random() < 0.8 else feat.cls + "b"
            w = self.float_val() if rng.random() < 0.7 else repr(rng.choice(INTS))
            return f"{cls}({w}, {self.small_tensor_src()})"
        if vt == "module":
            return f"{feat.cls}({self.ts()})"
        raise AssertionError(vt)

    def other_type_src(self, feat):
        rng, vt = self.rng, feat.vtype
        if vt == "int":
            return rng.choice(["2.0", "True", "None", "'2'"])
        if vt == "float":
            return rng.choice(["2", "True", "None"])
        if vt == "str":
            return rng.choice(["3", "None", "b'a'"])
        if vt == "bool":
            return rng.choice(["1", "0", "None"])
        if vt == "opt":
            return rng.choice(["1.0", "None"])
        if vt == "tensor":
            return rng.choice(["None", "1.5", "[1.0, 2.0]"])
        if vt == "list":
            return f"tuple({feat.ref()})"
        if vt == "dict":
            return rng.choice(["{}", "[('a', 1.0)]"])
        if vt == "fn":
            return rng.choice(["None", "torch.relu", "abs"])
        if vt == "obj":
            return rng.choice(["None", "1.0"])
        if vt == "module":
            return rng.choice(["nn.Identity()", "None"])
        raise AssertionError(vt)

    # features -----------------------------------------------------------------------------
    def new_name(self, vtype, bind):
        p = PREFIX[(vtype, bind)]
        i = self.counts.get(p, 0)
        self.counts[p] = i + 1
        return f"{p}{i}"

    def add_feature(self, vtype, bind, cls=None, value=None):
        name = self.new_name(vtype, bind)
        feat = Feat(vtype, bind, name, len(self.feats))
        setup, defines = [], []
        if vtype == "fn":
            i = self.n_classes
            self.n_classes += 1
            feat.helpers = (f"hf{i}a", f"hf{i}b", f"hf{i}c", f"HK{i}", f"hf{i}d", f"hf{i}d_set")
            setup.append(_HELPERS.format(i=i))
            defines += list(feat.helpers)
        if vtype == "obj":
            if cls is None:
                cls = f"K{self.n_classes}"
                self.n_classes += 1
                kind = _pick(self.rng, [("plain", 6), ("slots", 1), ("getattr", 1), ("dataclass", 1)])
                head = {"plain": f"class {cls}:\n",
                        "slots": f"class {cls}:\n    __slots__ = ('w', 't', 'flag', 'extra', 'last', 'count')\n",
                        "getattr": f"class {cls}:\n",
                        "dataclass": f"@dataclasses.dataclass\nclass {cls}:\n    w: object\n    t: object\n"
                                     f"    flag: bool = True\n"}[kind]
                init = ("" if kind == "dataclass" else
                        "    def __init__(self, w, t):\n"
                        "        self.w = w\n"
                        "        self.t = t\n"
                        "        self.flag = True\n\n")
                getattr_src = ("    def __getattr__(self, name):\n"
                               "        if name == 'extra':\n"
                               "            return 0.75\n"
                               "        raise AttributeError(name)\n\n") if kind == "getattr" else ""
                setup.append(_PLAIN_CLASS.format(C=cls, head=head, init=init, getattr=getattr_src))
                defines += [cls, cls + "b", f"KG{cls}"]
            feat.cls = cls
        if vtype == "module":
            cls = f"M{self.n_classes}"
            self.n_classes += 1
            setup.append(_MODULE_CLASS.format(C=cls))
            defines.append(cls)
            feat.cls = cls
        value = value or self.value_src(feat)
        param = arg = cell = None
        kwonly = False
        if bind == "arg":
            param, arg = name, value
        elif bind == "default":
            param = f"{name}={value}"
        elif bind == "kwdefault":
            param, kwonly = f"{name}={value}", True
        elif bind == "cell":
            cell = value
        else:
            setup.append(f"{name} = {value}\n")
        feat.spec = F(name=name, setup="\n\n".join(setup) if setup else None, param=param, arg=arg,
                      cell=cell, kwonly=kwonly, defines=defines)
        self.feats.append(feat)
        return feat

    # statements ---------------------------------------------------------------------------
    def stmt(self, feat):
        """One statement reading (or writing) feat; now and then inside a loop, a branch on a
        tensor's value (a graph break), a try block or a no_grad block."""
        s = self._stmt(feat)
        s = s[0] if isinstance(s, tuple) else s
        r = self.rng.random()
        if r < 0.25:
            wrappers = [
                ("for _j in range(2):", ""),
                ("if acc.sum() > 0:", "else:\n    py = py - 1"),
                ("try:", "except Exception:\n    py = py + 1000"),
                ("with torch.no_grad():", ""),
                ("with torch.enable_grad():", ""),
                ("with torch.autocast('cpu', dtype=torch.bfloat16):", ""),
            ]
            wrappers.append(("with torch.inference_mode():", ""))
            head, tail = self.rng.choice(wrappers)
            s = head + "\n" + _indent(s, 4) + ("\n" + tail if tail else "")
        return s

    def _stmt(self, feat):
        rng, X, vt = self.rng, feat.name, feat.vtype
        if vt == "tensor":
            others = [f for f in self.feats if f.vtype == "tensor" and f is not feat]
            if others and rng.random() < 0.25:
                Y = rng.choice(others).name
                return self.choose([
                    f"if {X} is {Y}:\n    py = py + 1000",
                    f"{X}.add_(1)\nacc = acc + {Y}.sum()",
                    f"with torch.no_grad():\n    {X}.mul_(0.5)\nacc = acc + {Y}",
                    f"acc = acc + {X}.sum() * {Y}.sum()",
                    f"acc = acc + torch.cat([{X}.reshape(-1), {Y}.reshape(-1)]).sum()",
                ])
            return self.choose([
                f"acc = acc + {X}.sum()",
                f"acc = acc * {X}.float().mean()",
                f"acc = acc + {X}",
                f"if {X}.dtype == torch.float64:\n    acc = acc + 1\nelse:\n    acc = acc - 1",
                f"if {X}.requires_grad:\n    py = py + 1",
                f"if {X}.shape[0] > 2:\n    acc = acc * 2",
                f"py = py + {X}.dim()",
                f"py = py + {X}.shape[-1] * 10",
                f"py = py + {X}.numel()",
                f"if {X}.is_contiguous():\n    py = py + 5",
                f"if {X}.is_inference():\n    py = py + 100",
                f"{X}.add_(1)",
                f"with torch.no_grad():\n    {X}.mul_(0.5)",
                f"if {X}.sum() > 0:\n    acc = acc + 1\nelse:\n    acc = acc - 2",
                f"py = py + int({X}.sum().item() > 0)",
                f"acc = acc + {X}.reshape(-1)[0]",
                f"acc = acc + {X}.view(-1, 4).sum(0)",
                f"acc = acc * {X}.size(0)",
                f"ex = {X}",
                f"acc = acc + torch.tanh({X}.float()).sum(-1, keepdim=True)",
                f"if {X}.dtype.is_floating_point:\n    acc = acc + {X}.sum().to(acc.dtype)",
                f"if {X}.grad is not None:\n    acc = acc + {X}.grad.sum()",
                f"if {X}.shape == (2, 4):\n    py = py + 20",
                f"py = py + len({X})",
                "acc = acc + torch.ones(4)",
                "if torch.get_default_dtype() == torch.float64:\n    py = py + 30",
                "if torch.is_grad_enabled():\n    py = py + 40",
                f"py = py + getattr({X}, 'tag', 0)",
                f"if hasattr({X}, 'tag'):\n    acc = acc * 2",
            ] + ([f"{X} = {X} * 2"] if feat.bind == "global" else []))
        if vt in ("int", "float", "bool"):
            common = [
                f"acc = acc + {X}",
                f"py = py + {X}",
                f"acc = acc * ({X} + 1)",
            ]
            if vt == "int":
                common += [
                    f"if {X} > 2:\n    acc = acc * 3\nelse:\n    acc = acc + 1",
                    f"for _i in range({X} % 4):\n    acc = acc * 1.5",
                    f"if {X} == 0:\n    raise ValueError('zero')",
                    f"py = py * 2 + {X}",
                    f"ex = f'n={{{X}}}'",
                    f"acc = acc + acc[..., :({X} % 4) + 1].sum()",
                ]
            if vt == "float":
                common += [
                    f"acc = acc * {X}",
                    f"if {X} > 1.0:\n    acc = acc - {X}",
                    f"py = py + math.floor({X}) if math.isfinite({X}) else py",
                    f"acc = torch.clamp(acc, max={X})",
                    f"py = py + math.copysign(1.0, {X})",
                    f"if {X} != {X}:\n    py = py + 1000",
                ]
            if vt == "bool":
                common += [
                    f"if {X}:\n    acc = acc + 1\nelse:\n    acc = acc - 1",
                    f"acc = acc * (2 if {X} else 3)",
                    f"if not {X}:\n    py = py + 4",
                ]
            if feat.bind in ("global", "cell"):
                common.append(f"{X} = {X} + 1")
            if feat.bind == "global":
                common.append(f"globals()[{X!r}] = 5\nacc = acc + {X}")
            return self.choose(common)
        if vt == "str":
            return self.choose([
                f"if {X} == 'a':\n    acc = acc + 1",
                f"py = py + len({X})",
                f"if {X}.startswith('a'):\n    acc = acc * 2\nelse:\n    acc = acc * 3",
                f"acc = acc * (len({X}) + 1)",
                f"py = py + {{'a': 1, 'b': 2}}.get({X}, 7)",
                f"ex = {X} + '!'",
            ])
        if vt == "opt":
            return self.choose([
                f"if {X} is None:\n    acc = acc + 1\nelse:\n    acc = acc + {X}",
                f"if {X} is not None:\n    py = py + 1",
                f"acc = acc + ({X} if {X} is not None else 0)",
            ])
        if vt == "list":
            choices = [
                f"acc = acc + len({X})",
                f"for _v in {X}:\n    acc = acc + _v",
                f"acc = acc + {X}[0]",
                f"if len({X}) > 2:\n    acc = acc * 2",
                f"acc = acc + sum({X})",
                f"if {X}:\n    py = py + 1",
                f"py = py + len({X})",
                f"acc = acc + {X}[-1]",
                f"{X}.append(1.5)",
                f"if len({X}) > 4:\n    {X}.pop()",
                f"ex = {X}",
                f"for _v in {X}:\n    if isinstance(_v, torch.Tensor):\n        acc = acc + _v.sum()",
                f"acc = acc + sum(_v * 2 for _v in {X})",
                f"for _i, _v in enumerate({X}):\n    py = py + _i",
                f"ex = [_v for _v in {X}]",
                (f"ex = {X} + [1.0]", "list_concat_shared"),
            ]
            if feat.bind == "global":
                choices.append((f"{X} = {X} + [0.5]", "list_concat_shared"))
            return self.choose(choices)
        if vt == "dict":
            return self.choose([
                f"if 'a' in {X}:\n    acc = acc + {X}['a']",
                f"acc = acc + {X}.get('bb', 0.5)",
                f"acc = acc + {X}['a']",
                f"for _k in {X}:\n    py = py * 10 + len(_k)",
                f"for _k, _v in {X}.items():\n    acc = acc + _v",
                f"py = py + len({X})",
                f"if 'ccc' not in {X}:\n    py = py + 3",
                f"acc = acc + sum({X}.values())",
                f"py = py + len(list({X}.keys()))",
                f"{X}['w'] = py",
                f"{X}.pop('a', None)",
                f"{X}.setdefault('ccc', 1.0)",
                f"try:\n    acc = acc + {X}['a']\nexcept KeyError:\n    acc = acc - 1",
                f"for _k, _v in {X}.items():\n    if isinstance(_v, float):\n        py = py + _v",
            ])
        if vt == "fn":
            return self.choose([
                f"acc = {X}(acc)",
                f"py = py + {X}(1)",
                f"acc = acc + {X}(acc).sum()",
                f"if {X} is {feat.helpers[0]}:\n    py = py + 9",
            ])
        if vt == "obj":
            C = feat.cls
            if rng.random() < 0.25:
                self.tags.add("obj_write")
                return self.choose([
                    f"{X}.last = acc",
                    f"{X}.w = {X}.w + 1",
                    f"{X}.count = getattr({X}, 'count', 0) + 1",
                    f"{X}.t = {X}.t * 2",
                    f"if hasattr({X}, 'last'):\n    del {X}.last",
                    f"{C}.hits = getattr({C}, 'hits', 0) + 1",
                    f"setattr({X}, 'w', 1.25)\nacc = acc * {X}.w",
                    f"vars({X}).update(w=2.5)\nacc = acc * {X}.w",
                    f"{X}.__dict__['w'] = 4.0\nacc = acc + {X}.w",
                    f"object.__setattr__({X}, 'w', 0.5)\nacc = acc + {X}.w",
                    f"{C}.ca = {C}.ca + 1\nacc = acc * {X}.ca",
                ])
            return self.choose([
                f"acc = acc + {X}.t",
                f"acc = acc * {X}.w",
                f"acc = {X}.meth(acc)",
                f"acc = acc + {X}.prop",
                f"acc = acc * {X}.ca",
                f"acc = {X}.stat(acc)",
                f"acc = {X}.cm(acc)",
                f"if {X}.flag:\n    acc = acc + 1",
                f"if hasattr({X}, 'extra'):\n    acc = acc + {X}.extra",
                f"acc = acc + getattr({X}, 'extra', 0.25)",
                f"try:\n    acc = acc + {X}.extra\nexcept AttributeError:\n    acc = acc - 1",
                f"if isinstance({X}, {C}b):\n    py = py + 50",
                f"if type({X}) is {C}:\n    py = py + 7",
                f"_m = {X}.meth\nacc = _m(acc)",
                f"ex = {X}.t",
                f"acc = {X}.meth2(acc)",
                f"py = py + len({X})",
                f"if len({X}) > 1:\n    acc = acc + 1",
            ])
        if vt == "module":
            if rng.random() < 0.2:
                return self.choose([
                    f"{X}.scale = {X}.scale * 1.1",
                    f"{X}.cache = acc",
                    f"{X}.calls = {X}.calls + 1",
                    f"{X}.train(False)\nif {X}.training:\n    acc = acc + 1",
                    f"{X}.__dict__['scale'] = 3.0\nacc = acc * {X}.scale",
                ])
            return self.choose([
                f"acc = {X}(acc)",
                f"acc = {X}(acc)",
                f"acc = {X}.lin(acc)",
                f"acc = acc + {X}.buf",
                f"acc = acc * {X}.p",
                f"acc = acc * {X}.scale",
                f"if {X}.training:\n    acc = acc * 2\nelse:\n    acc = acc + 3",
                f"acc = {X}.bn(acc.reshape(-1, 4)).reshape(acc.shape)",
                f"for _c in {X}.children():\n    py = py + 1",
                f"py = py + len(list({X}.parameters()))",
                f"if hasattr({X}, 'extra'):\n    acc = acc + {X}.extra",
                f"for _n, _p in {X}.named_parameters():\n    acc = acc + _p.sum()",
                f"ex = {X}.p",
                f"for _l in {X}.layers:\n    acc = _l(acc)",
                f"py = py + len({X}.layers)",
                f"if 'a' in {X}.md:\n    acc = {X}.md['a'](acc)",
                f"acc = {X}.layers[-1](acc)",
                f"if {X}.bn.training:\n    py = py + 2",
                f"if hasattr({X}, 'q'):\n    acc = acc + {X}.q",
            ])
        raise AssertionError(vt)

    # mutations ----------------------------------------------------------------------------
    def mutation(self, feat):
        """(source, tag) of one mutation of feat's state."""
        rng, vt, R = self.rng, feat.vtype, feat.ref()
        r = rng.random()
        if r < 0.08:
            return feat.assign(self.other_type_src(feat)), f"type_change_{feat.bind}"
        if feat.bind == "global" and r < 0.12:
            return f"globals().pop({feat.name!r}, None)", "delete_global"
        if vt in ("int", "float", "str", "bool", "opt", "fn") or r < (0.16 if vt in ("obj", "module") else 0.35):
            if vt == "float" and self.allowed("float_eq_guard") and rng.random() < 0.3:
                return self.choose([(feat.assign("-0.0"), "float_eq_guard"),
                                    (feat.assign("float('nan')"), "float_eq_guard")])
            if vt == "fn" and rng.random() < 0.4:
                a, b, c, hk, d, dset = feat.helpers
                return self.choose([
                    (f"{a}.__code__ = {b}.__code__", "replace_code"),
                    (f"{a}.__defaults__ = (5,)", "helper_defaults"),
                    (f"{hk} = {self.float_val()}", "helper_global"),
                    (f"{dset}({self.float_val()})", "helper_closure_cell"),
                    (feat.assign("lambda v: v + 3"), f"rebind_{feat.bind}"),
                ])
            return feat.assign(self.value_src(feat)), f"rebind_{feat.bind}"
        if vt == "tensor":
            choices = [
                (f"{R}.requires_grad_(not {R}.requires_grad)", "tensor_requires_grad"),
                (f"{R}.data = {self.tensor_src(rg=False, nc=False)}", "tensor_data"),
                (f"with torch.no_grad():\n    {R}.unsqueeze_(0)", "tensor_unsqueeze_"),
                (f"with torch.no_grad():\n    {R}.add_(1)", "tensor_value"),
                (feat.assign(f"copy_t({R})"), "tensor_copy"),
                (feat.assign(f"{R}.detach()"), "tensor_detach"),
                (feat.assign(f"nn.Parameter(mk_t({self.ts()}, (2, 4)))"), "tensor_parameter"),
                (feat.assign(f"mk_t({self.ts()}, {rng.choice([(), (0, 4), (1, 4), (4, 4)])!r})"),
                 "tensor_edge_shape"),
                (feat.assign(f"mk_t({self.ts()}, (4,)).expand(2, 4)"), "tensor_expanded"),
                (feat.assign(f"{R}.to('meta')"), "tensor_meta_device"),
                (f"{R}.tag = {rng.choice(INTS)}", "tensor_python_attr"),
                (f"try:\n    del {R}.tag\nexcept AttributeError:\n    pass", "tensor_python_attr_del"),
                (feat.assign(f"as_inference({R})"), "inference_tensor"),
                # an inference tensor turned back into an ordinary one
                (feat.assign(f"copy_t({R}) if {R}.is_inference() else {R}"), "from_inference"),
            ]
            others = [f for f in self.feats if f.vtype == "tensor" and f is not feat]
            if feat.bind == "arg" and others:
                o = rng.choice(others)
                choices += [(feat.assign(o.ref()), "alias_tensor")] * 3
                choices += [(feat.assign(f"copy_t({o.ref()})"), "unalias_tensor")]
            return self.choose(choices)
        if vt == "list":
            v = self.elem_src()
            others = [f for f in self.feats if f.vtype == "list" and f is not feat]
            alias = [(feat.assign(rng.choice(others).ref()), "alias_list")] * 2 if others else []
            return self.choose(alias + [
                (f"{R}.append({v})", "list_append"),
                (f"if {R}:\n    {R}.pop()", "list_pop"),
                (f"if {R}:\n    {R}[0] = {v}", "list_setitem"),
                (f"{R}.clear()", "list_clear"),
                (f"{R}.insert(0, {v})", "list_insert"),
                (f"{R}.extend([{v}, {v}])", "list_extend"),
                (f"{R}.reverse()", "list_reverse"),
            ])
        if vt == "dict":
            k = rng.choice(DICT_KEYS)
            others = [f for f in self.feats if f.vtype == "dict" and f is not feat]
            alias = [(feat.assign(rng.choice(others).ref()), "alias_dict")] * 2 if others else []
            return self.choose(alias + [
                (f"{R}[{k!r}] = {self.elem_src()}", "dict_setitem"),
                (f"{R}[{k!r}] = {self.elem_src()}", "dict_setitem"),
                (f"{R}.pop({k!r}, None)", "dict_delitem"),
                (f"{R}.pop({k!r}, None)", "dict_delitem"),
                (f"{R}.clear()", "dict_clear"),
                (feat.assign(f"dict(reversed(list({R}.items())))"), "dict_reorder"),
                (f"{R}.update({{{k!r}: {self.elem_src()}}})", "dict_update"),
            ])
        if vt == "obj":
            C = feat.cls
            choices = [
                (f"{R}.w = {self.float_val()}", "obj_setattr"),
                (f"{R}.w = {self.small_tensor_src()}", "obj_setattr"),
                (f"{R}.t = {self.tensor_src()}", "obj_setattr"),
                (f"try:\n    del {R}.t\nexcept AttributeError:\n    pass", "obj_delattr"),
                (f"{R}.extra = {self.elem_src()}", "obj_setattr_new"),
                (f"try:\n    del {R}.extra\nexcept AttributeError:\n    pass", "obj_delattr"),
                (f"{R}.flag = not {R}.flag", "obj_setattr"),
                (f"{C}.ca = {self.float_val()}", "class_attr_set"),
                (f"{C}.extra = {self.elem_src()}", "class_attr_add"),
                (f"if 'extra' in {C}.__dict__:\n    del {C}.extra", "class_attr_del"),
                (f"{R}.meth = lambda v: v - 1", "instance_shadows_method"),
                (f"try:\n    del {R}.meth\nexcept AttributeError:\n    pass", "obj_delattr"),
                (f"{R}.ca = {self.float_val()}", "instance_shadows_class_attr"),
                (f"KG{C} = {self.float_val()}", "method_global"),
                (f"{R}.__class__ = {C}b", "obj_set_class"),
                (f"{C}b.ca = {self.float_val()}", "class_attr_set"),
                (f"{C}.meth = alt_meth", "class_method_replaced"),
                (f"{C}.prop = property(lambda self: self.t - 1)", "class_method_replaced"),
                (f"{C}.stat = staticmethod(lambda v: v * 4)", "class_method_replaced"),
            ]
            objs = [f for f in self.feats if f.vtype == "obj" and f is not feat]
            if feat.bind == "arg" and objs:
                o = rng.choice(objs)
                # aliasing objects is fine while the body writes no attribute of an object
                tag = "alias_obj_write" if "obj_write" in self.tags else "alias_obj"
                choices += [(feat.assign(o.ref()), tag)] * 2
            return self.choose(choices)
        if vt == "module":
            C = feat.cls
            return self.choose([
                (f"{R}.train()", "module_train"),
                (f"{R}.eval()", "module_eval"),
                (f"{R}.eval()", "module_eval"),
                (f"{R}.lin = mk_lin({self.ts()})", "module_replace_submodule"),
                (f"{R}.lin = nn.Identity()", "module_replace_submodule"),
                (f"{R}.p = nn.Parameter(mk_t({self.ts()}, (4,)))", "module_replace_parameter"),
                (f"{R}.p = nn.Parameter(mk_t({self.ts()}, (4,)), requires_grad=False)", "module_replace_parameter"),
                (f"with torch.no_grad():\n    {R}.p.mul_(2)", "module_parameter_value"),
                (f"{R}.p.requires_grad_(not {R}.p.requires_grad)", "module_parameter_requires_grad"),
                (f"{R}.buf = mk_t({self.ts()}, (4,))", "module_replace_buffer"),
                (f"{R}.scale = {self.float_val()}", "module_float_attr"),
                (f"{R}.scale = {self.float_val()}", "module_float_attr"),
                (f"{R}.register_forward_hook(hook_double)", "module_forward_hook"),
                (f"{R}.register_forward_pre_hook(prehook_neg)", "module_forward_pre_hook"),
                (f"{R}.extra = {self.float_val()}", "module_setattr_new"),
                (f"{R}.lin.weight.requires_grad_(False)", "module_parameter_requires_grad"),
                (f"{R}.bn = nn.BatchNorm1d(4)", "module_replace_submodule"),
                (f"{R}.double()", "module_dtype"),
                (f"{R}.layers.append(nn.Identity())", "module_list_append"),
                (f"{R}.layers[0] = mk_lin({self.ts()})", "module_list_setitem"),
                (f"if len({R}.layers):\n    del {R}.layers[-1]", "module_list_delitem"),
                (f"{R}.md['b'] = nn.ReLU()", "module_dict_setitem"),
                (f"if 'a' in {R}.md:\n    del {R}.md['a']", "module_dict_delitem"),
                (f"{R}.bn.eval()", "submodule_eval"),
                (f"{R}.register_parameter('q', nn.Parameter(mk_t({self.ts()}, (4,))))", "module_new_parameter"),
                (f"if 'p' in {R}._parameters:\n    del {R}.p", "module_del_parameter"),
                (f"{R}.forward = types.MethodType(alt_forward, {R})", "instance_forward_replaced"),
                (f"{C}.forward = alt_forward", "class_forward_replaced"),
            ])
        raise AssertionError(vt)

    # the case -----------------------------------------------------------------------------
    def case(self):
        rng = self.rng
        backend = "native" if rng.random() < 0.25 else "eager"
        self.add_feature("tensor", "arg", value=self.tensor_src(dtype=rng.choice(DTYPES)))
        for _ in range(rng.randint(1, 5)):
            vt = _pick(rng, VTYPES)
            bind = _pick(rng, BINDS[vt])
            if vt == "obj" and rng.random() < 0.3:
                prev = [f for f in self.feats if f.vtype == "obj"]
                if prev:
                    self.add_feature(vt, bind, cls=rng.choice(prev).cls)
                    continue
            if vt == "tensor" and bind == "arg" and rng.random() < 0.2:
                prev = [f for f in self.feats if f.vtype == "tensor" and f.bind == "arg"]
                self.add_feature(vt, bind, value=f"A[{rng.choice(prev).name!r}]")
                continue
            self.add_feature(vt, bind)
        body = []
        for _ in range(rng.randint(2, 7)):
            feat = rng.choice(self.feats[1:] or self.feats) if rng.random() < 0.85 else self.feats[0]
            body.append(self.stmt(feat))
        if any("inference_mode" in s for s in body) and any("is_inference()" in s for s in body):
            if self.allowed("is_inference_in_inference_mode"):
                self.tags.add("is_inference_in_inference_mode")
            else:
                body = [s.replace("with torch.inference_mode():", "with torch.no_grad():") for s in body]
        used = [f for f in self.feats if any(re.search(rf"\b{f.name}\b", s) for s in body)]
        muts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.05:
                muts.append(("pass", "none"))
            elif r < 0.09:
                muts.append(("GRAD = not GRAD", "grad_mode"))
            elif r < 0.11:
                muts.append(("DTYPE = 'float64' if DTYPE == 'float32' else 'float32'", "default_dtype"))
            elif r < 0.14:
                muts.append(("KW = not KW", "call_form"))
            else:
                muts.append(self.mutation(rng.choice(used * 3 + self.feats)))
        options = {}
        if rng.random() < 0.15:
            options["dynamic"] = False
        if rng.random() < 0.15:
            options["warm_branches"] = True
        if rng.random() < 0.2:
            options["kw"] = True
        return Case(self.seed, backend, [f.spec for f in self.feats], body, muts, self.tags, options)


def generate(seed, known=False):
    return Gen(seed, known=known).case()


# ---------------------------------------------------------------------------------------------
# Running a case

_COUNTER = [0]
_HARNESS = "harness"


def build(case, tag):
    """A fresh module (registered in sys.modules under a unique name) holding the case's state."""
    _COUNTER[0] += 1
    name = f"guard_case_{case.seed}_{tag}_{_COUNTER[0]}"
    mod = types.ModuleType(name)
    mod.__file__ = f"<{name}>"
    sys.modules[name] = mod
    exec(compile(PRELUDE + render(case), f"<{name}>", "exec"), mod.__dict__)
    return mod


def _exc_name(e):
    return type(e).__name__


def _apply(mod, src):
    try:
        exec(compile(src, f"<mutation {mod.__name__}>", "exec"), mod.__dict__)
        return None
    except Exception as e:  # noqa: BLE001 - compared between the two copies
        return _exc_name(e)


def _call(mod, fn):
    """Calls fn with the module's arguments; (result, exception type name, backward's)."""
    torch.manual_seed(0)
    args = [mod.A[n] for n in mod.PARAMS]
    exc = out = None
    dtype = torch.get_default_dtype()
    with torch.set_grad_enabled(bool(mod.GRAD)):
        try:
            torch.set_default_dtype(getattr(torch, mod.DTYPE))
            out = fn(**dict(zip(mod.PARAMS, args))) if mod.KW else fn(*args)
        except Exception as e:  # noqa: BLE001 - compared between the two copies
            exc = _exc_name(e)
        finally:
            torch.set_default_dtype(dtype)
    bexc = None
    if exc is None and isinstance(out, tuple) and isinstance(out[0], torch.Tensor) and out[0].requires_grad:
        try:
            out[0].sum().backward()
        except Exception as e:  # noqa: BLE001
            bexc = _exc_name(e)
    return out, exc, bexc


class Keyed(tuple):
    """A snapshot of named items: ((key, value), ...), compared key by key."""


def _val(x, path, memo, modname, depth=0):
    """A snapshot of x: nested tuples, tensors cloned; an object met again is ("alias", path)."""
    if x is None or isinstance(x, (bool, int, str, bytes)):
        return ("v", type(x).__name__, x)
    if isinstance(x, float):
        return ("v", "float", repr(x))
    if depth > 8:
        return ("deep",)
    i = id(x)
    if i in memo:
        return ("alias", memo[i])
    memo[i] = path
    d = depth + 1
    if isinstance(x, torch.Tensor):
        grad = None
        if x.is_leaf and x.grad is not None:
            grad = _val(x.grad, path + ".grad", memo, modname, d)
        return ("T", type(x).__name__, f"{x.dtype} on {x.device}", tuple(x.shape), x.requires_grad,
                x.is_inference(), x.detach().clone(), grad)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_val(e, f"{path}[{k}]", memo, modname, d) for k, e in enumerate(x))
    if isinstance(x, dict):
        return ("dict", Keyed((repr(k), _val(v, f"{path}[{k!r}]", memo, modname, d)) for k, v in x.items()))
    if isinstance(x, nn.Module):
        items = []
        for k in sorted(x.__dict__):
            v = x.__dict__[k]
            if k in ("_parameters", "_buffers", "_modules"):
                items.append((k, _val(v, f"{path}.{k}", memo, modname, d)))
            elif k.endswith("_hooks"):
                items.append((k, ("v", "int", len(v))))
            elif not k.startswith("_"):
                items.append((k, _val(v, f"{path}.{k}", memo, modname, d)))
        return ("module", type(x).__qualname__, Keyed(items))
    if isinstance(x, types.MethodType):
        return ("method", x.__func__.__qualname__, _val(x.__self__, path + ".__self__", memo, modname, d))
    if isinstance(x, types.FunctionType):
        return ("function", x.__qualname__, x.__code__.co_name, x.__code__.co_firstlineno,
                _val(x.__defaults__, path + ".__defaults__", memo, modname, d))
    if isinstance(x, type):
        if x.__module__ == modname:
            items = Keyed((k, _val(v, f"{path}.{k}", memo, modname, d)) for k, v in sorted(x.__dict__.items())
                          if not (k.startswith("__") and k.endswith("__")))
            return ("class", x.__qualname__, items)
        return ("class", x.__module__, x.__qualname__)
    if isinstance(x, property):
        return ("property", getattr(x.fget, "__qualname__", None))
    if isinstance(x, (staticmethod, classmethod)):
        return (type(x).__name__, getattr(x.__func__, "__qualname__", None))
    if isinstance(x, types.ModuleType):
        return ("pymodule", x.__name__ if not x.__name__.startswith("guard_case_") else "<case>")
    if type(x).__module__ == modname:
        if hasattr(x, "__dict__"):
            items = sorted(vars(x).items())
        else:  # __slots__
            items = [(k, getattr(x, k)) for k in type(x).__slots__ if hasattr(x, k)]
        return ("object", type(x).__qualname__, Keyed((k, _val(v, f"{path}.{k}", memo, modname, d)) for k, v in items))
    if callable(x):
        return ("callable", getattr(x, "__qualname__", type(x).__qualname__))
    return ("?", type(x).__qualname__)


_SKIP_GLOBALS = {"f", "CELLS", "_make", "A", "PARAMS", "GRAD", "DTYPE", "KW"}


def snapshot_state(mod, memo):
    """Module globals, arguments, closure cells and defaults of the case, as (name, snapshot)."""
    name = mod.__name__
    g = mod.__dict__
    skip = prelude_names() | _SKIP_GLOBALS
    state = [("globals", Keyed((k, _val(g[k], k, memo, name)) for k in sorted(g)
                               if not k.startswith("__") and k not in skip))]
    state.append(("A", _val(mod.A, "A", memo, name)))
    state.append(("cells", Keyed((k, _val(get(), f"cell {k}", memo, name)) for k, (get, _) in mod.CELLS.items())))
    state.append(("defaults", _val(mod.f.__defaults__, "f.__defaults__", memo, name)))
    state.append(("kwdefaults", _val(mod.f.__kwdefaults__, "f.__kwdefaults__", memo, name)))
    return state


def snapshot(mod, result):
    """Everything the function can reach, and what it returned, as nested tuples; identity is
    kept as ("alias", first path) so aliasing between state and results is compared too."""
    memo = {}
    state = snapshot_state(mod, memo)
    out, exc, bexc = result
    state.append(("raised", ("v", "exc", exc)))
    state.append(("backward raised", ("v", "exc", bexc)))
    state.append(("returned", _val(out, "result", memo, mod.__name__)))
    return Keyed(state)


def _tensor_diff(a, b):
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    if a.device != b.device:
        return f"device {a.device} != {b.device}"
    if a.device.type == "meta":
        return None
    if a.dtype == torch.bool or not (a.dtype.is_floating_point or a.dtype.is_complex):
        return None if torch.equal(a, b) else "values differ"
    if a.dtype in (torch.bfloat16, torch.float16):
        rtol, atol = 2e-2, 2e-2
    else:
        rtol, atol = 1e-4, 1e-5
    a64, b64 = a.double(), b.double()
    if not torch.allclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True):
        return "values differ: max abs diff " + str(float((a64 - b64).abs().nan_to_num(0.0).max()))
    return None


def diff(a, b, path=""):
    """The first difference between two snapshots (eager a, compiled b), as text, or None."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: tensor vs {type(b).__name__}"
        d = _tensor_diff(a, b)
        return f"{path}: {d}\n  eager:    {a}\n  compiled: {b}" if d else None
    if isinstance(a, Keyed) and isinstance(b, Keyed):
        ka, kb = [k for k, _ in a], [k for k, _ in b]
        if ka != kb:
            only_a = [k for k in ka if k not in kb]
            only_b = [k for k in kb if k not in ka]
            if only_a or only_b:
                return f"{path}: keys only in eager {only_a}, only in compiled {only_b}"
            return f"{path}: key order {ka} (eager) != {kb} (compiled)"
        for (k, x), (_, y) in zip(a, b):
            r = diff(x, y, f"{path}/{k}")
            if r:
                return r
        return None
    if isinstance(a, tuple) and isinstance(b, tuple):
        if a and b and a[0] == "T" and b[0] == "T":
            for k, label in ((1, "type"), (2, "dtype"), (3, "shape"), (4, "requires_grad"), (5, "is_inference")):
                if a[k] != b[k]:
                    return f"{path}: tensor {label} {a[k]} (eager) != {b[k]} (compiled)"
            return diff(a[6], b[6], path) or diff(a[7], b[7], path + ".grad")
        if len(a) != len(b) or (a and b and a[0] != b[0]):
            return f"{path}: {_short(a)} (eager) != {_short(b)} (compiled)"
        for k, (x, y) in enumerate(zip(a, b)):
            r = diff(x, y, f"{path}[{k - 1}]" if a[0] in ("list", "tuple") and k else path)
            if r:
                return r if isinstance(x, (tuple, torch.Tensor)) else \
                    f"{path}: {_short(a)} (eager) != {_short(b)} (compiled)"
        return None
    if a != b:
        return f"{path}: {a!r} (eager) != {b!r} (compiled)"
    return None


def _short(x, n=400):
    s = _plain(x)
    return s if len(s) <= n else s[:n] + "..."


def _plain(x):
    """A snapshot as short readable text."""
    if isinstance(x, torch.Tensor):
        return repr(x.tolist()) if x.numel() <= 8 else f"tensor{tuple(x.shape)}"
    if isinstance(x, Keyed):
        return "{" + ", ".join(f"{k}: {_plain(v)}" for k, v in x) + "}"
    if isinstance(x, tuple) and x:
        if x[0] == "v":
            return repr(x[2]) if x[1] != "float" else x[2]
        if x[0] == "T":
            return f"tensor({_plain(x[6])}, {x[2]}{', requires_grad' if x[4] else ''})"
        if x[0] in ("list", "tuple"):
            return x[0] + "[" + ", ".join(_plain(e) for e in x[1:]) + "]"
        return x[0] + "(" + ", ".join(_plain(e) for e in x[1:]) + ")"
    return repr(x)


class Mismatch:
    def __init__(self, kind, text, step):
        self.kind, self.text, self.step = kind, text, step

    def __repr__(self):
        return f"Mismatch({self.kind!r}, step {self.step}: {self.text})"


def _kind(d):
    first = d.split(":", 1)[0]
    if first.startswith("/raised") or first.startswith("/backward raised"):
        return "exception"
    if first.startswith("/returned"):
        return "return"
    return "state"


def new_stats():
    return {"counts": {}, "warnings": {}}


def _bump(stats, section, key, n=1):
    if stats is not None:
        stats[section][key] = stats[section].get(key, 0) + n


def merge_stats(into, other):
    for section in ("counts", "warnings"):
        for k, v in other.get(section, {}).items():
            into[section][k] = into[section].get(k, 0) + v


def _region_stats(fn, stats):
    if stats is None:
        return
    try:
        from framejit.testing import regions
        rs = regions(fn)
    except Exception:  # noqa: BLE001 - statistics only
        return
    for r in rs:
        _bump(stats, "counts", f"regions {r['kind']}")
        if r["kind"] == "compiled":
            _bump(stats, "counts", "region calls reusing a cached region", max(0, r["hits"] - 1))


def run_case(case, compile_fn=None, stats=None, excluded=None):
    """Runs a case eagerly and compiled; returns a Mismatch or None. ``compile_fn(fn, backend)``
    replaces framejit.compile (the self-test uses a deliberately stale one). ``excluded``: the
    open-bug tags tolerated (default EXCLUDED; pass set() to tolerate none). ``stats``: a
    ``new_stats()`` dict that counts calls, regions and framejit warnings."""
    excluded = EXCLUDED if excluded is None else excluded
    opts = {k: v for k, v in case.options.items() if k in ("dynamic", "warm_branches")}
    compile_fn = compile_fn or (lambda fn, backend: framejit.compile(fn, backend=backend, **opts))
    framejit.reset()
    mods = []
    try:
        try:
            e = build(case, "e")
            mods.append(e)
            c = build(case, "c")
            mods.append(c)
        except Exception as ex:  # noqa: BLE001
            return Mismatch(_HARNESS, f"building the state raised {ex!r}", 0)
        cf = compile_fn(c.f, case.backend)
        steps = [None] + list(case.mutations)
        for i, step in enumerate(steps):
            if step is not None:
                re_, rc = _apply(e, step[0]), _apply(c, step[0])
                if re_ != rc:
                    return Mismatch("mutation", f"mutation {i} raised {re_} (eager) vs {rc} (compiled)", i)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                re_ = _call(e, e.f)
                rc = _call(c, cf)
            _bump(stats, "counts", "calls")
            _bump(stats, "counts", "calls raising (eager)" if re_[1] else "calls returning (eager)")
            internal = None
            told_not_rerun = False
            for w in caught:
                if issubclass(w.category, framejit.FramejitWarning):
                    told_not_rerun = told_not_rerun or "after writing into one of its input tensors" in str(w.message)
                    msg = re.sub(r"guard_case_\w+", "guard_case", str(w.message).split("\n")[0])
                    msg = re.sub(r":\d+\)", ")", msg)
                    msg = re.sub(r"at pc \d+", "at pc N", msg)
                    _bump(stats, "warnings", msg[:200])
                    # framejit's failure policy makes an internal error a fallback to plain
                    # Python, never a wrong result; it is a bug all the same
                    if "internal error" in msg:
                        if "guards_fail_own_state" in excluded and "guards fail on the state" in msg:
                            _bump(stats, "counts", "calls tolerated (open bug guards_fail_own_state)")
                        else:
                            internal = internal or msg
            se, sc = snapshot(e, re_), snapshot(c, rc)
            d = diff(se, sc)
            if d and told_not_rerun and re_[1] is not None and re_[1] == rc[1] and _kind(d) == "state":
                # The documented limit: a graph that wrote into an input (BatchNorm's counter in
                # training) and then raised is not run again as Python, so the region's earlier
                # writes are not done; framejit warned, and raised the same exception.
                _bump(stats, "counts", "calls where a graph raised after writing into an input (warned)")
                return None  # the copies diverged: the rest of the case would only repeat it
            if d is None and internal:
                return Mismatch("internal-error", f"call {i + 1}: FramejitWarning {internal!r}", i)
            if d:
                return Mismatch(_kind(d), f"call {i + 1} (after mutation {i}): {d}" if i else f"call 1: {d}", i)
        _region_stats(c.f, stats)
        return None
    finally:
        for m in mods:
            sys.modules.pop(m.__name__, None)


# ---------------------------------------------------------------------------------------------
# Shrinking


def _names_used(texts):
    used = set()
    for t in texts:
        used.update(re.findall(r"[A-Za-z_]\w*", t))
    return used


def drop_unused(case):
    """Drops features nothing refers to (x0 and features that name nothing always stay)."""
    feats = list(case.features)
    outside = list(case.body) + [m[0] for m in case.mutations]
    while True:
        keep = []
        for f in feats:
            names = ([f["name"]] if f["name"] else []) + list(f["defines"])
            if not names or f["name"] == "x0":
                keep.append(f)
                continue
            texts = list(outside)
            for g in feats:
                if g is not f:
                    texts += [g[k] for k in ("setup", "arg", "cell", "param") if g.get(k)]
            if set(names) & _names_used(texts):
                keep.append(f)
        if len(keep) == len(feats):
            return case.replace(features=keep)
        feats = keep


def shrink(case, still_fails, budget=400):
    """Greedy shrinking: drop mutations, body statements and features while ``still_fails``."""
    tries = [0]

    def ok(c):
        if tries[0] >= budget:
            return False
        tries[0] += 1
        return still_fails(c)

    changed = True
    while changed and tries[0] < budget:
        changed = False
        for i in range(len(case.mutations) - 1, -1, -1):
            if i >= len(case.mutations):
                continue
            cand = case.replace(mutations=case.mutations[:i] + case.mutations[i + 1:])
            if ok(cand):
                case, changed = cand, True
        for i in range(len(case.body) - 1, -1, -1):
            if i >= len(case.body):
                continue
            cand = case.replace(body=case.body[:i] + case.body[i + 1:])
            if ok(cand):
                case, changed = cand, True
        # a branch statement reduced to one of its sides
        for i, s in enumerate(case.body):
            for simpler in _simplify_stmt(s):
                cand = case.replace(body=case.body[:i] + [simpler] + case.body[i + 1:])
                if ok(cand):
                    case, changed = cand, True
                    break
        cand = drop_unused(case)
        if len(cand.features) < len(case.features) and ok(cand):
            case, changed = cand, True
        for i in range(len(case.features) - 1, 0, -1):
            if i >= len(case.features):
                continue
            cand = case.replace(features=case.features[:i] + case.features[i + 1:])
            if ok(cand):
                case, changed = cand, True
    return case


def _simplify_stmt(s):
    lines = s.split("\n")
    if len(lines) < 2 or not lines[0].rstrip().endswith(":"):
        return []
    out = []
    body, rest = [], []
    for ln in lines[1:]:
        (body if not rest and ln.startswith("    ") else rest).append(ln)
    if body:
        out.append("\n".join(ln[4:] for ln in body))
    if rest and rest[0].startswith("else:"):
        out.append("\n".join(ln[4:] for ln in rest[1:]))
    return out


def shrink_mismatch(case, mismatch, budget=400, excluded=None, compile_fn=None, on_try=None):
    """The smallest case found that still mismatches the same way (kind), and its Mismatch."""
    kind = mismatch.kind

    def still(c):
        if on_try:
            on_try()
        m = run_case(c, excluded=excluded, compile_fn=compile_fn)
        return m is not None and m.kind == kind

    small = shrink(case, still, budget)
    return small, run_case(small, excluded=excluded, compile_fn=compile_fn) or mismatch


# ---------------------------------------------------------------------------------------------
# Worker processes. A worker prints protocol lines (TAG, an event, JSON) on stdout: START before
# each case, FAIL for a mismatch, MIN for its shrunk form, TRY while shrinking, DONE at the end.


TAG = "@@guard "
_CRASH_AT = "FRAMEJIT_GUARD_CRASH_AT"  # self-test only: the worker segfaults on this seed


def _emit(kind, payload):
    sys.stdout.write(TAG + kind + " " + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _quiet():
    torch.set_num_threads(1)
    framejit.set_logs(handler=False)
    logging.getLogger("torch").setLevel(logging.CRITICAL)


def _maybe_crash(seed):
    if os.environ.get(_CRASH_AT) == str(seed):
        os.kill(os.getpid(), signal.SIGSEGV)


def worker(start, count, known=False, shrink_budget=400, max_shrinks=None):
    if max_shrinks is None:
        max_shrinks = int(os.environ.get("FRAMEJIT_GUARD_SHRINKS", "5"))
    _quiet()
    excluded = set() if known else EXCLUDED
    stats = new_stats()
    stats.update({"cases": 0, "native": 0, "seconds": 0.0})
    t0 = time.time()
    shrunk = 0
    for seed in range(start, start + count):
        _emit("START", {"seed": seed})
        case = generate(seed, known=known)
        m = run_case(case, stats=stats, excluded=excluded)
        _maybe_crash(seed)
        stats["cases"] += 1
        stats["native"] += case.backend == "native"
        if m is None:
            continue
        _emit("FAIL", {"seed": seed, "kind": m.kind, "text": m.text, "case": case.to_json(),
                       "report": describe(case, m.text) + "\n(not shrunk)"})
        if shrunk < max_shrinks:
            shrunk += 1
            small, sm = shrink_mismatch(case, m, shrink_budget, excluded,
                                        on_try=lambda: _emit("TRY", {"seed": seed}))
            _emit("MIN", {"seed": seed, "kind": m.kind, "text": sm.text, "case": small.to_json(),
                          "report": describe(small, sm.text)})
    stats["seconds"] = time.time() - t0
    _emit("DONE", stats)


def _fork_crashes(case, timeout=60):
    """Runs the case in a forked child; True if the child died from a signal or hung."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            run_case(case)
            _maybe_crash(case.seed)
        except BaseException:  # noqa: BLE001
            code = 3
        os._exit(code)
    t0 = time.time()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WIFSIGNALED(status) or os.WEXITSTATUS(status) not in (0, 3)
        if time.time() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return True
        time.sleep(0.002)


_WARMUP = Case(-1, "eager", [
    F(name="x0", param="x0", arg="mk_t(1, (2, 4), rg=True)"),
    F(name="m0", setup=_MODULE_CLASS.format(C="M0"), param="m0", arg="M0(2)", defines=["M0"]),
    F(name="o0", setup="class K0:\n    w = 2.0\n", param="o0", arg="K0()", defines=["K0"]),
], ["acc = m0(acc)", "acc = m0.bn(acc) + o0.w", "if acc.sum() > 0:\n    py = py + 1"], [("pass", "none")])


def crash_shrink(seed, known=False, hang=False):
    """Shrinks a case that crashes (or hangs) the process, each try in a forked child."""
    _quiet()
    case = generate(seed, known=known)
    timeout, budget = (10, 40) if hang else (60, 150)
    # the first case in a process pays ~1 s of one-time work (imports, first meta kernels):
    # pay it here once instead of in every forked child
    run_case(_WARMUP)

    def crashes(c):
        _emit("TRY", {"seed": seed})
        return _fork_crashes(c, timeout)

    if not crashes(case):
        _emit("NOCRASH", {"seed": seed, "report": describe(case)})
        return
    small = shrink(case, crashes, budget)
    what = "hung" if hang else "crashed (killed by a signal)"
    _emit("MIN", {"seed": seed, "kind": "hang" if hang else "crash", "text": what, "case": small.to_json(),
                  "report": describe(small, f"the process {what}")})


# ---------------------------------------------------------------------------------------------
# The parent side: batches of seeds in worker processes


HERE = os.path.abspath(__file__)


def _worker_env():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.pop("FRAMEJIT_LOGS", None)
    env.pop("TORCH_LOGS", None)
    return env


def _run_worker(cmd, idle_timeout):
    """Runs a worker; (events, returncode, hung, stderr tail). hung: no event for idle_timeout s."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_worker_env(), cwd=os.path.dirname(HERE))
    lines = queue.Queue()
    err_tail = collections.deque(maxlen=60)

    def read_out():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def read_err():
        for line in proc.stderr:
            err_tail.append(line)

    threads = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for t in threads:
        t.start()
    events, hung = [], False
    while True:
        try:
            line = lines.get(timeout=idle_timeout)
        except queue.Empty:
            hung = True
            proc.kill()
            break
        if line is None:
            break
        if line.startswith(TAG):
            kind, _, payload = line[len(TAG):].rstrip("\n").partition(" ")
            try:
                events.append((kind, json.loads(payload)))
            except ValueError:
                pass
    proc.wait()
    for t in threads:
        t.join(timeout=5)
    return events, proc.returncode, hung, "".join(err_tail)


class Results:
    def __init__(self):
        self.failures = []   # dicts: seed, kind, text, case, report (shrunk when MIN came)
        self.crashes = []    # dicts: seed, kind, report
        self.stats = new_stats()
        self.stats.update({"cases": 0, "native": 0, "seconds": 0.0, "workers": 0})

    def ok(self):
        return not self.failures and not self.crashes

    def summary(self, warnings_shown=15):
        s = self.stats
        lines = [f"{s['cases']} cases ({s['native']} with backend native) in {s['seconds']:.1f}s of "
                 f"worker time, {s['workers']} worker process(es)"]
        for k, v in sorted(s["counts"].items()):
            lines.append(f"  {k}: {v}")
        ws = sorted(s["warnings"].items(), key=lambda kv: -kv[1])
        if ws:
            lines.append(f"  framejit warnings ({sum(v for _, v in ws)}, by message):")
            for k, v in ws[:warnings_shown]:
                lines.append(f"    x{v}: {k}")
        return "\n".join(lines)

    def by_tag(self):
        """How many failing cases had each open-bug (or formerly open) construct."""
        counts = collections.Counter()
        for f in self.failures + self.crashes:
            tags = set(f.get("case", {}).get("tags", ())) & (set(KNOWN_BUGS) | set(NEW_BUGS))
            counts.update(tags or {"(none)"})
        return dict(counts)

    def report(self, limit=6):
        lines = [f"{len(self.failures)} mismatching case(s), {len(self.crashes)} crash(es) "
                 f"in {self.stats['cases']} cases"]
        if self.failures or self.crashes:
            lines.append("seeds: " + " ".join(
                f"{f['seed']}[{f['kind']}]" for f in self.crashes + self.failures))
        seen, shown = set(), 0
        for f in self.crashes + sorted(self.failures, key=lambda f: "(not shrunk)" in f["report"]):
            key = re.sub(r"seed -?\d+|mk_t\(\d+|\(\d{4,}\)|guard_case_\w+", "", f["report"])
            if key in seen:
                continue
            seen.add(key)
            if shown >= limit:
                lines.append(f"... and more: seeds {sorted(x['seed'] for x in self.crashes + self.failures)}")
                break
            shown += 1
            lines.append("-" * 100)
            mode = "one" if f in self.failures else "crash-shrink"
            lines.append(f"[{f['kind']}] seed {f['seed']}; rerun and shrink with "
                         f"`python3 tests/python/guard_cases.py {mode} --seed {f['seed']}"
                         f"{' --known' if f.get('known') else ''}{' --hang' if f['kind'] == 'hang' else ''}`")
            lines.append(f["report"])
        return "\n".join(lines)


def _extension_stamp():
    try:
        st = os.stat(framejit._C.__file__)
        return (st.st_mtime_ns, st.st_size)
    except (OSError, AttributeError):
        return None


def run_batches(start, count, batch=1000, known=False, idle_timeout=120, log=None):
    """Runs cases start..start+count-1 in worker processes, `batch` seeds each. A worker that
    dies (segfault, abort) or hangs (no event for idle_timeout s) is replaced: the case it was
    running is reported as a crash or hang, shrunk in forked children, and the batch goes on
    from the next seed."""
    res = Results()
    seed, end = start, start + count
    ext = _extension_stamp()
    while seed < end:
        n = min(batch, end - seed)
        cmd = [sys.executable, HERE, "worker", "--start", str(seed), "--count", str(n)] + (["--known"] if known else [])
        res.stats["workers"] += 1
        events, rc, hung, err = _run_worker(cmd, idle_timeout)
        last_start, done, fails = None, None, {}
        for kind, p in events:
            if kind == "START":
                last_start = p["seed"]
            elif kind in ("FAIL", "MIN"):
                p["known"] = known
                fails[p["seed"]] = p
            elif kind == "DONE":
                done = p
        res.failures.extend(fails.values())
        if done is not None and rc == 0:
            for k in ("cases", "native", "seconds"):
                res.stats[k] += done[k]
            merge_stats(res.stats, done)
            seed += n
            continue
        if last_start is None:
            raise RuntimeError(f"guard worker failed to start (rc {rc}):\n{err[-4000:]}")
        res.stats["cases"] += last_start - seed + 1
        if last_start not in fails:  # it died running the case, not shrinking a mismatch
            crash = {"seed": last_start, "kind": "hang" if hung else f"crash (exit status {rc})", "known": known}
            cmd2 = [sys.executable, HERE, "crash-shrink", "--seed", str(last_start)] + \
                (["--known"] if known else []) + (["--hang"] if hung else [])
            ev, _, _, _ = _run_worker(cmd2, idle_timeout + 30)
            for kind, p in ev:
                if kind == "MIN":
                    crash["report"] = p["report"]
                elif kind == "NOCRASH":
                    crash["report"] = p["report"] + "\n(alone it did not crash: it needs the cases run before it)"
            crash.setdefault("report", describe(generate(last_start, known=known)) + "\n(not shrunk)")
            if _extension_stamp() != ext:
                crash["report"] += "\n(framejit's extension module was rebuilt while the test ran: a crash " \
                                   "then, SIGBUS above all, may come from the file changing under the process)"
            crash["report"] += "\nworker stderr (tail):\n" + err[-2000:]
            res.crashes.append(crash)
            if log:
                log(f"{crash['kind']} at seed {last_start}")
        seed = last_start + 1
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description="guard property cases (see the module docstring)")
    ap.add_argument("mode", choices=["worker", "one", "show", "crash-shrink", "run"])
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--known", action="store_true", help="also generate the open bugs' constructs")
    ap.add_argument("--hang", action="store_true", help="crash-shrink: the case hung")
    a = ap.parse_args(argv)
    if a.mode == "worker":
        worker(a.start, a.count, known=a.known)
    elif a.mode == "crash-shrink":
        crash_shrink(a.seed, known=a.known, hang=a.hang)
    elif a.mode == "show":
        print(describe(generate(a.seed, known=a.known)))
    elif a.mode == "one":
        _quiet()
        excluded = set() if a.known else EXCLUDED
        case = generate(a.seed, known=a.known)
        m = run_case(case, excluded=excluded)
        if m is None:
            print(describe(case))
            print("OK: compiled matches eager")
            return
        print(f"FAILS: {m}")
        small, sm = shrink_mismatch(case, m, excluded=excluded)
        print(describe(small, sm.text))
    elif a.mode == "run":
        t0 = time.time()
        res = run_batches(a.start, a.count, known=a.known, log=print)
        print(res.report(limit=50))
        print("failing cases by construct tag:", res.by_tag())
        print(res.summary(), f"wall {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
