"""Runs a training scenario on `world` ranks (processes on this machine, gloo over loopback) and
writes what rank 0 saw as JSON: eager DDP and framejit-compiled DDP trained side by side from the
same weights on the same batches, graphs compiled per rank, DDP's own bucket count.

    python distributed_worker.py SCENARIO WORLD OUT.json

Used by test_distributed.py (a crash or a hang stays in the child process)."""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import framejit
import framejit.testing
from framejit import _distributed

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from models.zoo import ZOO  # noqa: E402


class Blocks(nn.Module):
    """An MLP of equal blocks: its parameters fill several DDP buckets of 0.3 MB."""

    def __init__(self, width=256, depth=6, classes=10):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU())
                                    for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(self.norm(x))


class RankScaled(Blocks):
    """Blocks whose output is scaled by a Python number that differs between ranks: each rank's
    graph is specialised on its own value (a guard no other rank shares)."""

    def __init__(self):
        super().__init__()
        self.scale = 1.0 + dist.get_rank()

    def forward(self, x):
        return super().forward(x) * self.scale


class RankRecompiles(Blocks):
    """Blocks scaled by a Python number that rank 1 alone changes after step 2 (the same on every
    rank before): rank 1's guard on it fails and it compiles again, the others do not."""

    def __init__(self):
        super().__init__()
        self.scale = 1.0

    def forward(self, x):
        return super().forward(x) * self.scale


class TinyGPT(nn.Module):
    """A nanoGPT-style decoder: embeddings, causal self-attention blocks, tied head."""

    def __init__(self, vocab=128, width=64, heads=4, depth=2, context=16):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.layers = nn.ModuleList()
        for _ in range(depth):
            self.layers.append(nn.ModuleDict(dict(
                ln1=nn.LayerNorm(width), qkv=nn.Linear(width, 3 * width), proj=nn.Linear(width, width),
                ln2=nn.LayerNorm(width), up=nn.Linear(width, 4 * width), down=nn.Linear(4 * width, width))))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for layer in self.layers:
            q, k, v = layer["qkv"](layer["ln1"](x)).split(x.size(-1), dim=2)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + layer["proj"](y.transpose(1, 2).reshape(b, t, -1))
            x = x + layer["down"](F.gelu(layer["up"](layer["ln2"](x))))
        return self.head(self.ln(x))


def scenario_setup(name):
    """(model factory, batch maker(step, rank), loss, DDP keyword arguments)."""
    if name.startswith(("blocks", "fsdp", "rank_")):
        def batch(step, rank):
            g = torch.Generator().manual_seed(1000 * step + rank)
            return torch.randn(8, 256, generator=g), torch.randint(0, 10, (8,), generator=g)
        make = (RankScaled if name.startswith("rank_scaled") else
                RankRecompiles if name.startswith("rank_recompiles") else Blocks)
        return make, batch, F.cross_entropy, dict(bucket_cap_mb=0.3)

    def batch(step, rank):
        g = torch.Generator().manual_seed(1000 * step + rank)
        idx = torch.randint(0, 128, (4, 17), generator=g)
        return idx[:, :-1], idx[:, 1:]

    def loss(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
    return TinyGPT, batch, loss, dict(bucket_cap_mb=0.05)


def same_models(make, n):
    """n models made by `make` holding the same weights (a seeded first one's)."""
    torch.manual_seed(0)
    reference = make()
    models = []
    for _ in range(n):
        model = make()
        model.load_state_dict(reference.state_dict())
        models.append(model)
    return models


def train(model, batch, loss_fn, rank, steps, after_step=None, grads=None):
    """`steps` AdamW steps on batch(step, rank); the losses. `grads`, a list: gets the last
    step's gradients (before the optimizer uses them)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        if after_step is not None and step > 0:
            after_step()
        x, y = batch(step, rank)
        torch.manual_seed(step)  # dropout draws the same masks in the runs compared
        loss = loss_fn(model(*x) if isinstance(x, tuple) else model(x), y)
        loss.backward()
        if grads is not None and step == steps - 1:
            grads.extend(p.grad.clone() for p in model.parameters())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def global_batch(batch, world):
    """batch(step, rank) of every rank, concatenated: what one process trains on to take the
    same steps as `world` DDP ranks (DDP averages the ranks' gradients, and every rank's batch
    has the same size)."""
    def make(step, _rank):
        parts = [batch(step, r) for r in range(world)]
        return tuple(torch.cat(column) for column in zip(*parts))
    return make


def max_diff(xs, ys):
    return max((a - b).abs().max().item() for a, b in zip(xs, ys))


def aot_counting_backend(graphs):
    """aot_eager, counting the forward graphs it compiles: its backward runs as one unit per
    graph, the case DDP's bucket split is for."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def forward_compiler(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=forward_compiler,
                        bw_compiler=lambda gm, example_inputs: make_boxed_func(gm.forward))


def run_diverging(rank, name, out):
    """rank_scaled / rank_recompiles: the ranks take different compile decisions; what each
    rank raised (framejit.RankDivergence), and how long after the compiled run started."""
    import time
    make, batch, loss_fn, ddp_kwargs = scenario_setup(name)
    framejit.config.rank_check_timeout_s = 3.0
    model = DDP(same_models(make, 1)[0], **ddp_kwargs)
    compiled = framejit.compile(model, backend=aot_counting_backend([]))

    steps = []

    def after_step():
        steps.append(1)
        if name.startswith("rank_recompiles") and rank == 1 and len(steps) == 2:
            model.module.scale = 0.5
    start = time.perf_counter()
    try:
        train(compiled, batch, loss_fn, rank, 5, after_step=after_step)
        error = None
    except framejit.RankDivergence as e:
        error = str(e)
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(dict(error=error, seconds=time.perf_counter() - start, steps=len(steps)), f)
    # A rank that raised leaves the others inside DDP's next all-reduce. Where only some ranks
    # raise (rank_recompiles) it exits with an error, and the launcher (mp.spawn, as torchrun
    # does) ends the others: a rank in a collective whose peer is gone may hang in the
    # teardown. Where every rank raises (rank_scaled) all exit cleanly; rank 0 holds the
    # group's store and waits (5 s at most) for every other rank to be done reading it, so
    # their checks finish before the store goes.
    if error:
        import datetime
        store = dist.distributed_c10d._get_default_store()
        store.set(f"worker/raised/{rank}", "1")
        every_rank_raises = name == "rank_scaled"
        if rank == 0 and every_rank_raises:
            keys = [f"worker/raised/{r}" for r in range(1, dist.get_world_size())]
            try:
                store.wait(keys, datetime.timedelta(seconds=5))
            except Exception:  # noqa: BLE001  (the test then finds a rank's result missing)
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if every_rank_raises else 1)

def run_ddp(rank, name, out):
    make, batch, loss_fn, ddp_kwargs = scenario_setup(name)
    framejit.config.optimize_ddp = not name.endswith("_nosplit")
    framejit.config.check_ranks = not name.endswith("_unchecked")
    eager_model, compiled_model, single_model = same_models(make, 3)
    eager_ddp = DDP(eager_model, **ddp_kwargs)
    eager_grads, compiled_grads, single_grads = [], [], []
    eager_losses = train(eager_ddp, batch, loss_fn, rank, 5, grads=eager_grads)
    graphs = []
    ddp = DDP(compiled_model, **ddp_kwargs)
    compiled = framejit.compile(ddp, backend=aot_counting_backend(graphs))
    compiled_losses = train(compiled, batch, loss_fn, rank, 5, grads=compiled_grads)
    buckets = ddp._get_ddp_logging_data().get("num_buckets_reduced")
    # The global batch's loss is the mean of the ranks' losses (every rank's batch has the same
    # size): all-reduced here to compare with one process training on it.
    mean_losses = torch.tensor(compiled_losses, dtype=torch.float64)
    dist.all_reduce(mean_losses)
    single_losses = train(single_model, global_batch(batch, dist.get_world_size()), loss_fn, 0, 5,
                          grads=single_grads)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(dict(eager=eager_losses, compiled=compiled_losses, graphs=len(graphs),
                           buckets=buckets, checked=_distributed.RankCheck.events(),
                           param_diff=max_diff(eager_model.parameters(), compiled_model.parameters()),
                           grad_diff=max_diff(eager_grads, compiled_grads),
                           single_losses=single_losses,
                           mean_losses=(mean_losses / dist.get_world_size()).tolist(),
                           single_param_diff=max_diff(single_model.parameters(),
                                                      compiled_model.parameters()),
                           single_grad_diff=max_diff(single_grads, compiled_grads)), f)


def run_zoo(rank, name, out):
    """Every model of tests/models/zoo.py in DDP with 10 kB buckets (the larger models split),
    eager and compiled, 5 AdamW steps each; per model: losses equal, graphs, parameter and
    gradient differences."""
    results = {}
    for model_name, cls in sorted(ZOO.items()):
        def batch(step, r, cls=cls):
            torch.manual_seed(1000 * step + r)
            return cls.example(4), None

        def loss_fn(out, _target):
            leaves = torch.utils._pytree.tree_leaves(out)
            return sum(t.float().pow(2).mean() for t in leaves)
        eager_model, compiled_model = same_models(cls, 2)
        eager_grads, compiled_grads = [], []
        eager_losses = train(DDP(eager_model, bucket_cap_mb=0.01), batch, loss_fn, rank, 5,
                             grads=eager_grads)
        graphs = []
        compiled = framejit.compile(DDP(compiled_model, bucket_cap_mb=0.01),
                                    backend=aot_counting_backend(graphs))
        compiled_losses = train(compiled, batch, loss_fn, rank, 5, grads=compiled_grads)
        results[model_name] = dict(
            eager=eager_losses, compiled=compiled_losses, graphs=len(graphs),
            param_diff=max_diff(eager_model.parameters(), compiled_model.parameters()),
            grad_diff=max_diff(eager_grads, compiled_grads))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)


def run_fsdp(rank, name, out):
    from torch.distributed.fsdp import fully_shard
    make, batch, loss_fn, _ = scenario_setup(name)
    models = same_models(make, 2)
    for model in models:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    eager_losses = train(models[0], batch, loss_fn, rank, 5)
    counter = framejit.testing.CompileCounter()
    aot_graphs = []
    backend = counter if name.endswith("eager") else aot_counting_backend(aot_graphs)
    compiled = framejit.compile(models[1], backend=backend)

    def graphs():
        return counter.frame_count + len(aot_graphs)
    per_step = []
    compiled_losses = train(compiled, batch, loss_fn, rank, 5,
                            after_step=lambda: per_step.append(graphs()))
    per_step.append(graphs())
    param_diff = max((a.full_tensor() - b.full_tensor()).abs().max().item()
                     for a, b in zip(models[0].parameters(), models[1].parameters()))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(dict(eager=eager_losses, compiled=compiled_losses, graphs=graphs(),
                           graphs_after_step=per_step, param_diff=param_diff,
                           checked=_distributed.RankCheck.events()), f)


def run_bench(rank, name, out):
    """bench:<how>: steps/s of 20 AdamW steps (after 3 to compile and warm up) of an MLP of 8
    Linear(512, 512) blocks in DDP with 2 MB buckets (5 buckets), batch 64. <how>: eager,
    framejit_eager, framejit_aot, framejit_aot_nosplit, torch_aot, torch_aot_nosplit."""
    import time
    how = name.split(":", 1)[1]
    torch.manual_seed(0)
    ddp = DDP(Blocks(width=512, depth=8), bucket_cap_mb=2)
    if how.startswith("framejit"):
        framejit.config.optimize_ddp = not how.endswith("_nosplit")
        model = framejit.compile(ddp, backend="eager" if how == "framejit_eager" else "aot_eager")
    elif how.startswith("torch"):
        from torch import _dynamo
        _dynamo.config.optimize_ddp = not how.endswith("_nosplit")
        model = torch.compile(ddp, backend="aot_eager")
    else:
        model = ddp
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 512, generator=g), torch.randint(0, 10, (64,), generator=g)

    def step():
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    for _ in range(3):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(20):
        step()
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        with open(out, "w") as f:
            json.dump(dict(steps_per_s=20 / elapsed), f)


def rank_main(rank, world, port, name, out):
    """One rank: joins the gloo group over loopback, runs the scenario, leaves the group."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import datetime
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20 if name.startswith("rank_") else 600))
    # One thread per rank: the ranks share this machine's cores, and a multi-threaded GEMM may
    # split its sums differently from one call to the next under load (the eager and compiled
    # runs would then differ in the last bits).
    torch.set_num_threads(1)
    target = (run_fsdp if name.startswith("fsdp") else
              run_diverging if name in ("rank_scaled", "rank_recompiles") else
              run_zoo if name == "zoo" else
              run_bench if name.startswith("bench:") else run_ddp)
    try:
        target(rank, name, out)
    except BaseException:
        # Not destroy_process_group(): with a peer left inside a collective it can hang. The
        # error is printed and the process ends; mp.spawn then ends the other ranks.
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group()
    # Ended here, not by interpreter shutdown: gloo's and the store's threads racing the
    # teardown of the interpreter can abort a process that finished its work
    # ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    scenario, world, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    mp.spawn(rank_main, args=(world, free_port(), scenario, out), nprocs=world)
