"""Runs generated CUDA kernels on the host, for tests on machines without a GPU.

A kernel's function (``Kernel.body``) and its helpers are plain C++ apart from a few CUDA
keywords and intrinsics; this file defines those for g++ (a single thread: blockIdx 0,
blockDim 1, gridDim 1, so the grid-stride loops cover every element, vector loop included) and
replaces the fp16 helpers, which are PTX, by the compiler's _Float16. The kernel then runs on
CPU tensors laid out as the CUDA ones it was generated for.
"""
import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from framejit._cuda.codegen import SNIPPETS, Kernel

HOST_PRELUDE = r"""
#include <math.h>
#include <string.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
struct fj_dim3 { unsigned int x, y, z; };
static const fj_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static const fj_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float fj_h2f(unsigned short h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
inline unsigned short fj_f2h(float f) {
  _Float16 x = (_Float16)f; unsigned short h; memcpy(&h, &x, 2); return h;
}
inline float fj_round_h(float f) { return fj_h2f(fj_f2h(f)); }
"""

_BUILD = Path(tempfile.gettempdir()) / "framejit_cuda_host"
_loaded = {}


def available() -> bool:
    return shutil.which("g++") is not None


def host_source(kernel: Kernel) -> str:
    helpers = "".join(SNIPPETS[h] for h in kernel.helpers if h != "fj_half")
    return HOST_PRELUDE + helpers + kernel.body


def _function(kernel: Kernel):
    source = host_source(kernel)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    if digest not in _loaded:
        _BUILD.mkdir(parents=True, exist_ok=True)
        src = _BUILD / f"{kernel.name}_{digest}.cpp"
        lib = _BUILD / f"{kernel.name}_{digest}.so"
        if not lib.exists():
            src.write_text(source)
            tmp = lib.with_suffix(".tmp.so")
            subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(tmp),
                            str(src)], check=True, capture_output=True, text=True)
            tmp.replace(lib)
        _loaded[digest] = ctypes.CDLL(str(lib))
    return getattr(_loaded[digest], kernel.name)


class HostLauncher:
    """Stands in for launch.Launcher: runs the kernel on CPU tensors."""

    def __init__(self, kernel: Kernel, constants=None):
        self.kernel = kernel
        self.constants = list(constants or [None] * len(kernel.inputs))
        self.function = _function(kernel)
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        outputs = [torch.empty_strided(o.shape, o.stride, dtype=o.dtype) for o in self.kernel.outputs]
        given = iter(args)
        inputs = [c if c is not None else next(given) for c in self.constants]
        for spec, tensor in zip(self.kernel.inputs, inputs):
            assert tuple(tensor.shape) == spec.shape and tuple(tensor.stride()) == spec.stride
            assert tensor.dtype == spec.dtype and tensor.device.type == "cpu"
        pointers = [ctypes.c_void_p(t.data_ptr()) for t in outputs + inputs]
        if self.kernel.numel:
            self.function(*pointers)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
