"""framejit.compile, framejit.disable and the module wrapper."""
import functools
import warnings

import torch

from . import _C, _distributed, _skip, backends, config
from .exc import FramejitWarning

_nn_module = torch.nn.modules.module
_jit_tracing = torch._C._get_tracing_state
_MODULE_CALL = torch.nn.Module.__call__  # FX's tracer patches it while tracing

_KNOWN_OPTIONS = {"recompile_limit"}


class CompiledModule(torch.nn.Module):
    """What ``framejit.compile(module)`` returns: shares the module's parameters and buffers (it
    holds the module as ``_orig_mod``, as torch.compile does) and calls it through the hook, so
    ``forward`` and anything it calls are traced while the module's own hooks run as usual."""

    def __init__(self, mod: torch.nn.Module, compiled_call, compile_kwargs=None):
        super().__init__()
        self._orig_mod = mod
        d = self.__dict__
        d["_framejit_compile_kwargs"] = dict(compile_kwargs or {})  # to compile it again
        d["_framejit_call"] = compiled_call  # calls mod(...): nn.Module.__call__, hooks included
        d["_framejit_mod"] = mod
        d["_framejit_forward"] = type(mod).forward
        # type(mod).forward(mod, ...) through the hook: what nn.Module.__call__ ends in when no
        # hook of any kind is registered (same backend, options and cache as _framejit_call).
        d["_framejit_forward_call"] = _C.make_compiled_like(compiled_call, type(mod).forward)

    def __call__(self, *args, **kwargs):
        # nn.Module.__call__ twice (this wrapper, then the module) costs two Python frames of
        # hook checks per call; with no hook anywhere both would only call forward.
        d = self.__dict__
        mod = d["_framejit_mod"]
        md = mod.__dict__
        if (d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_backward_hooks"]
                or d["_backward_pre_hooks"] or md["_forward_hooks"] or md["_forward_pre_hooks"]
                or md["_backward_hooks"] or md["_backward_pre_hooks"]
                or _nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks
                or _nn_module._global_backward_hooks or _nn_module._global_backward_pre_hooks
                or "forward" in md or "forward" in d
                or type(mod).forward is not d["_framejit_forward"]
                or d.get("_compiled_call_impl") is not None or md.get("_compiled_call_impl") is not None
                or type(mod).__call__ is not _MODULE_CALL or torch.nn.Module.__call__ is not _MODULE_CALL
                or _jit_tracing()):
            return torch.nn.Module.__call__(self, *args, **kwargs)
        return d["_framejit_forward_call"](mod, *args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._framejit_call(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._orig_mod, name)

    def __setattr__(self, name, value):
        # The module's attributes live on the module: `cm.scale = 2` and `cm.count += 1` change
        # what the compiled forward reads, as they would on the module itself. The wrapper keeps
        # only its own state (set while it is made, and nn.Module's bookkeeping).
        d = self.__dict__
        if "_orig_mod" not in d.get("_modules", {}) or name in d or name == "_orig_mod":
            super().__setattr__(name, value)
        else:
            setattr(d["_modules"]["_orig_mod"], name, value)

    def __delattr__(self, name):
        if name in self.__dict__ or name == "_orig_mod":
            super().__delattr__(name)
        else:
            delattr(self._orig_mod, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)))

    def __reduce__(self):
        # Pickled (torch.save) as the module and how it was compiled: loading compiles it again.
        # The compiled call itself (C++ state, regions) is not picklable and is not needed.
        return (functools.partial(compile, **self.__dict__["_framejit_compile_kwargs"]),
                (self._orig_mod,))


def compile(fn=None, *, backend="eager", fullgraph=False, dynamic=None, options=None, mode=None,
            warm_branches=False):
    """Compile a function or ``nn.Module`` with framejit.

    Works as ``@framejit.compile``, ``@framejit.compile(backend=...)`` and
    ``framejit.compile(fn_or_module, ...)``. ``backend`` is a registered name (``"eager"``,
    ``"inductor"``, any torch.compile backend) or a callable ``backend(gm, example_inputs)``.
    ``fullgraph=True`` raises :class:`framejit.Unsupported` at the first graph break.
    ``warm_branches=True`` also compiles, at the first call, the side of every data-dependent
    branch that call does not take, so later calls taking it compile nothing.
    ``dynamic``: as torch.compile's. framejit's own backends run any size already; for the others
    (inductor, your callables) ``None`` compiles static first and makes a dim symbolic once its
    size changed at a place that compiled before, ``True`` makes the frame's own tensors
    symbolic from the first call, ``False`` never (see also :func:`framejit.mark_dynamic`). A
    size read into Python stays specialised either way.
    ``options``: ``{"recompile_limit": int}``.
    """
    if fn is None:
        return functools.partial(compile, backend=backend, fullgraph=fullgraph, dynamic=dynamic,
                                 options=options, mode=mode, warm_branches=warm_branches)
    opts = dict(options or {})
    unknown = set(opts) - _KNOWN_OPTIONS
    if unknown:
        raise ValueError(f"framejit.compile: unknown option(s) {sorted(unknown)}; "
                         f"known: {sorted(_KNOWN_OPTIONS)}")
    recompile_limit = int(opts.get("recompile_limit", config.recompile_limit))
    if recompile_limit < 1:
        raise ValueError("framejit.compile: recompile_limit must be at least 1")
    if mode is not None:
        warnings.warn(f"framejit.compile(mode={mode!r}) is ignored", FramejitWarning, stacklevel=2)
    backend_fn, backend_name = backends.lookup(backend)
    # A trace that reads no size into Python holds for any size when the backend runs any size.
    any_sizes = dynamic is not False and bool(getattr(backend_fn, "framejit_shape_generic", False))
    backend_fn = _distributed.ddp_aware(backend_fn)
    # Compiles of a DDP / FSDP2 model are compared across ranks (framejit.config.check_ranks).
    on_region = (_distributed.RankCheck() if config.check_ranks is True or (
        config.check_ranks == "auto" and isinstance(fn, torch.nn.Module)
        and _distributed.is_distributed_module(fn)) else None)
    _skip.prepare_libraries()
    if isinstance(fn, torch.nn.Module):
        call = _C.make_compiled(fn, backend_fn, backend_name, bool(fullgraph), recompile_limit,
                                bool(warm_branches), on_region=on_region, any_sizes=any_sizes,
                                dynamic=-1 if dynamic is None else int(bool(dynamic)),
                                entry_code=_skip.allow_module(fn))
        return CompiledModule(fn, call, dict(backend=backend, fullgraph=fullgraph, dynamic=dynamic,
                                             options=options, mode=mode,
                                             warm_branches=warm_branches))
    if not callable(fn):
        raise TypeError(f"framejit.compile expects a function or nn.Module, got {type(fn).__name__}")
    compiled = _C.make_compiled(fn, backend_fn, backend_name, bool(fullgraph), recompile_limit,
                                bool(warm_branches), on_region=on_region, any_sizes=any_sizes,
                                dynamic=-1 if dynamic is None else int(bool(dynamic)),
                                entry_code=_skip.allow_file_of(fn))
    functools.update_wrapper(compiled, fn)
    return compiled


def disable(fn=None):
    """Run fn (and everything it calls) in plain Python, even inside a compiled function."""
    if fn is None:
        return disable
    wrapped = _C.make_disabled(fn)
    functools.update_wrapper(wrapped, fn)
    return wrapped


def reset() -> None:
    """Drop every compiled region of every function; the next calls trace again.

    The memo of meta results (what each torch op returns for given argument metadata) is kept:
    it depends only on torch, like the dispatch cache of FakeTensor that torch._dynamo.reset()
    keeps. ``framejit._C.clear_meta_cache()`` drops it."""
    _C.reset()
