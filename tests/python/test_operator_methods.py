"""Operators on instances of Python classes: `a + b`, `a += b`, `a < b`, `a != b`, `-a` run the
class's own methods in the trace, in Python's order (the left operand's method, then the right
one's reflected method; a right operand of a subclass first; NotImplemented passing the turn;
`==` falling back to identity; a TypeError when no method answers). Each against eager, with
graph counts, breaks and the guards on the methods looked up."""
import dataclasses

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions, same


class Vec:
    """A tensor wrapper with arithmetic, as small value types in model code are written."""

    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        if isinstance(other, Vec):
            return Vec(self.t + other.t)
        if isinstance(other, (int, float, torch.Tensor)):
            return Vec(self.t + other)
        return NotImplemented

    def __radd__(self, other):
        return Vec(other + self.t)

    def __mul__(self, other):
        return Vec(self.t * other)

    __rmul__ = __mul__

    def __neg__(self):
        return Vec(-self.t)

    def __matmul__(self, other):
        return self.t @ other.t

    def __lt__(self, other):
        return self.t.shape[-1] < other


class Scaled(Vec):
    """A subclass overriding the reflected method: Python tries it before Vec.__add__."""

    def __radd__(self, other):
        return Scaled(other.t * 10 + self.t)


class Accumulator:
    """`+=` in place through __iadd__, returning self."""

    def __init__(self):
        self.total = None

    def __iadd__(self, t):
        self.total = t if self.total is None else self.total + t
        return self


class Refuses:
    def __add__(self, other):
        return NotImplemented


class Takes:
    def __radd__(self, other):
        return "taken"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class ById:
    """__eq__ answering NotImplemented for strangers: == falls back to identity."""

    def __init__(self, key):
        self.key = key

    def __eq__(self, other):
        if not isinstance(other, ById):
            return NotImplemented
        return self.key == other.key


def compiled_with(fn):
    counter = CompileCounter()
    return framejit.compile(fn, backend=counter), counter


def one_graph(fn, *args, calls=2):
    compiled, counter = compiled_with(fn)
    for _ in range(calls):
        assert same(compiled(*args), fn(*args))
    assert counter.frame_count == 1, counter.frame_count
    assert [r["exit"] for r in regions(fn)] == ["return"]
    return compiled, counter


def arithmetic(x, y):
    v, w = Vec(x), Vec(y)
    u = -(2 * (v + w) + 1) * 3  # __add__, __rmul__ of an int, __add__ of an int, __neg__, __mul__
    u = x + u  # a tensor on the left: Tensor.__add__ answers NotImplemented, then Vec.__radd__
    return u.t, v @ w, v < 4, 3 > v  # 3 > v: int answers NotImplemented, then Vec.__lt__(v, 3)


def test_arithmetic_on_a_class_of_the_users_runs_its_methods_in_one_graph():
    one_graph(arithmetic, torch.randn(3), torch.randn(3))


def subclass_first(x):
    v, s = Vec(x), Scaled(x + 1)
    return (v + s).t, (s + v).t  # Scaled.__radd__ first; Scaled + Vec: Vec.__add__ (inherited)


def test_a_right_operand_of_a_subclass_with_its_own_reflected_method_goes_first():
    one_graph(subclass_first, torch.randn(3))


def passes_the_turn(x):
    return x + 1, Refuses() + Takes()  # NotImplemented from __add__, then Takes.__radd__


def test_not_implemented_passes_the_turn_to_the_reflected_method():
    one_graph(passes_the_turn, torch.randn(2))


def accumulates(x, parts):
    acc = Accumulator()
    for p in parts:
        acc += p * x
    v = Vec(x)
    v += 1  # no __iadd__: v = v.__add__(1)
    return acc.total, v.t


def test_in_place_operators_use_iadd_then_fall_back_to_add():
    one_graph(accumulates, torch.randn(3), [1, 2, 3])


def equalities(x, a, b):
    p, q = Point(1, 2), Point(1, 2)
    found = [a == b, a != b, a == 3, 3 != a, a == a, ById(1) != ById(2)]
    return x + sum(found) + (p == q) + (p != Point(2, 1))


def test_equality_runs_eq_negates_it_for_ne_and_falls_back_to_identity():
    x = torch.randn(2)
    compiled, counter = compiled_with(equalities)
    a, b = ById(1), ById(1)
    assert same(compiled(x, a, b), equalities(x, a, b))
    assert same(compiled(x, a, ById(2)), equalities(x, a, ById(2)))
    # a.key and b.key are guarded as the constants __eq__ compared: b's new key compiles again
    assert counter.frame_count == 2


def unsupported(x):
    try:
        Refuses() + Refuses()
    except TypeError:
        return x + 1
    return x


def test_no_method_answering_raises_pythons_type_error():
    one_graph(unsupported, torch.randn(2))


def test_replacing_a_method_on_the_class_recompiles():
    def uses_add(x):
        return (Vec(x) + 1).t

    compiled, counter = compiled_with(uses_add)
    x = torch.randn(2)
    assert same(compiled(x), uses_add(x)) and counter.frame_count == 1
    original = Vec.__add__
    try:
        Vec.__add__ = lambda self, other: Vec(self.t - other)
        assert same(compiled(x), uses_add(x))
        assert counter.frame_count == 2
    finally:
        Vec.__add__ = original
    assert same(compiled(x), uses_add(x)) and counter.frame_count == 2


def test_operands_read_by_source_guard_their_class_methods():
    def adds(x, v, w):
        return (v + w).t + x

    compiled, counter = compiled_with(adds)
    x = torch.randn(2)
    v, w = Vec(x), Vec(x * 2)
    assert same(compiled(x, v, w), adds(x, v, w)) and counter.frame_count == 1
    s = Scaled(x)  # another class on the right: its reflected method now goes first
    assert same(compiled(x, v, s), adds(x, v, s)) and counter.frame_count == 2
    assert same(compiled(x, Vec(x), Vec(x)), adds(x, Vec(x), Vec(x))) and counter.frame_count == 2


def test_ordering_without_a_method_raises_as_in_python():
    def orders(x):
        try:
            ById(1) < ById(2)
        except TypeError:
            return x + 1
        return x

    one_graph(orders, torch.randn(2))


class Wraps:
    """A class with __torch_function__ takes over tensor operators: left to Python."""

    def __init__(self, t):
        self.t = t

    def __radd__(self, other):
        return other + self.t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return NotImplemented


@pytest.mark.filterwarnings("ignore:Defining your `__torch_function__`")  # torch's, in eager
def test_a_class_with_torch_function_against_a_tensor_is_left_to_python():
    def adds(x):
        return x + Wraps(x)

    compiled, _ = compiled_with(adds)
    x = torch.randn(2)
    assert same(compiled(x), adds(x))
    assert [r["exit"] for r in regions(adds)] != ["return"]  # not traced through
