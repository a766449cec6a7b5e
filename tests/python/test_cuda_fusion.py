"""backend="cuda": element-wise fusion over aten graphs, generated CUDA sources, NVRTC.

Without a GPU (most of this file): graphs are traced on fake CUDA tensors; the fusion pass is
checked group by group, generated sources against tests/python/expected/cuda_*.cu, NVRTC compiles
every source to PTX (and ptxas assembles it when found), and the rewritten graphs run as native
programs on CPU tensors with each kernel built for the host by g++ (tests/python/cuda_host.py),
against eager. On a GPU: tests/python/test_cuda_gpu.py.

After a deliberate change to code generation, rewrite the expected sources with
`bash scripts/accept_goldens.sh` and review the diff."""
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import framejit
from framejit import _C
from framejit._cuda import codegen, fusion, nvrtc
from framejit._native import PythonCall, _build_program, _remove_dead_code
from framejit.testing import CompileCounter, same

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_host  # noqa: E402
from goldens import check_expected  # noqa: E402

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc not found")
needs_gxx = pytest.mark.skipif(not cuda_host.available(), reason="g++ not found")


def on_cpu(val):
    return isinstance(val, torch.Tensor) and val.device.type == "cpu"


def trace(fn, makers, device="cuda"):
    """fn's aten graph on fake tensors made by ``maker(device)``, as the native backend sees it."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [m(device) for m in makers]
    gm = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*fakes)
    _remove_dead_code(gm.graph)
    return gm


def names(groups):
    return [[n.name for n in g.nodes] for g in groups]


def lower_for_host(fn, makers):
    """fn traced on fake CUDA tensors, fused, each group replaced by its kernel built for the
    host; returns (native function running the rewritten graph, kernels, launchers)."""
    gm = trace(fn, makers)
    groups = fusion.find_groups(gm.graph)
    kernels = [codegen.generate(g) for g in groups]
    launchers = [cuda_host.HostLauncher(k, fusion.constants(gm, g)) for k, g in zip(kernels, groups)]
    calls = [PythonCall(k.name, launcher, len(g.outputs))
             for k, g, launcher in zip(kernels, groups, launchers)]
    fusion.apply(gm, groups, calls)
    program = _build_program(gm)
    return _C.make_native_function(lambda args: program, None), kernels, launchers


# ---------------------------------------------------------------------------------------------
# The fusion pass


def randn(*shape, dtype=torch.float32):
    return lambda d: torch.randn(shape, device=d, dtype=dtype)


def test_a_chain_is_one_group_with_its_outputs():
    def f(x, b):
        h = torch.sin(x) * 2 + b
        return torch.relu(h), h.sum()  # h is read by the sum (outside): an output too

    gm = trace(f, [randn(8, 16), randn(16)])
    (group,) = fusion.find_groups(gm.graph)
    assert [n.name for n in group.nodes] == ["sin", "mul", "add", "relu"]
    assert [n.name for n in group.inputs] == ["x_1", "b_1"]
    assert [n.name for n in group.outputs] == ["add", "relu"]
    assert group.shape == (8, 16)


def test_non_elementwise_ops_and_views_split_chains():
    def f(x, w):
        a = torch.tanh(x * 3)
        b = (a @ w).exp() + 1  # mm is not element-wise
        return (b.t() * 2).sigmoid()  # t is a view: a chain on each side

    gm = trace(f, [randn(4, 8), randn(8, 4)])
    reasons = {}
    groups = fusion.find_groups(gm.graph, reasons=reasons)
    assert names(groups) == [["mul", "tanh"], ["exp", "add"], ["mul_1", "sigmoid"]]
    assert reasons[next(n for n in gm.graph.nodes if n.name == "t")] == "not an element-wise op"


def test_groups_are_convex():
    def f(x):
        a = torch.sin(x)
        s = a.sum()  # leaves the chain ...
        return torch.cos(a) + s  # ... and comes back: {sin, cos, add} is not convex

    groups = fusion.find_groups(trace(f, [randn(32)]).graph)
    assert names(groups) == [["sin", "cos"]]


def test_a_group_is_not_formed_where_it_would_move_other_nodes():
    def f(x, y):
        a = torch.sin(x)
        s = a.sum()  # first outside use of a
        w = y @ y  # defined after that use, read by the chain
        return a * w, s  # convex, but only placeable by moving mm before sum: not fused

    assert fusion.find_groups(trace(f, [randn(4, 4), randn(4, 4)]).graph) == []


def test_in_place_ops_and_their_storages_are_not_fused():
    def f(x, y):
        a = x.exp()  # x is written below: x's readers stay as they are
        b = a.cos() + 1  # a's storage is never written: fused
        x.mul_(2)
        c = y * 2
        c.add_(1)  # in place: not fused; c's storage is written ...
        d = c.sin() * 3  # ... so its readers are not fused either
        return b, d

    reasons = {}
    gm = trace(f, [randn(16), randn(16)])
    groups = fusion.find_groups(gm.graph, reasons=reasons)
    assert names(groups) == [["cos", "add"]]
    by_name = {n.name: r for n, r in reasons.items()}
    assert "storage the graph writes" in by_name["exp"]
    assert "storage the graph writes" in by_name["sin"]
    assert by_name["mul_"] == "not an element-wise op"


def test_reads_of_views_of_written_tensors_are_not_fused():
    def f(x):
        v = x.view(4, 4)
        x.add_(1)
        return (v.sin() * 2,)  # v shares x's storage, written by add_

    assert fusion.find_groups(trace(f, [randn(16)]).graph) == []


def test_cpu_tensors_are_not_fused():
    def f(x):
        return torch.relu(x * 2 + 1)

    assert fusion.find_groups(trace(f, [randn(16)], device="cpu").graph) == []
    assert len(fusion.find_groups(trace(f, [randn(16)]).graph)) == 1


def test_groups_reading_tensors_that_require_grad_are_not_fused_when_grad_is_enabled():
    def f(x, y):
        return torch.sin(x) * 2, torch.cos(y) + 1

    x, y = torch.randn(8, requires_grad=True), torch.randn(8)
    gm = make_fx(f, tracing_mode="fake")(x, y)
    on = fusion.find_groups(gm.graph, [x, y], is_target=on_cpu, grad_enabled=True)
    assert names(on) == [["cos", "add"]]  # only the chain on y, which needs no gradient
    off = fusion.find_groups(gm.graph, [x, y], is_target=on_cpu, grad_enabled=False)
    assert names(off) == [["sin", "mul"], ["cos", "add"]]


def test_parameters_that_require_grad_are_checked_on_the_module():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            return (torch.tanh(x * self.scale) + 1,)

    gm = make_fx(torch.fx.symbolic_trace(Scaled()), tracing_mode="fake",
                 _allow_non_fake_inputs=True)(torch.randn(2, 4))
    assert fusion.find_groups(gm.graph, is_target=on_cpu, grad_enabled=True) == []
    (group,) = fusion.find_groups(gm.graph, is_target=on_cpu, grad_enabled=False)
    assert [c is not None for c in fusion.constants(gm, group)] == [False, True]


def test_dependent_groups_are_placed_in_order_and_replaced():
    def f(x, y):
        a = torch.exp(x) * 2
        m = a @ y  # splits the chain
        b = torch.relu(a + 1) - m.sigmoid()  # relu joins a's group, sub cannot (mm between)
        return b, a

    gm = trace(f, [randn(8, 8), randn(8, 8)])
    groups = fusion.find_groups(gm.graph)
    assert names(groups) == [["exp", "mul", "add", "relu"], ["sigmoid", "sub"]]
    calls = [PythonCall(f"k{i}", lambda *a: None, len(g.outputs)) for i, g in enumerate(groups)]
    fusion.apply(gm, groups, calls)
    text = [f"{n.op}:{getattr(n.target, '__name__', n.target)}" for n in gm.graph.nodes]
    assert text == ["placeholder:x_1", "placeholder:y_1", "call_function:k0",
                    "call_function:getitem", "call_function:getitem", "call_function:mm.default",
                    "call_function:k1", "output:output"]
    k1 = [n for n in gm.graph.nodes if getattr(n.target, "__name__", "") == "k1"][0]
    assert [a.name for a in k1.args] == ["mm", "getitem_1"]  # relu: k0's second output


def test_broadcast_members_of_smaller_shape_stay_inside():
    def f(x, b):
        scale = torch.exp(b) * 0.5  # [16]: recomputed per element, not an output
        return (torch.tanh(x * scale),)

    (group,) = fusion.find_groups(trace(f, [randn(4, 16), randn(16)]).graph)
    assert len(group.nodes) == 4 and [n.name for n in group.outputs] == ["tanh"]

    def g(x, b):
        scale = torch.exp(b) * 0.5
        return torch.tanh(x * scale), scale  # scale is read outside: two shapes, two groups

    assert names(fusion.find_groups(trace(g, [randn(4, 16), randn(16)]).graph)) == [
        ["exp", "mul"], ["mul_1", "tanh"]]


# ---------------------------------------------------------------------------------------------
# Generated sources


def chain_f32(x):
    return (torch.sigmoid(F.gelu(x * 2 + 1)) - 0.25,)


def bias_silu_bf16(x, b):
    return (F.silu(x + b),)


def transposed_f16(x, y):
    return (torch.relu(x.t() + y).to(torch.float32) * 3,)


def int_where_bool(x, y):
    return torch.where(x > y, x * 3 - y, -x), (x == y) | (x < 0)


def channels_last_scale(x):
    return (torch.clamp(x * 1.5 + 0.1, min=-1.0, max=1.0),)


GOLDEN = {
    "chain_f32": (chain_f32, [randn(64, 256)]),
    "bias_silu_bf16": (bias_silu_bf16, [randn(64, 256, dtype=torch.bfloat16),
                                        randn(256, dtype=torch.bfloat16)]),
    "transposed_f16": (transposed_f16, [randn(128, 64, dtype=torch.float16),
                                        randn(64, 128, dtype=torch.float16)]),
    "int_where_bool": (int_where_bool, [lambda d: torch.randint(-5, 5, (32, 8), device=d),
                                        lambda d: torch.randint(-5, 5, (8,), device=d,
                                                                dtype=torch.int32)]),
    "channels_last_scale": (channels_last_scale, [
        lambda d: torch.randn(2, 8, 4, 4, device=d).to(memory_format=torch.channels_last)]),
}


def golden_kernels(name):
    fn, makers = GOLDEN[name]
    groups = fusion.find_groups(trace(fn, makers).graph)
    return [codegen.generate(g) for g in groups]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_generated_source_matches_expected(name):
    kernels = golden_kernels(name)
    text = "\n".join(k.source for k in kernels)
    check_expected(f"cuda_{name}.cu", text)
    for kernel in kernels:  # named by a hash of the source written with a placeholder name
        unnamed = kernel.source.replace(kernel.name, "KERNEL_NAME")
        assert kernel.name.endswith(hashlib.sha256(unnamed.encode()).hexdigest()[:12])
    assert "\n".join(k.source for k in golden_kernels(name)) == text  # deterministic


def test_layouts_choose_linear_or_coordinate_indexing():
    (chain,) = golden_kernels("chain_f32")
    assert chain.vector == 4 and "c0" not in chain.source
    (bias,) = golden_kernels("bias_silu_bf16")
    assert bias.vector == 1 and "in1[c1]" in bias.source  # the broadcast bias by coordinate
    (transposed,) = golden_kernels("transposed_f16")
    # eager's output follows x.t()'s layout: x is read linearly, y (row-major) by coordinate
    assert transposed.outputs[0].stride == (1, 64) and transposed.notes["sizes"] == [128, 64]
    assert "fj_h2f(in0[i])" in transposed.source and "in1[c0 + c1 * 128u]" in transposed.source
    (nhwc,) = golden_kernels("channels_last_scale")  # dims ordered by strides: one linear dim
    assert nhwc.notes["sizes"] == [256] and nhwc.vector == 4


def test_scalars_are_float_math_and_constants_hold_their_dtype_value():
    def f(x):
        full = torch.full((64,), 0.1, dtype=torch.float16, device=x.device)
        return ((full + x) * 0.1,)

    (kernel,) = [codegen.generate(g) for g in fusion.find_groups(trace(f, [
        randn(64, dtype=torch.float16)]).graph)]
    assert "= 0.0999755859f;  // full.default" in kernel.source  # fp16(0.1)
    assert "* 0.100000001f)" in kernel.source  # float(0.1), as eager's CUDA kernels take it


# ---------------------------------------------------------------------------------------------
# Numbers: rewritten graphs run as native programs on CPU, kernels built for the host


def _pos(*shape, dtype=torch.float32):
    return lambda d: torch.rand(*shape, device=d, dtype=dtype) + 0.1


def unary_positive(x):
    return (x.log() + x.log2() + x.log10() + x.log1p() + x.sqrt() + x.rsqrt() + x.reciprocal()
            + x.pow(0.5) + x.pow(2.5) + x.pow(-1) + x.acos() * 0 + (x * 0.5).asin(),)


def unary_any(x):
    return (torch.exp(x) + x.exp2() + x.expm1() + x.sin() + x.cos() + x.tan() * 0.1 + x.tanh()
            + x.atan() + x.sinh() + x.cosh() + x.erf() + x.erfc() + x.sigmoid() + F.silu(x)
            + F.mish(x) + F.gelu(x) + F.gelu(x, approximate="tanh") + F.leaky_relu(x, 0.2)
            + F.elu(x) + F.softplus(x) + F.hardsigmoid(x) + F.hardswish(x) + F.hardtanh(x)
            + x.abs() + x.neg() + x.sign() + x.floor() + x.ceil() + x.trunc() + x.round()
            + x.frac() + x.square() + torch.clamp_min(x, 0.1) + torch.clamp_max(x, 0.2),)


def binary_broadcast(x, y, z):
    return (torch.maximum(x, y) - torch.minimum(y, z) * 2 + torch.add(x, z, alpha=0.5)
            + torch.sub(y, z, alpha=2) + (1 - x) + x / (y.abs() + 1) + torch.atan2(x, y)
            + torch.pow(y.abs() + 1, z) + torch.pow(2, x),)


def mixed_dtypes(a, b, c):
    h = a.float() * b + c.to(torch.float32)  # fp16 * fp32 + bf16
    return h.to(torch.bfloat16), (h > 0.5).logical_and(a < 0), h.to(torch.float16) * a


def integers(x, y, m):
    s = x * 3 + y - 7
    return (torch.where(m, s, -s), s // 1, (s & 6) ^ (y | 1), torch.bitwise_not(y), s.abs(), torch.relu(s),
            torch.clamp(y, -3, 3), (s > 2) | m.logical_not(), x.to(torch.int8) * 100)


def nan_propagation(x, y):
    return (torch.maximum(x, y) * 2, torch.minimum(x, y) * 2, torch.relu(x) * 2,
            torch.clamp(x, -0.5, 0.5) * 2, F.hardtanh(y) * 2, x.isnan() | (x != x))


def strided_views(x, y):
    a = x.t()  # transposed
    b = y.narrow(1, 3, 40)  # sliced, offset
    c = x.narrow(0, 0, 1).expand(40, 40)  # broadcast by stride 0
    return (a * b + c.sigmoid(), (b - a).exp())


def misaligned(x):
    return ((x.narrow(0, 1, 1001) * 2).sin() + 1,)  # offset by one element: scalar loop only


def zero_dim_and_empty(x, s, e):
    return (x * s + s.exp(), (e * 2).cos())


def constants_f16(x):
    full = torch.full((64,), 0.1, dtype=torch.float16, device=x.device)
    return (torch.where(x > 0, x, 0.1) * 3, (full + x) * 2)  # 0.1 as fp16 holds it


CASES = {
    "constants_f16": (constants_f16, [randn(64, dtype=torch.float16)], 1e-3),
    "unary_positive": (unary_positive, [_pos(33, 17)], 1e-5),
    "unary_any": (unary_any, [randn(1003)], 1e-4),
    "unary_any_bf16": (unary_any, [randn(515, dtype=torch.bfloat16)], 0.2),
    "binary_broadcast": (binary_broadcast, [randn(7, 1, 9), randn(5, 1), randn(9)], 1e-4),
    "mixed_dtypes": (mixed_dtypes, [randn(64, dtype=torch.float16), randn(64),
                                    randn(64, dtype=torch.bfloat16)], 2e-2),
    "integers": (integers, [lambda d: torch.randint(-100, 100, (50,), device=d),
                            lambda d: torch.randint(-100, 100, (50,), device=d, dtype=torch.int32),
                            lambda d: torch.randint(0, 2, (50,), device=d).bool()], 0),
    "nan_propagation": (nan_propagation, [
        lambda d: torch.tensor([float("nan"), 1.0, -2.0, 0.3, float("nan")], device=d),
        lambda d: torch.tensor([0.0, float("nan"), 3.0, -1.0, float("nan")], device=d)], 0),
    "strided_views": (strided_views, [randn(40, 40), randn(40, 50)], 1e-5),
    "misaligned": (misaligned, [randn(1002)], 1e-5),
    "zero_dim_and_empty": (zero_dim_and_empty, [randn(6, 5), randn(), randn(0, 3)], 1e-5),
    "chain_f32": (chain_f32, [randn(64, 256)], 1e-5),
    "bias_silu_bf16": (bias_silu_bf16, GOLDEN["bias_silu_bf16"][1], 2e-2),
    "transposed_f16": (transposed_f16, GOLDEN["transposed_f16"][1], 1e-2),
    "int_where_bool": (int_where_bool, GOLDEN["int_where_bool"][1], 0),
    "channels_last_scale": (channels_last_scale, GOLDEN["channels_last_scale"][1], 1e-6),
}


@needs_gxx
@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_graphs_equal_eager_with_kernels_run_on_the_host(name):
    fn, makers, tol = CASES[name]
    run, kernels, launchers = lower_for_host(fn, makers)
    assert kernels, "nothing was fused"
    torch.manual_seed(0)
    inputs = [m("cpu") for m in makers]
    out, ref = run(*inputs), fn(*inputs)
    assert all(launcher.calls == 1 for launcher in launchers)
    for got, want in zip(out, ref):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.stride() == want.stride() or got.numel() <= 1
        if tol == 0:
            assert torch.equal(got, want) or torch.allclose(got, want, equal_nan=True, atol=0, rtol=0)
        else:
            assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol, equal_nan=True)


def test_a_cuda_backend_graph_on_cpu_tensors_runs_as_native():
    def f(x):
        return torch.relu(x * 2 + 1).sin()

    counter = CompileCounter("cuda")
    compiled = framejit.compile(f, backend=counter)
    x = torch.randn(16)
    assert same(compiled(x), f(x))
    assert counter.compiled[0].variants == (1, 0)  # lowered to a program, nothing fused


@needs_gxx
def test_the_backend_end_to_end_with_host_kernels(monkeypatch, caplog):
    """framejit.compile(backend="cuda") with CPU values as the target and kernels built for the
    host: front end, native lowering, rewrite hook, program, output_code log."""
    from framejit._cuda import backend, launch
    monkeypatch.setattr(backend, "is_target", on_cpu)
    monkeypatch.setattr(nvrtc, "available", lambda: True)
    launchers = []

    def host_launcher(kernel, device, constants):
        launchers.append(cuda_host.HostLauncher(kernel, constants))
        return launchers[-1]

    monkeypatch.setattr(launch, "Launcher", host_launcher)

    def f(x, y):
        h = F.gelu(x * 2 + y)
        return torch.tanh(h @ h.t()).sigmoid() * 3, h - 1

    framejit.set_logs("output_code", handler=False)
    counter = CompileCounter("cuda")
    compiled = framejit.compile(f, backend=counter)
    x, y = torch.randn(8, 8), torch.randn(8)
    with caplog.at_level(logging.INFO, logger="framejit.output_code"), torch.no_grad():
        for _ in range(2):
            assert same(compiled(x, y), f(x, y), rtol=1e-5, atol=1e-6)
    assert counter.compiled[0].variants == (1, 0)
    assert [len(l.kernel.ops) for l in launchers] == [4, 3] and launchers[0].calls == 2
    (text,) = [r.getMessage() for r in caplog.records if r.name == "framejit.output_code"]
    assert text.count("CUDA KERNEL fj_") == 2 and "= fj_mul_4ops_" in text
    assert launchers[0].kernel.source in text and launchers[1].kernel.source in text


# ---------------------------------------------------------------------------------------------
# NVRTC


def all_kernels():
    kernels = [k for name in sorted(GOLDEN) for k in golden_kernels(name)]
    for name in sorted(CASES):
        fn, makers, _ = CASES[name]
        kernels += [codegen.generate(g) for g in fusion.find_groups(trace(fn, makers).graph)]
    return kernels


def _ptxas():
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and Path(home, "bin", "ptxas").exists():
            return str(Path(home, "bin", "ptxas"))
    return shutil.which("ptxas")


@needs_nvrtc
@pytest.mark.parametrize("arch", [80, 90])
def test_nvrtc_compiles_every_generated_source(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEJIT_CUDA_CACHE", str(tmp_path))
    ptxas = _ptxas()
    for kernel in all_kernels():
        ptx = nvrtc.compile_ptx(kernel.source, arch)
        assert f".target sm_{arch}" in ptx and f".entry {kernel.name}(" in ptx
        if ptxas:  # assembled to machine code too, as the driver would
            path = tmp_path / f"{kernel.name}.ptx"
            path.write_text(ptx)
            result = subprocess.run([ptxas, f"-arch=sm_{arch}", str(path), "-o",
                                     str(tmp_path / "out.cubin")], capture_output=True, text=True)
            assert result.returncode == 0, result.stderr


@needs_nvrtc
def test_ptx_cache_in_memory_and_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEJIT_CUDA_CACHE", str(tmp_path))
    (kernel,) = golden_kernels("chain_f32")
    source = kernel.source + "// cache test\n"
    ptx = nvrtc.compile_ptx(source, 80)
    (path,) = tmp_path.glob("*.ptx")
    assert path.name == nvrtc.cache_key(source, 80) + ".ptx" and path.read_text() == ptx
    nvrtc._memory.clear()
    path.write_text(ptx.replace(kernel.name, "from_disk"))  # what is read is what is on disk
    assert "from_disk" in nvrtc.compile_ptx(source, 80)
    nvrtc._memory.clear()
    path.write_text(ptx[:100])  # a truncated file is compiled again
    assert nvrtc.compile_ptx(source, 80) == ptx
    monkeypatch.setenv("FRAMEJIT_CUDA_CACHE", "")
    nvrtc._memory.clear()
    assert nvrtc.cache_dir() is None and nvrtc.compile_ptx(source, 80) == ptx


@needs_nvrtc
def test_nvrtc_errors_carry_the_log():
    with pytest.raises(nvrtc.NVRTCError, match="undefined"):
        nvrtc.compile_ptx('extern "C" __global__ void k() { undefined_thing(); }', 80)
