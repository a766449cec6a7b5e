"""Feature tests for tensors read as Python values and indexed: indexing with ints, slices, None,
Ellipsis, bool and long tensors, slice assignment; iterating and unpacking a tensor; x.shape/dtype/device/ndim/T/requires_grad,
size()/dim()/numel(), torch.Size arithmetic and indexing, view/reshape with computed shapes;
and the context managers torch.no_grad / enable_grad / inference_mode / autocast. One construct
per function, compiled and checked against eager with its exact graph count and the kinds of
its region exits."""
import pytest
import torch

from feature_checks import check, rand

ONE = {"return"}  # one region that runs to the return: no break
WITH = {"call", "with", "return"}  # the runtime enters and exits the block; the body compiles


# ---------------------------------------------------------------------------------------------
# Indexing
# ---------------------------------------------------------------------------------------------

def index_int(x):
    return x[1] * 2


def index_negative_int(x):
    return x[-1, -2] + 1


def index_slice_with_step(x):
    return x[::2, 1:] * 2


def index_none(x):
    return x[:, None] + 1


def index_ellipsis(x):
    return x[..., 0] * 3


def index_bool_mask_tensor(x):
    return x[x > 0] * 2


def index_long_tensor(x):
    idx = torch.tensor([2, 0])
    return x[idx] + 1


def index_with_python_list(x):
    return x[[0, 2]] * 2


def slice_assignment_scalar(x):
    y = x.clone()
    y[1:, :2] = 0.0
    return y


def slice_assignment_tensor(x):
    y = torch.zeros_like(x)
    y[:, 1] = x[:, 0] * 2
    return y


def bool_mask_assignment(x):
    y = x.clone()
    y[y < 0] = -1.0
    return y


def index_put_with_long_tensor(x):
    y = x.clone()
    y[torch.tensor([0, 2])] += 5.0
    return y


# ---------------------------------------------------------------------------------------------
# Iterating a tensor: its rows are x.unbind(0), as Tensor.__iter__ makes them
# ---------------------------------------------------------------------------------------------

def iterate_rows(x):
    total = torch.zeros(x.size(1))
    for row in x:
        total = total + row * 2
    return total


def unpack_rows(x):
    a, b, c = x
    return a + b * c


def enumerate_rows(x):
    return [row * i for i, row in enumerate(x)]


def zip_rows(x, y):
    return [a - b for a, b in zip(x, y)]


def list_and_sum_of_rows(x):
    return torch.stack(list(x)[::-1]) + sum(x)


def modify_rows_in_place(x):
    y = x.clone()
    for row in y:
        row.mul_(2)
    return y


# ---------------------------------------------------------------------------------------------
# Tensor attributes read into Python
# ---------------------------------------------------------------------------------------------

def shape_attribute(x):
    rows, cols = x.shape
    return x * rows - cols


def dtype_attribute(x):
    if x.dtype == torch.float32:
        return x * 2
    return x


def is_floating_point(x):
    return x + 1 if x.is_floating_point() else x


def device_attribute(x):
    if x.device.type == "cpu":
        return torch.ones(2, device=x.device) + x.sum()
    return x


def ndim_attribute(x):
    return x.sum() * x.ndim


def transpose_attribute(x):
    return x.T @ x


def requires_grad_attribute(x):
    if x.requires_grad:
        return x * 2
    return x * 3


def size_method(x):
    return x.reshape(x.size(1), x.size(0)) + x.size()[-1]


def dim_method(x):
    return x.sum(dim=x.dim() - 1)


def numel_method(x):
    return x.sum() / x.numel()


def len_of_tensor(x):
    return x * len(x)


# ---------------------------------------------------------------------------------------------
# torch.Size and computed shapes
# ---------------------------------------------------------------------------------------------

def size_concatenation(x):
    return x.reshape(x.shape + (1,)) * 2


def size_slice_and_index(x):
    return x.reshape(x.shape[:-1] + (2, -1)).sum(-1) + x.shape[0]


def size_arithmetic(x):
    n = x.shape[0] * x.shape[1] // 2
    return x.view(n, 2) - n


def size_equality(x, y):
    if x.shape == y.shape:
        return x + y
    return x


def size_len_and_unpack_star(x):
    return x.reshape(-1, *x.shape[len(x.shape) - 1:]) * 2


def view_with_computed_shape(x):
    b = x.shape[0]
    return x.view(b, -1, 2).sum(-1)


def reshape_with_size_list(x):
    shape = list(x.shape)
    shape[-1] = 1
    return x.sum(-1).reshape(shape)


def new_tensor_from_shape(x):
    return torch.zeros(x.shape[0], 2 * x.shape[1], dtype=x.dtype) + x.repeat(1, 2)


def split_by_size(x):
    half = x.size(-1) // 2
    a, b = x.split(half, dim=-1)
    return a * b


# ---------------------------------------------------------------------------------------------
# Context managers
# ---------------------------------------------------------------------------------------------

def no_grad_block(x):
    y = x * 2
    with torch.no_grad():
        z = y * 3
    return y + z


def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
    return y


def inference_mode_block(x):
    with torch.inference_mode():
        y = x + 1
    return y * 2


def autocast_cpu_bfloat16(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = a @ b
    return y.float() + 1


def return_inside_no_grad(x):
    with torch.no_grad():
        return x * 2


def autocast_disabled_inside_autocast(a):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            y = a @ a
    return y


def set_grad_enabled_false(x):
    with torch.set_grad_enabled(False):
        y = x * 2
    return y


def no_grad_as_decorator_callee(x):
    return frozen_double(x) + 1


@torch.no_grad()
def frozen_double(t):
    return t * 2


X = rand(3, 4)
XG = rand(3, 4, seed=1).requires_grad_()

CASES = [
    # (function, arguments, graphs, region exits)
    (index_int, (X,), 1, ONE),
    (index_negative_int, (X,), 1, ONE),
    (index_slice_with_step, (X,), 1, ONE),
    (index_none, (X,), 1, ONE),
    (index_ellipsis, (X,), 1, ONE),
    # a bool-mask read has a data-dependent shape (nonzero has no meta kernel): the region ends
    # at the subscript, the runtime reads it, and `* 2` is a second graph
    (index_bool_mask_tensor, (X,), 2, {"subscript", "return"}),
    (index_long_tensor, (X,), 1, ONE),
    (index_with_python_list, (X,), 1, ONE),
    (slice_assignment_scalar, (X,), 1, ONE),
    (slice_assignment_tensor, (X,), 1, ONE),
    (bool_mask_assignment, (X,), 1, ONE),
    (index_put_with_long_tensor, (X,), 1, ONE),
    (iterate_rows, (X,), 1, ONE),
    (unpack_rows, (X,), 1, ONE),
    (enumerate_rows, (X,), 1, ONE),
    (zip_rows, (X, rand(3, 4, seed=5)), 1, ONE),
    (list_and_sum_of_rows, (X,), 1, ONE),
    (modify_rows_in_place, (X,), 1, ONE),
    (shape_attribute, (X,), 1, ONE),
    (dtype_attribute, (X,), 1, ONE),
    (is_floating_point, (X,), 1, ONE),
    (device_attribute, (X,), 1, ONE),
    (ndim_attribute, (X,), 1, ONE),
    (transpose_attribute, (X,), 1, ONE),
    (requires_grad_attribute, (XG,), 1, ONE),
    (size_method, (X,), 1, ONE),
    (dim_method, (X,), 1, ONE),
    (numel_method, (X,), 1, ONE),
    (len_of_tensor, (X,), 1, ONE),
    (size_concatenation, (X,), 1, ONE),
    (size_slice_and_index, (X,), 1, ONE),
    (size_arithmetic, (X,), 1, ONE),
    (size_equality, (X, rand(3, 4, seed=2)), 1, ONE),
    # x.reshape(-1, *shape_slice): a tensor method called with a star argument
    (size_len_and_unpack_star, (X,), 1, ONE),
    (view_with_computed_shape, (X,), 1, ONE),
    (reshape_with_size_list, (X,), 1, ONE),
    (new_tensor_from_shape, (X,), 1, ONE),
    (split_by_size, (X,), 1, ONE),
    # torch.no_grad() / enable_grad() blocks are in the graph (torch._C._set_grad_enabled nodes)
    (no_grad_block, (XG,), 1, ONE),
    (enable_grad_inside_no_grad, (XG,), 1, ONE),
    (return_inside_no_grad, (XG,), 1, ONE),
    # other with blocks: the runtime makes the manager, enters it, compiles the body, exits it
    (inference_mode_block, (X,), 1, ONE),
    # autocast: enter/exit nodes in the graph, the body traced with autocast's dtypes
    (autocast_cpu_bfloat16, (X, rand(4, 5, seed=3)), 1, ONE),
    (autocast_disabled_inside_autocast, (rand(4, 4, seed=4),), 1, ONE),
    (set_grad_enabled_false, (XG,), 1, ONE),
    # a @torch.no_grad() function: its wrapper is traced, the grad switches are in the graph
    (no_grad_as_decorator_callee, (XG,), 1, ONE),
]


@pytest.mark.parametrize("fn,args,graphs,exits", CASES, ids=[c[0].__name__ for c in CASES])
def test_tensor_construct(fn, args, graphs, exits):
    check(fn, *args, graphs=graphs, exits=exits)
