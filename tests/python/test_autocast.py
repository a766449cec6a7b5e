"""torch.autocast around a compiled call and inside one: traced dtypes are autocast's, the
autocast state is guarded, results equal eager."""
import torch

import framejit
from framejit.testing import CompileCounter, regions, same

lin = torch.nn.Linear(8, 8)


def dtype_branch(x):
    y = lin(x).relu() + 1
    if y.dtype == torch.bfloat16:  # Python reads the dtype autocast chose
        return y.float() * 2, str(y.dtype)
    return y, str(y.dtype)


def test_autocast_around_the_call_is_guarded_and_traced_with_its_dtypes():
    counter = CompileCounter()
    compiled = framejit.compile(dtype_branch, backend=counter)
    x = torch.randn(4, 8)
    assert same(compiled(x), dtype_branch(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
        assert out[1] == "torch.bfloat16"
        assert same(out, dtype_branch(x))
    assert counter.frame_count == 2  # the autocast state is part of the global-state guard
    assert same(compiled(x), dtype_branch(x))
    assert counter.frame_count == 2
    texts = [r["guards"] for r in regions(dtype_branch)]
    assert any("autocast_cpu=15" in t for t in texts), texts  # 15: c10::ScalarType::BFloat16


def autocast_inside(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
        z = torch.softmax(y, -1) @ y.T
    return z.float() + 1, str(z.dtype)


def test_a_with_autocast_block_is_traced_under_autocast():
    counter = CompileCounter()
    compiled = framejit.compile(autocast_inside, backend=counter)
    x = torch.randn(4, 8)
    for _ in range(2):
        out = compiled(x)
        assert same(out, autocast_inside(x), rtol=1e-2, atol=1e-2)
    assert out[1] == "torch.bfloat16"


def test_native_backend_under_autocast_matches_eager():
    compiled = framejit.compile(dtype_branch, backend="native")
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert same(compiled(x), dtype_branch(x))
