"""Feature tests for calls: one construct per case (user functions, methods, closures and cells,
lambdas, *args/**kwargs, recursion, static/class methods, properties, functools.partial,
super(), user classes and dataclasses), each compiled with framejit and checked against eager
with its exact graph count. test_inlining.py covers several of these mixed in one function;
here every case isolates one."""
import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit.testing import CompileCounter, regions, same
from feature_checks import check, rand


# ---------------------------------------------------------------------------------------------
# Helpers the cases call
# ---------------------------------------------------------------------------------------------

def add_one(t):
    return t + 1


def twice(t):
    return add_one(add_one(t))


def affine(t, w, b):
    return t * w + b


def kwonly(t, *, scale, shift=0.0):
    return t * scale + shift


def collect(*parts):
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def options(t, **opts):
    return t * opts["scale"] + opts.get("shift", 0.0)


def forward_all(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def apply_fn(fn, t):
    return fn(t)


def countdown(t, n):
    if n == 0:
        return t
    return countdown(t * 2, n - 1)


def fib_sum(t, n):
    if n < 2:
        return t * n
    return fib_sum(t, n - 1) + fib_sum(t, n - 2)


def pair(t):
    return t + 1, t - 1


def logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * 2
    return wrapper


@logged
def decorated(t):
    return t - 3


class Shape:
    sides = 4

    def __init__(self, size):
        self.size = size

    def scale(self, t):
        return t * self.size

    def scale_twice(self, t):
        return self.scale(self.scale(t))

    @staticmethod
    def clip(t):
        return t.clamp(-1, 1)

    @classmethod
    def per_side(cls, t):
        return t / cls.sides

    @property
    def area(self):
        return self.size * self.size

    def __call__(self, t):
        return t + self.size


class Square(Shape):
    def scale(self, t):
        return super().scale(t) + 1


class Cube(Shape):
    pass


class OldStyleSquare(Shape):
    def scale(self, t):
        return super(OldStyleSquare, self).scale(t) - 1


class Point:
    def __init__(self, t, k):
        self.t = t
        self.k = k


@dataclasses.dataclass
class Config:
    scale: float
    shift: float = 1.0


@dataclasses.dataclass
class Holder:
    value: torch.Tensor
    weight: float = 2.0


class Base:
    def __init__(self, t):
        self.t = t * 2


class Child(Base):
    def __init__(self, t, k):
        super().__init__(t)
        self.k = k

    def total(self):
        return self.t + self.k


SHAPE = Shape(3.0)
SQUARE = Square(2.0)
OLD_STYLE_SQUARE = OldStyleSquare(3.0)
CUBE = Cube(5.0)
CONFIG = Config(0.5)
OPS = {"add": torch.add, "one": add_one}
PARTIAL_AFFINE = functools.partial(affine, w=2.0, b=0.5)
GELU_TANH = functools.partial(F.gelu, approximate="tanh")


# ---------------------------------------------------------------------------------------------
# One construct per function
# ---------------------------------------------------------------------------------------------

def user_function(x):
    return add_one(x) * 2


def nested_user_calls(x):
    return twice(x)


def keyword_only_arguments(x):
    return kwonly(x, scale=3.0)


def keyword_arguments_in_any_order(x):
    return affine(b=1.0, t=x, w=2.0)


def star_args_at_call_site(x):
    parts = (x, x * 2, x * 3)
    return collect(*parts)


def star_star_kwargs_at_call_site(x):
    opts = {"scale": 2.0, "shift": 1.0}
    return options(x, **opts)


def varargs_callee(x):
    return collect(x, x + 1, x + 2, x + 3)


def kwargs_callee_uses_get(x):
    return options(x, scale=4.0)


def forwarding_wrapper(x):
    return forward_all(affine, x, 2.0, b=3.0)


def star_args_and_kwargs_mixed(x):
    args, kwargs = [x], {"b": 1.0}
    return affine(*args, 3.0, **kwargs)


def recursion_depth_limited(x):
    return countdown(x, 5)


def tree_recursion(x):
    return fib_sum(x, 5)


def tuple_returned_and_unpacked(x):
    a, b = pair(x)
    return a * b


def bound_method(x):
    return SHAPE.scale(x)


def method_calls_method(x):
    return SHAPE.scale_twice(x)


def bound_method_stored_in_local(x):
    fn = SHAPE.scale
    return fn(x) + fn(x)


def staticmethod_via_instance(x):
    return SHAPE.clip(x * 4)


def staticmethod_via_class(x):
    return Shape.clip(x * 4)


def classmethod_via_class(x):
    return Shape.per_side(x)


def classmethod_via_instance(x):
    return SHAPE.per_side(x * 2) + 1


def property_read(x):
    return x * SHAPE.area


def class_attribute_read(x):
    return x * Shape.sides + SHAPE.sides


def inherited_method(x):
    return CUBE.scale(x)


def callable_object(x):
    return SHAPE(x * 2) + 1


def closure_reads_cell(x):
    k = 3.0

    def inner(t):
        return t * k
    return inner(x)


def closure_over_tensor(x):
    bias = x.sum(0)

    def inner(t):
        return t + bias
    return inner(x)


def closure_nonlocal_write(x):
    count = 0

    def bump(t):
        nonlocal count
        count += 1
        return t * count
    y = bump(x)
    y = bump(y)
    return y, count


def closure_cell_changed_after_def(x):
    k = 1.0

    def inner(t):
        return t * k
    k = 5.0
    return inner(x)


def closure_factory(x):
    def make(k):
        def mul(t):
            return t * k
        return mul
    return make(2.0)(x) + make(3.0)(x)


def nested_def_with_defaults(x):
    def inner(t, scale=2.0, *, shift=1.0):
        return t * scale + shift
    return inner(x) + inner(x, 3.0, shift=0.0)


def default_bound_at_def_time(x):
    fns = []
    for i in range(3):
        def times(t, i=i):
            return t * i
        fns.append(times)
    return fns[0](x) + fns[1](x) + fns[2](x)


def lambda_called_directly(x):
    return (lambda t: t * 2 + 1)(x)


def lambda_passed_to_function(x):
    return apply_fn(lambda t: t.relu() - 1, x)


def lambda_with_default_capture(x):
    k = 4.0
    f = lambda t, k=k: t * k  # noqa: E731
    return f(x)


def builtin_passed_as_function(x):
    return apply_fn(torch.tanh, x)


def function_from_dict(x):
    return OPS["add"](x, 1) + OPS["one"](x)


def functools_wraps_decorator(x):
    return decorated(x)


def functools_partial_created(x):
    y = x * 2
    scale = functools.partial(affine, w=3.0, b=0.0)
    return scale(y) + 1


def functools_partial_global(x):
    return PARTIAL_AFFINE(x * 2) + 1


def functools_partial_of_torch_function(x):
    gelu = functools.partial(F.gelu, approximate="tanh")
    return gelu(x * 2) + GELU_TANH(x)


def super_method_call(x):
    return SQUARE.scale(x * 2) + 1


def two_argument_super(x):
    return OLD_STYLE_SQUARE.scale(x) * 2


def super_method_on_object_made_in_trace(x):
    return Square(3.0).scale(x * 2) + 1


def super_init_in_trace(x):
    c = Child(x, 3.0)
    return c.total() * 2


def user_class_instantiated(x):
    p = Point(x * 2, 2.0)
    return p.t * p.k


def user_object_mutated(x):
    p = Point(x, 2.0)
    p.k = p.k + 1
    p.t = p.t * p.k
    return p.t - 1


def user_object_across_break(x):
    p = Point(x * 2, 3.0)
    p.k = p.k + 1
    s = x.sum().item()
    p.t = p.t + s
    return p.t * p.k


def user_object_argument(x, p):
    return p.t * p.k


def dataclass_instantiated(x):
    y = x * 2
    c = Config(2.0)
    return y * c.scale + c.shift


def dataclass_global_fields(x):
    return x * CONFIG.scale + CONFIG.shift


def dataclass_holding_tensor(x, h):
    return h.value * h.weight + x


def dataclasses_replace(x):
    y = x * 2
    c = dataclasses.replace(CONFIG, shift=3.0)
    return y * c.scale + c.shift


X = rand(3, 4)

ONE = {"return"}  # one region that runs to the return: no break
CALL = {"call", "return"}  # the runtime performs the call(s); the rest compiles

CASES = [
    # (function, arguments, graphs, region exits)
    (user_function, (X,), 1, ONE),
    (nested_user_calls, (X,), 1, ONE),
    (keyword_only_arguments, (X,), 1, ONE),
    (keyword_arguments_in_any_order, (X,), 1, ONE),
    (star_args_at_call_site, (X,), 1, ONE),
    (star_star_kwargs_at_call_site, (X,), 1, ONE),
    (varargs_callee, (X,), 1, ONE),
    (kwargs_callee_uses_get, (X,), 1, ONE),
    (forwarding_wrapper, (X,), 1, ONE),
    (star_args_and_kwargs_mixed, (X,), 1, ONE),
    (recursion_depth_limited, (X,), 1, ONE),
    (tree_recursion, (X,), 1, ONE),
    (tuple_returned_and_unpacked, (X,), 1, ONE),
    (bound_method, (X,), 1, ONE),
    (method_calls_method, (X,), 1, ONE),
    (bound_method_stored_in_local, (X,), 1, ONE),
    (staticmethod_via_instance, (X,), 1, ONE),
    (staticmethod_via_class, (X,), 1, ONE),
    (classmethod_via_class, (X,), 1, ONE),
    (classmethod_via_instance, (X,), 1, ONE),
    (property_read, (X,), 1, ONE),
    (class_attribute_read, (X,), 1, ONE),
    (inherited_method, (X,), 1, ONE),
    (callable_object, (X,), 1, ONE),
    (closure_reads_cell, (X,), 1, ONE),
    (closure_over_tensor, (X,), 1, ONE),
    (closure_nonlocal_write, (X,), 1, ONE),
    (closure_cell_changed_after_def, (X,), 1, ONE),
    (closure_factory, (X,), 1, ONE),
    (nested_def_with_defaults, (X,), 1, ONE),
    (default_bound_at_def_time, (X,), 1, ONE),
    (lambda_called_directly, (X,), 1, ONE),
    (lambda_passed_to_function, (X,), 1, ONE),
    (lambda_with_default_capture, (X,), 1, ONE),
    (builtin_passed_as_function, (X,), 1, ONE),
    (function_from_dict, (X,), 1, ONE),
    (functools_wraps_decorator, (X,), 1, ONE),
    (functools_partial_created, (X,), 1, ONE),
    (functools_partial_global, (X,), 1, ONE),
    (functools_partial_of_torch_function, (X,), 1, ONE),
    (super_method_call, (X,), 1, ONE),
    (two_argument_super, (X,), 1, ONE),
    (super_method_on_object_made_in_trace, (X,), 1, ONE),
    (super_init_in_trace, (X,), 1, ONE),
    (user_class_instantiated, (X,), 1, ONE),
    (user_object_mutated, (X,), 1, ONE),
    # the object lives on across the .item() break: rebuilt at the exit, read back after it
    (user_object_across_break, (X,), 2, CALL),
    (user_object_argument, (X, Point(rand(3, 4, seed=1), 3.0)), 1, ONE),
    (dataclass_instantiated, (X,), 1, ONE),
    (dataclass_global_fields, (X,), 1, ONE),
    (dataclass_holding_tensor, (X, Holder(rand(3, 4, seed=2))), 1, ONE),
    (dataclasses_replace, (X,), 1, ONE),
]


@pytest.mark.parametrize("fn,args,graphs,exits", CASES, ids=[c[0].__name__ for c in CASES])
def test_call_construct(fn, args, graphs, exits):
    check(fn, *args, graphs=graphs, exits=exits)


def fields(obj):
    """An object as its type and attributes, for same()."""
    return type(obj), dict(vars(obj))


def returns_dataclass(x):
    y = x * 2
    return Holder(y + 1, 3.0)


def returns_user_object(x):
    p = Point(x, 2.0)
    p.t = p.t * p.k
    return p


@pytest.mark.parametrize("fn", [returns_dataclass, returns_user_object])
def test_object_made_in_trace_escapes(fn):
    """An object made in the trace and returned is rebuilt at the exit: same type, same fields
    as eager's, a fresh object on every call."""
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    outs = []
    for seed in (0, 1):
        x = rand(3, 4, seed=seed)
        out, expected = compiled(x.clone()), fn(x.clone())
        assert same(fields(out), fields(expected))
        outs.append(out)
    assert outs[0] is not outs[1]
    assert counter.frame_count == 1
    assert {r["exit"] for r in regions(fn)} == ONE


# ---------------------------------------------------------------------------------------------
# A custom torch.autograd.Function: one node calling apply, so its own backward runs
# ---------------------------------------------------------------------------------------------

class RoundSTE(torch.autograd.Function):
    """A straight-through estimator: autograd of its forward (round) would give zero gradients."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return torch.round(x * scale) / scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x.abs() < 1).to(grad.dtype) * ctx.scale / 4, None


class SplitSigns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clamp(min=0), x.clamp(max=0)

    @staticmethod
    def backward(ctx, g_pos, g_neg):
        return g_pos * 2 + g_neg * 3


class MaskedSoftmax(torch.autograd.Function):
    """DeBERTa's XSoftmax: its forward makes its fill value with torch.tensor(...), no device
    given; on the trace's meta tensors that value is made on meta too (it was a CPU tensor
    that masked_fill refused to mix with meta ones: a break per attention layer)."""

    @staticmethod
    def forward(ctx, x, mask):
        rmask = ~mask.to(torch.bool)
        out = x.masked_fill(rmask, torch.tensor(torch.finfo(x.dtype).min)).softmax(-1)
        out.masked_fill_(rmask, 0)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return out * (grad - (grad * out).sum(-1, keepdim=True)), None


def uses_masked_softmax(x, w):
    scores = x @ w
    return (MaskedSoftmax.apply(scores, (scores > -0.5).int()) * torch.arange(5.0)).sum()


def uses_ste(x, w):
    y = (x @ w).tanh()
    return (RoundSTE.apply(y, 4.0).sum(dim=-1) * 2).sum()


def uses_split(x, w):
    pos, neg = SplitSigns.apply(x @ w)
    return (pos - neg).sum()


@pytest.mark.parametrize("backend", ["eager", "native", "aot_eager"])
@pytest.mark.parametrize("fn", [uses_ste, uses_split, uses_masked_softmax])
def test_autograd_function_is_one_node_and_runs_its_own_backward(fn, backend):
    counter = CompileCounter() if backend == "eager" else CompileCounter(backend)
    compiled = framejit.compile(fn, backend=counter)
    for seed in (0, 1):
        x = rand(3, 4, seed=seed)
        w = rand(4, 5, seed=seed + 10).requires_grad_()
        w_ref = w.detach().clone().requires_grad_()
        out, ref = compiled(x, w), fn(x, w_ref)
        out.backward()
        ref.backward()
        assert same(out.detach(), ref.detach())
        assert torch.allclose(w.grad, w_ref.grad)
        assert w.grad.abs().sum() > 0  # the function's backward, not round's zero gradient
    assert counter.frame_count == 1
    assert {r["exit"] for r in regions(fn)} == ONE
    with torch.no_grad():  # no gradient needed: native runs it as a program
        assert same(compiled(x, w), fn(x, w))


def test_autograd_function_in_the_graph_text_and_its_methods_guarded():
    counter = CompileCounter()
    compiled = framejit.compile(uses_ste, backend=counter)
    x, w = rand(3, 4), rand(4, 5).requires_grad_()
    compiled(x, w)
    assert "RoundSTE_apply(" in counter.graphs[0].code
    original = RoundSTE.backward
    try:
        RoundSTE.backward = staticmethod(lambda ctx, grad: (grad * 7, None))
        w1 = w.detach().clone().requires_grad_()
        compiled(x, w1).backward()
        assert counter.frame_count == 2  # a replaced backward compiles again
        w2 = w.detach().clone().requires_grad_()
        uses_ste(x, w2).backward()
        assert torch.allclose(w1.grad, w2.grad)
    finally:
        RoundSTE.backward = original


class Tile:
    sides = 4

    @classmethod
    def per_side(cls, x):
        return x * cls.sides


class Hexagon(Tile):
    sides = 6


def calls_a_classmethod_through_an_instance(tile, x):
    return tile.per_side(x) + 1


def test_a_classmethod_through_an_instance_is_bound_to_its_class_and_guarded():
    counter = CompileCounter()
    compiled = framejit.compile(calls_a_classmethod_through_an_instance, backend=counter)
    x = torch.ones(2)
    for tile in (Tile(), Hexagon(), Tile()):
        assert same(compiled(tile, x), calls_a_classmethod_through_an_instance(tile, x))
    assert counter.frame_count == 2  # one per class
    assert {r["exit"] for r in regions(calls_a_classmethod_through_an_instance)} == {"return"}
    Tile.sides = 5  # a class attribute read in the trace: guarded
    try:
        assert same(compiled(Tile(), x), x * 5 + 1)
    finally:
        Tile.sides = 4
