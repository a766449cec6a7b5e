"""Element-wise chains on a GPU: framejit backend="cuda" vs eager vs torch.compile (inductor).

Run from the repository root (a CUDA device is required; about 1-2 minutes on an H200):

    python3 benchmarks/cuda_chains.py            # framejit from ./python if built, else installed
    python3 benchmarks/cuda_chains.py --quick    # 1e6 and 1e7 elements only

Chains of 8, 16 and 32 ops (cycling through x*1.01, +y, sigmoid, -0.5, tanh, *y, relu, +0.25)
on two inputs of 1e6, 1e7 and 1e8 elements, float32 and bfloat16, under torch.no_grad(). Time per
call is the best of 3 CUDA-event-timed loops. Achieved bandwidth counts the bytes a fused kernel
must move (two inputs read, one output written) over the time, compared with the device's copy
bandwidth (a 1 GiB tensor copy: bytes read + written over its time). Writes
benchmarks/results/cuda_chains.md. Stops starting new configurations after --budget seconds
(default 150) so the whole run stays under 3 minutes.
"""
import argparse
import math
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _import_framejit():
    """framejit from this source tree when its _C is built for this Python, else installed."""
    sys.path.insert(0, str(ROOT / "python"))
    try:
        import framejit  # noqa: F401
        return
    except ImportError:
        sys.path.pop(0)
        for name in [m for m in sys.modules if m == "framejit" or m.startswith("framejit.")]:
            del sys.modules[name]
    import framejit  # noqa: F401


_import_framejit()
import framejit  # noqa: E402
from framejit._cuda import launch, nvrtc  # noqa: E402

OPS = ["h * 1.01", "h + y", "torch.sigmoid(h)", "h - 0.5", "torch.tanh(h)", "h * y",
       "torch.relu(h)", "h + 0.25"]


def make_chain(length):
    """A straight-line function of ``length`` ops, with its own code object (exec), so that
    neither compiler's per-code recompile limit is shared between chain lengths."""
    lines = [f"def chain_{length}(x, y):", "    h = x"]
    lines += [f"    h = {OPS[i % len(OPS)]}" for i in range(length)]
    lines.append("    return h")
    namespace = {"torch": torch}
    exec("\n".join(lines), namespace)  # noqa: S102 -- our own generated text
    return namespace[f"chain_{length}"]


def time_ms(fn, target_s=0.04):
    """Best of 3 loops, each about target_s long, in ms per call (CUDA events)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = time.perf_counter() - start
    n = max(2, min(500, int(target_s / max(once, 1e-6))))
    best = math.inf
    for _ in range(3):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        best = min(best, begin.elapsed_time(end) / n)
    return best


def copy_bandwidth():
    src = torch.empty(2 ** 28, dtype=torch.float32, device="cuda").fill_(1.0)  # 1 GiB
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), target_s=0.2)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9  # GB/s


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--budget", type=float, default=150.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cuda_chains.md"))
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cuda_chains.py needs a CUDA device")
    began = time.perf_counter()
    torch.manual_seed(0)
    torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)
    peak = copy_bandwidth()
    sizes = [10 ** 6, 10 ** 7] + ([] if opts.quick else [10 ** 8])
    lengths = [8, 16, 32]
    dtypes = [torch.float32, torch.bfloat16]
    compiled = {}  # one compiled function per (backend, length): sizes and dtypes re-key inside
    rows, skipped = [], []
    for dtype in dtypes:
        for length in lengths:
            chain = make_chain(length)
            fj = compiled.setdefault(("fj", length), framejit.compile(chain, backend="cuda"))
            ind = compiled.setdefault(("ind", length), torch.compile(chain, backend="inductor",
                                                                     dynamic=False))
            for numel in sizes:
                config = f"{str(dtype)[6:]} n={numel:.0e} ops={length}"
                if time.perf_counter() - began > opts.budget:
                    skipped.append(config)
                    continue
                x = torch.randn(numel, device="cuda", dtype=dtype)
                y = torch.rand(numel, device="cuda", dtype=dtype)
                with torch.no_grad():
                    ref = chain(x, y)
                    kernels_before = len(launch._functions)
                    out_fj = fj(x, y)
                    kernels = len(launch._functions) - kernels_before
                    out_ind = ind(x, y)
                    tol = 1e-4 if dtype == torch.float32 else 5e-2
                    ok_fj = torch.allclose(out_fj.float(), ref.float(), rtol=tol, atol=tol)
                    ok_ind = torch.allclose(out_ind.float(), ref.float(), rtol=tol, atol=tol)
                    t_eager = time_ms(lambda: chain(x, y))
                    t_fj = time_ms(lambda: fj(x, y))
                    t_ind = time_ms(lambda: ind(x, y))
                moved = 3 * numel * x.element_size()  # x, y read; output written
                gbs = {k: moved / (t * 1e-3) / 1e9 for k, t in
                       (("eager", t_eager), ("fj", t_fj), ("ind", t_ind))}
                rows.append(dict(config=config, dtype=str(dtype)[6:], numel=numel, ops=length,
                                 eager=t_eager, fj=t_fj, ind=t_ind, gbs=gbs, kernels=kernels,
                                 ok_fj=ok_fj, ok_ind=ok_ind))
                print(f"{config:32s} eager {t_eager:8.3f} ms  framejit-cuda {t_fj:8.3f} ms "
                      f"({gbs['fj']:6.0f} GB/s, {100 * gbs['fj'] / peak:5.1f}% of copy)  "
                      f"inductor {t_ind:8.3f} ms ({gbs['ind']:6.0f} GB/s)  kernels={kernels} "
                      f"match={ok_fj}/{ok_ind}", flush=True)
                del x, y, ref, out_fj, out_ind
    write_report(opts.out, rows, skipped, peak, time.perf_counter() - began)


def write_report(path, rows, skipped, peak, elapsed):
    props = torch.cuda.get_device_properties(0)
    try:
        nvrtc_version = "%d.%d" % nvrtc.version()
    except Exception as e:  # noqa: BLE001
        nvrtc_version = f"unavailable ({e})"
    lines = [
        "# Element-wise chains: framejit backend=\"cuda\" vs eager vs inductor", "",
        f"Generated by `benchmarks/cuda_chains.py` on {time.strftime('%Y-%m-%d %H:%M')} in "
        f"{elapsed:.0f} s.", "",
        f"- Device: {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, NVRTC {nvrtc_version}, Python {platform.python_version()}",
        f"- Copy bandwidth (1 GiB tensor copy, read + written): **{peak:.0f} GB/s**",
        "- Bandwidth = bytes a fused kernel must move (2 inputs + 1 output) / time; eager moves "
        "far more (every op reads and writes), so its figure is an effective one.",
        "- `kernels`: generated kernels loaded when framejit lowered that configuration (1 = the "
        "whole chain fused); `match`: output allclose to eager (fp32 1e-4, bf16 5e-2; both fused "
        "versions keep bf16 intermediates in float, eager rounds after every op).", "",
        "| dtype | elements | ops | eager ms | framejit ms | inductor ms | framejit GB/s "
        "| % copy | inductor GB/s | % copy | eager/framejit | inductor/framejit | kernels "
        "| match |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['numel']:.0e} | {r['ops']} | {r['eager']:.3f} | {r['fj']:.3f} "
            f"| {r['ind']:.3f} | {r['gbs']['fj']:.0f} | {100 * r['gbs']['fj'] / peak:.0f}% "
            f"| {r['gbs']['ind']:.0f} | {100 * r['gbs']['ind'] / peak:.0f}% "
            f"| {r['eager'] / r['fj']:.2f} | {r['ind'] / r['fj']:.2f} | {r['kernels']} "
            f"| {'yes' if r['ok_fj'] else 'NO'}/{'yes' if r['ok_ind'] else 'NO'} |")
    if rows:
        geo = lambda xs: math.exp(sum(math.log(v) for v in xs) / len(xs))  # noqa: E731
        lines += ["", f"Geometric means over {len(rows)} configurations: eager/framejit "
                  f"{geo([r['eager'] / r['fj'] for r in rows]):.2f}x, inductor/framejit "
                  f"{geo([r['ind'] / r['fj'] for r in rows]):.2f}x."]
        big = [r for r in rows if r["numel"] >= 10 ** 7]
        if big:
            lines.append(f"At 1e7+ elements framejit reaches {100 * geo([r['gbs']['fj'] for r in big]) / peak:.0f}% "
                         f"of copy bandwidth (geometric mean), inductor "
                         f"{100 * geo([r['gbs']['ind'] for r in big]) / peak:.0f}%.")
    if skipped:
        lines += ["", f"Not run (time budget): {', '.join(skipped)}."]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
