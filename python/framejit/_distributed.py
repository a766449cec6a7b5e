"""framejit under torch.distributed.

DistributedDataParallel all-reduces gradients bucket by bucket, each as soon as every gradient in
it is ready, so communication overlaps the rest of the backward. A backend that compiles the
backward of a whole graph as one unit (aot_eager, inductor) makes every gradient ready only at the
end of that unit. When a graph is compiled inside DDP's forward, framejit therefore splits it at
DDP's bucket boundaries (torch.compile's DDPOptimizer does the same) and compiles each piece on its
own. framejit's own backends run the graph's ops through eager autograd, where each gradient is
ready when computed: they get the whole graph. `framejit.config.optimize_ddp = False` turns the
split off.

Every rank must take the same compile decisions: DDP and FSDP2 call their collectives in the
order the ranks run the same code, and a rank that specialises on a value no other rank sees
(a rank-dependent Python number, a recompile on one rank only) runs code the others do not.
RankCheck compares each compile of a distributed model across the ranks through the process
group's store, and raises on every rank, naming the guard, within
`framejit.config.rank_check_timeout_s` seconds.
"""
import datetime
import functools
import json
import re
import sys
import weakref

import torch

from . import config
from .exc import RankDivergence


def active_ddp_module():
    """The DistributedDataParallel module whose forward is running (it marks itself around the
    call of the module it wraps), or None."""
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    return getattr(ddp, "_active_ddp_module", None) if ddp is not None else None


def bucket_caps(ddp):
    """(first bucket's cap, every other bucket's cap) in bytes, as DDP sizes its buckets."""
    bucket_config = getattr(ddp, "_bucket_config", None)
    if bucket_config is not None:
        cap = bucket_config.bucket_bytes_cap
        first = bucket_config.first_bucket_bytes_cap
    else:  # older torch: the cap and whether the first bucket keeps the small default
        cap = ddp.bucket_bytes_cap
        default_first = getattr(ddp, "bucket_bytes_cap_default", False)
        first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES if default_first else cap
    return min(first, cap), cap


def ddp_aware(backend):
    """backend, splitting graphs compiled inside a DDP forward at its bucket boundaries."""
    if getattr(backend, "framejit_shape_generic", False):
        return backend  # framejit's own backends: eager autograd, gradients ready one by one

    @functools.wraps(backend)
    def compile_graph(gm, example_inputs):
        ddp = active_ddp_module()
        if ddp is None or not config.optimize_ddp:
            return backend(gm, example_inputs)
        return compile_by_bucket(backend, gm, example_inputs, *bucket_caps(ddp))

    return compile_graph


def assign_buckets(graph, example_inputs, first_cap, cap):
    """node -> piece index. Walks the graph from its output back to its inputs (the order of the
    backward, in which DDP fills its buckets), adding the bytes of each trainable parameter the
    first time a node uses it; a bucket closes once it holds `cap` bytes (`first_cap` for the
    first). Pieces are numbered in forward order. Returns (assignment, number of pieces)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    param_bytes = {}
    for node, value in zip(placeholders, example_inputs):
        if isinstance(value, torch.nn.Parameter) and value.requires_grad:
            param_bytes[node] = value.numel() * value.element_size()
    reverse_piece = {}
    bucket, filled, counted = 0, 0, set()
    for node in reversed(list(graph.nodes)):
        if node.op in ("placeholder", "output"):
            continue
        reverse_piece[node] = bucket
        for used in node.all_input_nodes:
            if used in param_bytes and used not in counted:
                counted.add(used)
                filled += param_bytes[used]
        if filled >= (first_cap if bucket == 0 else cap):
            bucket, filled = bucket + 1, 0
    last = max(reverse_piece.values(), default=0)
    return {node: last - index for node, index in reverse_piece.items()}, last + 1


class _Piece(torch.nn.Module):
    """One compiled piece in the split graph: calls the backend's callable, unwrapping the tuple
    the piece's graph was made to return."""

    def __init__(self, compiled, single):
        super().__init__()
        self.compiled = compiled
        self.single = single

    def forward(self, *args):
        out = self.compiled(*args)
        return out[0] if self.single else out


def _returns_tuple(piece):
    """Makes the piece's graph return a tuple (what backends expect); True if it returned one
    value before."""
    output = next(n for n in piece.graph.nodes if n.op == "output")
    value = output.args[0]
    if isinstance(value, (tuple, list)):
        return False
    output.args = ((value,),)
    piece.recompile()
    return True


def compile_by_bucket(backend, gm, example_inputs, first_cap, cap):
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.fx.passes.split_module import split_module

    assignment, pieces = assign_buckets(gm.graph, example_inputs, first_cap, cap)
    if pieces <= 1:
        return backend(gm, example_inputs)
    split = split_module(gm, gm, lambda node: assignment[node], keep_original_order=True)
    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)

    def fake(value):
        if isinstance(value, torch.Tensor) and not isinstance(value, torch._subclasses.FakeTensor):
            return fake_mode.from_tensor(value)
        return value

    class PieceCompiler(torch.fx.Interpreter):
        # Runs the split graph on fake values: each piece is compiled with the fake values
        # that reach it as its example inputs, then replaced by its compiled callable.
        def call_module(self, target, args, kwargs):
            piece = self.fetch_attr(target)
            out = piece(*args, **kwargs)
            single = _returns_tuple(piece)
            with unset_fake_temporarily():  # the backend runs as it would on a whole graph
                compiled = backend(piece, list(args))
            split.add_submodule(target, _Piece(compiled, single))
            return out

    with fake_mode:
        PieceCompiler(split).run(*[fake(value) for value in example_inputs])
    split.framejit_pieces = pieces
    return split.forward


def is_distributed_module(module):
    """True for a DistributedDataParallel module and for a module with FSDP2-sharded parts:
    the models whose compiles RankCheck compares across ranks (config.check_ranks = "auto")."""
    ddp = torch.nn.parallel.DistributedDataParallel
    if isinstance(module, ddp):
        return True
    fsdp = sys.modules.get("torch.distributed.fsdp")  # never imported here for the check
    fsdp_module = getattr(fsdp, "FSDPModule", None)
    return fsdp_module is not None and any(isinstance(m, fsdp_module) for m in module.modules())


# Per-process text in guards that does not say what a rank assumed: addresses in reprs, the
# rank's own device index.
_PER_PROCESS = [(re.compile(r"0x[0-9a-fA-F]+"), "0x?"), (re.compile(r"\b(cuda|xpu|hpu):\d+"), r"\1")]


def _comparable(text):
    for pattern, repl in _PER_PROCESS:
        text = pattern.sub(repl, text)
    return text


class _StoreCursor:
    """The number of compile events this process has published to the current default process
    group's store; a new group starts again at 0. The group is held weakly, and the store not at
    all: a store kept alive past destroy_process_group is torn down at interpreter exit, while
    its threads run (std::terminate, seen on 3.13)."""
    group = None  # weakref.ref to the default ProcessGroup
    count = 0


def _group():
    """(store, rank, world size) of the default process group, or None outside one."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    if world < 2:
        return None
    return dist.distributed_c10d._get_default_store(), dist.get_rank(), world


_CHECK_OFF = ("and their collectives may not match (framejit.config.check_ranks = False turns "
              "this check off)")


def _describe(event):
    text = f"{event['where']} at pc {event['pc']} ({event['kind']}"
    if event["recompile"]:
        text += f", recompiled because {event['recompile']}"
    return text + ")"


def _guard_difference(rank, mine, other, theirs):
    """'rank A guards X, rank B guards Y' for the first guard one side has and the other has not
    (Y: the other side's guard of the same kind on the same source, if it has one), or None."""
    for a, lines_a, b, lines_b in ((rank, mine, other, theirs), (other, theirs, rank, mine)):
        only_b = [line for line in lines_b if line not in lines_a]
        for line in lines_a:
            if line in lines_b:
                continue
            head = line.split(" ")[:2]  # the guard's kind and source
            counterpart = next((x for x in only_b if x.split(" ")[:2] == head), None)
            if counterpart is None:
                return f"rank {a} guards {line}, rank {b} does not"
            return f"rank {a} guards {line}, rank {b} guards {counterpart}"
    return None


class RankCheck:
    """on_region callback of a compiled distributed model: publishes each new region (where it
    is, its guards, why it recompiled) under the next key of the process group's store, reads
    every other rank's, and raises RankDivergence when they differ or a rank compiled nothing
    within config.rank_check_timeout_s. Regions are compared in the order each rank made them,
    which is the same on ranks that run the same program."""

    @staticmethod
    def events():
        """How many compiles this process compared with the other ranks in the current group."""
        return _StoreCursor.count

    def __call__(self, info):
        group = _group()
        if group is None or not config.check_ranks:
            return
        store, rank, world = group
        default_group = torch.distributed.distributed_c10d._get_default_group()
        if _StoreCursor.group is None or _StoreCursor.group() is not default_group:
            _StoreCursor.group, _StoreCursor.count = weakref.ref(default_group), 0
        n = _StoreCursor.count
        _StoreCursor.count += 1
        code = info["code"]
        event = dict(where=f"{code.co_qualname} ({code.co_filename}:{info['entry_line']})",
                     pc=info["entry_pc"], kind=info["kind"], recompile=_comparable(info["recompile"]),
                     guards=_comparable(info["guards"]).splitlines())
        store.set(f"framejit/compile/{n}/{rank}", json.dumps(event))
        others = [r for r in range(world) if r != rank]
        keys = [f"framejit/compile/{n}/{r}" for r in others]
        try:
            store.wait(keys, datetime.timedelta(seconds=config.rank_check_timeout_s))
        except Exception:  # the store's timeout error (its type differs between versions)
            missing = [r for r, key in zip(others, keys) if not store.check([key])]
            raise RankDivergence(
                f"framejit: rank {rank} compiled {_describe(event)}, and rank(s) "
                f"{', '.join(map(str, missing))} did not compile it within "
                f"{config.rank_check_timeout_s:g} s: the ranks take different compile decisions, "
                f"{_CHECK_OFF}") from None
        for r, key in zip(others, keys):
            theirs = json.loads(store.get(key))
            if theirs == event:
                continue
            if (theirs["where"], theirs["pc"]) != (event["where"], event["pc"]):
                detail = f"rank {r} compiled {_describe(theirs)} at the same point"
            else:
                detail = (_guard_difference(rank, event["guards"], r, theirs["guards"])
                          or f"rank {r}: {_describe(theirs)}")
            raise RankDivergence(
                f"framejit: ranks {rank} and {r} compiled {_describe(event)} differently: "
                f"{detail}. Ranks that specialise differently run different code, {_CHECK_OFF}")
