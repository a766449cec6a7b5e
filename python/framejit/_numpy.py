"""NumPy in traced code. An array the trace makes (`x.numpy()`, a NumPy call or operator on one)
is a tensor of the graph that keeps NumPy's semantics: every NumPy function, method, operator
and attribute applied to it is one graph node whose target runs torch._numpy's version of it on
tensors (NumpyFunction, NumpyMethod, NumpyOperator below), so dtype promotion, defaults and
reductions are NumPy's, and a backend that traces the node (make_fx, inductor) sees torch ops.
Where an array leaves the region it becomes a real np.ndarray again (`to_ndarray`).

As under torch.compile, a NumPy scalar result (np.sum(a)) is a 0-d array in the trace, and
arrays are CPU arrays (a CUDA tensor's .numpy() raises in eager too)."""
import functools
import operator

import numpy as np
import torch
import torch._numpy as tnp


def _as_tnp_dtype(value):
    """A NumPy dtype or scalar type given as an argument, as torch._numpy's dtype."""
    if isinstance(value, np.dtype):
        return tnp.dtype(value.name)
    if isinstance(value, type) and issubclass(value, np.generic):
        return tnp.dtype(np.dtype(value).name)
    return value


def _in(value):
    """An argument for torch._numpy: tensors as arrays, NumPy dtypes as its dtypes."""
    if isinstance(value, torch.Tensor):
        return tnp.ndarray(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_in(item) for item in value)
    if isinstance(value, dict):
        return {key: _in(item) for key, item in value.items()}
    return _as_tnp_dtype(value)


def _out(value):
    """A result of torch._numpy as graph values: arrays as their tensors."""
    if isinstance(value, tnp.ndarray):
        return value.tensor
    if isinstance(value, (list, tuple)):
        return type(value)(_out(item) for item in value)
    return value


class _Target:
    """A graph node's target: picklable by name, printed as framejit._numpy.<NumPy name>
    (`framejit._numpy.sin(x)`, `framejit._numpy.ndarray.mean(a, axis = 0)`)."""

    def __init__(self, name, run):
        self.__name__ = name.rpartition(".")[2]
        self.__qualname__ = name
        self._run = run

    def __call__(self, *args, device=None, **kwargs):
        # (`device`: the tracer's, for an array made from constants: its metadata on meta)
        if device is None:
            return _out(self._run(*_in(args), **_in(kwargs)))
        with torch.device(device):
            return _out(self._run(*_in(args), **_in(kwargs)))

    def __repr__(self):
        return f"<numpy {self.__qualname__} run by torch._numpy>"


class NumpyFunction(_Target):
    def __init__(self, name):
        fn = tnp
        for part in name.split("."):
            fn = getattr(fn, part)
        super().__init__(name, fn)

    def __reduce__(self):
        return numpy_function, (self.__qualname__,)


class NumpyMethod(_Target):
    def __init__(self, name):
        super().__init__(f"ndarray.{name}", lambda array, *args, **kwargs: getattr(array, name)(*args, **kwargs))
        self.method = name

    def __reduce__(self):
        return numpy_method, (self.method,)


class NumpyOperator(_Target):
    def __init__(self, name):
        # Printed numpy.ndarray.<operator> (iadd, setitem: framejit's rules for operators that
        # write into their first argument know these names).
        super().__init__(f"ndarray.{name.rstrip('_')}", getattr(operator, name))
        self.operator = name

    def __reduce__(self):
        return numpy_operator, (self.operator,)


# One target per name (cached), so nodes of every graph share it.
@functools.lru_cache(maxsize=None)
def numpy_function(name):
    return NumpyFunction(name)


@functools.lru_cache(maxsize=None)
def numpy_method(name):
    return NumpyMethod(name)


@functools.lru_cache(maxsize=None)
def numpy_operator(name):
    return NumpyOperator(name)


# NumPy's namespaces torch._numpy mirrors, by the module name of their functions.
_SUBMODULES = {"numpy": "", "numpy.linalg": "linalg.", "numpy.fft": "fft.", "numpy.random": "random."}
# Array creation from nothing but constants: NumPy makes a new array (a graph value here).
_CREATION = frozenset({"zeros", "ones", "empty", "full", "arange", "linspace", "logspace",
                       "geomspace", "eye", "identity", "array", "asarray", "zeros_like",
                       "ones_like", "full_like", "empty_like", "tri"})


def function_target(fn, has_array):
    """The node target for NumPy callable fn (a function or ufunc of numpy or its linalg / fft
    namespaces) that torch._numpy implements, or None: called with an array of the trace
    (has_array), or an array creation from constants."""
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or isinstance(fn, type):
        return None
    module = getattr(fn, "__module__", None) or ("numpy" if isinstance(fn, np.ufunc) else "")
    prefix = _SUBMODULES.get(module)
    if prefix is None:
        return None
    if prefix == "random." or (not has_array and (prefix or name not in _CREATION)):
        return None
    namespace = tnp
    for part in prefix.split(".")[:-1]:
        namespace = getattr(namespace, part, None)
    if namespace is None or not callable(getattr(namespace, name, None)):
        return None
    real = np
    for part in prefix.split(".")[:-1]:
        real = getattr(real, part)
    if getattr(real, name, None) is not fn:
        return None
    return numpy_function(prefix + name)


class NumpyAttribute(_Target):
    def __init__(self, name):
        super().__init__(f"ndarray.{name}", lambda array: getattr(array, name))
        self.attribute = name

    def __reduce__(self):
        return numpy_attribute, (self.attribute,)


@functools.lru_cache(maxsize=None)
def numpy_attribute(name):
    return NumpyAttribute(name)


def method_target(name):
    """The node target for `array.<name>(...)`, or None if torch._numpy's array lacks it."""
    if name.startswith("_") or not callable(getattr(tnp.ndarray, name, None)):
        return None
    return numpy_method(name)


def numpy_dtype(dtype):
    """The NumPy dtype of arrays made from tensors of a torch dtype (a.dtype in the trace)."""
    return np.dtype(tnp.dtype(dtype).name)


def to_ndarray(tensor):
    """An array of the trace leaving the region: the np.ndarray sharing the tensor's memory."""
    return tensor.numpy(force=True)
