"""The examples of docs/coverage.md's "Python's data model" rows, registered into
test_coverage_doc.py's table check by register(example). Each takes one 4x4 tensor unless its
registration gives another input."""
import collections
import contextvars
import copy
import enum
import itertools
import logging
import os
import sys
import typing

import numpy as np
import torch
import torch.nn as nn


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


Pair = collections.namedtuple("Pair", "a b")
LOGGER = logging.getLogger("framejit_tests.coverage")  # WARNING, from the root logger
SCALE = contextvars.ContextVar("framejit_tests_coverage_scale", default=1.0)
LAYERS = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))


class Point:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x = x
        self.y = y


class Frozen:
    def __init__(self, d):
        object.__setattr__(self, "d", d)


def _counting():
    count = 0

    def step(x):
        nonlocal count
        count += 1
        return x * count

    return step


def register(example):
    @example("outs[1:3] = [x, x]")
    def ex_list_slice_store(x):
        outs = [None] * 4
        outs[0] = x
        outs[1:3] = [x, x]
        outs[3] = x + 1
        return outs

    @example("[x] * 3")
    def ex_sequence_repeat(x):
        return [x] * 3

    @example("xs.index(x)")
    def ex_index_by_identity(x):
        xs = [x, x * 2]  # (a different tensor before the one sought would be compared)
        return xs.index(x), [x, x].count(x)

    @example("d.update(zip(names, xs))")
    def ex_dict_update(x):
        d = {"a": x}
        d.update(zip(["b", "c"], [x + 1, x + 2]))
        return sorted(d), d

    @example("max(d, key=d.get)", lambda: (torch.randn(4, 4), {"a": 1.0, "b": 3.0}))
    def ex_bound_dict_method(x, d):
        return x * d[max(d, key=d.get)]

    @example("sorted(d.items())")
    def ex_sorted_items(x):
        d = {"b": x, "a": x + 1}
        return [v for _, v in sorted(d.items())]

    @example("mode.value", lambda: (torch.randn(4, 4), Mode.EVAL))
    def ex_enum_value(x, mode):
        return x * len(mode.value), mode.name, [m.value for m in Mode]

    @example("p._replace(b=x)", lambda: (torch.randn(4, 4), Pair(1, 2)))
    def ex_namedtuple_replace(x, p):
        q = p._replace(b=x)
        return q, q._asdict(), p.a * x

    @example("match spec:", lambda: (torch.randn(4, 4), Point(2.0, 0)))
    def ex_match(x, spec):
        match spec:
            case Point(px, 0):
                return x * px
            case [a, b]:
                return x + a + b
            case _:
                return x

    @example("itertools.pairwise(xs)")
    def ex_itertools(x):
        xs = [x, x * 2, x * 3]
        return [b - a for a, b in itertools.pairwise(xs)], list(itertools.islice(xs, 2))

    @example("copy.copy(xs)", lambda: (torch.randn(4, 4), [1, 2]))
    def ex_copy(x, xs):
        ys = copy.copy(xs)
        ys.append(3)
        return x * len(ys)

    @example('os.getenv("FRAMEJIT_N", "3")')
    def ex_getenv(x):
        return x * int(os.getenv("FRAMEJIT_N", "3"))

    @example('logger.debug("x %s", x.shape)')
    def ex_logging(x):
        if LOGGER.isEnabledFor(logging.DEBUG):
            x = x + 1
        LOGGER.debug("x %s", x.shape)
        return x * 2

    @example("token = var.set(2.0)")
    def ex_context_var(x):
        token = SCALE.set(2.0)
        try:
            y = x * SCALE.get()
        finally:
            SCALE.reset(token)
        return y * SCALE.get()

    @example("for kind in self.kinds:", lambda: (torch.randn(4, 4), {"full", "sliding"}))
    def ex_set_by_source(x, kinds):
        for kind in kinds:
            x = x * len(kind)
        return x

    @example("reversed(self.layers)")
    def ex_reversed_layers(x):
        for layer in reversed(LAYERS):
            x = layer(x)
        return x

    step = _counting()

    @example("nonlocal count; count += 1")
    def ex_nonlocal(x):
        return step(x)

    @example("sys.version_info >= (3, 10)")
    def ex_version_info(x):
        return x * 2 if sys.version_info >= (3, 10) and torch.__version__ >= "2.0" else x

    @example('x.type("torch.DoubleTensor")', lambda: (torch.randn(4, 4), {"a": 1}))
    def ex_legacy_type(x, v):
        y = x.type("torch.DoubleTensor") + torch.ones(4, device=torch.device("cpu"))
        return y if isinstance(v, typing.Mapping) else -y

    @example('object.__setattr__(self, "d", d)')
    def ex_object_setattr(x):
        return x * Frozen(x.shape[0]).d

    @example("np.sin(x.numpy()) * 2")
    def ex_numpy(x):
        a = np.sin(x.numpy()) * 2
        return torch.from_numpy(a.mean(axis=0))

    @example("x + x.numpy()")
    def ex_numpy_mixed(x):
        return x + x.numpy()
