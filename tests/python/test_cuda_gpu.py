"""backend="cuda" on a GPU: fused kernels launched through the driver API against eager.

Skipped without a CUDA device. The cases are those of test_cuda_fusion.py, which runs the same
kernels on the host; here they run as CUDA kernels in the backend's programs."""
import copy
import logging
import sys
from pathlib import Path

import pytest
import torch

import framejit
from framejit.testing import same

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.zoo import ZOO, backward_and_compare_gradients  # noqa: E402
from test_cuda_fusion import CASES  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def kernel_texts(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "framejit.output_code" and "CUDA KERNEL" in r.getMessage()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["chain_f32", "binary_broadcast", "strided_views", "misaligned",
                                  "unary_any"])
def test_gpu_fused_chains_equal_eager(name, dtype, caplog):
    """Within the dtype's tolerance: no further from the float64 result than eager is (eager
    rounds after every op, the kernel once), plus a few ulps of the result's magnitude."""
    fn, makers, _ = CASES[name]
    torch.manual_seed(0)
    inputs = [m("cuda").to(dtype) for m in makers]
    framejit.set_logs("output_code", handler=False)
    compiled = framejit.compile(fn, backend="cuda")
    with caplog.at_level(logging.INFO, logger="framejit.output_code"), torch.no_grad():
        out = compiled(*inputs)
        ref = fn(*inputs)
        exact = fn(*[t.double() for t in inputs])
    assert kernel_texts(caplog), "nothing was fused"
    for got, want, best in zip(out, ref, exact):
        assert got.dtype == want.dtype and got.stride() == want.stride()
        err = (got.double() - best).abs().max().item()
        err_eager = (want.double() - best).abs().max().item()
        assert err <= 2 * err_eager + 4 * torch.finfo(dtype).eps * (best.abs().max().item() + 1)


@pytest.mark.parametrize("name", ["integers", "nan_propagation", "mixed_dtypes",
                                  "zero_dim_and_empty", "int_where_bool", "channels_last_scale",
                                  "bias_silu_bf16", "transposed_f16"])
def test_gpu_cases_equal_eager(name):
    fn, makers, tol = CASES[name]
    torch.manual_seed(0)
    inputs = [m("cuda") for m in makers]
    out = framejit.compile(fn, backend="cuda")(*inputs)
    ref = fn(*inputs)
    for got, want in zip(out, ref):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.allclose(got.float(), want.float(), rtol=max(tol, 1e-5), atol=max(tol, 1e-5),
                              equal_nan=True)


def test_gpu_gradients_equal_eager_and_nothing_reading_them_is_fused(caplog):
    def f(x, w):
        return (torch.tanh(x * w + 1) * 2).sigmoid().sum()

    x = torch.randn(256, 64, device="cuda", requires_grad=True)
    w = torch.randn(64, device="cuda", requires_grad=True)
    framejit.set_logs("output_code", handler=False)
    compiled = framejit.compile(f, backend="cuda")
    with caplog.at_level(logging.INFO, logger="framejit.output_code"):
        compiled(x, w).backward()
    assert kernel_texts(caplog) == []
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    f(x, w).backward()
    assert same(gx, x.grad, rtol=1e-6, atol=1e-7) and same(gw, w.grad, rtol=1e-6, atol=1e-7)


def test_gpu_launches_on_the_current_stream():
    def f(x):
        return (torch.sin(x) * 2 + 1,)

    compiled = framejit.compile(f, backend="cuda")
    x = torch.randn(1 << 20, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # x is made on the default stream
    with torch.cuda.stream(stream):
        out = compiled(x)
    stream.synchronize()
    assert torch.allclose(out[0], f(x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_gpu_zoo_equals_eager(name, training):
    torch.manual_seed(1)
    eager = ZOO[name]().cuda().train(training)
    model = copy.deepcopy(eager)
    compiled = framejit.compile(model, backend="cuda")
    for step in range(2):
        args = [a.cuda() for a in ZOO[name].example(batch=3)]
        torch.manual_seed(step)
        with torch.set_grad_enabled(training):
            out = compiled(*args)
            torch.manual_seed(step)
            ref = eager(*args)
        assert same(out, ref, rtol=1e-4, atol=1e-5)
        if training:
            backward_and_compare_gradients(model, eager, out, ref)
