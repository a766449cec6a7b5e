"""Which files the frame hook leaves alone: torch, the standard library, site-packages and
framejit itself (a compiled function living in site-packages is traced even so)."""
import os
import site
import sysconfig

import torch

from . import _C

_allowed = []


def _dir(path: str) -> str:
    return os.path.join(os.path.realpath(path), "")


def _skip_prefixes():
    paths = {os.path.dirname(torch.__file__), os.path.dirname(__file__)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        value = sysconfig.get_paths().get(key)
        if value:
            paths.add(value)
    for getter in (getattr(site, "getsitepackages", None), getattr(site, "getusersitepackages", None)):
        if getter is None:
            continue
        found = getter()
        paths.update([found] if isinstance(found, str) else found)
    prefixes = set()
    for path in paths:
        prefixes.add(os.path.join(path, ""))
        prefixes.add(_dir(path))
    return sorted(prefixes)


_SKIP = _skip_prefixes()


def apply() -> None:
    _C.set_skip_rules(_SKIP, sorted(set(_allowed)))


def allow_file_of(fn) -> None:
    """Trace fn's own file even if it lies under a skipped prefix (a package in site-packages);
    for torch's own files (a torch.nn module compiled directly) only fn's code."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return
    filename = code.co_filename
    if filename.startswith(os.path.join(os.path.dirname(torch.__file__), "")):
        _C.allow_code(code)
        return
    if any(filename.startswith(p) for p in _SKIP):
        package_dir = os.path.join(os.path.dirname(filename), "")
        if package_dir not in _allowed:
            _allowed.append(package_dir)
            apply()
