"""``backend="cuda"``: the native backend with element-wise chains on CUDA tensors fused into
kernels generated and compiled (NVRTC) when a graph is lowered; see docs/cuda.md."""
import logging
import torch

from .._native import PythonCall, native
from . import codegen, fusion, nvrtc

log = logging.getLogger("framejit.cuda")
_warned = set()
is_target = fusion.is_cuda  # the values that fuse (tests run the whole path on CPU values)


def _warn_once(key: str, message: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def rewrite(aten_gm: torch.fx.GraphModule, args) -> str:
    """The native backend's rewrite hook: fuses, compiles, and replaces each group by a call of
    its launcher. Returns the kernels' sources for the output_code log."""
    groups = fusion.find_groups(aten_gm.graph, args, is_target=is_target,
                                grad_enabled=torch.is_grad_enabled())
    if not groups:
        return ""
    if not nvrtc.available():
        _warn_once("nvrtc", "cuda backend: no fusion (%s); graphs run as in the native backend",
                   _nvrtc_reason())
        return ""
    from . import launch
    kept, calls, texts = [], [], []
    for group in groups:
        kernel = codegen.generate(group)
        device = group.outputs[0].meta["val"].device
        try:
            launcher = launch.Launcher(kernel, device, fusion.constants(aten_gm, group))
        except Exception as e:  # noqa: BLE001 -- this group keeps its own ops
            _warn_once(kernel.name, "cuda backend: %s not used: %s: %s", kernel.name,
                       type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            continue
        kept.append(group)
        calls.append(PythonCall(kernel.name, launcher, len(group.outputs)))
        texts.append(f"\nCUDA KERNEL {kernel.name} (fuses {', '.join(n.name for n in group.nodes)})"
                     f"\n{kernel.source}")
    if kept:
        fusion.apply(aten_gm, kept, calls)
    return "".join(texts)


def _nvrtc_reason() -> str:
    try:
        nvrtc.library()
        return ""
    except nvrtc.NVRTCError as e:
        return str(e)


def cuda(gm: torch.fx.GraphModule, example_inputs) -> object:
    return native(gm, example_inputs, rewrite=rewrite)
