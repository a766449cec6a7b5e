"""The trace policy: which files the frame hook traces (and the tracer inlines).

As torch.compile does: third-party packages (site-packages) are traced; the standard library is
not (the parts the tracer models, such as functools.partial or dataclass-generated methods, are
handled by the tracer itself); torch's own files are leaves, except the optimizers (TRACED_TORCH)
and the Python the tracer inlines by name (torch.nn modules and their helpers); framejit itself
never. A few third-party packages
that are C libraries behind thin Python wrappers, tooling or tracing machinery are leaves too
(SKIPPED_PACKAGES). Users change the policy with framejit.skip_files / framejit.trace_files; the
longest matching prefix decides."""
import functools
import os
import site
import sys
import sysconfig
import types

import torch

from . import _C, _support

# Third-party packages never traced: numerical C libraries with Python wrappers (their Python
# layer only dispatches), test and tooling frameworks, and compiler machinery. (einops is
# traced, as torch.compile traces it: its functions become the torch ops they call.)
SKIPPED_PACKAGES = (
    "numpy", "scipy", "pandas", "sklearn", "PIL", "matplotlib", "sympy", "mpmath", "networkx",
    "triton", "_pytest", "pytest", "pluggy", "tqdm", "IPython", "ipykernel", "jinja2",
    "markupsafe", "filelock", "fsspec", "safetensors", "tokenizers", "regex",
    "yaml", "packaging", "setuptools", "pip", "psutil", "requests", "urllib3",
    "typing_extensions.py", "six.py",
)

# Files of the standard library that are traced all the same: plain Python the tracer handles,
# which libraries call on their own classes (a Mapping subclass's `in` and `.get` are
# collections.abc's mixin methods; transformers' ModelOutput asks dataclasses.fields(self)).
# Inlined only: called from untraced code (FSDP's hooks ask dataclasses.is_dataclass), their
# frames run as plain Python, as does code made by exec (dataclass and namedtuple methods,
# file "<string>") unless compiled itself.
TRACED_STDLIB = ("_collections_abc.py", "dataclasses.py")
EXEC_FILE = "<string>"

# torch's own Python that is traced, as torch.compile inlines it: the optimizers (their step()
# records the update into a graph; what torch marks with torch._disable_dynamo, such as
# zero_grad, still runs as plain Python) and the helpers they call. torch.nn's modules and
# functional are inlined by name (trace/calls.cpp, is_user_function).
TRACED_TORCH = ("optim", "utils/_foreach_utils.py")

# torch's Python inlined where traced code calls it (never hooked on its own: torch's internals
# call it all the time): pytree's flatten / unflatten / tree_map, which libraries call on their
# arguments (x-transformers, accelerate), and clip_grad_norm_ / clip_grad_value_ of a training
# step, as torch.compile inlines them. Its TreeSpec objects are
# made in the trace as instances of any plain class are (_support.plain_class_init).
INLINED_TORCH = ("utils/_pytree.py", "nn/utils/clip_grad.py")

SKIP, TRACE, INLINE_ONLY = 0, 1, 2  # the C++ TraceRule values

_allowed = []     # directories traced because a compiled function lives there
_user_rules = []  # (prefix, traced) from skip_files / trace_files


def _forms(path: str):
    """The prefix as given and as its real path (a symlinked site-packages matches either)."""
    forms = {path}
    real = os.path.realpath(path.rstrip(os.sep) or path)
    forms.add(os.path.join(real, "") if path.endswith(os.sep) else real)
    return forms


def _dir(path: str) -> str:
    return os.path.join(path, "")


def _site_dirs():
    dirs = set()
    for key in ("purelib", "platlib"):
        value = sysconfig.get_paths().get(key)
        if value:
            dirs.add(value)
    for getter in (getattr(site, "getsitepackages", None), getattr(site, "getusersitepackages", None)):
        if getter is None:
            continue
        found = getter()
        dirs.update([found] if isinstance(found, str) else found)
    return {d for d in dirs if d}


def _rules():
    rules = []

    def add(path, rule):
        for form in _forms(path):
            rules.append((form, rule))

    for key in ("stdlib", "platstdlib"):
        value = sysconfig.get_paths().get(key)
        if value:
            add(_dir(value), SKIP)
            for name in TRACED_STDLIB:
                add(os.path.join(value, name), INLINE_ONLY)
    for name in TRACED_STDLIB:  # the frozen copy CPython may run instead of the file
        rules.append((f"<frozen {name[:-3]}>", INLINE_ONLY))
    rules.append((EXEC_FILE, INLINE_ONLY))
    for site_dir in _site_dirs():
        add(_dir(site_dir), TRACE)
        for name in SKIPPED_PACKAGES:
            add(os.path.join(site_dir, name) if name.endswith(".py") else _dir(os.path.join(site_dir, name)), SKIP)
    torch_dir = os.path.dirname(torch.__file__)
    add(_dir(torch_dir), SKIP)
    for names, rule in ((TRACED_TORCH, TRACE), (INLINED_TORCH, INLINE_ONLY)):
        for name in names:
            path = os.path.join(torch_dir, *name.split("/"))
            add(path if name.endswith(".py") else _dir(path), rule)
    add(_dir(os.path.dirname(__file__)), SKIP)
    for path in _allowed:
        add(path, TRACE)
    for path, traced in _user_rules:
        add(path, TRACE if traced else SKIP)
    return rules


def apply() -> None:
    _C.set_trace_rules(_rules())


def _prefix_of(target) -> str:
    if isinstance(target, types.ModuleType):
        paths = getattr(target, "__path__", None)
        if paths:  # a package: everything under its directory
            return _dir(list(paths)[0])
        if not getattr(target, "__file__", None):
            raise ValueError(f"module {target.__name__} has no file")
        return target.__file__
    if isinstance(target, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(target))
        return _dir(path) if os.path.isdir(path) else path
    raise TypeError(f"expected a module or a path, got {type(target).__name__}")


def skip_files(*targets) -> None:
    """Never trace the files of these modules, packages or paths: calls into them from compiled
    code run as plain Python (they end the graph)."""
    for target in targets:
        _user_rules.append((_prefix_of(target), False))
    apply()


def trace_files(*targets) -> None:
    """Trace the files of these modules, packages or paths even where the policy skips them
    (a package of SKIPPED_PACKAGES, the standard library)."""
    for target in targets:
        _user_rules.append((_prefix_of(target), True))
    apply()


def allow_in_graph(fn):
    """Put calls of ``fn`` into the graph as one node instead of tracing its body, as
    ``torch.compiler.allow_in_graph`` does for torch.compile (whose registrations framejit
    honours too). ``fn`` runs on the trace's meta tensors for its outputs' metadata, and on the
    real ones each time the graph runs: it must take and return tensors (or tuples and lists of
    them, with constants beside), have no side effect the graph would lose, and not depend on
    state the guards do not see. Returns ``fn`` (usable as a decorator); a list or tuple of
    functions registers each."""
    if isinstance(fn, (list, tuple)):
        return [allow_in_graph(f) for f in fn]
    if not callable(fn):
        raise TypeError(f"framejit.allow_in_graph expects a callable, got {type(fn).__name__}")
    _support.mark_in_graph(fn)
    return fn


def _prepare_einops(einops) -> None:
    # Its torch backend is made (and stored in a registry keyed by tensor class) on its first
    # call: traced, that first call would break where the backend is made, and the caller's
    # call site would stay split after. One call now, as torch.compile makes one.
    einops.rearrange(torch.empty(1), "i -> i")


# Libraries with state made lazily on first use that a trace should find made: run once, by
# framejit.compile, for those already imported.
_LIBRARY_PREPARERS = {"einops": _prepare_einops}
_prepared = set()


# Optimizers whose step() is not traced, as torch.compile leaves them (it wraps them in
# torch._dynamo.disable once it is first used): LBFGS re-evaluates the closure in a loop of
# data-dependent line searches, SparseAdam needs sparse gradients meta tensors lack. Their steps
# run as plain Python (wrapped once, at the first framejit.compile).
UNTRACED_OPTIMIZER_STEPS = ("LBFGS", "SparseAdam")


def _leave_optimizer_steps_untraced() -> None:
    for name in UNTRACED_OPTIMIZER_STEPS:
        cls = getattr(torch.optim, name, None)
        step = None if cls is None else vars(cls).get("step")
        if step is None or getattr(step, "_framejit_untraced", False):
            continue
        # (as framejit.disable wraps: its attributes too, among them the `hooked` mark Optimizer
        # leaves on a step it wrapped for hooks, without which it wraps it again)
        wrapped = functools.update_wrapper(_C.make_disabled(step), step)
        wrapped._framejit_untraced = True
        cls.step = wrapped


def prepare_libraries() -> None:
    if "torch" not in _prepared:
        _prepared.add("torch")
        _leave_optimizer_steps_untraced()
    for name, prepare in _LIBRARY_PREPARERS.items():
        module = sys.modules.get(name)
        if module is None or name in _prepared:
            continue
        _prepared.add(name)
        try:
            prepare(module)
        except Exception:  # noqa: BLE001 - an older or changed library: traced as it comes
            pass


def _torch_file_in(filename: str, names) -> bool:
    torch_dir = os.path.dirname(torch.__file__)
    for name in names:
        path = os.path.join(torch_dir, *name.split("/"))
        if filename == path or filename.startswith(_dir(path)):
            return True
    return False


def is_traced_torch(filename: str) -> bool:
    """Whether the file is torch's own Python that the policy traces or inlines (TRACED_TORCH,
    INLINED_TORCH)."""
    return _torch_file_in(filename, TRACED_TORCH + INLINED_TORCH)


def is_inlined_torch(filename: str) -> bool:
    """Whether the file is torch's own Python inlined where traced code calls it (INLINED_TORCH)."""
    return _torch_file_in(filename, INLINED_TORCH)


def is_traced(filename: str) -> bool:
    """Whether the policy traces code from this file (the longest matching prefix decides)."""
    best = None if not filename.startswith("<frozen") else ("", False)
    for prefix, traced in _rules():
        if filename.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, traced)
    return True if best is None else best[1] != SKIP


def _wrapper_classes():
    """Modules whose forward is a distributed wrapper that runs as torch runs it (its hooks,
    collectives and bookkeeping in plain Python) around the module it wraps, which is traced."""
    classes = []
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    if ddp is not None:
        classes.append(ddp)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        classes.append(FullyShardedDataParallel)
    except ImportError:  # torch built without distributed
        pass
    return tuple(classes)


def allow_module(mod):
    """Trace the compiled module's forward; for a DDP / FSDP wrapper, the forward of the module
    it wraps (as torch.compile does, the wrapper's own forward runs eagerly). Returns the entry
    code to hook for this compile (allow_file_of)."""
    wrappers = _wrapper_classes()
    while isinstance(mod, wrappers) and isinstance(getattr(mod, "module", None), torch.nn.Module):
        mod = mod.module
    if not isinstance(mod, wrappers):
        return allow_file_of(type(mod).forward)
    return None


def allow_file_of(fn):
    """Trace fn's own file even if the policy skips it (a package's function compiled by hand:
    the package is traced from then on, as the policy traces third-party code). For torch's own
    files (a torch.nn module compiled directly) and functions made by exec, returns fn's code:
    the compiled call hooks it as its own frame, and elsewhere it runs as the policy says."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return None
    filename = code.co_filename
    if filename.startswith((os.path.join(os.path.dirname(torch.__file__), ""), EXEC_FILE)):
        return code
    if not is_traced(filename):
        package_dir = os.path.join(os.path.dirname(filename), "")
        if package_dir not in _allowed:
            _allowed.append(package_dir)
            apply()
    return None
