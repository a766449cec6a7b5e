"""Keeps docs/status.md true: every row with an example is run here and its outcome compared
with the status the table claims."""
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import framejit
from framejit.testing import CompileCounter, regions

DOC = Path(__file__).resolve().parents[2] / "docs" / "status.md"


def helper(x, scale=1, *rest, **opts):
    return x * scale


class Obj:
    def method(self, x):
        return x + 1


def gen(x):
    yield x
    yield x * 2


class Hooked(nn.Module):
    def forward(self, x):
        return x * 2


HOOKED = Hooked()
HOOKED.register_forward_hook(lambda m, a, out: None)

# One function per example in the table; the body is the example in context.
EXAMPLES = {
    "F.gelu(torch.add(x, 1, alpha=2)).sum(dim=0)":
        lambda x: F.gelu(torch.add(x, 1, alpha=2)).sum(dim=0),
    "y = x * 2; y += 1; y[0] = 0": None,
    "torch.zeros(4) + torch.arange(4)": lambda x: torch.zeros(4) + torch.arange(4) + x,
    'inputs["x"] + pair[1]': None,
    "x.shape[0] * x.ndim": lambda x: x * (x.shape[0] * x.ndim),
    "torch.max(x, dim=0).values": lambda x: torch.max(x, dim=0).values,
    "helper(x, scale=2)": lambda x: helper(x, scale=2),
    "obj.method(x)": None,
    "[t * 2 for t in xs]": lambda x: torch.stack([t * 2 for t in x]),
    "self.layers[0](x)": None,
    "for i, t in enumerate(xs)": None,
    "if self.training:": None,
    "len(xs)": lambda x: x * len([x, x]),
    "if x.sum() > 0:": None,
    "s = x.sum().item()": lambda x: x * x.sum().item(),
    "if s * 2 > 1:": None,
    "print(x.shape)": None,
    "for t in gen(x)": None,
    "hooked(x)": lambda x: HOOKED(x) + 1,
    "with torch.no_grad():": None,
    "obj.attr = x": None,
    'inputs["k"] = x': None,
    "raise ValueError()": None,
}


def ex_inplace(x):
    y = x * 2
    y += 1
    y[0] = 0
    return y


def ex_inputs(x):
    inputs, pair = {"x": x}, (x, x + 1)
    return inputs["x"] + pair[1]


OBJ = Obj()


def ex_method(x):
    return OBJ.method(x)


class Layers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4)])

    def forward(self, x):
        return self.layers[0](x)


LAYERS = Layers()


def ex_layers(x):
    return LAYERS(x)


def ex_enumerate(x):
    out = x
    for i, t in enumerate([x, x]):
        out = out + t * i
    return out


def ex_training(x):
    if LAYERS.training:
        return x + 1
    return x - 1


def ex_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def ex_number_branch(x):
    s = x.sum().item()
    if s * 2 > 1:
        return x * 2
    return x


def ex_print(x):
    print(x.shape)
    return x + 1


def ex_generator(x):
    out = 0
    for t in gen(x):
        out = out + t
    return out


def ex_with(x):
    y = x + 1
    with torch.no_grad():
        y = y * 2
    return y


def ex_setattr(x):
    y = x + 1
    OBJ.attr = y
    return y


def ex_store_item(x):
    y = x + 1
    INPUTS["k"] = y
    return y


INPUTS = {}


def ex_raise(x):
    y = x + 1
    try:
        raise ValueError()
    except ValueError:
        return y


EXAMPLES.update({
    "y = x * 2; y += 1; y[0] = 0": ex_inplace,
    'inputs["x"] + pair[1]': ex_inputs,
    "obj.method(x)": ex_method,
    "self.layers[0](x)": ex_layers,
    "for i, t in enumerate(xs)": ex_enumerate,
    "if self.training:": ex_training,
    "if x.sum() > 0:": ex_branch,
    "if s * 2 > 1:": ex_number_branch,
    "print(x.shape)": ex_print,
    "for t in gen(x)": ex_generator,
    "with torch.no_grad():": ex_with,
    "obj.attr = x": ex_setattr,
    'inputs["k"] = x': ex_store_item,
    "raise ValueError()": ex_raise,
})


def table_rows():
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("construct", "---"):
            continue
        example = re.sub(r"^`|`$", "", cells[1])
        if example:
            rows.append((cells[0], example, cells[2]))
    return rows


def outcome(fn):
    kinds = [(r["kind"], r["exit"]) for r in regions(fn)]
    if any(kind == "fallback" or exit == "deopt" for kind, exit in kinds):
        return "deopt"
    if all(exit == "return" for _, exit in kinds):
        return "graph"
    return "break"


@pytest.mark.parametrize("construct,example,status", table_rows(), ids=lambda v: str(v)[:30])
def test_status_table_row(construct, example, status, capsys):  # capsys: quiet prints
    fn = EXAMPLES[example]
    x = torch.randn(4, 4) if example != "[t * 2 for t in xs]" else [torch.randn(4)] * 2
    compiled = framejit.compile(fn, backend=CompileCounter())
    compiled(x)
    assert outcome(fn) == status, [r["reason"] for r in regions(fn)]


def test_every_example_row_is_covered():
    assert {example for _, example, _ in table_rows()} == set(EXAMPLES)
