"""NVRTC through ctypes: CUDA C++ source to PTX at run time, cached in memory and on disk.

libnvrtc is looked up in this order: $FRAMEJIT_NVRTC (a path), the pip packages
``nvidia-cuda-nvrtc-cu12`` / ``-cu13`` (those matching torch's CUDA major first; torch's CUDA
wheels depend on them), torch/lib, $CUDA_HOME / $CUDA_PATH / /usr/local/cuda, then the loader's
search path. No GPU is needed to compile.

The disk cache holds PTX text only, one file per (source, architecture, NVRTC version,
options): ``$FRAMEJIT_CUDA_CACHE`` or ``~/.cache/framejit/cuda``, ``<sha256>.ptx``; set
``FRAMEJIT_CUDA_CACHE=`` (empty) to turn it off. A cached file is text handed to the driver's
PTX assembler, never deserialised into Python objects.
"""
import ctypes
import ctypes.util
import glob
import hashlib
import os
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

OPTIONS = ("--std=c++17",)  # no fast math: libm accuracy as in eager's kernels

_lock = threading.Lock()
_lib = None
_lib_error: Optional[str] = None
_memory: Dict[str, str] = {}


class NVRTCError(RuntimeError):
    pass


def _candidates() -> List[str]:
    found = []
    if os.environ.get("FRAMEJIT_NVRTC"):
        found.append(os.environ["FRAMEJIT_NVRTC"])
    major = None
    try:
        import torch
        major = (torch.version.cuda or "").split(".")[0] or None
    except Exception:  # noqa: BLE001
        pass
    packaged = []
    try:
        import nvidia  # namespace package of NVIDIA's pip wheels
        for root in list(nvidia.__path__):
            packaged += glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*"))
            packaged += glob.glob(os.path.join(root, "*", "lib64", "libnvrtc.so*"))
    except ImportError:
        pass
    packaged = [p for p in packaged if ".alt." not in p and "builtins" not in p]
    # the package matching torch's CUDA first: its PTX is what torch's driver runs
    packaged.sort(key=lambda p: (major is None or not p.split(".so.")[-1].startswith(major), p))
    found += packaged
    try:
        import torch
        found += sorted(p for p in glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib",
                                                          "libnvrtc*.so*")) if "builtins" not in p)
    except Exception:  # noqa: BLE001
        pass
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
                found += sorted(glob.glob(os.path.join(home, sub, "libnvrtc.so*")))
    found = [p for p in found if "builtins" not in p]
    name = ctypes.util.find_library("nvrtc")
    if name:
        found.append(name)
    found += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    return list(dict.fromkeys(found))


def library():
    """The loaded libnvrtc (ctypes.CDLL); raises NVRTCError when there is none."""
    global _lib, _lib_error
    with _lock:
        if _lib is None and _lib_error is None:
            errors = []
            for path in _candidates():
                try:
                    lib = ctypes.CDLL(path)
                    lib.nvrtcVersion  # noqa: B018 -- a libnvrtc, not something else
                except (OSError, AttributeError) as e:
                    errors.append(f"{path}: {e}")
                    continue
                _declare(lib)
                _lib = lib
                break
            else:
                _lib_error = "libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12, or set " \
                             "FRAMEJIT_NVRTC); tried " + "; ".join(errors[-3:])
        if _lib is None:
            raise NVRTCError(_lib_error)
        return _lib


def available() -> bool:
    try:
        library()
        return True
    except NVRTCError:
        return False


def _declare(lib):
    p, c_int, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    char_pp = ctypes.POINTER(ctypes.c_char_p)
    signatures = {
        "nvrtcVersion": [ctypes.POINTER(c_int), ctypes.POINTER(c_int)],
        "nvrtcCreateProgram": [ctypes.POINTER(p), ctypes.c_char_p, ctypes.c_char_p, c_int,
                               char_pp, char_pp],
        "nvrtcCompileProgram": [p, c_int, char_pp],
        "nvrtcDestroyProgram": [ctypes.POINTER(p)],
        "nvrtcGetProgramLogSize": [p, ctypes.POINTER(size)],
        "nvrtcGetProgramLog": [p, ctypes.c_char_p],
        "nvrtcGetPTXSize": [p, ctypes.POINTER(size)],
        "nvrtcGetPTX": [p, ctypes.c_char_p],
        "nvrtcGetCUBINSize": [p, ctypes.POINTER(size)],
        "nvrtcGetCUBIN": [p, ctypes.c_char_p],
        "nvrtcGetNumSupportedArchs": [ctypes.POINTER(c_int)],
        "nvrtcGetSupportedArchs": [ctypes.POINTER(c_int)],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = argtypes
            fn.restype = c_int
    lib.nvrtcGetErrorString.argtypes = [c_int]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p


def version() -> Tuple[int, int]:
    lib = library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def supported_archs() -> List[int]:
    """Compute capabilities this NVRTC compiles for, as 80, 90, ..."""
    lib = library()
    if not hasattr(lib, "nvrtcGetSupportedArchs"):
        return []
    count = ctypes.c_int()
    lib.nvrtcGetNumSupportedArchs(ctypes.byref(count))
    archs = (ctypes.c_int * count.value)()
    lib.nvrtcGetSupportedArchs(archs)
    return list(archs)


def arch_for(capability: Tuple[int, int]) -> int:
    """The newest architecture NVRTC supports that the device runs (its own when supported)."""
    wanted = capability[0] * 10 + capability[1]
    archs = [a for a in supported_archs() if a <= wanted]
    return max(archs) if archs else wanted


def cache_dir() -> Optional[Path]:
    value = os.environ.get("FRAMEJIT_CUDA_CACHE")
    if value is None:
        return Path.home() / ".cache" / "framejit" / "cuda"
    return Path(value) if value else None


def cache_key(source: str, arch: int, kind: str = "ptx") -> str:
    text = "\0".join([source, f"{kind}_{arch}", "%d.%d" % version(), *OPTIONS])
    return hashlib.sha256(text.encode()).hexdigest()


def compile_ptx(source: str, arch: int = 80, name: str = "kernel.cu") -> str:
    """PTX text of ``source`` for ``compute_<arch>``, from the memory or disk cache when there."""
    key = cache_key(source, arch)
    ptx = _memory.get(key)
    if ptx is not None:
        return ptx
    directory = cache_dir()
    path = directory / f"{key}.ptx" if directory is not None else None
    if path is not None and path.is_file():
        try:
            text = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            text = ""
        if ".entry" in text and text.rstrip().endswith("}"):  # complete, else compile again
            _memory[key] = text
            return text
    ptx = _compile(source, f"--gpu-architecture=compute_{arch}", name, cubin=False).decode("ascii")
    _memory[key] = ptx
    if path is not None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(ptx, encoding="ascii")
            os.replace(tmp, path)  # readers see the old file or the whole new one
        except OSError:
            pass  # a read-only cache directory only costs compile time
    return ptx


def compile_cubin(source: str, arch: int, name: str = "kernel.cu") -> bytes:
    """Machine code for ``sm_<arch>`` (in memory only): for drivers older than the NVRTC, which
    reject its PTX version."""
    return _compile(source, f"--gpu-architecture=sm_{arch}", name, cubin=True)


def _compile(source: str, arch_option: str, name: str, cubin: bool) -> bytes:
    lib = library()
    program = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(),
                                       0, None, None), "nvrtcCreateProgram")
    try:
        options = [arch_option.encode()] + [o.encode() for o in OPTIONS]
        array = (ctypes.c_char_p * len(options))(*options)
        result = lib.nvrtcCompileProgram(program, len(options), array)
        if result != 0:
            raise NVRTCError(f"NVRTC could not compile {name}: "
                             f"{lib.nvrtcGetErrorString(result).decode()}\n{_log(lib, program)}")
        size = ctypes.c_size_t()
        get_size, get = ((lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if cubin
                         else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX))
        _check(lib, get_size(program, ctypes.byref(size)), "size")
        buffer = ctypes.create_string_buffer(size.value)
        _check(lib, get(program, buffer), "get")
        return buffer.raw[:size.value].rstrip(b"\0") if not cubin else buffer.raw[:size.value]
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def _log(lib, program) -> str:
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    buffer = ctypes.create_string_buffer(max(1, size.value))
    lib.nvrtcGetProgramLog(program, buffer)
    return buffer.value.decode(errors="replace")


def _check(lib, result: int, what: str) -> None:
    if result != 0:
        raise NVRTCError(f"{what}: {lib.nvrtcGetErrorString(result).decode()}")
