"""Loading generated kernels and launching them, through the CUDA driver API (libcuda.so.1) and
ctypes, on torch's current stream; outputs are allocated by torch with the strides eager gives.

GPU only: nothing here runs in framejit's CPU tests.
"""
import ctypes
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import nvrtc
from .codegen import BLOCK, Kernel

CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222
CUDA_ERROR_INVALID_PTX = 218
CUDA_ERROR_NO_BINARY_FOR_GPU = 209

_lock = threading.Lock()
_driver = None
_contexts: Dict[int, int] = {}  # device index -> primary context
_functions: Dict[Tuple[int, str], int] = {}  # (device, kernel name) -> CUfunction


class CUDADriverError(RuntimeError):
    def __init__(self, what: str, code: int):
        super().__init__(f"{what} failed: {_error_name(code)} ({code})")
        self.code = code


def driver():
    global _driver
    if _driver is None:
        lib = ctypes.CDLL("libcuda.so.1")
        p, c_int, c_uint = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        signatures = {
            "cuInit": [c_uint],
            "cuDeviceGet": [ctypes.POINTER(c_int), c_int],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(p), c_int],
            "cuCtxGetCurrent": [ctypes.POINTER(p)],
            "cuCtxPushCurrent_v2": [p],
            "cuCtxPopCurrent_v2": [ctypes.POINTER(p)],
            "cuModuleLoadData": [ctypes.POINTER(p), ctypes.c_char_p],
            "cuModuleGetFunction": [ctypes.POINTER(p), p, ctypes.c_char_p],
            "cuLaunchKernel": [p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, p,
                               ctypes.POINTER(p), ctypes.POINTER(p)],
            "cuGetErrorName": [c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = c_int
        _check(lib.cuInit(0), "cuInit")
        _driver = lib
    return _driver


def _error_name(code: int) -> str:
    if _driver is None:
        return "CUDA error"
    name = ctypes.c_char_p()
    _driver.cuGetErrorName(code, ctypes.byref(name))
    return name.value.decode() if name.value else "CUDA error"


def _check(code: int, what: str) -> None:
    if code != 0:
        raise CUDADriverError(what, code)


class _Context:
    """Makes the device's primary context (torch's) current for a driver call, when it is not."""

    def __init__(self, device: int):
        self.device = device

    def __enter__(self):
        lib = driver()
        with _lock:
            ctx = _contexts.get(self.device)
            if ctx is None:
                torch.cuda.init()
                handle = ctypes.c_int()
                _check(lib.cuDeviceGet(ctypes.byref(handle), self.device), "cuDeviceGet")
                context = ctypes.c_void_p()
                _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle),
                       "cuDevicePrimaryCtxRetain")
                ctx = _contexts[self.device] = context.value
        current = ctypes.c_void_p()
        lib.cuCtxGetCurrent(ctypes.byref(current))
        self.pushed = current.value != ctx
        if self.pushed:
            _check(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        return self

    def __exit__(self, *exc):
        if self.pushed:
            popped = ctypes.c_void_p()
            driver().cuCtxPopCurrent_v2(ctypes.byref(popped))


def load(kernel: Kernel, device: int) -> int:
    """The CUfunction of ``kernel`` on ``device``: PTX for the device's architecture (compiled
    or cached), or machine code when the driver is older than NVRTC's PTX."""
    key = (device, kernel.name)
    function = _functions.get(key)
    if function is not None:
        return function
    lib = driver()
    arch = nvrtc.arch_for(torch.cuda.get_device_capability(device))
    with _Context(device):
        module = ctypes.c_void_p()
        image = nvrtc.compile_ptx(kernel.source, arch, kernel.name + ".cu").encode() + b"\0"
        code = lib.cuModuleLoadData(ctypes.byref(module), image)
        if code in (CUDA_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_ERROR_INVALID_PTX,
                    CUDA_ERROR_NO_BINARY_FOR_GPU):
            image = nvrtc.compile_cubin(kernel.source, arch, kernel.name + ".cu")
            code = lib.cuModuleLoadData(ctypes.byref(module), image)
        _check(code, f"cuModuleLoadData({kernel.name})")
        handle = ctypes.c_void_p()
        _check(lib.cuModuleGetFunction(ctypes.byref(handle), module, kernel.name.encode()),
               f"cuModuleGetFunction({kernel.name})")
    _functions[key] = handle.value
    return handle.value


class Launcher:
    """Runs a kernel for a fused call: ``launcher(*inputs)`` -> output or tuple of outputs.
    ``constants[j]`` is the tensor for kernel input j when it is a module constant (then it is
    not among the call's arguments), else None."""

    def __init__(self, kernel: Kernel, device: torch.device,
                 constants: Optional[Sequence[Optional[torch.Tensor]]] = None):
        self.kernel = kernel
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.index = index
        self.constants = list(constants or [None] * len(kernel.inputs))
        self.function = load(kernel, index)
        sms = torch.cuda.get_device_properties(index).multi_processor_count
        self.grid = kernel.grid(max_blocks=sms * (2048 // BLOCK) * 4)
        self.outputs = [(o.shape, o.stride, o.dtype) for o in kernel.outputs]
        self.count = len(kernel.outputs) + len(kernel.inputs)
        self.single = len(kernel.outputs) == 1

    def __call__(self, *args):
        outputs = [torch.empty_strided(shape, stride, dtype=dtype, device=self.device)
                   for shape, stride, dtype in self.outputs]
        if self.kernel.numel:
            pointers: List[int] = [t.data_ptr() for t in outputs]
            given = iter(args)
            for constant in self.constants:
                pointers.append((constant if constant is not None else next(given)).data_ptr())
            values = (ctypes.c_void_p * self.count)(*pointers)
            base = ctypes.addressof(values)
            size = ctypes.sizeof(ctypes.c_void_p)
            params = (ctypes.c_void_p * self.count)(*[base + i * size for i in range(self.count)])
            stream = torch.cuda.current_stream(self.index).cuda_stream
            with _Context(self.index):
                _check(driver().cuLaunchKernel(self.function, self.grid, 1, 1, BLOCK, 1, 1, 0,
                                               stream, params, None),
                       f"cuLaunchKernel({self.kernel.name})")
        return outputs[0] if self.single else tuple(outputs)
