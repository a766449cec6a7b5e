"""Fusion of element-wise aten ops into groups, each run as one generated kernel.

``find_groups`` reads an aten graph (the one the native backend's ``rewrite`` hook receives,
with fake values in ``node.meta['val']``) and returns maximal groups of fusable nodes; ``apply``
replaces each group by one ``PythonCall`` node (plus ``getitem``s). The rules:

- A node is fusable when its op is in ``ops.OPS`` (element-wise, functional: no in-place, out=
  or view ops), every tensor it reads and its result are target values (``is_target``: CUDA by
  default), no storage it reads is written by any op of the graph (in-place ops, out= ops,
  anything that is not an aten op), and, when autograd records (grad mode at lowering), none of
  its tensors requires grad: such nodes keep their own ops so that gradients are eager's.
- Nodes join the group of their producers, graph order, greedily; a merge is kept only while
  the group can run as one call at one point of the graph without moving any other node: the
  last value it reads from outside is defined before the first outside use of anything it
  computes. That also makes every group convex (no path leaves the group and comes back).
  All outputs (members read outside the group or returned) have one shape, the kernel's
  iteration space; members of smaller (broadcast) shapes are recomputed per element.
- Groups of fewer than ``min_ops`` ops are left alone. The fused call is placed right after the
  last value it reads (after the groups it reads from); other nodes keep their order, so side
  effects (in-place ops, random draws) happen as in eager.
"""
import operator
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch.fx import Node

from .ops import DTYPES, FLOATING, OPS, compute_dtype, params


def is_cuda(val) -> bool:
    return isinstance(val, torch.Tensor) and val.device.type == "cuda"


@dataclass(eq=False)
class Group:
    nodes: List[Node]  # members, graph order
    inputs: List[Node] = field(default_factory=list)  # values read from outside, order of first read
    outputs: List[Node] = field(default_factory=list)  # members read outside, graph order
    shape: tuple = ()
    anchor: Optional[Node] = None  # the fused call goes right after this node

    def __repr__(self):
        return f"Group({[n.name for n in self.nodes]})"


def _tensor_val(node) -> Optional[torch.Tensor]:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _storage(val):
    try:
        return val.untyped_storage()._cdata
    except Exception:
        return None


def _node_args(node) -> List[Node]:
    found = []
    torch.fx.map_arg((node.args, node.kwargs), lambda a: found.append(a))
    return found


class _Analysis:
    def __init__(self, graph, args, is_target, grad_enabled):
        self.nodes = list(graph.nodes)
        self.pos = {n: i for i, n in enumerate(self.nodes)}
        self.is_target = is_target
        self.written = set()  # storages some op of the graph writes
        self.unknown_writes = False
        self.requires_grad: Dict[Node, bool] = {}
        self.grad_enabled = torch.is_grad_enabled() if grad_enabled is None else grad_enabled
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        module = graph.owning_module
        for node in self.nodes:
            self._note_writes(node)
            val = _tensor_val(node)
            flag = bool(val is not None and val.requires_grad)
            if node.op == "placeholder" and args is not None:
                i = placeholders.index(node)
                flag = flag or (i < len(args) and isinstance(args[i], torch.Tensor)
                                and args[i].requires_grad)
            elif node.op == "get_attr" and module is not None:
                real = _fetch(module, node.target)
                flag = flag or (isinstance(real, torch.Tensor) and real.requires_grad)
            else:  # conservatively: anything computed from a tensor that requires grad does too
                flag = flag or any(self.requires_grad.get(a, False) for a in _node_args(node))
            self.requires_grad[node] = flag

    def _note_writes(self, node):
        if node.op != "call_function" or node.target is operator.getitem:
            return
        if not isinstance(node.target, torch._ops.OpOverload):
            targets = _node_args(node)  # something we cannot see into may write what it gets
        else:
            schema = node.target._schema
            if not schema.is_mutable:
                return
            bound = params(node)
            targets = []
            for arg in schema.arguments:
                if arg.alias_info is not None and arg.alias_info.is_write:
                    torch.fx.map_arg(bound.get(arg.name), lambda a: targets.append(a))
        for target in targets:
            val = _tensor_val(target)
            storage = _storage(val) if val is not None else None
            if storage is None:
                self.unknown_writes = True
            else:
                self.written.add(storage)

    def why_not(self, node) -> Optional[str]:
        """None when the node may join a group, else the reason it may not."""
        if node.op != "call_function" or node.target not in OPS:
            return "not an element-wise op"
        op = OPS[node.target]
        val = _tensor_val(node)
        if val is None or not self.is_target(val) or val.dtype not in DTYPES:
            return "result is not a target tensor"
        if any(not isinstance(s, int) for s in val.shape):
            return "symbolic size"
        if op.accepts is not None and not op.accepts(node):
            return "arguments not supported"
        bound = params(node)
        for arg in _node_args(node):
            names = [k for k in op.operands if bound.get(k) is arg]
            arg_val = _tensor_val(arg)
            if not names or arg_val is None:
                return f"reads {arg.name} as a non-operand"
            if not self.is_target(arg_val) or arg_val.dtype not in DTYPES:
                return f"reads {arg.name}, not a target tensor"
            if _storage(arg_val) in self.written or self.unknown_writes:
                return f"reads {arg.name}, whose storage the graph writes"
            if self.grad_enabled and self.requires_grad.get(arg, False):
                return f"reads {arg.name}, which requires grad"
        for name in op.operands:
            value = bound.get(name)
            if not isinstance(value, (Node, bool, int, float)):
                return f"operand {name} is {type(value).__name__}"
        if op.floating and compute_dtype(node, op) not in FLOATING:
            return "floating op on a non-floating dtype"
        return None

    def summary(self, members: Sequence[Node]):
        """(inputs, outputs, last input position, first outside use position)."""
        member_set = set(members)
        inputs, seen = [], set()
        last_input, first_use = -1, len(self.nodes)
        outputs = []
        for node in members:
            for arg in _node_args(node):
                if arg not in member_set and arg not in seen:
                    seen.add(arg)
                    inputs.append(arg)
                    if arg.op != "get_attr":  # constants are there all along
                        last_input = max(last_input, self.pos[arg])
            outside = [u for u in node.users if u not in member_set]
            if outside:
                outputs.append(node)
                first_use = min([first_use] + [self.pos[u] for u in outside])
        return inputs, outputs, last_input, first_use

    def placeable(self, members) -> bool:
        inputs, outputs, last_input, first_use = self.summary(members)
        shapes = {tuple(n.meta["val"].shape) for n in outputs}
        return last_input < first_use and len(shapes) <= 1


def _fetch(module, target: str):
    for part in target.split("."):
        module = getattr(module, part, None)
    return module


def find_groups(graph: torch.fx.Graph, args=None, *, is_target: Callable = is_cuda,
                grad_enabled: Optional[bool] = None, min_ops: int = 2,
                reasons: Optional[Dict[Node, str]] = None) -> List[Group]:
    """Groups of fusable nodes, in the order their fused calls are to run. ``args``: the real
    inputs (their requires_grad); ``grad_enabled``: grad mode at lowering (default: current);
    ``reasons``, when given, receives why each op node was not fusable."""
    analysis = _Analysis(graph, args, is_target, grad_enabled)
    group_of: Dict[Node, List[Node]] = {}
    for node in analysis.nodes:
        reason = analysis.why_not(node)
        if reason is not None:
            if reasons is not None and node.op == "call_function":
                reasons[node] = reason
            continue
        producers = []
        for arg in _node_args(node):
            members = group_of.get(arg)
            if members is not None and not any(members is p for p in producers):
                producers.append(members)
        chosen = None
        candidates = [producers] if len(producers) > 1 else []
        candidates += [[p] for p in sorted(producers, key=len, reverse=True)]
        for candidate in candidates:
            merged = sorted({n for p in candidate for n in p} | {node}, key=analysis.pos.get)
            if analysis.placeable(merged):
                chosen = merged
                break
        chosen = chosen or [node]
        for member in chosen:
            group_of[member] = chosen
    unique = {id(g): g for g in group_of.values()}
    groups = [Group(list(g)) for g in unique.values() if len(g) >= min_ops]
    return _schedule(analysis, groups)


def _schedule(analysis: _Analysis, groups: List[Group]) -> List[Group]:
    """Orders groups and finds where each fused call goes; a group that cannot be placed (its
    inputs come from groups placed after its first outside use) is dissolved."""
    while True:
        owner = {n: g for g in groups for n in g.nodes}
        for g in groups:
            g.inputs, g.outputs, _, _ = analysis.summary(g.nodes)
        order, state = [], {}

        def visit(g):  # depth-first topological order of groups by the values they pass
            state[g] = 1
            for arg in g.inputs:
                h = owner.get(arg)
                if h is not None and state.get(h) != 2:
                    if state.get(h) == 1:
                        raise _Cycle(g)
                    visit(h)
            state[g] = 2
            order.append(g)

        try:
            for g in sorted(groups, key=lambda g: analysis.pos[g.nodes[0]]):
                if g not in state:
                    visit(g)
        except _Cycle as cycle:
            groups = [g for g in groups if g is not cycle.group]
            continue
        slot: Dict[Group, int] = {}
        bad = None
        last_placeholder = max([analysis.pos[n] for n in analysis.nodes if n.op == "placeholder"],
                               default=-1)
        for g in order:
            at = last_placeholder
            for arg in g.inputs:
                if arg.op == "get_attr":
                    continue
                at = max(at, slot[owner[arg]] if arg in owner else analysis.pos[arg])
            # users in other groups run after this one (their slots come later in the order)
            first_use = min((analysis.pos[u] for n in g.outputs for u in n.users if u not in owner),
                            default=len(analysis.nodes))
            slot[g] = at
            if not at < first_use:
                bad = g
                break
        if bad is not None:
            groups = [g for g in groups if g is not bad]
            continue
        order.sort(key=lambda g: slot[g])  # stable: dependencies stay first within a slot
        for g in order:
            g.anchor = analysis.nodes[slot[g]] if slot[g] >= 0 else None
            g.shape = tuple(g.outputs[0].meta["val"].shape)
        return order


class _Cycle(Exception):
    def __init__(self, group):
        super().__init__()
        self.group = group


def apply(gm: torch.fx.GraphModule, groups: List[Group], calls: List[Callable]) -> List[Node]:
    """Replaces each group by a call of ``calls[i]`` (a ``PythonCall`` taking the group's
    non-constant inputs in order, returning its outputs) placed after the group's anchor."""
    graph = gm.graph
    replaced: Dict[Node, Node] = {}
    cursor: Dict[Node, Node] = {}
    new_nodes = []
    first = next(iter(graph.nodes))
    for group, call in zip(groups, calls):
        args = tuple(replaced.get(n, n) for n in group.inputs if n.op != "get_attr")
        anchor = cursor.get(group.anchor, group.anchor)
        context = graph.inserting_after(anchor) if anchor is not None else graph.inserting_before(first)
        with context:
            fused = graph.call_function(call, args)
        vals = [n.meta["val"] for n in group.outputs]
        fused.meta["val"] = vals[0] if len(vals) == 1 else tuple(vals)
        results = [fused]
        if len(group.outputs) > 1:
            results, last = [], fused
            for i, val in enumerate(vals):
                with graph.inserting_after(last):
                    last = graph.call_function(operator.getitem, (fused, i))
                last.meta["val"] = val
                results.append(last)
        cursor[group.anchor] = results[-1]
        members = set(group.nodes)
        for node, result in zip(group.outputs, results):
            node.replace_all_uses_with(result, delete_user_cb=lambda u: u not in members)
            replaced[node] = result
        new_nodes.append(fused)
    for group in reversed(groups):
        for node in reversed(group.nodes):
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return new_nodes


def constants(gm: torch.fx.GraphModule, group: Group) -> List[Optional[torch.Tensor]]:
    """For each input of the group: the tensor when it is a constant of the module (get_attr),
    else None (a value the fused call receives)."""
    return [_fetch(gm, n.target) if n.op == "get_attr" else None for n in group.inputs]
