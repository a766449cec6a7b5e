"""A whole training step (forward, loss, backward, optimizer step, zero_grad) through the hook:
torch.optim is traced, so each optimizer's update is one graph, compared with eager and with
torch.compile in the same process."""
import collections

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions

OPTIMIZERS = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1),
    "SGD-nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "Adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "AdamW-amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
}


def make(optimizer, layers=1):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                *[torch.nn.Linear(8, 8) for _ in range(layers - 1)],
                                torch.nn.Linear(8, 3))
    return model, OPTIMIZERS[optimizer](model.parameters())


def train_step(model, opt, x):
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def run(step, optimizer, steps=3, layers=1):
    model, opt = make(optimizer, layers)
    torch.manual_seed(1)
    losses = [step(model, opt, torch.randn(2, 4)) for _ in range(steps)]
    state = []
    for p in model.parameters():
        state += [p.detach().clone()] + [v for _, v in sorted(opt.state[p].items()) if torch.is_tensor(v)]
        assert p.grad is None  # zero_grad's set_to_none, replayed
    return losses, state


def close(a, b):
    # The update under a compiler computes its step sizes as float32 tensors where eager uses
    # Python floats (torch.optim's _get_value): the last bits differ, as under torch.compile.
    return len(a) == len(b) and all(torch.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a, b))


def update_graphs(counter):
    return [g for g in counter.graphs if "add_" in g.code or "addcmul_" in g.code or "lerp_" in g.code]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_training_step_traces_the_optimizer_update_into_one_graph(optimizer):
    counter = CompileCounter()
    compiled = framejit.compile(train_step, backend=counter)
    ref_losses, ref_state = run(train_step, optimizer)
    losses, state = run(compiled, optimizer)
    assert close(losses, ref_losses) and close(state, ref_state)
    # One graph holds the whole update, from the first step on (the state's lazy
    # initialisation included). The step function breaks at backward() and at opt.step(),
    # whose torch.optim wrapper calls torch._dynamo.graph_break() around the update on
    # purpose (as under torch.compile); zero_grad is in the last region.
    breaks = [r["exit"] for r in regions(train_step) if r["kind"] == "compiled"]
    assert breaks == ["call", "call", "return"]
    reasons = [r["reason"] for r in regions(train_step)][:2]  # as the graph_breaks log says
    assert "Tensor.backward() runs autograd outside the graph" in reasons[0]
    assert "torch._dynamo.graph_break(): the code asks for a break here" in reasons[1]
    updates = update_graphs(counter)
    assert updates, [g.code for g in counter.graphs]
    # The update of every parameter is in it: one in-place change per parameter at least.
    assert all(g.code.count("_(") >= 4 for g in updates)
    # Graphs: the forward, the update of the first step (which also makes the state lazily) and
    # of the steps after; SGD without momentum and Adagrad (state made in __init__) have one
    # update graph. The regions torch.optim's graph_break() calls leave holding only grad-mode
    # switches give no graph (the runtime switches, as torch.compile drops such graphs).
    assert counter.frame_count == (2 if optimizer in ("SGD", "Adagrad") else 3)
    assert not [g for g in counter.graphs if "_set_grad_enabled" in g.code and "_(" not in g.code]
    assert torch.is_grad_enabled()


def test_adamw_matches_torch_compile_and_compiles_once_per_state():
    counter = CompileCounter()
    compiled = framejit.compile(train_step, backend=counter)
    ref_losses, ref_state = run(train_step, "AdamW", steps=4)
    losses, state = run(compiled, "AdamW", steps=4)
    dynamo = torch.compile(train_step, backend="eager")
    torch._dynamo.reset()
    tc_losses, tc_state = run(dynamo, "AdamW", steps=4)
    assert close(losses, ref_losses) and close(state, ref_state)
    assert close(state, tc_state) and close(losses, tc_losses)
    first = counter.frame_count
    run(compiled, "AdamW", steps=2)  # a new model and optimizer of the same shapes
    # The state is keyed by the parameters, which are guarded by identity: a new optimizer
    # compiles its update again (as under torch.compile); the step function's own regions do not.
    assert counter.frame_count - first <= 2


def test_many_parameters_stay_below_the_recompile_limit(recwarn):
    counter = CompileCounter()
    compiled = framejit.compile(train_step, backend=counter)
    ref_losses, ref_state = run(train_step, "Adam", steps=3, layers=12)
    losses, state = run(compiled, "Adam", steps=3, layers=12)
    assert close(losses, ref_losses) and close(state, ref_state)
    assert not [w for w in recwarn if "recompile_limit" in str(w.message)]
    assert counter.frame_count == 3


def test_a_compiled_step_alone_updates_the_state_the_model_sees():
    model, opt = make("SGD-nesterov")
    ref_model, ref_opt = make("SGD-nesterov")
    step = framejit.compile(lambda o: o.step(), backend=CompileCounter())
    for _ in range(3):
        for m, o in ((model, opt), (ref_model, ref_opt)):
            m(torch.ones(2, 4)).sum().backward()
        step(opt)
        ref_opt.step()
        for m, o in ((model, opt), (ref_model, ref_opt)):
            o.zero_grad()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["momentum_buffer"], ref_opt.state[q]["momentum_buffer"])


def test_grad_of_an_input_is_read_and_set():
    def clip_and_clear(params):
        total = 0.0
        for p in params:
            if p.grad is not None:
                total = total + p.grad.square().sum()
                p.grad = None
        return total

    counter = CompileCounter()
    compiled = framejit.compile(clip_and_clear, backend=counter)
    for _ in range(2):
        w = torch.ones(3, requires_grad=True)
        v = torch.ones(2, requires_grad=True)
        (w * 2).sum().backward()  # v has no grad
        assert torch.equal(compiled([w, v]), torch.tensor(12.0))
        assert w.grad is None and v.grad is None
    assert counter.frame_count == 1
    assert "L['params'][0].grad" in regions(clip_and_clear)[0]["guards"]


def test_a_dict_keyed_by_objects_reads_guarded_and_stores_into_a_defaultdict():
    state = collections.defaultdict(dict)

    def remember(key, x):
        entry = state[key]
        if len(entry) == 0:
            entry["sum"] = torch.zeros_like(x)
        entry["sum"].add_(x)
        return entry["sum"] * 1

    counter = CompileCounter()
    compiled = framejit.compile(remember, backend=counter)
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    x = torch.ones(2)
    assert torch.equal(compiled(a, x), torch.ones(2)) and set(state) == {a}
    assert torch.equal(compiled(a, x), torch.full((2,), 2.0))
    assert torch.equal(compiled(b, x), torch.ones(2)) and set(state) == {a, b}
    assert torch.equal(compiled(b, x), torch.full((2,), 2.0))
    assert torch.equal(compiled(a, x), torch.full((2,), 3.0))
    assert counter.frame_count == 4  # (a missing, a present, b missing, b present)


def test_an_ordered_dict_is_read_like_a_dict_in_its_own_order():
    hooks = collections.OrderedDict(a=2.0, b=3.0)

    def scaled(x):
        for name, factor in hooks.items():
            x = x * factor
        return x, list(hooks)

    counter = CompileCounter()
    compiled = framejit.compile(scaled, backend=counter)
    x = torch.ones(2)
    assert torch.equal(compiled(x)[0], x * 6) and compiled(x)[1] == ["a", "b"]
    hooks.move_to_end("a")  # the same keys in another order: the dict's own order is guarded
    assert compiled(x)[1] == ["b", "a"]
    hooks["c"] = 0.5
    assert torch.equal(compiled(x)[0], x * 3) and counter.frame_count == 3


def test_zip_strict_raises_as_python_does():
    def pairs(xs, ys):
        return [x * y for x, y in zip(xs, ys, strict=True)]

    compiled = framejit.compile(pairs, backend=CompileCounter())
    t = torch.ones(2)
    assert len(compiled([t, t], [t, t])) == 2
    with pytest.raises(ValueError, match="shorter"):
        compiled([t, t], [t])
    with pytest.raises(ValueError, match="longer"):
        compiled([t], [t, t])


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(torch.relu(self.linear(x))) + x


class _Checkpointed(torch.nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block() for _ in range(3)])
        self.reentrant = reentrant

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return (x * x).mean()


@pytest.mark.parametrize("backend", ["eager", "native"])
@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("offload", [False, True], ids=["", "save_on_cpu"])
def test_activation_checkpointing_and_saved_tensor_hooks_see_only_the_programs_saves(
        backend, reentrant, offload):
    # A checkpointed block's frame is compiled inside checkpoint()'s saved-tensor hooks. The
    # trace's meta tensors (and the native backend's lowering) were packed by those hooks as if
    # the forward had saved them, so the recomputation in backward, which saves only the real
    # ones, raised CheckpointError; save_on_cpu would copy them. Hooks are off while compiling.
    import contextlib

    def grads(model, compiled):
        torch.manual_seed(1)
        x = torch.randn(4, 8, requires_grad=True)
        run = framejit.compile(model, backend=backend) if compiled else model
        for _ in range(2):  # the first call compiles, the second runs the cached graphs
            hooks = torch.autograd.graph.save_on_cpu() if offload else contextlib.nullcontext()
            with hooks:
                loss = run(x)
            loss.backward()
        return [loss.detach(), x.grad] + [p.grad for p in model.parameters()]

    torch.manual_seed(0)
    model = _Checkpointed(reentrant)
    ref = grads(model, False)
    model.zero_grad()
    got = grads(model, True)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, ref))


def test_saved_tensor_hooks_pack_the_same_tensors_as_eager_on_the_compiling_call():
    model = _Block()
    x = torch.randn(4, 8, requires_grad=True)
    packed = []

    def saves(run):
        packed.clear()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.device) or t,
                                                      lambda t: t):
            run(x)
        return list(packed)

    eager = saves(model)
    compiled = framejit.compile(model, backend=CompileCounter())
    assert saves(compiled) == eager  # the compiling call: no meta tensor of the trace
    assert saves(compiled) == eager
    assert all(d.type == "cpu" for d in eager)


def step_with_clipping_and_a_schedule(model, opt, sched, x):
    loss = model(x).sum()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    sched.step()
    opt.zero_grad()
    return loss.detach(), norm


@pytest.mark.parametrize("backend", ["eager", "native"])
def test_a_learning_rate_a_scheduler_changes_compiles_once_more_not_every_step(backend):
    # The scheduler writes a new float into the param group every step: the first compile
    # specialises it (guarded equal), the second finds it changed and reads it as a run-time
    # number from then on (a scalar graph input), as torch.compile does.
    def train(compiled):
        model, opt = make("AdamW")
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
        counter = CompileCounter(None if backend == "eager" else backend)
        step = framejit.compile(step_with_clipping_and_a_schedule, backend=counter) if compiled else \
            step_with_clipping_and_a_schedule
        torch.manual_seed(1)
        counts, outs = [], []
        for _ in range(8):
            outs += list(step(model, opt, sched, torch.randn(2, 4)))
            counts.append(counter.frame_count)
        return outs + [p.detach().clone() for p in model.parameters()], counts, opt

    expected, _, eager_opt = train(False)
    got, counts, opt = train(True)
    # (over 8 steps the float32 step sizes' last bits add up a little more than in `close`)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, expected))
    assert opt.param_groups[0]["lr"] == eager_opt.param_groups[0]["lr"]
    assert counts[-1] == counts[2]  # nothing compiles after the second step
    assert counts[-1] <= 5


class _Scaled:
    scale = 0.5


def scales(x, config):
    return x * config.scale + 1


def test_a_float_attribute_that_changes_is_a_run_time_number_after_its_second_compile():
    counter = CompileCounter()
    compiled = framejit.compile(scales, backend=counter)
    config = _Scaled()
    x = torch.randn(3)
    counts = []
    for value in (0.5, 0.25, 0.125, 2.0, 3.5):
        config.scale = value
        assert torch.allclose(compiled(x, config), scales(x, config))
        counts.append(counter.frame_count)
    assert counts == [1, 2, 2, 2, 2]
    assert "config_scale: \"Sym(f64)\"" in regions(scales)[-1]["graph"]
    # dynamic=False specialises every value
    framejit.reset()
    counter = CompileCounter()
    static = framejit.compile(scales, backend=counter, dynamic=False)
    for value in (0.5, 0.25, 0.125):
        config.scale = value
        assert torch.allclose(static(x, config), scales(x, config))
    assert counter.frame_count == 3


def clips(model, x):
    loss = model(x).sum()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    value_clipped = torch.nn.utils.clip_grad_norm_([p for p in model.parameters()][:1], 0.1, norm_type="inf")
    return norm, value_clipped, [p.grad.clone() for p in model.parameters()]


class _TwoDtypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 8).double()
        self.second = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)).float())


def test_clip_grad_norm_is_traced_into_the_graph_after_backward():
    # The region after backward() holds both clips: clip_grad_norm_ is inlined (the gradients
    # grouped by device and dtype at trace time: two groups here), as torch.compile inlines it.
    def run(compiled):
        torch.manual_seed(0)
        model = _TwoDtypes()
        x = torch.randn(2, 4, dtype=torch.float64)
        step = framejit.compile(clips, backend="eager") if compiled else clips
        return step(model, x)

    assert same_tree(run(True), run(False))
    assert [r["exit"] for r in regions(clips)] == ["call", "return"]  # only backward() breaks


def same_tree(a, b):
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_tree(x, y) for x, y in zip(a, b))
    return torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def lbfgs_training(model, opt, x, y):
    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss
    return opt.step(closure)


def test_lbfgs_and_sparse_adam_steps_run_as_plain_python_as_under_torch_compile():
    # LBFGS re-evaluates the closure in data-dependent line searches (traced, 48 graphs for
    # pytorch/examples' time_sequence_prediction); torch.compile leaves its step untraced, and so
    # does framejit: the same parameters as eager, and no graph for the step.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    twin = collections.OrderedDict((k, v.clone()) for k, v in model.state_dict().items())
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    eager_model = torch.nn.Linear(4, 1)
    eager_model.load_state_dict(twin)
    eager_opt = torch.optim.LBFGS(eager_model.parameters(), lr=0.5, max_iter=5)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    counter = CompileCounter()
    compiled = framejit.compile(lbfgs_training, backend=counter)
    for _ in range(3):
        assert torch.allclose(compiled(model, opt, x, y), lbfgs_training(eager_model, eager_opt, x, y))
    for p, q in zip(model.parameters(), eager_model.parameters()):
        assert torch.allclose(p, q)
    assert counter.frame_count == 0
    assert getattr(torch.optim.SparseAdam.step, "_framejit_untraced", False)


LBFGS_BEFORE_THE_FIRST_COMPILE = """
import torch, framejit
w = torch.nn.Parameter(torch.ones(2))
torch.optim.LBFGS([w])  # wraps LBFGS.step for hooks, marked `hooked`
framejit.compile(lambda x: x + 1, backend="eager")(torch.ones(1))  # framejit wraps it again
opt = torch.optim.LBFGS([w], max_iter=1)
calls = []
opt.register_step_pre_hook(lambda *a: calls.append("pre"))
opt.register_step_post_hook(lambda *a: calls.append("post"))

def closure():
    opt.zero_grad()
    loss = (w * w).sum()
    loss.backward()
    return loss

opt.step(closure)
print(calls)
"""


def test_step_hooks_run_once_when_an_lbfgs_was_made_before_the_first_compile():
    # The mark Optimizer leaves on a step it wrapped for hooks (`hooked`) must stay on framejit's
    # wrapper, or the next LBFGS wraps it once more and its hooks run twice. (In a process of its
    # own: the order of the first LBFGS and the first compile matters.)
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", LBFGS_BEFORE_THE_FIRST_COMPILE], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['pre', 'post']"
