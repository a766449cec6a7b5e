"""NumPy on tensors in traced code (issue #16): `x.numpy()` and the NumPy functions, methods,
operators and attributes applied to the array are graph nodes run by torch._numpy, as under
torch.compile; arrays leaving the region are np.ndarrays again. Each program is compared with
eager (values and dtypes) and counted: one graph, no break."""
import pytest
import torch

import framejit
from framejit.testing import CompileCounter

np = pytest.importorskip("numpy")


def same_values(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                and np.allclose(a, b, equal_nan=True))
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.allclose(a, b, equal_nan=True))
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_values, a, b))
    return type(a) is type(b) and a == b


def check(fn, *args, backend=None):
    counter = CompileCounter(backend)
    compiled = framejit.compile(fn, backend=counter)
    for _ in range(2):
        assert same_values(compiled(*args), fn(*args))
    explained = framejit.explain(fn)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert counter.frame_count == 1
    return counter


def roundtrip(x):
    a = x.numpy()
    b = np.sin(a) * 2 + 1
    return torch.from_numpy(b) + x, b


def statistics(x):
    a = x.detach().cpu().numpy()
    a = np.clip(a, -1.0, 1.0) ** 2
    m = a.mean(axis=0, keepdims=True)
    s = np.sum(a, axis=1)
    both = np.concatenate([a, a])
    return torch.as_tensor(m), s, a.shape, a.dtype, a.T, both.shape, a.ndim, a.size


def creates(x):
    z = np.zeros(4)  # NumPy's float64
    r = np.arange(4)
    w = np.where(x.numpy() > 0, x.numpy(), 0.0)
    return x + torch.from_numpy(z), r, w, isinstance(w, np.ndarray)


def rows(x):
    total = x.numpy()[0] * 0
    for row in x.numpy():
        total = total + row
    return total, np.linalg.norm(x.numpy(), axis=1)


@pytest.mark.parametrize("fn", [roundtrip, statistics, creates, rows])
def test_numpy_on_a_tensor_is_one_graph_with_eagers_values_and_dtypes(fn):
    check(fn, torch.randn(3, 4))


def test_the_printed_graph_names_the_numpy_functions():
    counter = check(roundtrip, torch.randn(3, 4))
    code = counter.graphs[0].code
    assert "numpy" in code and "sin" in code


@pytest.mark.parametrize("backend", ["native", "aot_eager"])
def test_numpy_graphs_run_through_backends_that_trace_them(backend):
    check(statistics, torch.randn(3, 4), backend=backend)


def writes_through_the_array(x):
    a = x.numpy()  # shares x's memory, as in eager
    a += 1
    a[0] = 5.0
    return x * 2


def test_writes_into_an_array_reach_the_tensor_it_shares_memory_with():
    x1, x2 = torch.randn(3), torch.randn(3)
    x2.copy_(x1)
    counter = CompileCounter()
    out = framejit.compile(writes_through_the_array, backend=counter)(x1)
    assert same_values(out, writes_through_the_array(x2)) and torch.equal(x1, x2)
    assert counter.frame_count == 1


def needs_grad(x):
    return x.numpy()


def test_numpy_of_a_tensor_that_requires_grad_raises_as_in_eager():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        framejit.compile(needs_grad, backend=CompileCounter())(x)


def mixes(x):
    return x + x.numpy()  # a tensor and a NumPy array: left to Python


def test_an_array_mixed_with_a_tensor_is_left_to_python():
    x = torch.randn(3)
    out = framejit.compile(mixes, backend=CompileCounter())(x)
    assert same_values(out, mixes(x))
