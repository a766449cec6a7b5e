"""torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=False) inside compiled code: fn is
traced in place and its calls outlined into a graph of their own, which one node of the region's
graph runs through checkpoint (activations not kept, recomputed in the backward pass with the
random state they had), as torch.compile puts it into its graph. Compared with eager: losses,
gradients, the tensors autograd keeps, the printed graph."""
import warnings

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import framejit
from framejit.testing import CompileCounter, regions, same


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 32)
        self.down = torch.nn.Linear(32, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x, scale=1.0):
        return x + self.down(self.drop(torch.relu(self.up(x)))) * scale


class Net(torch.nn.Module):
    def __init__(self, reentrant=False, checkpointed=True):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(8, 1)
        self.reentrant = reentrant
        self.checkpointed = checkpointed

    def forward(self, x):
        for block in self.blocks:
            if self.checkpointed:
                x = checkpoint(block, x, 0.5, use_reentrant=self.reentrant)
            else:
                x = block(x, scale=0.5)
        return self.head(x).sum()


def loss_and_gradients(model, x, seed=1):
    torch.manual_seed(seed)  # the same dropout masks in both runs
    loss = model(x)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    return loss.detach(), grads


@pytest.mark.parametrize("backend", ["eager", "native", "aot_eager"])
def test_checkpointed_blocks_with_dropout_are_one_graph_with_eagers_gradients(backend):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 8, requires_grad=True)
    expected = loss_and_gradients(net, x)
    counter = CompileCounter() if backend == "eager" else CompileCounter(backend)
    compiled = framejit.compile(net, backend=counter)
    for _ in range(2):
        assert same(loss_and_gradients(compiled, x), expected)
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(Net.forward)] == ["return"]


def test_the_graph_calls_each_body_through_checkpoint_and_prints_it():
    torch.manual_seed(0)
    net = Net()
    compiled = framejit.compile(net, backend="eager")
    compiled(torch.randn(4, 8, requires_grad=True))
    text = regions(Net.forward)[0]["graph"]
    for k in range(3):
        assert f"= self.checkpoint_body_{k}(" in text
        assert (f"# checkpoint_body_{k} (run by torch.utils.checkpoint.checkpoint("
                f"self.checkpoint_body_{k}, ..., use_reentrant=False)):") in text
    body = text.split("# checkpoint_body_0")[1].split("# checkpoint_body_1")[0]
    assert "torch.nn.functional.dropout(" in body and "torch.relu(" in body
    outer = text.split("# checkpoint_body_0")[0]
    assert "dropout" not in outer and "relu" not in outer  # the bodies' ops are not in the graph


def saved_tensor_count(model, x):
    """The activations autograd keeps for the backward pass (tensors saved that are not views of
    a parameter: the body's inputs include the parameters it reads, which cost nothing)."""
    count = 0
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        nonlocal count
        count += t.untyped_storage().data_ptr() not in parameters
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x)
    loss.backward()
    return count


def test_the_compiled_model_keeps_only_what_eagers_checkpoint_keeps():
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 8, requires_grad=True)
    eager_kept = saved_tensor_count(net, x)
    compiled = framejit.compile(net, backend="eager")
    compiled(x).backward()  # (the first call traces, on meta tensors)
    compiled_kept = saved_tensor_count(compiled, x)
    assert compiled_kept == eager_kept
    net.checkpointed = False  # the same model without checkpoint keeps every activation
    assert saved_tensor_count(net, x) > eager_kept


def test_reentrant_checkpoint_is_left_to_python_with_eagers_gradients():
    torch.manual_seed(0)
    net = Net(reentrant=True)
    x = torch.randn(4, 8, requires_grad=True)
    expected = loss_and_gradients(net, x)
    counter = CompileCounter()
    compiled = framejit.compile(net, backend=counter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert same(loss_and_gradients(compiled, x), expected)
    assert "call" in [r["exit"] for r in regions(Net.forward)]  # checkpoint: a break


def test_without_gradients_the_bodies_run_as_they_are():
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(4, 8)
    counter = CompileCounter()
    compiled = framejit.compile(net, backend=counter)
    with torch.no_grad():
        assert same(compiled(x), net(x))
    assert counter.frame_count == 1


def writes_into_its_input(t, w):
    t.mul_(2)
    return t * w


def checkpoints_a_function_writing_its_input(x, w):
    y = x * 1.0
    out = checkpoint(writes_into_its_input, y, w, use_reentrant=False)
    return out.sum() + y.sum()


def test_a_body_writing_into_a_tensor_from_outside_is_not_outlined():
    # Recomputed in the backward pass, it would write a second time: Python runs the call, and
    # its backward fails as eager's does (autograd sees the input changed).
    x = torch.randn(5, requires_grad=True)
    w = torch.randn(5, requires_grad=True)
    expected = checkpoints_a_function_writing_its_input(x, w)
    out = framejit.compile(checkpoints_a_function_writing_its_input, backend="eager")(x, w)
    assert same(out, expected)
    assert "call" in [r["exit"] for r in regions(checkpoints_a_function_writing_its_input)]
    for result in (expected, out):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            result.backward()


def checkpoints_a_closure_and_a_nested_checkpoint(x, w):
    def inner(a):
        return torch.sin(a) * w

    def outer(a, bias=0.0):
        return checkpoint(inner, a + bias, use_reentrant=False).cos()

    return checkpoint(outer, x, bias=1.0, use_reentrant=False, preserve_rng_state=False) * 2


def test_a_closure_over_a_tensor_and_a_nested_checkpoint_are_one_graph():
    x = torch.randn(6, requires_grad=True)
    w = torch.randn(6, requires_grad=True)
    expected = checkpoints_a_closure_and_a_nested_checkpoint(x, w)
    expected.sum().backward()
    expected_grads = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    counter = CompileCounter()
    out = framejit.compile(checkpoints_a_closure_and_a_nested_checkpoint, backend=counter)(x, w)
    out.sum().backward()
    assert same(out, expected) and same((x.grad, w.grad), expected_grads)
    assert counter.frame_count == 1
    text = regions(checkpoints_a_closure_and_a_nested_checkpoint)[0]["graph"]
    assert text.count("= self.checkpoint_body_") == 1  # the inner one is part of the outer body
    assert "preserve_rng_state=False" in text
