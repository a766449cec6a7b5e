"""The CUDA backend: element-wise chains of a lowered aten graph fused into kernels generated as
CUDA C++, compiled at run time with NVRTC and launched through the driver API (docs/cuda.md).

fusion.py finds and replaces the groups, codegen.py writes the kernels (ops.py: the op table),
nvrtc.py compiles them, launch.py loads and runs them, backend.py joins them to the native backend.
"""
from .backend import cuda, rewrite
from .codegen import Kernel, generate
from .fusion import Group, apply, find_groups

__all__ = ["Group", "Kernel", "apply", "cuda", "find_groups", "generate", "rewrite"]
