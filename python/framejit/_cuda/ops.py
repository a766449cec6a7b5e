"""The element-wise aten operators the CUDA fusion knows, each with the C++ expression it becomes.

An entry says which arguments are *operands* (tensors or numbers converted to the op's compute
dtype before the expression), whether that compute dtype is the result's (arithmetic) or the
promotion of the operands (comparisons and logical ops, whose result is bool), and how to write
the expression. Everything else an op takes (alpha, approximate, slopes, bounds) is a *parameter*,
read from the node with the schema's defaults and baked in as a literal.
"""
import math
from typing import Callable, Dict, Optional, Sequence

import torch

aten = torch.ops.aten

FLOATING = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

# dtype -> (storage type in memory, compute type in registers, bytes per element)
DTYPES = {
    torch.float32: ("float", "float", 4),
    torch.float16: ("unsigned short", "float", 2),
    torch.bfloat16: ("unsigned short", "float", 2),
    torch.float64: ("double", "double", 8),
    torch.int64: ("long long", "long long", 8),
    torch.int32: ("int", "int", 4),
    torch.int16: ("short", "short", 2),
    torch.int8: ("signed char", "signed char", 1),
    torch.uint8: ("unsigned char", "unsigned char", 1),
    torch.bool: ("unsigned char", "bool", 1),
}


def ctype(dtype) -> str:
    return DTYPES[dtype][1]


class Emit:
    """What an op's expression is written from: operands already in the compute dtype ``o``,
    parameters ``p``, the compute type ``T`` and helpers for literals, math functions and the
    prelude snippets the kernel needs."""

    def __init__(self, operands: Sequence[str], params: Dict[str, object], dtype, needs: set):
        self.o = list(operands)
        self.p = params
        self.dtype = dtype
        self.T = ctype(dtype)
        self.needs = needs

    def lit(self, value) -> str:
        return literal(value, self.dtype)

    def exact(self, value) -> str:
        """A number as the value a tensor of the compute dtype holds (rounded to fp16/bf16)."""
        if self.dtype in (torch.float16, torch.bfloat16):
            value = torch.tensor(float(value), dtype=self.dtype).item()
        return literal(value, self.dtype)

    def fn(self, name: str) -> str:
        """The libm function for the compute type: expf for float, exp for double."""
        return name + "f" if self.T == "float" else name

    def helper(self, name: str) -> str:
        self.needs.add(name)
        return name


def literal(value, dtype) -> str:
    """A number as a C++ literal of ``dtype``'s compute type (for fp16/bf16: float, which is how
    eager's CUDA kernels take a Python scalar: in the op's float math, not rounded to half)."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    if dtype == torch.bool:
        return "true" if bool(value) else "false"
    if dtype not in FLOATING:
        text = str(int(value))
        return text + "LL" if dtype == torch.int64 else text
    value = float(value)
    single = ctype(dtype) == "float"
    if math.isnan(value):
        return "__int_as_float(0x7fc00000)" if single else "__longlong_as_double(0x7ff8000000000000LL)"
    if math.isinf(value):
        sign = "-" if value < 0 else ""
        return (f"{sign}__int_as_float(0x7f800000)" if single
                else f"{sign}__longlong_as_double(0x7ff0000000000000LL)")
    if single:
        value = float(torch.tensor(value, dtype=torch.float32).item())  # what eager's float sees
        text = "%.9g" % value
    else:
        text = repr(value)
    if not any(c in text for c in ".en"):
        text += ".0"
    return text + ("f" if single else "")


class Op:
    """``operands``: argument names converted to the compute dtype; ``promote``: the compute dtype
    is the operands' promotion (result bool) instead of the result's; ``floating``: only for a
    floating compute dtype; ``accepts(node)``: any further condition on the node; ``conditions``:
    operands converted to bool rather than to the compute dtype."""

    def __init__(self, operands: Sequence[str], emit: Callable[[Emit], str], promote=False,
                 floating=False, accepts: Optional[Callable] = None, constant=False,
                 conditions: Sequence[str] = ()):
        self.operands = tuple(operands)
        self.emit = emit
        self.promote = promote
        self.floating = floating
        self.accepts = accepts
        self.constant = constant  # no tensor operand: a value made from parameters (full, ...)
        self.conditions = tuple(conditions)  # operands taken as bool (where's condition)


OPS: Dict[object, Op] = {}


def _add(overloads, op: Op):
    for overload in overloads:
        OPS[overload] = op


def _unary_math(packet, name):
    _add([packet.default], Op(["self"], lambda e: f"{e.fn(name)}({e.o[0]})", floating=True))


for _packet, _name in [
    (aten.exp, "exp"), (aten.exp2, "exp2"), (aten.expm1, "expm1"), (aten.log, "log"),
    (aten.log2, "log2"), (aten.log10, "log10"), (aten.log1p, "log1p"), (aten.sqrt, "sqrt"),
    (aten.rsqrt, "rsqrt"), (aten.sin, "sin"), (aten.cos, "cos"), (aten.tan, "tan"),
    (aten.tanh, "tanh"), (aten.asin, "asin"), (aten.acos, "acos"), (aten.atan, "atan"),
    (aten.sinh, "sinh"), (aten.cosh, "cosh"), (aten.erf, "erf"), (aten.erfc, "erfc"),
]:
    _unary_math(_packet, _name)


def _rounding(name):
    # floor/ceil/trunc/round of an integer tensor is the tensor itself
    return lambda e: f"{e.fn(name)}({e.o[0]})" if e.T in ("float", "double") else e.o[0]


_add([aten.floor.default], Op(["self"], _rounding("floor")))
_add([aten.ceil.default], Op(["self"], _rounding("ceil")))
_add([aten.trunc.default], Op(["self"], _rounding("trunc")))
_add([aten.round.default], Op(["self"], _rounding("rint")))  # half to even, as torch.round
_add([aten.frac.default], Op(["self"], lambda e: f"({e.o[0]} - {e.fn('trunc')}({e.o[0]}))",
                             floating=True))
_add([aten.neg.default], Op(["self"], lambda e: f"(-{e.o[0]})",
                            accepts=lambda n: _out(n).dtype != torch.bool))
_add([aten.abs.default], Op(["self"], lambda e: (
    f"{e.fn('fabs')}({e.o[0]})" if e.T in ("float", "double") else
    e.o[0] if e.T == "bool" else f"({e.o[0]} < 0 ? -{e.o[0]} : {e.o[0]})")))
_add([aten.reciprocal.default], Op(["self"], lambda e: f"({e.lit(1)} / {e.o[0]})", floating=True))
_add([aten.sigmoid.default], Op(["self"], lambda e: (
    f"({e.lit(1)} / ({e.lit(1)} + {e.fn('exp')}(-{e.o[0]})))"), floating=True))
_add([aten.silu.default], Op(["self"], lambda e: (
    f"({e.o[0]} / ({e.lit(1)} + {e.fn('exp')}(-{e.o[0]})))"), floating=True))
_add([aten.mish.default], Op(["self"], lambda e: (
    f"({e.o[0]} * {e.fn('tanh')}({e.fn('log1p')}({e.fn('exp')}({e.o[0]}))))"), floating=True))
_add([aten.relu.default], Op(["self"], lambda e: f"{e.helper('fj_relu')}({e.o[0]})",
                             accepts=lambda n: _out(n).dtype != torch.bool))
_add([aten.sign.default], Op(["self"], lambda e: (
    f"(({e.T})({e.o[0]} > 0) - ({e.T})({e.o[0]} < 0))" if e.T != "bool" else e.o[0])))


def _gelu(e: Emit) -> str:
    x = e.o[0]
    if e.p["approximate"] == "tanh":
        inner = f"{e.lit(math.sqrt(2.0 / math.pi))} * ({x} + {e.lit(0.044715)} * {x} * {x} * {x})"
        return f"({e.lit(0.5)} * {x} * ({e.lit(1)} + {e.fn('tanh')}({inner})))"
    return f"({e.lit(0.5)} * {x} * ({e.lit(1)} + {e.fn('erf')}({x} * {e.lit(math.sqrt(0.5))})))"


_add([aten.gelu.default], Op(["self"], _gelu, floating=True,
                             accepts=lambda n: _param(n, "approximate") in ("none", "tanh")))
_add([aten.leaky_relu.default], Op(["self"], lambda e: (
    f"({e.o[0]} > 0 ? {e.o[0]} : {e.o[0]} * {e.lit(e.p['negative_slope'])})"), floating=True))
_add([aten.elu.default], Op(["self"], lambda e: (
    f"({e.o[0]} > 0 ? {e.o[0]} * {e.lit(e.p['scale'])} : "
    f"{e.fn('expm1')}({e.o[0]} * {e.lit(e.p['input_scale'])}) * "
    f"{e.lit(e.p['alpha'])} * {e.lit(e.p['scale'])})"), floating=True))
_add([aten.softplus.default], Op(["self"], lambda e: (
    f"({e.o[0]} * {e.lit(e.p['beta'])} > {e.lit(e.p['threshold'])} ? {e.o[0]} : "
    f"{e.fn('log1p')}({e.fn('exp')}({e.o[0]} * {e.lit(e.p['beta'])})) / {e.lit(e.p['beta'])})"),
    floating=True))


def _relu6_of_shifted(e: Emit) -> str:
    """min(max(x + 3, 0), 6), shared by hardsigmoid and hardswish."""
    return (f"{e.helper('fj_min')}({e.helper('fj_max')}({e.o[0]} + {e.lit(3)}, {e.lit(0)}), "
            f"{e.lit(6)})")


_add([aten.hardsigmoid.default], Op(["self"], lambda e: f"({_relu6_of_shifted(e)} / {e.lit(6)})",
                                    floating=True))
_add([aten.hardswish.default], Op(["self"], lambda e: (
    f"({e.o[0]} * {_relu6_of_shifted(e)} / {e.lit(6)})"), floating=True))


def _clamp(lo_name, hi_name):
    def emit(e: Emit) -> str:
        x = e.o[0]
        lo, hi = e.p.get(lo_name), e.p.get(hi_name)
        if lo is not None:
            x = f"{e.helper('fj_max')}({x}, {e.lit(lo)})"
        if hi is not None:
            x = f"{e.helper('fj_min')}({x}, {e.lit(hi)})"
        return x
    return emit


_no_bool = (lambda n: _out(n).dtype != torch.bool)
_add([aten.clamp.default], Op(["self"], _clamp("min", "max"), accepts=_no_bool))
_add([aten.clamp_min.default], Op(["self"], _clamp("min", None), accepts=_no_bool))
_add([aten.clamp_max.default], Op(["self"], _clamp(None, "max"), accepts=_no_bool))
_add([aten.hardtanh.default], Op(["self"], _clamp("min_val", "max_val"), accepts=_no_bool))


def _scaled(e: Emit, x: str) -> str:
    alpha = e.p.get("alpha", 1)
    return x if alpha == 1 else f"{e.lit(alpha)} * {x}"


_add([aten.add.Tensor, aten.add.Scalar], Op(
    ["self", "other"], lambda e: f"({e.o[0]} + {_scaled(e, e.o[1])})"))
_add([aten.sub.Tensor, aten.sub.Scalar], Op(
    ["self", "other"], lambda e: f"({e.o[0]} - {_scaled(e, e.o[1])})"))
_add([aten.rsub.Tensor, aten.rsub.Scalar], Op(
    ["self", "other"], lambda e: f"({e.o[1]} - {_scaled(e, e.o[0])})"))
_add([aten.mul.Tensor, aten.mul.Scalar], Op(["self", "other"], lambda e: f"({e.o[0]} * {e.o[1]})"))
_add([aten.div.Tensor, aten.div.Scalar], Op(["self", "other"], lambda e: f"({e.o[0]} / {e.o[1]})",
                                             floating=True))
_add([aten.maximum.default], Op(["self", "other"],
                                lambda e: f"{e.helper('fj_max')}({e.o[0]}, {e.o[1]})"))
_add([aten.minimum.default], Op(["self", "other"],
                                lambda e: f"{e.helper('fj_min')}({e.o[0]}, {e.o[1]})"))
_add([aten.atan2.default], Op(["self", "other"], lambda e: f"{e.fn('atan2')}({e.o[0]}, {e.o[1]})",
                              floating=True))


def _pow_scalar_exponent(e: Emit) -> str:
    x, exponent = e.o[0], e.p["exponent"]
    special = {1: x, 2: f"({x} * {x})", 3: f"({x} * {x} * {x})", 0.5: f"{e.fn('sqrt')}({x})",
               -0.5: f"{e.fn('rsqrt')}({x})", -1: f"({e.lit(1)} / {x})",
               -2: f"({e.lit(1)} / ({x} * {x}))"}
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and exponent in special:
        return special[exponent]
    return f"{e.fn('pow')}({x}, {e.lit(exponent)})"


_add([aten.pow.Tensor_Scalar], Op(["self"], _pow_scalar_exponent, floating=True))
_add([aten.pow.Tensor_Tensor, aten.pow.Scalar], Op(
    ["self", "exponent"], lambda e: f"{e.fn('pow')}({e.o[0]}, {e.o[1]})", floating=True))

for _packet, _sym in [(aten.eq, "=="), (aten.ne, "!="), (aten.lt, "<"), (aten.le, "<="),
                      (aten.gt, ">"), (aten.ge, ">=")]:
    _add([_packet.Tensor, _packet.Scalar],
         Op(["self", "other"], (lambda s: lambda e: f"({e.o[0]} {s} {e.o[1]})")(_sym), promote=True))
for _packet, _sym in [(aten.logical_and, "&&"), (aten.logical_or, "||"), (aten.logical_xor, "!=")]:
    _add([_packet.default], Op(["self", "other"], (lambda s: lambda e: (
        f"(({e.o[0]} != 0) {s} ({e.o[1]} != 0))"))(_sym), promote=True))
_add([aten.logical_not.default], Op(["self"], lambda e: f"({e.o[0]} == 0)", promote=True))
_add([aten.isnan.default], Op(["self"], lambda e: f"({e.o[0]} != {e.o[0]})", promote=True))
for _packet, _sym in [(aten.bitwise_and, "&"), (aten.bitwise_or, "|"), (aten.bitwise_xor, "^")]:
    _add([_packet.Tensor, _packet.Scalar], Op(["self", "other"], (lambda s: lambda e: (
        f"({e.o[0]} {s} {e.o[1]})"))(_sym), accepts=lambda n: _out(n).dtype not in FLOATING))
_add([aten.bitwise_not.default], Op(["self"], lambda e: (
    f"(!{e.o[0]})" if e.T == "bool" else f"({e.T})(~{e.o[0]})"),
    accepts=lambda n: _out(n).dtype not in FLOATING))

_add([aten.where.self], Op(["condition", "self", "other"], lambda e: (
    f"({e.o[0]} ? {e.o[1]} : {e.o[2]})"), conditions=("condition",)))


def _plain_copy(node) -> bool:
    """``_to_copy`` that only changes the dtype (on the same device, default layout)."""
    kwargs = dict(node.kwargs)
    kwargs.pop("dtype", None)
    if kwargs.pop("layout", None) not in (None, torch.strided):
        return False
    device = kwargs.pop("device", None)
    if device is not None and torch.device(device) != _out(node).device:
        return False
    if kwargs.pop("memory_format", None) not in (None, torch.preserve_format):
        return False
    if kwargs.pop("non_blocking", False) or kwargs.pop("pin_memory", None):
        return False
    return not kwargs and len(node.args) == 1


_add([aten._to_copy.default], Op(["self"], lambda e: e.o[0], accepts=_plain_copy))
_add([aten.clone.default], Op(["self"], lambda e: e.o[0], accepts=lambda n: (
    n.kwargs.get("memory_format") in (None, torch.preserve_format) and len(n.args) == 1)))
_add([aten.scalar_tensor.default], Op([], lambda e: e.exact(e.p["s"]), constant=True))
_add([aten.full.default], Op([], lambda e: e.exact(e.p["fill_value"]), constant=True))


def _out(node):
    return node.meta.get("val")


def params(node) -> Dict[str, object]:
    """Every schema argument of the node by name, the schema's default where not given."""
    schema = node.target._schema
    bound = {}
    for i, arg in enumerate(schema.arguments):
        if not arg.kwarg_only and i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _param(node, name):
    return params(node).get(name)


def compute_dtype(node, op: Op):
    """The dtype the op computes in: the result's, or (comparisons, logical ops) the promotion
    of its operands, as ``torch.result_type`` gives it (0-dim tensors and numbers weigh less)."""
    out = _out(node).dtype
    if not op.promote:
        return out
    bound = params(node)
    stand_ins = []
    for name in op.operands:
        value = bound[name]
        if isinstance(value, torch.fx.Node):
            val = value.meta["val"]
            stand_ins.append(torch.empty([1] * min(val.dim(), 1), dtype=val.dtype, device="meta"))
        else:
            stand_ins.append(value)
    if len(stand_ins) == 1:
        value = stand_ins[0]
        return value.dtype if isinstance(value, torch.Tensor) else torch.tensor(value).dtype
    return torch.result_type(*stand_ins)
