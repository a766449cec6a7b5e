"""framejit under torch.distributed.

DistributedDataParallel all-reduces gradients bucket by bucket, each as soon as every gradient in
it is ready, so communication overlaps the rest of the backward. A backend that compiles the
backward of a whole graph as one unit (aot_eager, inductor) makes every gradient ready only at the
end of that unit. When a graph is compiled inside DDP's forward, framejit therefore splits it at
DDP's bucket boundaries (torch.compile's DDPOptimizer does the same) and compiles each piece on its
own. framejit's own backends run the graph's ops through eager autograd, where each gradient is
ready when computed: they get the whole graph. `framejit.config.optimize_ddp = False` turns the
split off.
"""
import functools

import torch

from . import config


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
