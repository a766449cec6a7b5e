"""framejit under torch.distributed: DDP and FSDP2 on gloo, ranks as processes on this machine
(tests/python/distributed_worker.py), each trained 5 AdamW steps beside the same model in eager
DDP / FSDP2 from the same weights on the same batches."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import framejit
from framejit import _distributed

WORKER = Path(__file__).resolve().parent / "distributed_worker.py"

needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")


def run_ranks(scenario, world, tmp_path, must_succeed=True):
    out = tmp_path / f"{scenario}-{world}.json"
    done = subprocess.run([sys.executable, "-W", "ignore", str(WORKER), scenario, str(world), str(out)],
                          capture_output=True, text=True, timeout=240)
    if not must_succeed:
        return [json.loads(Path(f"{out}.rank{r}").read_text())
                if Path(f"{out}.rank{r}").exists() else None for r in range(world)]
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def assert_trains_as_eager(result):
    """Every loss and every parameter after 5 steps bit for bit as in the eager run, and every
    compile compared with the other ranks' (framejit.config.check_ranks)."""
    assert result["compiled"] == result["eager"]
    assert result["param_diff"] == 0.0
    assert result["checked"] >= 1


def assert_trains_as_one_process(result, param_tol):
    """As one process training on the ranks' batches together: the same loss (the mean of the
    ranks' losses) and gradients up to float summation order; parameters after 5 AdamW steps
    within `param_tol` (AdamW divides by the root of the squared gradients, which lifts
    differences in the last bits of tiny gradients)."""
    assert result["mean_losses"] == pytest.approx(result["single_losses"], rel=1e-5)
    assert result["single_grad_diff"] < 1e-5
    assert result["single_param_diff"] < param_tol


@needs_gloo
@pytest.mark.parametrize("scenario,graphs", [
    # Blocks: 6 Linear(256, 256) blocks (263,168 bytes each), LayerNorm and head; buckets of
    # 0.3 MB (314,572 bytes). From the output back: head + norm + block 5 + block 4 close the
    # first bucket, blocks 3 + 2 the second, 1 + 0 the third: 3 pieces, each compiled apart.
    ("blocks", 3),
    ("blocks_nosplit", 1),  # framejit.config.optimize_ddp = False
])
def test_ddp_two_ranks_train_as_eager_ddp_with_a_graph_per_bucket(tmp_path, scenario, graphs):
    result = run_ranks(scenario, 2, tmp_path)
    assert_trains_as_eager(result)
    assert result["grad_diff"] == 0.0
    assert result["graphs"] == graphs
    assert_trains_as_one_process(result, param_tol=1e-4)


@needs_gloo
def test_ranks_specialising_on_different_values_raise_naming_the_guard(tmp_path):
    # Each rank's `self.scale` is 1.0 + rank: both ranks compile forward at once, compare their
    # guards through the group's store, and raise before the first step's collectives.
    rank0, rank1 = run_ranks("rank_scaled", 2, tmp_path, must_succeed=False)
    for result, mine, theirs in ((rank0, 0, 1), (rank1, 1, 0)):
        assert result["steps"] == 0 and result["seconds"] < 20
        assert (f"ranks {mine} and {theirs} compiled RankScaled.forward "
                f"({WORKER}:") in result["error"]
        assert (f"rank {mine} guards CONSTANT_MATCH L['self'].scale == {1.0 + mine}, rank "
                f"{theirs} guards CONSTANT_MATCH L['self'].scale == {1.0 + theirs}"
                in result["error"])


@needs_gloo
def test_a_recompile_on_one_rank_only_raises_within_the_timeout(tmp_path):
    # After 2 steps rank 1 alone changes `scale`: it recompiles, waits 3 s
    # (config.rank_check_timeout_s) for rank 0 to compile the same, and raises naming the guard
    # that failed. Rank 0, left in DDP's next all-reduce, is ended by the launcher when rank 1
    # exits with the error.
    rank0, rank1 = run_ranks("rank_recompiles", 2, tmp_path, must_succeed=False)
    assert rank0 is None
    assert rank1["steps"] == 2 and 3 <= rank1["seconds"] < 20
    assert ("rank 1 compiled RankRecompiles.forward" in rank1["error"]
            and "recompiled because CONSTANT_MATCH L['self'].scale == 1.0 (got 0.5)" in rank1["error"]
            and "rank(s) 0 did not compile it within 3 s" in rank1["error"])


@needs_gloo
def test_rank_dependent_values_train_as_eager_with_the_check_off(tmp_path):
    # config.check_ranks = False: each rank's graphs are specialised on its own `self.scale`.
    # framejit never puts a collective into a graph (DDP's and FSDP2's run eagerly from their
    # hooks, torch.distributed calls are not graph ops), so the ranks issue the same
    # collectives in the same order as eager: no hang.
    result = run_ranks("rank_scaled_unchecked", 2, tmp_path)
    assert result["compiled"] == result["eager"] and result["param_diff"] == 0.0
    assert result["graphs"] == 3 and result["checked"] == 0


@needs_gloo
@pytest.mark.parametrize("world,param_tol", [(2, 1e-6), (4, 1e-3)])
def test_ddp_zoo_models_train_as_eager_ddp(tmp_path, world, param_tol):
    # Every model of tests/models/zoo.py in DDP with 10 kB buckets: the GPT block and the ViT
    # encoder have more than one bucket of parameters and are split. Gradients agree to the
    # last bits; on 4 ranks gloo's ring sums a bucket in an order that follows its layout (see
    # the nanoGPT test), and AdamW lifts that to ~1e-4 on parameters with tiny gradients.
    results = run_ranks("zoo", world, tmp_path)
    graphs = {name: r["graphs"] for name, r in results.items()}
    assert graphs == {"cnn": 1, "embedding_classifier": 1, "gpt_block": 4, "gru_sequence": 1,
                      "lstm_loop": 1, "mlp": 1, "resnet_block": 1, "vit_encoder": 3}
    for name, r in results.items():
        assert r["compiled"] == pytest.approx(r["eager"], rel=1e-6), name
        assert r["grad_diff"] < 1e-6 and r["param_diff"] < param_tol, name


@needs_gloo
def test_ddp_two_ranks_nanogpt_style_model_trains_as_eager_ddp(tmp_path):
    result = run_ranks("gpt", 2, tmp_path)
    assert_trains_as_eager(result)
    assert result["grad_diff"] == 0.0
    assert result["graphs"] == int(result["buckets"]) == 7
    assert_trains_as_one_process(result, param_tol=1e-3)


@needs_gloo
def test_ddp_four_ranks_nanogpt_style_model_has_a_piece_per_bucket(tmp_path):
    # Tied embedding / head, causal attention; buckets of 0.05 MB: as many pieces as DDP has
    # buckets. On 4 ranks gloo's ring all-reduce sums each bucket's chunks in an order that
    # follows the bucket layout, which DDP rebuilds from the order gradients became ready (a
    # compiled backward makes them ready in another order): the gradients differ in the last
    # bits, and AdamW's normalisation lifts that to ~1e-4 on parameters with tiny gradients.
    # torch.compile (aot_eager, one graph) differs from eager DDP here by the same 2.2e-4.
    result = run_ranks("gpt", 4, tmp_path)
    assert result["compiled"] == pytest.approx(result["eager"], rel=1e-5)
    assert result["param_diff"] < 1e-3 and result["grad_diff"] < 1e-5
    assert result["checked"] >= 1
    assert_trains_as_one_process(result, param_tol=1e-3)
    assert result["graphs"] == int(result["buckets"]) == 7


@needs_gloo
@pytest.mark.parametrize("scenario", ["fsdp_eager", "fsdp_aot"])
def test_fsdp2_per_block_and_root_trains_as_eager_fsdp2_without_recompiling(tmp_path, scenario):
    # fully_shard on every block and on the root: FSDP2's hooks run as torch runs them (the
    # blocks are called with their hooks, outside the graphs), parameters are read from the
    # modules on every call as FSDP2 swaps them between sharded and unsharded tensors.
    result = run_ranks(scenario, 2, tmp_path)
    assert_trains_as_eager(result)
    steps = result["graphs_after_step"]
    assert steps[0] > 0 and steps == [steps[0]] * 5  # all compiled in the first step


def test_bucket_assignment_walks_back_from_the_output():
    class Three(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 16)  # 1,088 bytes with its bias
            self.b = torch.nn.Linear(16, 16)
            self.c = torch.nn.Linear(16, 16)

        def forward(self, x):
            return self.c(self.b(self.a(x)).relu())

    graph_holder = []

    def capture(gm, example_inputs):
        graph_holder.append((gm, example_inputs))
        return gm.forward

    model = Three()
    framejit.compile(model, backend=capture)(torch.randn(2, 16))
    gm, example_inputs = graph_holder[0]
    pieces = {}
    for cap, first in ((1000, 1000), (2000, 2000), (10_000, 10_000), (2000, 1000)):
        assignment, count = _distributed.assign_buckets(gm.graph, example_inputs, first, cap)
        order = [assignment[n] for n in gm.graph.nodes if n in assignment]
        assert order == sorted(order)  # contiguous pieces in forward order
        pieces[(cap, first)] = count
    # One layer fills a 1,000-byte bucket; two a 2,000-byte one (c + b, then a); all fit 10 kB;
    # a small first bucket takes c alone, then b + a.
    assert pieces == {(1000, 1000): 3, (2000, 2000): 2, (10_000, 10_000): 1, (2000, 1000): 2}


def test_graphs_outside_ddp_and_framejits_own_backends_are_not_split():
    calls = []

    def backend(gm, example_inputs):
        calls.append(gm)
        return gm.forward

    assert _distributed.ddp_aware(framejit.backends.eager) is framejit.backends.eager
    wrapped = _distributed.ddp_aware(backend)
    assert _distributed.active_ddp_module() is None
    f = framejit.compile(lambda x: torch.nn.functional.linear(x, torch.ones(3, 3)).relu(),
                         backend=wrapped)
    f(torch.randn(2, 3))
    assert len(calls) == 1 and not hasattr(calls[0], "framejit_pieces")
