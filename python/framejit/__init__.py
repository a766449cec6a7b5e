"""framejit: a C++ front end for torch.compile.

``@framejit.compile(backend=...)`` runs a function (or ``nn.Module``) with a PEP 523 frame hook
that traces its bytecode with meta tensors into FX graphs, guards what it assumed, and hands each
graph to a torch.compile backend.
"""
import os as _os

import torch  # noqa: F401  (libtorch must be loaded before _C)

from . import _C, _support

_C._init(_support)

from . import _logging, _skip, backends, config  # noqa: E402
from ._compile import CompiledModule, compile, disable, reset  # noqa: E402
from ._skip import allow_in_graph, skip_files, trace_files  # noqa: E402
from ._explain import ExplainOutput, explain  # noqa: E402
from ._dynamic import mark_dynamic, mark_static, maybe_mark_dynamic  # noqa: E402
from ._logging import set_logs  # noqa: E402
from .exc import FramejitWarning, RankDivergence, Unsupported  # noqa: E402

_skip.apply()
_logging.init_from_env()
if _os.environ.get("FRAMEJIT_INJECT_FAULT"):  # tests: site:n (framejit.testing.inject_fault)
    _site, _, _n = _os.environ["FRAMEJIT_INJECT_FAULT"].partition(":")
    _C._inject_fault(_site, int(_n or 1))

__all__ = [
    "compile", "disable", "explain", "allow_in_graph", "skip_files", "trace_files", "ExplainOutput", "reset", "set_logs", "backends", "config", "Unsupported",
    "FramejitWarning", "RankDivergence", "CompiledModule", "mark_dynamic", "maybe_mark_dynamic", "mark_static",
]
__version__ = "0.1.0"
