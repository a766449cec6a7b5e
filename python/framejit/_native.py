"""The native backend: a graph lowered to aten operators and run by framejit's C++ interpreter
through the c10 dispatcher, with no Python per op.

Lowering is torch's own tracing to aten (``make_fx`` on fake copies of the call's inputs), with no
decomposition table of ours: the program calls exactly the aten kernels eager reaches below
autograd (CompositeImplicitAutograd ops such as ``linear`` or ``dropout`` appear decomposed, as
eager runs them; everything with its own kernel stays one op). Sizes, strides, dtypes, devices and
numbers passed as inputs are baked into a program, so the callable keys its programs on them
(and on grad / inference mode) and lowers again on a miss; see ``docs/native.md``.
"""
import logging
import operator
import threading
from typing import Dict, List

import torch

from . import _C
from ._support import AutogradFunctionApply, CheckpointedBody
from ._logging import enabled as _enabled_logs

log = logging.getLogger("framejit.native")


class LoweringError(Exception):
    """A graph the native program cannot express (the graph then runs as it is)."""


class PythonCall:
    """A node target the program calls as one Python call with tensor arguments, returning
    ``num_outputs`` tensors: how other backends (the CUDA fusion's kernel launchers) put their
    own steps into a native program."""

    def __init__(self, name: str, fn, num_outputs: int = 1):
        self.__name__ = name
        self.fn = fn
        self.num_outputs = num_outputs

    def __call__(self, *args):
        return self.fn(*args)


def native(gm: torch.fx.GraphModule, example_inputs, rewrite=None):
    """``backend="native"``: lowers on the first call with each new input metadata.

    ``rewrite(aten_gm, args) -> str``, when given, changes the aten graph in place before it
    becomes a program (the CUDA backend replaces fused groups by PythonCall nodes) and returns
    text for the output_code log (e.g. generated kernel sources)."""
    name = getattr(gm, "meta", {}).get("framejit_name") or type(gm).__name__

    def lower(args):
        extra_text = ""
        try:
            aten_gm = _trace_to_aten(gm, args)
            if rewrite is not None:
                extra_text = rewrite(aten_gm, args) or ""
            program = _build_program(aten_gm)
        except Exception as e:  # any failure: this graph runs through the eager backend
            log.warning("native backend: %s runs as a GraphModule (eager backend): %s: %s", name,
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            return None
        if "output_code" in _enabled_logs():
            logging.getLogger("framejit.output_code").info(
                "NATIVE PROGRAM %s (%d instructions)\n%s%s%s", name, len(program),
                _input_notes(aten_gm, args), program.text(name), extra_text)
        return program

    return _C.make_native_function(lower, gm.forward)


_MAKE_FX_LOCK = threading.RLock()


def _trace_to_aten(gm, args) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (
                torch._C._set_grad_enabled, torch.autograd.grad_mode._enter_inference_mode):
            # make_fx records below autograd: the aten program would lose the switch.
            raise LoweringError("the graph switches grad or inference mode (a `with` block inside)")
        if (node.op == "call_function" and isinstance(node.target, (AutogradFunctionApply, CheckpointedBody))
                and torch.is_grad_enabled()
                and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
            # make_fx records the function's forward ops: autograd would differentiate those,
            # not run the function's own backward (nor recompute a checkpointed body).
            raise LoweringError(f"{node.target.__name__} needs its own backward")
        if node.op == "call_method" and node.target == "requires_grad_":
            # autograd metadata, which the aten program (below autograd) does not hold
            raise LoweringError("the graph sets requires_grad on a tensor it makes")
    with _MAKE_FX_LOCK:  # make_fx's tracing state is process-wide: one lowering at a time
        aten_gm = make_fx(gm, tracing_mode="fake", _allow_non_fake_inputs=True)(*_unaliased(args))
    _remove_dead_code(aten_gm.graph)
    return aten_gm


def _unaliased(args):
    """The inputs with every repeat of a tensor object replaced by a fresh tensor of the same
    metadata. make_fx memoises fakes by identity, so `f(a, a)` would lower to a program that reads
    one input twice, and programs are keyed on metadata, not identity: a later `f(b, a)` would
    then get `f(b, b)`."""
    seen = set()
    out = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if id(arg) in seen:
                arg = torch.empty_strided(arg.size(), arg.stride(), dtype=arg.dtype,
                                          device=arg.device).requires_grad_(arg.requires_grad)
            seen.add(id(arg))
        out.append(arg)
    return out


def _is_pure(node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return node.op == "call_function" and target is operator.getitem
    if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
        return False  # writes something, or draws from the random generator
    return True


def _remove_dead_code(graph) -> None:
    """Drops results nobody reads (e.g. the detach nodes autograd's saved tensors leave in the
    trace); keeps ops that mutate or consume random numbers, as eager runs them."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and _is_pure(node):
            graph.erase_node(node)


def _build_program(aten_gm) -> "_C.NativeProgram":
    graph = aten_gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    program = _C.NativeProgram(len(placeholders))
    values: Dict[torch.fx.Node, tuple] = {}  # node -> its operand
    for i, node in enumerate(placeholders):
        values[node] = ("r", i)

    def operand(value):
        if isinstance(value, torch.fx.Node):
            if value not in values:
                raise LoweringError(f"{value.format_node()} is not a value the program has")
            return values[value]
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in value):
            return ("l", [operand(v) for v in value])
        return ("c", value)

    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr":
            values[node] = ("c", _fetch_attr(aten_gm, node.target))
            continue
        if node.op != "call_function":
            raise LoweringError(f"cannot lower {node.op} {node.target}")
        if node.target is operator.getitem:
            if node not in values:
                raise LoweringError(f"getitem on a non-op value: {node.format_node()}")
            continue
        if isinstance(node.target, PythonCall):
            _add_python_call(program, node, values)
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            raise LoweringError(f"{node.target} is not an aten operator")
        if _is_symbolic(node.meta.get("val")):
            raise LoweringError(f"{node.format_node()} has a data-dependent size or value")
        schema = node.target._schema
        args = _bind(schema, node, operand)
        outputs, unpack = _assign_outputs(program, schema, node, values)
        program.add_call(schema.name, schema.overload_name, args, outputs, unpack)

    (result,) = [n for n in graph.nodes if n.op == "output"][0].args
    if not isinstance(result, (tuple, list)):
        raise LoweringError("the graph does not return a tuple")
    program.set_outputs([operand(v) for v in result])
    program.finish()
    return program


def _add_python_call(program, node, values) -> None:
    call = node.target
    if node.kwargs or not all(isinstance(a, torch.fx.Node) and a in values for a in node.args):
        raise LoweringError(f"{call.__name__} takes graph values as positional arguments only")
    regs = []
    for arg in node.args:
        kind, reg = values[arg]
        if kind != "r":
            raise LoweringError(f"{call.__name__} takes registers, got a constant")
        regs.append(reg)
    if call.num_outputs == 1:
        out = program.new_register()
        values[node] = ("r", out)
        outputs = [out]
    else:
        outputs = [program.new_register() for _ in range(call.num_outputs)]
        for user in node.users:
            if user.target is not operator.getitem:
                raise LoweringError(f"the tuple result of {call.__name__} is used whole")
            values[user] = ("r", outputs[user.args[1]])
    program.add_python_call(call.__name__, call, regs, outputs)


def _bind(schema, node, operand) -> List[tuple]:
    """Operands in schema order; ("d",) takes the schema's default."""
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(node.args) > len(positional):
        raise LoweringError(f"too many arguments for {schema.name}")
    bound = []
    for i, arg in enumerate(schema.arguments):
        if not arg.kwarg_only and i < len(node.args):
            bound.append(operand(node.args[i]))
        elif arg.name in node.kwargs:
            bound.append(operand(node.kwargs[arg.name]))
        elif arg.has_default_value():
            bound.append(("d",))
        else:
            raise LoweringError(f"{schema.name} needs argument {arg.name!r}")
    return bound


def _assign_outputs(program, schema, node, values):
    """Registers for the op's results: one per return read, or the elements of one list return
    unpacked where only single elements are read."""
    returns = schema.returns
    getitems = [u for u in node.users if u.op == "call_function" and u.target is operator.getitem]
    others = [u for u in node.users if u not in getitems]
    if len(returns) == 1 and not getitems:
        if not node.users:
            return [-1], []
        reg = program.new_register()
        values[node] = ("r", reg)
        return [reg], []
    is_list = len(returns) == 1 and isinstance(returns[0].type, torch.ListType)
    if len(returns) > 1 and others:
        raise LoweringError(f"the tuple result of {schema.name} is used whole")
    regs: Dict[int, int] = {}
    for user in getitems:
        index = user.args[1]
        if index not in regs:
            regs[index] = program.new_register()
        values[user] = ("r", regs[index])
    if is_list:
        whole = -1
        if others:
            whole = program.new_register()
            values[node] = ("r", whole)
        unpack = [regs.get(i, -1) for i in range(max(regs) + 1)] if regs else []
        return [whole], unpack
    return [regs.get(i, -1) for i in range(len(returns))], []


def _is_symbolic(value) -> bool:
    """Whether fake tracing met a size or number it could only name (x[mask], t.item()): the
    program bakes sizes in, so such graphs are not lowered."""
    sym_types = (torch.SymInt, torch.SymFloat, torch.SymBool)
    for leaf in torch.utils._pytree.tree_leaves(value):
        if isinstance(leaf, sym_types):
            return True
        if isinstance(leaf, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in leaf.shape):
            return True
    return False


def _fetch_attr(module, target: str):
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _input_notes(aten_gm, args) -> str:
    lines = []
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            text = f"{str(arg.dtype).replace('torch.', '')}{list(arg.shape)} {arg.device.type}"
        else:
            text = f"{type(arg).__name__} {arg!r} (baked in)"
        lines.append(f"# %{i}: {text}\n")
    return "".join(lines)
