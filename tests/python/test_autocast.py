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


def test_a_with_autocast_block_is_one_graph_with_enter_and_exit_nodes():
    counter = CompileCounter()
    compiled = framejit.compile(autocast_inside, backend=counter)
    compiled(torch.randn(4, 8))
    assert counter.frame_count == 1
    text = "".join(r["graph"] for r in regions(autocast_inside) if r["graph"])
    assert "torch.amp.autocast_mode._enter_autocast('cpu', torch.bfloat16, True, None)" in text
    assert "torch.amp.autocast_mode._exit_autocast(enter_autocast)" in text
    assert 'linear: "bf16[4, 8]"' in text
    assert not torch.is_autocast_enabled("cpu")  # the trace left the thread state as it was


def test_a_break_inside_an_autocast_block_leaves_the_block_to_the_runtime(capsys):
    def noisy(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
            print("inside")
            z = y * 2
        return z + 1

    compiled = framejit.compile(noisy, backend=CompileCounter())
    x = torch.randn(4, 8)
    for _ in range(2):
        assert same(compiled(x), noisy(x), rtol=1e-2, atol=1e-2)
    assert not torch.is_autocast_enabled("cpu")


def test_native_backend_runs_an_in_graph_autocast_block():
    compiled = framejit.compile(autocast_inside, backend="native")
    x = torch.randn(4, 8)
    assert same(compiled(x), autocast_inside(x), rtol=1e-2, atol=1e-2)


# Review findings.
def test_a_graph_raising_inside_autocast_leaves_autocast_as_it_was():
    def index_inside(x, idx):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = lin(x)[idx]
        return z.float()

    compiled = framejit.compile(index_inside, backend="eager")
    x = torch.randn(4, 8)
    compiled(x, torch.tensor([0]))
    try:
        compiled(x, torch.tensor([100]))
    except IndexError:
        pass
    assert not torch.is_autocast_enabled("cpu")


def test_the_default_autocast_dtype_is_read_when_the_graph_runs():
    def default_dtype(x):
        with torch.autocast("cpu"):
            y = lin(x)
        return y.float(), str(y.dtype)

    compiled = framejit.compile(default_dtype, backend="eager")
    x = torch.randn(4, 8)
    assert same(compiled(x), default_dtype(x), rtol=1e-2, atol=1e-2)
    before = torch.get_autocast_dtype("cpu")
    try:
        torch.set_autocast_dtype("cpu", torch.float16)
        out = compiled(x)
        assert out[1] == "torch.float16" and same(out, default_dtype(x), rtol=1e-2, atol=1e-2)
    finally:
        torch.set_autocast_dtype("cpu", before)


def test_in_place_op_on_an_autocast_result_stays_in_the_graph():
    def add_in_place(x):
        y = lin(x)
        y.add_(1)
        return y.float()

    counter = CompileCounter()
    compiled = framejit.compile(add_in_place, backend=counter)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert same(compiled(x), add_in_place(x))
    assert counter.frame_count == 1
