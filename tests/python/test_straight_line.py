"""Straight-line torch functions compiled with framejit, checked against eager.

Every case is a function with no branches, loops, user-function calls or prints, plus a factory
that builds its arguments for a given dtype and seed. For each case:

1. the first call equals eager, compiles exactly one graph (none for a function without a tensor
   op) and leaves exactly one region, of kind "compiled";
2. a second call with new values of the same metadata compiles nothing and still equals eager;
3. a call with another dtype compiles exactly one more graph and equals eager.

Inputs are cloned for every call, and the inputs after the call are compared too, so a function
that mutates its inputs is checked fairly.
"""
import types

import pytest
import torch
import torch.nn.functional as F

import framejit
from framejit.testing import CompileCounter, regions, same


@pytest.fixture(autouse=True)
def _reset_framejit():
    framejit.reset()
    yield
    framejit.reset()


# ---------------------------------------------------------------------------------------------
# Input helpers: every factory is called as make(dtype, gen) and returns an Args.
# ---------------------------------------------------------------------------------------------

class Args:
    """Positional and keyword arguments for one call."""

    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs


def randn(gen, dtype, *shape):
    return torch.randn(*shape, generator=gen).to(dtype)


def positive(gen, dtype, *shape):
    """Values in [0.5, 1.5): safe divisors, bases for ** and arguments of sqrt/log."""
    return (torch.rand(*shape, generator=gen) + 0.5).to(dtype)


def randint(gen, dtype, *shape, low=1, high=10):
    return torch.randint(low, high, shape, generator=gen).to(dtype)


def randbool(gen, dtype, *shape):
    return (torch.rand(*shape, generator=gen) > 0.5).to(dtype)


# ---------------------------------------------------------------------------------------------
# torch functions
# ---------------------------------------------------------------------------------------------

def add_matmul(a, b, bias):
    return torch.add(torch.matmul(a, b), bias, alpha=2)


def relu_sigmoid(x):
    return torch.relu(x) + torch.sigmoid(x) * 0.5


def cat_stack(x, y):
    return torch.cat([x, y], dim=0), torch.stack((x, y), dim=1), torch.cat((x, y), -1)


def where_clamp(x, y):
    return torch.where(x > 0, x, y), torch.clamp(x, min=-0.5, max=0.5), torch.where(y < 0, y, 0.0)


def softmaxes(x):
    return torch.softmax(x, dim=-1), x.softmax(0), F.softmax(x, dim=1), F.log_softmax(x, dim=-1)


def gelu_layer_norm(x, weight, bias):
    return F.layer_norm(F.gelu(x), (x.shape[-1],), weight, bias, eps=1e-5)


def linear_layers(x, w1, b1, w2):
    return F.linear(torch.relu(F.linear(x, w1, b1)), w2)


def reductions_dim_keepdim(x):
    return (x.sum(dim=1), x.amax(dim=0, keepdim=True), torch.mean(x, dim=-1),
            x.std(dim=0), torch.argmax(x, dim=1), torch.prod(x, 1, keepdim=True))


def sum_over_dims(x):
    return torch.sum(x, dim=(1, 2)), x.sum([0, -1], keepdim=True), x.sum()


# ---------------------------------------------------------------------------------------------
# Tensor methods
# ---------------------------------------------------------------------------------------------

def view_reshape(x):
    return x.view(2, -1), x.reshape(-1), x.view(x.shape[0], -1) * 2, x.reshape(3, 2, 4)


def transpose_permute_contiguous(x):
    t = x.transpose(0, 1).contiguous()
    return t, x.permute(2, 0, 1) + 1, x.transpose(-1, -2).reshape(-1)


def unsqueeze_expand(x):
    return x.unsqueeze(0).expand(3, -1, -1) + 1, x.unsqueeze(-1).expand(4, 5, 2), x[None].squeeze(0)


def dtype_conversions(x):
    return x.to(torch.float16), x.float() * 2, x.to(dtype=torch.int64), x.double(), x.to(torch.bool)


def dtype_argument(x, dtype):
    return x.to(dtype) + 1


def mean_dims(x):
    return x.mean(dim=1), x.mean(dim=-1, keepdim=True), x.mean(), x.var(dim=0, keepdim=True)


def chunk_unpack(x):
    a, b = x.chunk(2, dim=1)
    return a * b


def chunk_tuple(x):
    return x.chunk(3)


def max_namedtuple_fields(x):
    r = torch.max(x, dim=1)
    values, indices = x.min(dim=0)
    return r.values * 2, r.indices, values, indices + 1


def max_namedtuple_return(x):
    return torch.max(x, dim=1)


# ---------------------------------------------------------------------------------------------
# Operators
# ---------------------------------------------------------------------------------------------

def tensor_arithmetic(x, y, w):
    return x + y, x - y, x * y, x / y, x @ w, x ** y


def number_arithmetic(x):
    return 2 + x, x - 1.5, 3 * x, x / 4, 1 / x, x ** 2, 2 ** x, 10 - x


def floordiv_mod_int(x, y):
    return x // y, x % y, x // 2, x % 3, x * y - 1


def floordiv_mod_float(x, y):
    return x // y, x % y, x // 0.5, x % 0.25


def unary_ops(x):
    return -x, -(x * 2) + 1, torch.abs(x).neg()


def bool_ops(m, n):
    return ~m, m & n, m | n, m ^ n, ~(m & n)


def comparisons(x, y):
    return x < y, x == y, x >= 0.5, x != y, (x < y) & (y > 0), x <= 0


def matmul_operator_batched(a, b, v):
    return a @ b, b @ v, (a @ b) @ v, v @ b.transpose(-1, -2)


# ---------------------------------------------------------------------------------------------
# dtypes and broadcasting
# ---------------------------------------------------------------------------------------------

def half_precision(x, y):
    return x * 2 + y, torch.relu(x), x.sum(dim=0), x.float() + y.float()


def int64_math(x):
    return x * 2 + 1, x.sum(dim=0), x.max(), torch.argmax(x), x.float() / 3


def mixed_promotion(i, f):
    return i + f, i * 2.5, f * i.sum(), (i > 3) + f


def broadcasting(col, row, bias):
    return col + row, (col * row) * bias, torch.maximum(col, row), row - bias.unsqueeze(0)


# ---------------------------------------------------------------------------------------------
# Containers and argument kinds
# ---------------------------------------------------------------------------------------------

def dict_input(inputs):
    x = inputs["x"]
    y = inputs["y"]
    return x * y + inputs["bias"]


def tuple_input_unpack(pair):
    a, b = pair
    return a @ b.T + pair[0].sum()


def list_input_index(xs):
    return xs[0] + xs[1] * xs[2], xs[-1] - xs[0]


def kwargs_at_call_sites(x):
    return (torch.sum(x, dim=1, keepdim=True), torch.cumsum(x, dim=0), x.clamp(min=0),
            torch.full_like(x, fill_value=3.0), x.norm(p=2, dim=-1))


def python_number_args(x, n, eps):
    return x * n + eps, x / n, x.shape[0] * n


def keyword_call(x, y, *, scale):
    return (x - y) * scale


# ---------------------------------------------------------------------------------------------
# In-place ops, indexing and item assignment
# ---------------------------------------------------------------------------------------------

def inplace_methods(x):
    y = x.clone()
    y.add_(1)
    y.mul_(2)
    y.clamp_(min=0.5)
    return y


def inplace_operators(x, z):
    y = x.clone()
    y += 1
    y -= z
    y *= 2
    y /= 3
    return y, x


def indexing_slicing(x):
    return x[0], x[:, 1:3], x[..., None], x[-1, ::2], x[None, :, 0], x[1:, -2:]


def index_with_tensor(x, idx):
    return x[idx], x[:, idx], torch.index_select(x, 0, idx)


def item_assignment(x):
    y = x.clone()
    y[0] = 0
    y[:, 1] = x[:, 0]
    y[..., -1] += 1
    return y


def masked_fill_local(x):
    y = x.clone()
    y[y < 0] = 0.0
    return y


def mutate_inputs(x, inputs):
    x.mul_(2)
    inputs["y"][0] = 5.0
    inputs["y"].add_(x)
    return x + 1


# ---------------------------------------------------------------------------------------------
# What a function returns
# ---------------------------------------------------------------------------------------------

def return_tuple(x):
    return x + 1, x * 2


def return_list(x, y):
    return [x + y, x - y]


def return_dict(x):
    return {"double": x * 2, "square": x * x}


def return_nested(x):
    return {"a": x + 1, "b": [x * 2, (x - 1, None)], "n": 3, "s": "text"}


def return_none_and_number(x):
    y = x + 1
    return None, 7, 2.5, y


def return_shape_only(x):
    return x.shape


def return_python_numbers_only(x):
    return x.shape[0] * 2 + x.ndim, x.shape[-1] - 1


def return_size_and_tensor(x):
    y = x.sum(dim=0)
    return y.shape, y, x.size(1)


# ---------------------------------------------------------------------------------------------
# Factories and attributes
# ---------------------------------------------------------------------------------------------

def factories(x):
    return (torch.zeros(3) + x.sum(), torch.ones_like(x), torch.arange(4), torch.full((2, 2), 7.0),
            torch.zeros(x.shape[0], dtype=x.dtype), torch.empty_like(x).fill_(2.0))


def factories_from_shape(x):
    return torch.ones(x.shape, dtype=x.dtype) + x, torch.arange(x.shape[0]) * 2, torch.eye(3) * x[0, 0]


def attributes(x):
    return x * x.shape[0] + x.ndim, x.dtype, x.T, x.shape[1] * 2, x.T.shape


def dtype_attribute_in_op(x):
    return torch.zeros(2, 3, dtype=x.dtype) + x, x.to(x.dtype), x.new_ones(2, 3)


# ---------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------

F32, F64, F16, BF16, I64, I32, BOOL = (torch.float32, torch.float64, torch.float16,
                                      torch.bfloat16, torch.int64, torch.int32, torch.bool)


class Case:
    def __init__(self, fn, make, dtypes=(F32, F64), graphs=1):
        self.fn = fn
        self.make = make
        self.dtypes = dtypes  # (first dtype, the dtype that must recompile)
        self.graphs = graphs  # graphs per compile: 0 for a function without a tensor op

    def __repr__(self):
        return self.fn.__name__


CASES = [
    # torch functions
    Case(add_matmul, lambda d, g: Args(randn(g, d, 3, 4), randn(g, d, 4, 5), randn(g, d, 5))),
    Case(relu_sigmoid, lambda d, g: Args(randn(g, d, 4, 4))),
    Case(cat_stack, lambda d, g: Args(randn(g, d, 2, 3), randn(g, d, 2, 3))),
    Case(where_clamp, lambda d, g: Args(randn(g, d, 3, 4), randn(g, d, 3, 4))),
    Case(softmaxes, lambda d, g: Args(randn(g, d, 3, 5))),
    Case(gelu_layer_norm, lambda d, g: Args(randn(g, d, 2, 3, 8), randn(g, d, 8), randn(g, d, 8))),
    Case(linear_layers, lambda d, g: Args(randn(g, d, 4, 6), randn(g, d, 5, 6), randn(g, d, 5),
                                          randn(g, d, 2, 5))),
    Case(reductions_dim_keepdim, lambda d, g: Args(randn(g, d, 3, 4))),
    Case(sum_over_dims, lambda d, g: Args(randn(g, d, 2, 3, 4))),
    # Tensor methods
    Case(view_reshape, lambda d, g: Args(randn(g, d, 4, 6))),
    Case(transpose_permute_contiguous, lambda d, g: Args(randn(g, d, 2, 3, 4))),
    Case(unsqueeze_expand, lambda d, g: Args(randn(g, d, 4, 5))),
    Case(dtype_conversions, lambda d, g: Args(randn(g, d, 3, 3) * 4)),
    Case(dtype_argument, lambda d, g: Args(randn(g, F32, 3), d), dtypes=(F64, F16)),
    Case(mean_dims, lambda d, g: Args(randn(g, d, 3, 4))),
    Case(chunk_unpack, lambda d, g: Args(randn(g, d, 3, 4))),
    Case(chunk_tuple, lambda d, g: Args(randn(g, d, 6, 2))),
    Case(max_namedtuple_fields, lambda d, g: Args(randn(g, d, 3, 4))),
    Case(max_namedtuple_return, lambda d, g: Args(randn(g, d, 3, 4))),
    # operators
    Case(tensor_arithmetic, lambda d, g: Args(positive(g, d, 3, 4), positive(g, d, 3, 4),
                                              randn(g, d, 4, 2))),
    Case(number_arithmetic, lambda d, g: Args(positive(g, d, 5))),
    Case(floordiv_mod_int, lambda d, g: Args(randint(g, d, 3, 4, low=-20, high=20),
                                             randint(g, d, 3, 4)), dtypes=(I64, I32)),
    Case(floordiv_mod_float, lambda d, g: Args(randn(g, d, 6) * 3, positive(g, d, 6))),
    Case(unary_ops, lambda d, g: Args(randn(g, d, 5))),
    Case(bool_ops, lambda d, g: Args(randbool(g, d, 6), randbool(g, d, 6)), dtypes=(BOOL, I64)),
    Case(comparisons, lambda d, g: Args(randn(g, d, 6), randn(g, d, 6))),
    Case(matmul_operator_batched, lambda d, g: Args(randn(g, d, 2, 3, 4), randn(g, d, 4, 5),
                                                    randn(g, d, 5))),
    # dtypes and broadcasting
    Case(half_precision, lambda d, g: Args(randn(g, d, 4, 3), randn(g, d, 4, 3)), dtypes=(F16, BF16)),
    Case(int64_math, lambda d, g: Args(randint(g, d, 3, 4)), dtypes=(I64, I32)),
    Case(mixed_promotion, lambda d, g: Args(randint(g, I64, 4), randn(g, d, 4))),
    Case(broadcasting, lambda d, g: Args(randn(g, d, 4, 1), randn(g, d, 1, 5), randn(g, d, 5))),
    # containers and argument kinds
    Case(dict_input, lambda d, g: Args({"x": randn(g, d, 3), "y": randn(g, d, 3),
                                        "bias": randn(g, d, 1)})),
    Case(tuple_input_unpack, lambda d, g: Args((randn(g, d, 2, 3), randn(g, d, 4, 3)))),
    Case(list_input_index, lambda d, g: Args([randn(g, d, 3), randn(g, d, 3), randn(g, d, 3)])),
    Case(kwargs_at_call_sites, lambda d, g: Args(randn(g, d, 3, 4))),
    Case(python_number_args, lambda d, g: Args(randn(g, d, 4), 3, 0.25)),
    Case(keyword_call, lambda d, g: Args(randn(g, d, 4), randn(g, d, 4), scale=2.0)),
    # in-place ops, indexing, item assignment
    Case(inplace_methods, lambda d, g: Args(randn(g, d, 3, 3))),
    Case(inplace_operators, lambda d, g: Args(randn(g, d, 3, 3), randn(g, d, 3))),
    Case(indexing_slicing, lambda d, g: Args(randn(g, d, 4, 5))),
    Case(index_with_tensor, lambda d, g: Args(randn(g, d, 4, 4),
                                              torch.randint(0, 4, (3,), generator=g))),
    Case(item_assignment, lambda d, g: Args(randn(g, d, 3, 4))),
    Case(masked_fill_local, lambda d, g: Args(randn(g, d, 3, 4))),
    Case(mutate_inputs, lambda d, g: Args(randn(g, d, 3), {"y": randn(g, d, 3)})),
    # returned values
    Case(return_tuple, lambda d, g: Args(randn(g, d, 3))),
    Case(return_list, lambda d, g: Args(randn(g, d, 3), randn(g, d, 3))),
    Case(return_dict, lambda d, g: Args(randn(g, d, 3))),
    Case(return_nested, lambda d, g: Args(randn(g, d, 2, 2))),
    Case(return_none_and_number, lambda d, g: Args(randn(g, d, 3))),
    Case(return_shape_only, lambda d, g: Args(randn(g, d, 3, 2)), graphs=0),
    Case(return_python_numbers_only, lambda d, g: Args(randn(g, d, 3, 2)), graphs=0),
    Case(return_size_and_tensor, lambda d, g: Args(randn(g, d, 3, 2))),
    # factories and attributes
    Case(factories, lambda d, g: Args(randn(g, d, 3))),
    Case(factories_from_shape, lambda d, g: Args(randn(g, d, 3, 3))),
    Case(attributes, lambda d, g: Args(randn(g, d, 2, 3))),
    Case(dtype_attribute_in_op, lambda d, g: Args(randn(g, d, 2, 3))),
]


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------

def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def _fresh(fn):
    """A new function object over the same code, so no test reuses another's function."""
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)


def _inputs(case, dtype, seed):
    return case.make(dtype, torch.Generator().manual_seed(seed))


def _call(fn, inputs):
    """fn's result on fresh copies of the inputs, and those copies after the call."""
    args, kwargs = _clone(inputs.args), _clone(inputs.kwargs)
    return fn(*args, **kwargs), (args, kwargs)


def _describe(compiled):
    return "\n".join(f"  {r['kind']}: reason={r['reason']!r} hits={r['hits']}\n{r['graph']}"
                     for r in regions(compiled))


def _check_same(case, compiled, inputs, what):
    out, inputs_after = _call(compiled, inputs)
    expected, expected_inputs_after = _call(case.fn, inputs)
    assert same(out, expected), (f"{what}: compiled result differs from eager\n"
                                 f"compiled: {out!r}\neager: {expected!r}\n{_describe(compiled)}")
    assert same(inputs_after, expected_inputs_after), (
        f"{what}: inputs after the compiled call differ from eager\n"
        f"compiled: {inputs_after!r}\neager: {expected_inputs_after!r}\n{_describe(compiled)}")


def _compile(case):
    counter = CompileCounter()
    return counter, framejit.compile(_fresh(case.fn), backend=counter)


def _check_first_call(case, counter, compiled):
    _check_same(case, compiled, _inputs(case, case.dtypes[0], seed=0), "first call")
    regs = regions(compiled)
    assert [r["kind"] for r in regs] == ["compiled"], f"regions:\n{_describe(compiled)}"
    assert counter.frame_count == case.graphs, f"graphs: {counter.frame_count}\n{_describe(compiled)}"


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_first_call_is_one_graph_equal_to_eager(case):
    counter, compiled = _compile(case)
    _check_first_call(case, counter, compiled)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_same_metadata_reuses_the_graph(case):
    counter, compiled = _compile(case)
    _check_first_call(case, counter, compiled)
    _check_same(case, compiled, _inputs(case, case.dtypes[0], seed=1), "second call")
    assert counter.frame_count == case.graphs, "second call with the same metadata compiled again"
    regs = regions(compiled)
    assert len(regs) == 1 and regs[0]["hits"] == 2, f"regions:\n{_describe(compiled)}"


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_new_dtype_compiles_one_more_graph(case):
    counter, compiled = _compile(case)
    _check_first_call(case, counter, compiled)
    _check_same(case, compiled, _inputs(case, case.dtypes[1], seed=2), f"call with {case.dtypes[1]}")
    assert counter.frame_count == 2 * case.graphs, (
        f"graphs after a dtype change: {counter.frame_count}\n{_describe(compiled)}")
    assert all(r["kind"] == "compiled" for r in regions(compiled)), _describe(compiled)
