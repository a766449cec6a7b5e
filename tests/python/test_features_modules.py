"""Feature tests for nn.Module: submodules, containers (ModuleList, ModuleDict, Sequential,
ParameterList) iterated and indexed, torch.nn built-in layers in train and eval mode,
self.training branches, parameters and buffers. Each case builds two identical modules; one
runs compiled, one eager, and their outputs and state_dicts (running statistics included) must
stay equal while the graph count is held to an exact number."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import framejit
from feature_checks import check_module, rand
from framejit.testing import CompileCounter, same

ONE = {"return"}  # one region that runs to the return: no break


# ---------------------------------------------------------------------------------------------
# Submodules and containers
# ---------------------------------------------------------------------------------------------

class Submodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.proj(x))


class NestedSubmodules(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Submodule()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block(x))


class ModuleListLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class ModuleListIndex(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        return self.layers[-1](self.layers[0](x))


class ModuleListEnumerate(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) * (i + 1)
        return x


class ModuleListLen(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        return x * len(self.layers)


class ModuleListSlice(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])

    def forward(self, x):
        for layer in self.layers[1:3]:
            x = layer(x)
        return x


class ModuleDictItems(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})

    def forward(self, x):
        out = {}
        for name, head in self.heads.items():
            out[name] = head(x)
        return out


class ModuleDictKey(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})

    def forward(self, x):
        return self.heads["b"](x)


class ModuleDictValues(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})

    def forward(self, x):
        return sum(head(x) for head in self.heads.values())


class ModuleDictKeys(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})

    def forward(self, x):
        return [self.heads[k](x) for k in self.heads.keys()]


class SequentialCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x):
        return self.net(x)


class SequentialIndex(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x):
        return self.net[0](x) + self.net[-1].bias.sum()


class SequentialIterate(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4))

    def forward(self, x):
        for layer in self.net:
            x = layer(x) + x
        return x


class ParameterListLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(3)])

    def forward(self, x):
        for s in self.scales:
            x = x * s
        return x


# ---------------------------------------------------------------------------------------------
# Parameters, buffers, plain attributes, training flag
# ---------------------------------------------------------------------------------------------

class DirectParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x @ self.weight


class RegisteredBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x):
        return x - self.offset


class ParametersIterated(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        penalty = sum(p.pow(2).sum() for p in self.parameters())
        return self.b(self.a(x)), penalty


class NamedBuffersIterated(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("m", torch.ones(4))
        self.register_buffer("s", torch.full((4,), 2.0))

    def forward(self, x):
        for name, buf in self.named_buffers():
            x = x * buf if name == "s" else x + buf
        return x


class ModulesHooksCheck(nn.Module):
    """The fast-path test of nn.TransformerEncoderLayer: a generator over self.modules()."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        if any(len(getattr(m, "_forward_hooks", {})) for m in self.modules()):
            return x
        names = [name for name, _ in self.named_modules()]
        return self.inner(x) * len(names)


class DtypeFromFirstParameter(nn.Module):
    """The HF idiom `next(self.parameters()).dtype`."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x.to(next(self.parameters()).dtype))


class PlainAttributes(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 0.5
        self.act = "relu"

    def forward(self, x):
        return getattr(F, self.act)(x) * self.scale


class TrainingBranch(nn.Module):
    def forward(self, x):
        if self.training:
            return x * 2
        return x - 1


class HelperMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def project(self, x):
        return self.proj(x) * 0.5

    def forward(self, x):
        return self.project(x) + self.project(-x)


class FunctionalWithParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return F.linear(x, self.lin.weight, self.lin.bias)


# ---------------------------------------------------------------------------------------------
# torch.nn built-in layers, called directly as the compiled module
# ---------------------------------------------------------------------------------------------

class Wrapped(nn.Module):
    """A user module around one built-in layer: the way layers are met in real models."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, *args):
        return self.layer(*args)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        out, weights = self.mha(x, x, x)
        return out, weights


class MaskedAttention(nn.Module):
    def __init__(self, need_weights=True):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2)
        self.need_weights = need_weights

    def forward(self, x, mask):
        out, _ = self.mha(x, x, x, attn_mask=mask, need_weights=self.need_weights)
        return out


class LSTMStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(4, 6)

    def forward(self, x):
        h, c = self.cell(x)
        return h + c


class GRUStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(4, 6)

    def forward(self, x, h):
        return self.cell(x, h)


X = rand(2, 4)
IMG = rand(2, 3, 6, 6)
SEQ = rand(2, 3, 5)
CAUSAL = torch.triu(torch.ones(3, 3, dtype=torch.bool), 1)

CASES = [
    # (id, make the module, arguments, graphs, region exits of its forward)
    ("submodule", Submodule, (X,), 1, ONE),
    ("nested_submodules", NestedSubmodules, (X,), 1, ONE),
    ("modulelist_for", ModuleListLoop, (X,), 1, ONE),
    ("modulelist_index", ModuleListIndex, (X,), 1, ONE),
    ("modulelist_enumerate", ModuleListEnumerate, (X,), 1, ONE),
    ("modulelist_len", ModuleListLen, (X,), 1, ONE),
    ("modulelist_slice", ModuleListSlice, (X,), 1, ONE),
    ("moduledict_items", ModuleDictItems, (X,), 1, ONE),
    ("moduledict_key", ModuleDictKey, (X,), 1, ONE),
    ("moduledict_values", ModuleDictValues, (X,), 1, ONE),
    ("moduledict_keys", ModuleDictKeys, (X,), 1, ONE),
    ("sequential_call", SequentialCall, (X,), 1, ONE),
    ("sequential_index", SequentialIndex, (X,), 1, ONE),
    ("sequential_iterate", SequentialIterate, (X,), 1, ONE),
    ("parameterlist_for", ParameterListLoop, (X,), 1, ONE),
    ("direct_parameter", DirectParameter, (X,), 1, ONE),
    ("registered_buffer", RegisteredBuffer, (X,), 1, ONE),
    # parameters() / named_buffers(): the live module tree, each member read by source
    ("parameters_iterated", ParametersIterated, (X,), 1, ONE),
    ("named_buffers_iterated", NamedBuffersIterated, (X,), 1, ONE),
    ("modules_hooks_check", ModulesHooksCheck, (X,), 1, ONE),
    ("next_of_parameters", DtypeFromFirstParameter, (X,), 1, ONE),
    # getattr(F, self.act): the function read from torch.nn.functional
    ("plain_attributes", PlainAttributes, (X,), 1, ONE),
    ("training_branch_train", lambda: TrainingBranch().train(), (X,), 1, ONE),
    ("training_branch_eval", lambda: TrainingBranch().eval(), (X,), 1, ONE),
    ("helper_method", HelperMethod, (X,), 1, ONE),
    ("functional_with_parameters", FunctionalWithParameters, (X,), 1, ONE),
    ("linear", lambda: Wrapped(nn.Linear(4, 3)), (X,), 1, ONE),
    ("conv1d", lambda: Wrapped(nn.Conv1d(3, 4, 3, padding=1)), (SEQ,), 1, ONE),
    ("conv2d", lambda: Wrapped(nn.Conv2d(3, 4, 3, stride=2)), (IMG,), 1, ONE),
    ("batchnorm_train", lambda: Wrapped(nn.BatchNorm2d(3).train()), (IMG,), 1, ONE),
    ("batchnorm_eval", lambda: Wrapped(nn.BatchNorm2d(3).eval()), (IMG,), 1, ONE),
    ("layernorm", lambda: Wrapped(nn.LayerNorm(5)), (SEQ,), 1, ONE),
    ("groupnorm", lambda: Wrapped(nn.GroupNorm(1, 3)), (IMG,), 1, ONE),
    ("dropout_eval", lambda: Wrapped(nn.Dropout(0.5).eval()), (X,), 1, ONE),
    ("embedding", lambda: Wrapped(nn.Embedding(10, 4)), (torch.tensor([[1, 2], [3, 9]]),), 1, ONE),
    # MultiheadAttention.forward: torch.nn.functional's private helpers are inlined
    ("multihead_attention", Attention, (rand(2, 3, 8),), 1, ONE),
    ("multihead_attention_masked", MaskedAttention, (rand(3, 2, 8), CAUSAL), 1, ONE),
    # need_weights=False: F.multi_head_attention_forward is a graph node whose result is
    # (tensor, None); the None is a constant of the trace
    ("multihead_attention_no_weights", lambda: MaskedAttention(need_weights=False),
     (rand(3, 2, 8), CAUSAL), 1, ONE),
    ("lstm_cell", LSTMStep, (X,), 1, ONE),
    ("gru_cell", GRUStep, (X, rand(2, 6, seed=1)), 1, ONE),
]


@pytest.mark.parametrize("make,args,graphs,exits", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_module_construct(make, args, graphs, exits):
    check_module(make, *args, graphs=graphs, exits=exits)


@pytest.mark.parametrize("make,args", [
    (lambda: nn.Linear(4, 3), (X,)),
    (lambda: nn.BatchNorm2d(3).train(), (IMG,)),
])
def test_bare_builtin_module_is_compiled(make, args):
    # Compiling a torch.nn layer itself (not a user module holding it): its forward lives in
    # torch, which is never hooked, but that one code object is allowed, so it makes a graph.
    check_module(make, *args, graphs=1, exits=ONE)


def test_dropout_train_draws_like_eager():
    # Same seed before each side: the graph must draw its mask the way eager does.
    check_module(lambda: Wrapped(nn.Dropout(0.5).train()), X, graphs=1, exits=ONE, seed_rng=True)


def test_training_flag_flip_compiles_the_other_side():
    counter, compiled = check_module(TrainingBranch, X, graphs=1, exits=ONE)
    compiled.eval()  # guarded: the flag is read at trace time, so the eval side compiles now
    assert torch.equal(compiled(X), X - 1)
    assert counter.frame_count == 2
    compiled.train()
    assert torch.equal(compiled(X), X * 2)
    assert counter.frame_count == 2


def test_a_property_subclass_wins_over_a_parameter_of_the_same_name():
    class myprop(property):
        pass

    class Shadowed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self._parameters["w"] = torch.nn.Parameter(torch.ones(2))

        @myprop
        def w(self):
            return torch.full((2,), 5.0)

        def forward(self, x):
            return x * self.w

    model = Shadowed()
    compiled = framejit.compile(model, backend="eager")
    x = torch.randn(2)
    assert same(compiled(x), model(x))


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_torch_nn_module_compiled_directly_is_traced(training, grad):
    """nn.TransformerEncoderLayer's own forward lives in torch's files, which the hook skips;
    compiling the module allows that code. Its fast-path checks (a generator over
    self.modules(), getattr with defaults) trace, so eval under no_grad is one fast-path op."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).train(training)
    counter = CompileCounter()
    compiled = framejit.compile(layer, backend=counter)
    for batch in (2, 3):
        x = rand(batch, 5, 16, seed=batch)
        with torch.set_grad_enabled(grad):
            assert same(compiled(x), layer(x), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1
    targets = [n.target for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    fast = any(getattr(t, "__name__", "") == "_transformer_encoder_layer_fwd" for t in targets)
    assert fast == (not training and not grad)


class WeightNormedConv(nn.Module):
    """wav2vec2's positional convolution: a weight_norm parametrization (its forward calls
    `self[0](*(getattr(self, f"original{i}") for i in range(n)))`), and a submodule named
    `output`, whose call's node would be named like the graph's output node."""

    def __init__(self):
        super().__init__()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3, padding=1), dim=2)
        self.output = nn.Linear(4, 4)

    def forward(self, x):
        return self.output(torch.relu(self.conv(x)).transpose(1, 2))


def test_a_weight_norm_parametrization_and_a_submodule_named_output_are_one_graph():
    torch.manual_seed(0)
    model = WeightNormedConv()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    for batch in (2, 3):
        x = torch.randn(batch, 4, 10)
        assert same(compiled(x), model(x), atol=1e-6)
    assert counter.frame_count == 1

    def star_of_a_generator(xs):
        return torch.add(*(t * 2 for t in xs))

    xs = [torch.randn(3), torch.randn(3)]
    counter = CompileCounter()
    assert same(framejit.compile(star_of_a_generator, backend=counter)(xs), star_of_a_generator(xs))
    assert counter.frame_count == 1


class _PartialConv(torch.nn.Module):
    """timm's FasterNet Partial_conv3: `self.forward = self.forward_slicing` in __init__."""

    def __init__(self, mode):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 3, padding=1, bias=False)
        self.forward = self.forward_slicing if mode == "slicing" else self.forward_split

    def forward_slicing(self, x):
        x = x.clone()
        x[:, :2] = self.conv(x[:, :2])
        return x

    def forward_split(self, x):
        a, b = torch.split(x, [2, x.shape[1] - 2], dim=1)
        return torch.cat((self.conv(a), b), 1)


def test_a_forward_set_on_the_instance_is_traced_and_guarded():
    for mode in ("slicing", "split"):
        model = torch.nn.Sequential(_PartialConv(mode), torch.nn.ReLU())
        counter = CompileCounter()
        compiled = framejit.compile(model, backend=counter)
        x = torch.randn(2, 5, 6, 6)
        assert same(compiled(x), model(x)) and counter.frame_count == 1
        assert framejit.explain(model)(x).graph_break_count == 0
        model[0].forward = model[0].forward_split if mode == "slicing" else model[0].forward_slicing
        assert same(compiled(x), model(x)) and counter.frame_count == 2  # the guard saw the change
