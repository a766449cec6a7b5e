"""The Python half of tracing decisions, called by the C++ core (rarely: results are cached).

Which callables are torch operations, which Tensor methods read data, how targets are printed.
Kept in Python because the answers are lists of torch objects, easy to read and extend.
"""
import builtins
import dis
import functools
import gc
import logging
import math
import operator
import os
import sys
import types
import typing
import collections
from collections import OrderedDict
import warnings
import weakref

import torch

from . import _C
from ._C import AttrKind, CallableKind, Presence, TensorMethodKind
from ._graph_module import FramejitGraphModule  # noqa: F401  (made by the C++ core)
from ._python_forms import FORM_CLASSES, TORCH_FORMS, copy_kind, deepcopy_kind, python_form, tuple_method  # noqa: F401  (python_form, tuple_method: looked up by the C++ core)
from ._python_forms import trace_defaultdict_missing as defaultdict_missing  # noqa: F401  (the same)
from ._python_forms import trace_operator as operator_form  # noqa: F401  (the same)
from .exc import FramejitWarning, Unsupported  # noqa: F401  (looked up by the C++ core)

# Namespaces under torch whose functions are not graph operations: state, I/O, autograd
# drivers, other compilers.
_NOT_OPS_PREFIXES = (
    "torch.autograd", "torch.cuda", "torch.mps", "torch.xpu", "torch.distributed", "torch.utils",
    "torch._dynamo", "torch.compiler", "torch.jit", "torch.fx", "torch.testing", "torch.random",
    "torch.serialization", "torch.backends", "torch.hub", "torch.onnx", "torch.profiler",
    "torch._logging", "torch.multiprocessing", "torch.overrides", "torch.export",
    "torch._inductor", "torch.library", "torch.nn.modules", "torch.optim", "torch._guards",
    "torch.storage", "torch.package", "torch.futures", "torch.nn.parallel",
)

_NOT_OPS = {
    torch.manual_seed, torch.seed, torch.initial_seed, torch.set_grad_enabled,
    torch.save, torch.load, torch.compile, torch.set_default_dtype, torch.set_default_device,
    torch.use_deterministic_algorithms, torch.set_printoptions, torch.get_rng_state,
    torch.set_rng_state, torch.set_num_threads, torch.get_num_threads, torch.equal,
    torch.allclose, torch.is_nonzero, torch.is_same_size,
}

# Pure questions about metadata or global settings the guards already pin.
_QUERIES = {
    torch.is_tensor, torch.is_floating_point, torch.is_complex, torch.numel, torch.result_type,
    torch.promote_types, torch.can_cast, torch.get_default_dtype, torch.is_grad_enabled,
    torch.broadcast_shapes, torch.is_inference_mode_enabled, torch.finfo, torch.iinfo,
    # Global switches read as constants at trace time (as eager reads them once per call).
    torch.backends.mha.get_fastpath_enabled, torch.jit.is_scripting, torch.jit.is_tracing,
    torch.are_deterministic_algorithms_enabled, torch.is_autocast_enabled,
    # Traced tensors never override __torch_function__ (those are not traced), so these are
    # False for the values framejit traces.
    torch._C._has_torch_function, torch._C._has_torch_function_unary,
    torch._C._has_torch_function_variadic,
    # Named once per process (torch.utils.rename_privateuse1_backend): optimizers list devices.
    torch._C._get_privateuse1_backend_name,
} | {  # autocast's dtypes (the global-state guard pins the CPU's and CUDA's)
    getattr(torch, name) for name in ("get_autocast_dtype", "get_autocast_cpu_dtype",
                                      "get_autocast_gpu_dtype") if hasattr(torch, name)
}

# Builtins that are pure functions of their arguments (folded on constants).
_PURE_BUILTINS = {
    builtins.abs, builtins.all, builtins.any, builtins.bool, builtins.callable, builtins.chr,
    builtins.divmod, builtins.float, builtins.int, builtins.isinstance, builtins.issubclass,
    builtins.len, builtins.max, builtins.min, builtins.ord, builtins.pow, builtins.repr,
    builtins.round, builtins.str, builtins.sum, builtins.tuple, builtins.type, builtins.range,
    builtins.sorted, builtins.list, builtins.hash, builtins.format, builtins.enumerate,
    builtins.zip, builtins.reversed, builtins.dict, builtins.slice,
    builtins.id,  # (of a tensor input or an object read by source: see Tracer::call)
    deepcopy_kind, copy_kind,  # framejit's own: how copy.(deep)copy copies a class (_python_forms)
    typing.get_origin, typing.get_args,  # of annotations (strict dataclasses' validators)
    collections.namedtuple,  # a class made from constants at trace time, as torch.compile makes it
}

# Tensor methods that need the data (or give it away): a graph cannot contain them.
_DATA_METHODS = {
    "item", "tolist", "numpy", "data_ptr", "storage", "untyped_storage", "_storage", "backward",
    "register_hook", "__bool__", "__int__", "__float__", "__index__", "__len__", "__iter__",
    "__array__", "__format__", "__repr__", "__str__", "__reduce_ex__", "__setstate__",
    "__getstate__", "pin_memory", "is_pinned", "share_memory_", "record_stream", "__dlpack__",
    "retain_grad", "type", "equal", "allclose", "is_nonzero", "__contains__", "is_shared",
    "register_post_accumulate_grad_hook",
}

# Tensor methods that only read metadata (constant results: the guards pin the metadata).
_QUERY_METHODS = {
    "dim", "ndimension", "size", "stride", "numel", "nelement", "element_size", "is_contiguous",
    "is_floating_point", "is_complex", "is_signed", "storage_offset", "has_names", "is_inference",
}


# NumPy's functions that reduce or round numbers (pure: folded where called with constants).
_NUMPY_REDUCTIONS = frozenset(("prod", "product", "sum", "mean", "amax", "amin", "max", "min",
                               "round", "around", "clip", "floor_divide", "isclose"))


# framejit.allow_in_graph: id -> the function (held: an id is never reused while registered).
_IN_GRAPH = {}


def mark_in_graph(fn) -> None:
    _IN_GRAPH[id(fn)] = fn
    _C.forget_callable(fn)  # classified before: classified again at its next call


def in_graph(fn) -> bool:
    """Whether fn was registered by framejit.allow_in_graph, or by torch.compiler.allow_in_graph
    / torch._dynamo.allow_in_graph (a library's registration for torch.compile, read from
    Dynamo's id set where Dynamo is imported at all)."""
    if id(fn) in _IN_GRAPH:
        return True
    rules = sys.modules.get("torch._dynamo.trace_rules")
    if rules is None:
        return False
    try:
        ids = rules._allowed_callable_ids.function_ids
    except AttributeError:  # another torch's layout: its registrations are not seen
        return False
    return ids is not None and id(fn) in ids


def classify_callable(fn) -> CallableKind:
    """What fn is to the tracer: TORCH_OP (graph op), QUERY (constant from metadata), BUILTIN
    (pure), a grad-mode kind (see _grad_mode_kind), the listings and builtins the tracer answers
    itself, IN_GRAPH (allow_in_graph: one graph node), or NOT_TRACED."""
    if in_graph(fn):
        return CallableKind.IN_GRAPH
    mode_kind = _grad_mode_kind(fn)
    if mode_kind is not CallableKind.NOT_TRACED:
        return mode_kind
    try:
        if fn in _MODULE_LISTINGS:
            return CallableKind.MODULE_LISTING
        if fn is builtins.getattr or fn is builtins.hasattr or fn is builtins.setattr or fn is builtins.delattr or fn is builtins.vars:
            return CallableKind.ATTRIBUTE_BUILTIN
        if fn is builtins.next:
            return CallableKind.NEXT_BUILTIN
        if fn in _COMPILING_FLAGS:
            return CallableKind.COMPILING_FLAG
        if fn in _EXPORTING_FLAGS:
            return CallableKind.EXPORTING_FLAG
        if fn in _NOT_OPS:
            return CallableKind.NOT_TRACED
        if fn in _QUERIES:
            return CallableKind.QUERY
        if fn in _PURE_BUILTINS:
            return CallableKind.BUILTIN
    except TypeError:  # unhashable callables
        return CallableKind.NOT_TRACED
    module = getattr(fn, "__module__", None) or ""
    if module in ("math", "_operator", "operator") and getattr(fn, "__name__", "") != "setitem":
        return CallableKind.BUILTIN
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, functools._lru_cache_wrapper):
        return CallableKind.BUILTIN  # a cached function bound to an object (cached_method)
    if isinstance(fn, functools._lru_cache_wrapper):
        # @functools.cache / lru_cache (transformers' is_torch_greater_or_equal("2.9")): of
        # constants, the value it cached, as every later call answers; called at trace time
        return CallableKind.BUILTIN
    if module == "numpy" and getattr(fn, "__name__", "") in _NUMPY_REDUCTIONS:
        return CallableKind.BUILTIN  # np.prod(x.shape[1:]): folded on constants, like a ufunc
    if type(fn).__name__ == "ufunc" and type(fn).__module__ == "numpy":
        return CallableKind.BUILTIN  # np.sqrt(d_model): elementwise math, folded on constants
    if fn in _NULL_CONTEXTS:
        return CallableKind.NULL_CONTEXT
    if isinstance(fn, type):
        return CallableKind.NOT_TRACED
    if module == "torch" or module.startswith("torch."):
        if module.startswith(_NOT_OPS_PREFIXES) or fn in TORCH_FORMS:
            return CallableKind.NOT_TRACED
        if isinstance(fn, types.FunctionType) and _is_policy_traced_torch(fn):
            return CallableKind.NOT_TRACED  # torch's Python the policy traces (clip_grad_norm_)
        if getattr(fn, "__name__", "") in ("__enter__", "__exit__"):
            return CallableKind.NOT_TRACED  # a torch context manager the runtime enters
        if _is_traced_torch_helper(module, fn):
            # F._none_or_dtype, F._canonical_mask, init._calculate_fan_in_and_fan_out,
            # init.calculate_gain, ...: traced through, like user code
            return CallableKind.NOT_TRACED
        return CallableKind.TORCH_OP
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, type) and owner.__name__ == "_VariableFunctionsClass":
        return CallableKind.TORCH_OP
    return CallableKind.NOT_TRACED


# Context managers whose block holds nothing for a graph: profiler ranges (not recorded inside a
# compiled region, as under torch.compile) and contextlib.nullcontext.
def _null_contexts():
    import contextlib
    import torch.autograd.profiler
    found = {contextlib.nullcontext, torch.autograd.profiler.record_function}
    profiler = getattr(torch, "profiler", None)
    if profiler is not None and hasattr(profiler, "record_function"):
        found.add(profiler.record_function)
    return found


_NULL_CONTEXTS = _null_contexts()


def call_keeping_rng(fn, args, kwargs):
    """fn(*args, **kwargs) run at trace time for the metadata of what it makes, with the random
    number generators' states put back afterwards: the graph makes it again when it runs, and
    eager draws only once."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def bound_exit(manager):
    """The __exit__ a `with` on `manager` holds (BEFORE_WITH's lookup), for a region that ends
    inside the block."""
    return type(manager).__exit__.__get__(manager)


def null_exit(*exc_info):
    """The __exit__ of a null context's block a region ends inside."""
    return None


_C.allow_code(null_exit.__code__)  # called in the region that resumes inside the block


def _disable_wrapper_files():
    import torch._compile
    import torch._dynamo.eval_frame
    return {torch._compile.__file__, torch._dynamo.eval_frame.__file__}


_DISABLE_WRAPPER_FILES = _disable_wrapper_files()


def traced_past_disable(fn):
    """The function a torch._disable_dynamo / torch._dynamo.disable wrapper calls, where that
    function is torch's own Python the policy traces (optimizers' zero_grad, and the _init_group
    that torch.compile disables for itself once it is used): framejit traces it, as the wrapper
    only keeps Dynamo out. None otherwise: a user's disable is honoured."""
    from . import _skip
    code = getattr(fn, "__code__", None)
    if code is None or code.co_filename not in _DISABLE_WRAPPER_FILES:
        return None
    inner = getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", None)
    while isinstance(inner, types.FunctionType) and inner.__code__.co_filename in _DISABLE_WRAPPER_FILES:
        inner = getattr(inner, "_torchdynamo_orig_callable", None) or getattr(inner, "__wrapped__", None)
    if isinstance(inner, types.FunctionType) and _skip.is_traced_torch(inner.__code__.co_filename):
        return inner
    return None


def dynamo_disable_code():
    """The code object of the wrapper torch.compiler.disable / torch._dynamo.disable put around a
    function (DisableContext's ``_fn``, one code object for all of them), or None."""
    import torch._dynamo.eval_frame
    call = getattr(torch._dynamo.eval_frame.DisableContext, "__call__", None)
    for const in getattr(getattr(call, "__code__", None), "co_consts", ()):
        if isinstance(const, types.CodeType) and const.co_name == "_fn":
            return const
    return None


def honours_disable(wrapper) -> bool:
    """Whether a frame of torch.compiler.disable's wrapper ``wrapper`` runs, with all it calls,
    in plain Python: a user's (or a library's) disable, as torch.compile honours it; not torch's
    own Python that the policy traces past its disable (traced_past_disable)."""
    return isinstance(wrapper, types.FunctionType) and traced_past_disable(wrapper) is None


# Questions libraries ask to take their compile-friendly paths: True while framejit traces, as under
# torch.compile (torch.compiler.is_exporting stays False: framejit does not export).
def _compiling_flags():
    import torch._dynamo.external_utils
    import torch._utils
    flags = {torch.compiler.is_compiling, torch._dynamo.external_utils.is_compiling,
             torch._utils.is_compiling}
    if hasattr(torch.compiler, "is_dynamo_compiling"):
        flags.add(torch.compiler.is_dynamo_compiling)
    return flags


_COMPILING_FLAGS = _compiling_flags()
_EXPORTING_FLAGS = {fn for fn in (getattr(torch.compiler, "is_exporting", None),
                                  getattr(torch._dynamo, "is_exporting", None)) if fn is not None}


# nn.Module's generators over its tree (Module.modules, named_parameters, ...): answered at trace
# time from the live module tree, read by source (Tracer::module_listing).
_MODULE_LISTINGS = {
    torch.nn.Module.modules, torch.nn.Module.named_modules, torch.nn.Module.children,
    torch.nn.Module.named_children, torch.nn.Module.parameters, torch.nn.Module.named_parameters,
    torch.nn.Module.buffers, torch.nn.Module.named_buffers,
}


def _is_traced_torch_helper(module, fn) -> bool:
    """torch's Python helpers traced like user code (trace/calls.cpp, is_user_function, agrees):
    torch.nn.functional's private ones, torch.nn.init's that fill no tensor (the private
    ones, calculate_gain; the in-place fills such as uniform_ stay graph ops), and torch._assert
    (timm's size checks: its `assert` on sizes is a guard, as Python's own assert)."""
    if not isinstance(fn, types.FunctionType):
        return False
    name = fn.__name__
    if module == "torch":
        return name == "_assert"
    if module == "torch.nn.functional":
        return name.startswith("_")
    return module == "torch.nn.init" and (name.startswith("_") or not name.endswith("_"))


def tensor_method_kind(name: str) -> TensorMethodKind:
    """OP (graph node), METADATA (constant), or NOT_TRACEABLE (needs data / not a Tensor method)."""
    if name in _DATA_METHODS:
        return TensorMethodKind.NOT_TRACEABLE
    if name in _QUERY_METHODS:
        return TensorMethodKind.METADATA
    return (TensorMethodKind.OP if callable(getattr(torch.Tensor, name, None))
            else TensorMethodKind.NOT_TRACEABLE)


_NAMESPACES = (
    ("torch.nn.functional", torch.nn.functional), ("torch", torch), ("torch.linalg", torch.linalg),
    ("torch.special", torch.special), ("torch.fft", torch.fft),
)


class AutogradFunctionApply:
    """``MyFunction.apply`` as the target of a graph node: called, it is that call, so autograd
    records the function's own backward. (A bound ``apply`` itself cannot be a target: its
    ``__module__`` is torch's, and FX prints such targets by a dotted path that does not exist.)
    One per class, so graphs that call the same function share the target."""

    _made = weakref.WeakKeyDictionary()

    def __init__(self, function_class):
        self.function_class = function_class
        self.__name__ = f"{function_class.__name__}_apply"
        self.__qualname__ = self.__name__
        self.__module__ = "framejit"

    def __call__(self, *args, **kwargs):
        return self.function_class.apply(*args, **kwargs)

    @classmethod
    def of(cls, function_class):
        made = cls._made.get(function_class)
        if made is None:
            made = cls._made[function_class] = cls(function_class)
        return made


def target_text(fn) -> str:
    """How a call target is printed in graphs: torch.add, torch.nn.functional.relu, operator.add."""
    if isinstance(fn, AutogradFunctionApply):
        klass = fn.function_class
        return f"{klass.__module__}.{klass.__qualname__}.apply"
    if isinstance(fn, torch._ops.OpOverloadPacket):  # torch.ops.<namespace>.<op>
        return "torch.ops." + fn._qualified_op_name.replace("::", ".")
    if isinstance(fn, torch._ops.OpOverload):  # torch.ops.<namespace>.<op>.<overload>
        return f"torch.ops.{fn.namespace}.{fn._opname}.{fn._overloadname}"
    name = getattr(fn, "__name__", None)
    if name is None:
        return repr(fn)
    if getattr(operator, name, None) is fn:
        return f"operator.{name}"
    if getattr(builtins, name, None) is fn:
        return name
    for prefix, namespace in _NAMESPACES:
        if getattr(namespace, name, None) is fn:
            return f"{prefix}.{name}"
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, type):  # a class method bound to its class: MyFunction.apply
        return f"{owner.__module__}.{owner.__qualname__}.{name}"
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}.{getattr(fn, '__qualname__', name)}"


_SHORT_DTYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


def short_dtype(dtype) -> str:
    return _SHORT_DTYPES.get(dtype, str(dtype).replace("torch.", ""))


def _underlying(f):
    return getattr(f, "__func__", f)


# __torch_function__ implementations that behave like plain tensors (nn.Parameter disables it).
_PLAIN_TORCH_FUNCTIONS = {_underlying(torch.Tensor.__torch_function__),
                          torch._C._disabled_torch_function_impl}


def has_torch_function_override(t) -> bool:
    """Whether t's type customises __torch_function__ (then meta tensors cannot stand in)."""
    return _underlying(type(t).__torch_function__) not in _PLAIN_TORCH_FUNCTIONS


def make_meta(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with t's sizes, strides, dtype and requires_grad (no data, no device)."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta",
                               requires_grad=t.requires_grad)


_FAKE_MODE = None


class _ContextVarUnset:
    """The default a guard reads `var.get(default)`'s source with: the variable has no value in
    the running context (an object no program can set it to)."""

    def __repr__(self):
        return "<unset>"


CONTEXT_VAR_UNSET = _ContextVarUnset()


class InternalFault(Exception):
    """A fault of framejit's own found by a helper the tracer calls: the tracer turns it into an
    internal error (the region falls back to plain Python with one warning), never a break."""


def call_python_on_meta(fn, args, kwargs):
    """fn(*args, **kwargs) of a Python-level graph target (an autograd.Function's apply, a
    function allowed in the graph) on meta tensors, with meta the default device: a tensor its
    body makes without a device (`torch.tensor(torch.finfo(x.dtype).min)` as a fill value)
    meets the meta tensors on their device, as it meets the real ones on theirs."""
    with torch.device("meta"):
        return fn(*args, **kwargs)


def autocast_meta(fn, method: str, args, kwargs, devices):
    """fn(*args, **kwargs), or args[0].<method>(*args[1:], **kwargs), on the metadata of meta
    tensors as their real devices run it under the current torch.autocast: each meta tensor
    becomes a fake tensor on its device (``devices``: id(meta tensor) -> torch.device), so
    autocast's kernels cast as they do for real tensors. Results come back as meta tensors."""
    global _FAKE_MODE
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.utils._pytree import tree_map
    if _FAKE_MODE is None:
        _FAKE_MODE = FakeTensorMode()
    mode = _FAKE_MODE
    converter = mode.fake_tensor_converter

    def to_fake(a):
        if isinstance(a, torch.Tensor) and a.device.type == "meta":
            if id(a) not in devices:  # guessing a device would trace autocast's wrong dtype
                raise InternalFault(f"no real device known for an argument of {method or fn}")
            return converter.from_meta_and_device(mode, a, devices[id(a)])
        return a

    def to_meta(t):
        if isinstance(t, FakeTensor):
            meta = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta",
                                       requires_grad=t.requires_grad)
            # An op's result is not a leaf: in-place ops on it must trace as on the real one.
            return meta.clone() if t.requires_grad else meta
        return t

    args, kwargs = tree_map(to_fake, list(args)), tree_map(to_fake, dict(kwargs))
    with mode:
        out = getattr(args[0], method)(*args[1:], **kwargs) if method else fn(*args, **kwargs)
    return tree_map(to_meta, out)


_MISSING = object()


def _class_attribute(klass, name: str):
    for base in klass.__mro__:
        if name in base.__dict__:
            return base.__dict__[name]
    return _MISSING


def _function_kind(found, plain: AttrKind):
    """(kind, function) for the function-like class attributes, else None."""
    if isinstance(found, staticmethod):
        return (AttrKind.STATICMETHOD, found.__func__)
    if isinstance(found, classmethod):
        return (AttrKind.CLASSMETHOD, found.__func__)
    if isinstance(found, types.FunctionType):
        return (plain, found)
    return None


def _class_level_kind(found, class_value):
    """(kind, value) for a class attribute as an instance sees it: 'property' (its getter),
    the function-like kinds, CLASS_VALUE (value: class_value), or MISSING (absent, or a
    descriptor that would run code)."""
    if found is _MISSING:
        return (AttrKind.MISSING, None)
    if isinstance(found, property):
        return (AttrKind.PROPERTY, found.fget) if found.fget is not None else (AttrKind.MISSING,
                                                                               None)
    kind = _function_kind(found, AttrKind.FUNCTION)
    if kind is not None:
        return kind
    if hasattr(type(found), "__get__"):  # other descriptors run code: not traced
        return (AttrKind.MISSING, None)
    return (AttrKind.CLASS_VALUE, class_value)


def _instance_store(obj, name: str):
    """Where instance state `name` lives: "__dict__", an nn.Module's "_parameters" / "_buffers"
    / "_modules" dict, or None if it is not instance state. nn.Module's stores count only when
    the class has nothing of that name: its __getattr__, which reads them, runs only then."""
    state = getattr(obj, "__dict__", None)
    if not isinstance(state, dict):
        return None
    if name in state:
        return "__dict__"
    if _class_attribute(type(obj), name) is not _MISSING:
        return None
    for store in ("_parameters", "_buffers", "_modules"):
        if isinstance(state.get(store), dict) and name in state[store]:
            return store
    return None


def cached_method(obj, name: str):
    """obj.name, bound, where the class holds a functools.lru_cache function under that name
    and the instance does not shadow it (transformers' `logger.warning_once`); else None."""
    found = _class_attribute(type(obj), name)
    if not isinstance(found, functools._lru_cache_wrapper):
        return None
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict) and name in state:
        return None
    return types.MethodType(found, obj)


def resolve_attribute(obj, name: str):
    """How ``obj.name`` resolves, without running any user code: (kind, value) with kind one of
    an AttrKind: INSTANCE (plain instance state; value: "__dict__", "__slots__" for a slot, or
    the nn.Module dict holding it), FUNCTION (bound to obj), PLAIN_FUNCTION (a function read off a class), STATICMETHOD,
    CLASSMETHOD (value: the function), PROPERTY (value: fget), CLASS_VALUE (a plain class
    attribute) or MISSING."""
    if isinstance(obj, type):  # attributes of a class itself: nothing binds to an instance
        found = _class_attribute(obj, name)
        if found is _MISSING:
            return (AttrKind.MISSING, None)
        return _function_kind(found, AttrKind.PLAIN_FUNCTION) or (AttrKind.CLASS_VALUE, None)
    found = _class_attribute(type(obj), name)
    if isinstance(found, property):  # a data descriptor wins over instance state
        return _class_level_kind(found, None)
    if isinstance(found, types.MemberDescriptorType) and type(obj).__flags__ & _HEAPTYPE:
        # A __slots__ slot of a Python class (dataclasses.Field's name, type, ...): instance
        # state read through the slot, if it is set.
        try:
            found.__get__(obj, type(obj))
        except AttributeError:
            return (AttrKind.MISSING, None)
        return (AttrKind.INSTANCE, "__slots__")
    store = _instance_store(obj, name)
    if store is not None:
        return (AttrKind.INSTANCE, store)
    return _class_level_kind(found, None)


def attribute_presence(obj, name: str, generic: bool = False):
    """Whether ``hasattr(obj, name)`` holds, decided without running user code: (verdict,
    store) with verdict a Presence: PRESENT, ABSENT or UNKNOWN (a property or slot that may raise, a
    __getattr__ other than nn.Module's that could make it up); store is the instance dict
    holding a present attribute ("__dict__", or an nn.Module's "_parameters" / "_buffers" /
    "_modules"), None when the class (or a metaclass) provides it. generic: as
    object.__getattribute__ finds it (past a class's own __getattribute__, never calling
    __getattr__)."""
    if isinstance(obj, type):
        if _class_attribute(obj, name) is not _MISSING or _class_attribute(type(obj), name) is not _MISSING:
            return (Presence.PRESENT, None)
        hook = _class_attribute(type(obj), "__getattr__")
        return (Presence.UNKNOWN if hook is not _MISSING else Presence.ABSENT, None)
    if not generic and isinstance(_class_attribute(type(obj), "__getattribute__"), types.FunctionType):
        return (Presence.UNKNOWN, None)  # the class's own __getattribute__ decides
    store = _instance_store(obj, name)
    if store is not None:
        return (Presence.PRESENT, store)
    found = _class_attribute(type(obj), name)
    if found is not _MISSING:
        # A property, or a slot of a Python class, can raise AttributeError; a C type's own
        # descriptors (a builtin function's __name__) cannot. A generic lookup goes on to read
        # the attribute: a property's getter then runs in the trace, which models whatever it does.
        if generic and isinstance(found, property) and isinstance(found.fget, types.FunctionType):
            return (Presence.PRESENT, None)
        if isinstance(found, property) or (isinstance(found, types.MemberDescriptorType)
                                           and type(obj).__flags__ & _HEAPTYPE):
            return (Presence.UNKNOWN, None)
        return (Presence.PRESENT, None)
    hook = _class_attribute(type(obj), "__getattr__")
    if not generic and hook is not _MISSING and hook is not torch.nn.Module.__getattr__:
        return (Presence.UNKNOWN, None)
    return (Presence.ABSENT, None)


def absent_attribute_stores(obj):
    """For an attribute obj lacks (attribute_presence says ABSENT): the instance dicts whose
    not holding it the trace guards ("__dict__", and an nn.Module's "_parameters" / "_buffers" /
    "_modules"). Without instance state the class decides, and the class is guarded."""
    if not isinstance(getattr(obj, "__dict__", None), dict):
        return []
    if isinstance(obj, torch.nn.Module):
        return ["__dict__", "_parameters", "_buffers", "_modules"]
    return ["__dict__"]


def resolve_super_attribute(this_class, self_type, self_is_class: bool, name: str):
    """How ``super().name`` resolves in a method of ``this_class`` whose first argument has type
    ``self_type`` (is a class, for classmethods, when ``self_is_class``): the first class after
    this_class in the MRO defining name. Kinds as in resolve_attribute (function-like attributes
    and properties only; anything else MISSING)."""
    mro = self_type.__mro__
    if self_is_class:
        return (AttrKind.MISSING, None)  # super() in a classmethod: not traced
    try:
        start = mro.index(this_class) + 1
    except ValueError:
        return (AttrKind.MISSING, None)
    for cls in mro[start:]:
        if name in vars(cls):
            if vars(cls)[name] is object.__getattribute__:
                return (AttrKind.OBJECT_GETATTRIBUTE, None)
            if not cls.__flags__ & _HEAPTYPE and isinstance(
                    vars(cls)[name], (types.MethodDescriptorType, types.WrapperDescriptorType)):
                return (AttrKind.BUILTIN_METHOD, vars(cls)[name])  # dict.get, object.__setattr__
            kind = _class_level_kind(vars(cls)[name], None)
            return (AttrKind.MISSING, None) if kind[0] is AttrKind.CLASS_VALUE else kind
    return (AttrKind.MISSING, None)


_SLOT_NAMES = weakref.WeakKeyDictionary()


def slot_names(cls):
    """The attributes an instance of cls can hold where it has no __dict__ (every class in its
    MRO declares __slots__): the slots' names as stored (a private `__x` as `_K__x`)."""
    names = _SLOT_NAMES.get(cls)
    if names is None:
        names = frozenset(name for klass in cls.__mro__ for name, member in vars(klass).items()
                          if isinstance(member, types.MemberDescriptorType))
        _SLOT_NAMES[cls] = names
    return names


def _is_policy_traced_torch(fn) -> bool:
    from . import _skip
    return _skip.is_traced_torch(fn.__code__.co_filename)


def _is_traced_torch_class(klass) -> bool:
    """A class of torch's Python that the policy inlines (pytree's TreeSpec): made in the trace
    like a user's class. (Not torch.optim's: an LR scheduler's step would then be traced, and the
    epoch counter it reads, an int that changes every step, would compile a graph per step.)"""
    from . import _skip
    module = sys.modules.get(klass.__module__)
    filename = getattr(module, "__file__", None)
    return bool(filename) and _skip.is_inlined_torch(filename)


def plain_class_init(cls):
    """For a plain user class (Python classes up to object, or up to dict / OrderedDict as
    ModelOutput is; __slots__ only below object, no custom __new__ / __getattr__, a metaclass only if it
    leaves instance creation to type.__call__; a __getattribute__ / __setattr__ only if
    written in Python, which the trace inlines, as for transformers' configs): its __init__
    function, or False when that is object.__init__. None for any other class (not traced
    into)."""
    meta = type(cls)
    if not isinstance(cls, type) or meta.__call__ is not type.__call__:
        return None
    if meta is not type and ("__getattribute__" in vars(meta) or "__getattr__" in vars(meta)):
        return None
    mapping = mapping_base(cls)
    if cls.__new__ is not (object.__new__ if mapping is None else dict.__new__):
        return None
    if cls.__getattribute__ not in (object.__getattribute__, dict.__getattribute__) and not isinstance(
            _class_attribute(cls, "__getattribute__"), types.FunctionType):
        return None
    if cls.__setattr__ not in (object.__setattr__, dict.__setattr__) and not isinstance(
            _class_attribute(cls, "__setattr__"), types.FunctionType):
        return None
    for klass in cls.__mro__:
        if klass is object or klass is mapping or (mapping is OrderedDict and klass is dict):
            continue
        if not klass.__flags__ & _HEAPTYPE or "__getattr__" in vars(klass):
            return None
        if vars(klass).get("__slots__") and mapping is not None:
            return None  # (an empty __slots__, as collections.abc's classes have, is no slot)
        if (klass.__module__.startswith(("torch", "framejit")) and klass not in FORM_CLASSES
                and not _is_traced_torch_class(klass)):
            return None
    # (slots only, no instance dict: the tracer stores only the slots' names, slot_names)
    init = cls.__init__
    if init is object.__init__:
        return False
    return init if isinstance(init, types.FunctionType) else None


def stateless_module(cls, args, kwargs):
    """An instance of a module class made with these constant arguments, if it holds no
    parameter, buffer tensor or submodule (a loss or an activation made in a forward), else None.
    torch.nn's stateless modules are made as they are; a library's or user's module class
    (transformers' ``ACT2FN["gelu"]`` makes a GELUActivation per call) only when its constructor
    changes nothing but the new module: its ``__init__`` code writes only attributes of self, and
    while it runs it calls no Python function but the ``__init__``s of its classes and
    torch.nn.Module's own, and no builtin that could change something else (_InitWatch)."""
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        return None
    watch = None
    if cls.__module__ not in _STATELESS_MODULE_FILES:
        watch = _InitWatch.of(cls)
        if watch is None:
            return None
    try:
        with torch.random.fork_rng(devices=[]):  # a constructor that draws leaves no trace
            module = cls(*args, **kwargs) if watch is None else watch.construct(args, kwargs)
    except Exception:
        return None
    if module is None or (module._parameters or module._modules
                          or any(b is not None for b in module._buffers.values())):
        return None
    return module


# torch.nn's files of modules that hold no state of their own (a few, such as PReLU or
# MultiheadAttention, have parameters: refused after they are made).
_STATELESS_MODULE_FILES = {
    f"torch.nn.modules.{name}" for name in (
        "loss", "activation", "dropout", "flatten", "pooling", "padding", "pixelshuffle",
        "upsampling", "distance", "channelshuffle", "fold")
}

# Opcodes a constructor run at trace time may not hold: they write outside the new module
# (globals, cells, items, other objects' attributes), import, make a generator, or handle an
# exception (the watch's refusal must end the constructor: Python drops a profile hook that
# raised, so code that caught it would run on unwatched).
_INIT_REFUSED_OPS = frozenset((
    "PUSH_EXC_INFO", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF", "STORE_NAME", "DELETE_NAME",
    "STORE_SUBSCR", "DELETE_SUBSCR", "STORE_SLICE", "DELETE_ATTR", "IMPORT_NAME", "IMPORT_FROM",
    "IMPORT_STAR", "YIELD_VALUE", "RETURN_GENERATOR", "SETUP_ANNOTATIONS"))
# Builtins a constructor may call: they read their arguments and change nothing.
_INIT_PURE_BUILTINS = frozenset((
    "isinstance", "issubclass", "hasattr", "getattr", "len", "abs", "min", "max", "round", "sum",
    "any", "all", "callable", "id", "hash", "repr", "format", "divmod", "pow", "sorted", "ord",
    "chr", "iter"))
# Methods of builtin values a constructor may call, for the same reason.
_INIT_PURE_METHODS = frozenset((
    "get", "keys", "values", "items", "copy", "index", "count", "startswith", "endswith", "lower",
    "upper", "split", "rsplit", "strip", "lstrip", "rstrip", "replace", "join", "format", "find",
    "is_integer", "bit_length"))


class _InitWatch:
    """Runs a module class's constructor under a profile hook that refuses, by raising before
    it runs, any call but those listed above (see stateless_module); its codes were checked
    before (_init_code_writes_only): they can neither write elsewhere nor catch the
    refusal."""

    # torch's own files whose code a module's constructor runs: Module.__init__, __setattr__,
    # the isinstance checks of Parameter and Buffer, and the generation tag Dynamo's
    # Module.__init__ patch keeps once torch.compile has run in the process
    _torch_files = frozenset((
        torch.nn.modules.module.__file__, torch.nn.parameter.__file__,
        os.path.join(os.path.dirname(torch.__file__), "_dynamo", "mutation_guard.py"),
        os.path.join(os.path.dirname(torch.__file__), "_dynamo", "utils.py")))

    def __init__(self, cls, codes):
        self.cls = cls
        self.codes = codes

    @staticmethod
    def of(cls):
        if type(cls).__call__ is not type.__call__ or cls.__module__.startswith(("torch", "framejit")):
            return None  # (torch.nn.Module itself too)
        codes = set()
        for klass in cls.__mro__:
            if klass is torch.nn.Module:
                break
            if klass.__module__.startswith(("torch", "framejit")) or "__new__" in vars(klass):
                return None
            init = vars(klass).get("__init__")
            if init is None:
                continue
            if not isinstance(init, types.FunctionType) or init.__code__.co_argcount == 0:
                return None
            made = list(_nested_codes(init.__code__))
            self_name = init.__code__.co_varnames[0]
            # the nested functions and comprehensions store no attribute at all
            if not all(_init_code_writes_only(code, self_name if code is made[0] else None) for code in made):
                return None
            codes.update(made)
        return _InitWatch(cls, codes)

    def construct(self, args, kwargs):
        refused = []  # (also where the constructor catches the exception: its module differs)

        def hook(frame, event, arg):
            if event == "call":
                code = frame.f_code
                if code not in self.codes and code.co_filename not in self._torch_files:
                    refused.append(code.co_qualname)
                    raise _InitRefused(code.co_qualname)  # before its first instruction runs
            elif event == "c_call" and frame.f_code in self.codes and not _pure_call(arg):
                refused.append(getattr(arg, "__name__", ""))
                raise _InitRefused(refused[-1])  # instead of the call

        previous = sys.getprofile()
        collecting = gc.isenabled()
        gc.disable()  # (a collection's callbacks are no calls of the constructor's)
        sys.setprofile(hook)
        try:
            module = self.cls(*args, **kwargs)
        except _InitRefused:
            return None
        finally:
            sys.setprofile(previous)
            if collecting:
                gc.enable()
        return None if refused else module


class _InitRefused(Exception):
    """Raised by _InitWatch's hook in place of a call it refuses."""


def _pure_call(fn):
    """Whether a builtin a module's constructor calls changes nothing (see _InitWatch)."""
    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", "")
    if owner is builtins:
        return name in _INIT_PURE_BUILTINS
    if owner is math or fn is torch._C._log_api_usage_once:
        return True
    return type(owner) in (str, dict, tuple, list, int, float, frozenset) and name in _INIT_PURE_METHODS


def _init_code_writes_only(code, self_name):
    """Whether one code of a constructor holds no refused opcode and stores attributes only on
    `self_name` (None: on nothing), which it never rebinds."""
    previous = None
    for ins in dis.get_instructions(code):
        if ins.opname in _INIT_REFUSED_OPS:
            return False
        if ins.opname == "EXTENDED_ARG":
            continue
        if ins.opname == "BINARY_OP" and "=" in ins.argrepr:  # x += y: may change x in place
            return False
        if ins.opname in ("STORE_FAST", "DELETE_FAST") and ins.argval == self_name:
            return False
        if ins.opname == "STORE_FAST_STORE_FAST" and self_name in ins.argval:
            return False
        if ins.opname == "STORE_ATTR":
            target = None
            if previous is not None and previous.opname in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"):
                target = previous.argval
            elif previous is not None and previous.opname == "LOAD_FAST_LOAD_FAST":
                target = previous.argval[1]
            if self_name is None or target != self_name:
                return False
        previous = ins
    return True


def _nested_codes(code):
    """code and the codes of the functions and comprehensions it makes."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested_codes(const)


_PROBED_RULES = {}  # (op, argument shapes and constants) -> probe_size_rule's answer


def _probe_source_class():
    """A ShapeEnv source naming a probed argument (torch._dynamo's own sources would import
    Dynamo for it)."""
    from torch._guards import GuardSource, Source

    class ProbeSource(Source):
        def __init__(self, label):
            self.label = label

        def name(self):
            return self.label

        def guard_source(self):
            return GuardSource.LOCAL

        def __hash__(self):
            return hash(self.label)

        def __eq__(self, other):
            return isinstance(other, ProbeSource) and other.label == self.label

    return ProbeSource


def probe_size_rule(op, args, kwargs):
    """How the sizes of a custom op's result (a ``torch.library`` op of a namespace other than
    aten and prims: transformers' ``grouped_mm_fallback``) follow from its arguments' sizes, read
    from its fake implementation run on fake tensors whose every size is a symbol of its own:
    per result dimension, None (not one input size), "fixed" (no size), or (position, dim) of the
    argument size it equals; and the (position, dim) of every size that the implementation
    compared or constrained, which the rule holds for only while they keep their values.
    Positions: an int for args, a str for kwargs. None where the op is no such op, or its fake
    run fails or returns no single tensor."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        qualified = op._qualified_op_name
    elif isinstance(op, torch._ops.OpOverload):
        qualified = op.name()
    else:
        return None
    if qualified.split("::")[0] in ("aten", "prims", "_c10d_functional", "c10d"):
        return None
    key = [op]
    for position, value in list(enumerate(args)) + sorted(kwargs.items()):
        key.append((position, (tuple(value.shape), value.stride(), value.dtype)
                              if isinstance(value, torch.Tensor) else repr(value)))
    key = tuple(key)
    if key not in _PROBED_RULES:
        try:
            _PROBED_RULES[key] = _probe_size_rule(op, args, kwargs)
        except Exception:
            _PROBED_RULES[key] = None
    return _PROBED_RULES[key]


_ProbeSource = None


def _probe_size_rule(op, args, kwargs):
    import sympy
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    # Every size its own symbol: not merged where two are equal now (duck shaping), and 0 or 1
    # kept symbolic, so a result size that equals one of them is not taken for a constant.
    global _ProbeSource
    if _ProbeSource is None:
        _ProbeSource = _probe_source_class()
    env = ShapeEnv(duck_shape=False, specialize_zero_one=False)
    mode = FakeTensorMode(shape_env=env)
    where = {}

    def fake(position, value):
        if not isinstance(value, torch.Tensor):
            return value
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * value.dim())
        made = mode.from_tensor(value, source=_ProbeSource(f"probe_{position}"), symbolic_context=context)
        for d, size in enumerate(made.shape):
            if not isinstance(size, torch.SymInt) or not isinstance(size.node.expr, sympy.Symbol):
                return None
            where[size.node.expr] = (position, d)
        return made

    fake_args = [fake(i, a) for i, a in enumerate(args)]
    fake_kwargs = {k: fake(k, v) for k, v in kwargs.items()}
    if any(a is None and b is not None for a, b in zip(fake_args, args)) or any(
            fake_kwargs[k] is None and kwargs[k] is not None for k in kwargs):
        return None
    with mode:
        out = op(*fake_args, **fake_kwargs)
    if not isinstance(out, torch.Tensor):
        return None
    constrained = set()
    for guard in env.guards:
        constrained |= guard.expr.free_symbols
    for asserts in env.deferred_runtime_asserts.values():
        for ra in asserts:
            constrained |= ra.expr.free_symbols
    for symbol, replacement in env.replacements.items():
        constrained |= {symbol} | replacement.free_symbols
    dims = []
    for size in out.shape:
        expr = env.replace(size.node.expr) if isinstance(size, torch.SymInt) else sympy.Integer(size)
        if expr.is_Integer:
            dims.append("fixed")
        elif isinstance(expr, sympy.Symbol) and expr in where:
            dims.append(where[expr])
        else:
            dims.append(None)
    pins = sorted((where[s] for s in constrained if s in where), key=repr)
    if any(s not in where for s in constrained):
        return None  # a symbol of the op's own (unbacked): no rule
    return dims, pins


_NO_CAUSE = object()


def remake(spec, cause=_NO_CAUSE):
    """A fresh module or exception, as the traced constructor call made it (see
    stateless_module); an exception the trace raised `from` another gets that __cause__."""
    cls, args, kwargs = spec
    made = cls(*args, **kwargs)
    if cause is not _NO_CAUSE:
        made.__cause__ = cause  # (also sets __suppress_context__, as `raise ... from` does)
    return made


def _iterator_types():
    import itertools
    samples = [iter([]), iter(()), iter(range(0)), iter({}), iter({}.values()), iter({}.items()),
               iter(set()), iter(""), reversed([]), enumerate(()), zip(), map(len, ()),
               filter(None, ()), (i for i in ()), itertools.chain(), itertools.product(),
               itertools.islice((), 0)]
    return tuple({type(sample) for sample in samples})


_ITERATOR_TYPES = _iterator_types()


def iterator_isinstance(classes):
    """isinstance(it, classes) for an iterator the trace made, whatever kind it is (a list's, a
    generator, map's): the answer they all give, or None where kinds of iterator differ."""
    answers = {issubclass(kind, classes) for kind in _ITERATOR_TYPES}
    return answers.pop() if len(answers) == 1 else None


def mapping_base(cls):
    """dict or OrderedDict where cls subclasses one of them (its instances are mappings whose
    items the trace keeps beside their attributes), else None."""
    if not issubclass(cls, dict):
        return None
    return OrderedDict if issubclass(cls, OrderedDict) else dict


def builtin_base_method(cls, name: str):
    """The method `name` of the builtin base of cls (dict, OrderedDict or object) that Python
    reaches past cls's own Python classes, or None: what `super().name` or an inherited
    `obj.name` is on a mapping subclass (dict.get, OrderedDict.__setitem__,
    object.__setattr__)."""
    for klass in cls.__mro__:
        if klass.__flags__ & _HEAPTYPE:
            if name in vars(klass):
                return None  # a Python class defines it first
            continue
        found = vars(klass).get(name)
        if found is not None:
            return found if isinstance(found, (types.MethodDescriptorType,
                                               types.WrapperDescriptorType)) else None
    return None


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined by a class statement


def resolve_new_object_attribute(cls, name: str):
    """How ``obj.name`` resolves for an instance of a plain class that has no such instance
    attribute: like resolve_attribute, with CLASS_VALUE carrying the value."""
    found = _class_attribute(cls, name)
    builtin = builtin_base_method(cls, name) if found is not _MISSING else None
    if builtin is not None:
        return (AttrKind.BUILTIN_METHOD, builtin)  # obj.keys() of a dict subclass
    return _class_level_kind(found, found)


def class_lacks(cls, name: str) -> bool:
    """No class in cls's MRO defines `name` (an instance of cls finds it only in its own dict)."""
    return _class_attribute(cls, name) is _MISSING


def _grad_mode_classes():
    return (torch.no_grad, torch.enable_grad)


def _grad_mode_kind(fn) -> CallableKind:
    """The callables the tracer turns into grad / inference mode switches in the graph:
    GRAD_MODE_MANAGER (torch.no_grad, torch.enable_grad), SET_GRAD_ENABLED, INFERENCE_MODE,
    AUTOCAST (torch.autocast), GRAD_MODE_CLONE (ctx_factory of a @torch.no_grad() or
    @torch.inference_mode() wrapper),
    GRAD_MODE_WRAPPER (that wrapper), else NOT_TRACED."""
    if fn is torch.no_grad or fn is torch.enable_grad:
        return CallableKind.GRAD_MODE_MANAGER
    if fn is torch.set_grad_enabled:
        return CallableKind.SET_GRAD_ENABLED
    if fn is torch.inference_mode:
        return CallableKind.INFERENCE_MODE
    if fn is torch.amp.autocast_mode.autocast:
        return CallableKind.AUTOCAST
    if grad_mode_clone_class(fn) is not None:
        return CallableKind.GRAD_MODE_CLONE
    if isinstance(fn, types.FunctionType) and is_grad_mode_decorator_wrapper(fn):
        return CallableKind.GRAD_MODE_WRAPPER
    return CallableKind.NOT_TRACED


def grad_mode_clone_class(fn):
    """For ``ctx_factory`` of a @torch.no_grad() / @torch.enable_grad() /
    @torch.inference_mode(mode) wrapper (the manager's bound ``clone``): the manager's class,
    else None."""
    owner = getattr(fn, "__self__", None)
    if not isinstance(fn, types.MethodType):
        return None
    if (type(owner) in _grad_mode_classes()
            and fn.__func__ is torch.autograd.grad_mode._DecoratorContextManager.clone):
        return type(owner)
    if type(owner) is torch.inference_mode and fn.__func__ is torch.inference_mode.clone:
        return torch.inference_mode
    return None


def is_grad_mode_decorator_wrapper(fn) -> bool:
    """Whether fn is torch's wrapper of a function decorated with @torch.no_grad(),
    @torch.enable_grad() or @torch.inference_mode() (torch/utils/_contextlib.py,
    context_decorator)."""
    code = fn.__code__
    if code.co_qualname != "context_decorator.<locals>.decorate_context" or not fn.__closure__:
        return False
    cells = dict(zip(code.co_freevars, fn.__closure__))
    try:
        factory = cells["ctx_factory"].cell_contents
        wrapped = cells["func"].cell_contents
    except (KeyError, ValueError):
        return False
    return grad_mode_clone_class(factory) is not None and isinstance(wrapped, types.FunctionType)


def grad_mode_setter(prev: bool, mode: bool):
    """A torch.set_grad_enabled(mode) object whose switch already happened (in a graph)."""
    obj = object.__new__(torch.set_grad_enabled)
    obj.prev, obj.mode = prev, mode
    return obj


def grad_mode_exit(restore: bool):
    """The __exit__ of a `with torch.no_grad()` / `enable_grad()` block entered inside a graph
    and left by CPython or a later region: restores the grad mode, lets exceptions through."""
    def __exit__(*exc_info):
        torch._C._set_grad_enabled(restore)
        return False
    return __exit__


def new_object(cls, names, mapping, *values):
    """The real object for an instance the trace made: cls's instance with these attributes
    and, for a dict subclass, the items of `mapping` (set as its builtin base sets them, in
    order, past any __setitem__ of cls)."""
    base = mapping_base(cls)
    obj = object.__new__(cls) if base is None else dict.__new__(cls)
    if mapping is not None:
        for key, value in mapping.items():
            base.__setitem__(obj, key, value)
    for name, value in zip(names, values):
        object.__setattr__(obj, name, value)
    return obj


def defaultdict_of(cls, factory, items):
    """The defaultdict a region's exit rebuilds: of class cls, with this factory and items."""
    made = cls(factory)
    made.update(items)
    return made


def module_container_keys(obj):
    """The child keys a ModuleList / Sequential / ModuleDict / ParameterList iterates over, and
    the attribute holding them, or None for anything else."""
    nn = torch.nn
    if isinstance(obj, (nn.ModuleList, nn.Sequential, nn.ModuleDict)):
        return "_modules", list(obj._modules.keys())
    if isinstance(obj, (nn.ParameterList, nn.ParameterDict)):
        return "_parameters", list(obj._parameters.keys())
    return None


def make_partial(func, args, keyword_pairs):
    """A functools.partial the traced code made of its own values and that outlives the
    region."""
    return functools.partial(func, *args, **dict(keyword_pairs))


def make_function(code, globals_, defaults, kwdefaults, closure, wrapped=None, decorated=False):
    """A function the traced code made (MAKE_FUNCTION) and that outlives the region; one that
    `@functools.wraps(wrapped)` decorated gets wrapped's metadata as the decorator gives it."""
    fn = types.FunctionType(code, globals_, code.co_name, defaults, closure)
    fn.__kwdefaults__ = kwdefaults
    fn.__qualname__ = code.co_qualname
    if decorated:
        functools.update_wrapper(fn, wrapped)
    return fn


def wraps_applied(wrapped, wrapper):
    """What `functools.wraps(wrapped)` returns, applied to wrapper (the tracer binds this to
    `wrapped` for a wraps decorator made in the trace)."""
    return functools.update_wrapper(wrapper, wrapped)


def default_device():
    return torch.get_default_device()


def emit(artifact: str, message: str) -> None:
    logging.getLogger(f"framejit.{artifact}").info(message)


def warn(message: str) -> None:
    warnings.warn(message, FramejitWarning, stacklevel=2)


def iterator_at(container, position: int, view: str = "keys"):
    """A real iterator over container (a list or dict a region exit rebuilt; for a dict, over its
    keys, values or items) that has yielded `position` items, as the loop the region traced had:
    later changes of the container are seen (or, for a dict that changes size, raise) as in
    Python."""
    if isinstance(container, list):
        it = iter(container)
        it.__setstate__(position)
        return it
    it = iter(container if view == "keys" else getattr(container, view)())
    for _ in range(position):
        next(it)
    return it


def reversed_at(container: list, next_index: int):
    """reversed(container) whose next item is container[next_index] (-1: exhausted)."""
    it = reversed(container)
    if next_index < 0:
        for _ in it:
            pass
    else:
        it.__setstate__(next_index)
    return it


def namedtuple_fields(cls, nargs, kwnames):
    """How a call cls(*args, **kwargs) of a collections.namedtuple / typing.NamedTuple class
    fills its fields: per field ("arg", position), ("kw", name) or ("default", value); None if
    cls is no such class (its __new__ is not namedtuple's) or the call would raise."""
    new = getattr(cls, "__new__", None)
    fields = getattr(cls, "_fields", None)
    if (not isinstance(cls, type) or not issubclass(cls, tuple) or type(cls).__call__ is not type.__call__
            or not isinstance(fields, tuple) or not str(getattr(new, "__globals__", {}).get(
                "__name__", "")).startswith("namedtuple_")
            or cls.__init__ is not object.__init__):
        return None
    if nargs > len(fields) or any(k not in fields for k in kwnames):
        return None
    defaults = getattr(cls, "_field_defaults", {})
    out = []
    for i, field in enumerate(fields):
        if i < nargs:
            if field in kwnames:
                return None
            out.append(("arg", i))
        elif field in kwnames:
            out.append(("kw", field))
        elif field in defaults:
            out.append(("default", defaults[field]))
        else:
            return None
    return out


def tensor_type_name(dtype, device):
    """x.type() for a tensor of this dtype on this device: "torch.FloatTensor",
    "torch.cuda.HalfTensor"."""
    name = torch.empty(0, dtype=dtype).type()
    return name if device.type == "cpu" else name.replace("torch.", f"torch.{device.type}.", 1)


_LEGACY_TYPE_DTYPES = {
    "DoubleTensor": torch.float64, "FloatTensor": torch.float32, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "LongTensor": torch.int64, "IntTensor": torch.int32,
    "ShortTensor": torch.int16, "CharTensor": torch.int8, "ByteTensor": torch.uint8,
    "BoolTensor": torch.bool, "ComplexFloatTensor": torch.complex64,
    "ComplexDoubleTensor": torch.complex128,
}


def legacy_tensor_type(target):
    """x.type(target) for a legacy tensor type named by text ("torch.DoubleTensor",
    "torch.cuda.HalfTensor") or given as its class (torch.FloatTensor): the (device, dtype) it
    converts to, as x.to(device, dtype); None for anything else (a dtype is x.to(dtype))."""
    if isinstance(target, str):
        name = target
    elif isinstance(target, type) and isinstance(getattr(target, "__module__", None), str):
        name = f"{target.__module__}.{target.__name__}"
    else:
        return None
    prefix, _, base = name.rpartition(".")
    dtype = _LEGACY_TYPE_DTYPES.get(base)
    if dtype is None or prefix not in ("torch", "torch.cuda"):
        return None
    return ("cuda" if prefix == "torch.cuda" else "cpu"), dtype


class CheckpointedBody:
    """A graph node's target: the body of a function passed to torch.utils.checkpoint.checkpoint,
    traced in place and outlined into a GraphModule of its own (GraphRecorder::finish), its
    inputs the values from outside it reads (the parameters included). Where gradients are
    needed it runs as eager ran the function, through checkpoint with the call's keywords
    (non-reentrant: the body's activations are not kept, it runs again in the backward pass,
    with the random state it had); under torch.compile-style tracing (a backend's make_fx) it is
    torch's tag_activation_checkpoint op, which AOTAutograd and inductor recompute in their
    partitioner; without gradients the body runs as it is. Printed `self.<name>`."""

    __module__ = __name__

    def __init__(self, body, name, checkpoint_kwargs):
        self.body = body
        self.checkpoint_kwargs = dict(checkpoint_kwargs)
        self.__name__ = name
        self.__qualname__ = name

    def __call__(self, *inputs):
        if not torch.is_grad_enabled():
            return self.body(*inputs)
        if _is_tracing(inputs):
            from torch._higher_order_ops.wrap import tag_activation_checkpoint
            return tag_activation_checkpoint(self.body, *inputs, **self.checkpoint_kwargs)
        from torch.utils.checkpoint import checkpoint
        return checkpoint(self.body, *inputs, **self.checkpoint_kwargs)

    def __repr__(self):
        return f"<checkpointed body {self.__name__}>"


def _is_tracing(inputs) -> bool:
    """Whether a backend is tracing the graph (make_fx / AOTAutograd): fake or functional
    tensors, or torch's proxy mode active."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    if get_proxy_mode() is not None:
        return True
    return any(isinstance(t, FakeTensor) or torch._is_functional_tensor(t)
               for t in inputs if isinstance(t, torch.Tensor))


class FunctionArguments:
    """A graph node's target: `op` called with functions the trace made (a higher-order op's
    combine_fn, defined in the traced frame) put back at their positions among the arguments,
    since a graph's arguments are values FX can print (Tracer::record_call). Printed
    framejit._support.<op's name>."""

    def __init__(self, op, positions, functions):
        self.op = op
        self.positions = positions
        self.functions = functions
        self.__name__ = getattr(op, "__name__", "call")
        self.__qualname__ = self.__name__

    def __call__(self, *args, **kwargs):
        full = list(args)
        for position, function in zip(self.positions, self.functions):
            full.insert(position, function)
        return self.op(*full, **kwargs)

    def __repr__(self):
        return f"<{self.__name__} with the trace's functions at {self.positions}>"


def instance_dict(obj):
    """obj.__dict__ as object's own lookup finds it (past a class's __getattribute__): the dict a
    region's exit gives for a copy of it the trace read (ExitBuilder)."""
    return object.__getattribute__(obj, "__dict__")
