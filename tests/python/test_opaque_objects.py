"""Values the graph would hold as constants that come from the frame: each must be guarded as
what the graph assumes of it, or left to Python. Found by the survey of pytorch/examples
(actor_critic samples from torch.distributions) and by generated programs: a NumPy scalar
argument, a distribution object whose sample() the graph called, kept the first call's value.
Each test compares with eager over calls whose values change."""
import warnings

import numpy as np
import pytest
import torch
from torch.distributions import Bernoulli, Categorical, Normal

import framejit
from framejit.testing import CompileCounter, same


def compiled_with_counter(fn):
    counter = CompileCounter()
    return framejit.compile(fn, backend=counter), counter


def scaled(x, s):
    return x * s + 1


def test_a_numpy_scalar_argument_is_guarded_by_its_value():
    # It was guarded by its type only, and the graph held the first one: every later call
    # returned x * 0 + 1.
    compiled, counter = compiled_with_counter(scaled)
    x = torch.ones(3)
    for s in [np.float32(0.0), np.float32(1.5), np.int64(3), np.float32(1.5), np.float32(0.0)]:
        assert same(compiled(x, s), scaled(x, s)), s
    assert counter.frame_count == 3  # one per value (and type) met


def select_action(probs):
    m = Categorical(probs)
    action = m.sample()
    return action, m.log_prob(action)


def reparameterised(mu, sigma):
    d = Normal(mu, sigma)
    x = d.rsample()
    return x, d.log_prob(x).sum() * 2


def coin(p):
    return Bernoulli(probs=p).sample() + 1


CASES = [
    (select_action, lambda i: (torch.softmax(torch.randn(4) * (i + 1), -1),)),
    (reparameterised, lambda i: (torch.randn(3) * i, torch.rand(3) + 0.1)),
    (coin, lambda i: (torch.rand(5),)),
]


@pytest.mark.parametrize("fn,make", CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_sampling_from_a_distribution_matches_eager_on_every_call(fn, make):
    # The distribution's sample() was a graph op holding the object made on the first call
    # (a new object with other probabilities ran the old one's), and it drew from the random
    # generator once more while tracing. Now each such method ends the region: same draws as
    # eager, the generator left where eager leaves it, no recompiles, no warnings.
    compiled, counter = compiled_with_counter(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error", framejit.FramejitWarning)
        for i in range(10):
            args = make(i)
            torch.manual_seed(i)
            expected, after_eager = fn(*args), torch.rand(2)
            torch.manual_seed(i)
            out, after = compiled(*args), torch.rand(2)
            assert same(out, expected), i
            assert torch.equal(after, after_eager), i
    assert counter.frame_count <= 2


def draws_through_a_python_function(g):
    # A torch factory made for real at trace time (one meta tensors cannot make) draws from the
    # generator: the draw is given back, as the graph draws again when it runs.
    return torch.tensor(np.random.default_rng(0).random(3)) + torch.rand(3, generator=g)


def test_the_generator_passed_to_a_graph_op_is_guarded_by_identity():
    compiled, counter = compiled_with_counter(draws_through_a_python_function)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    a = compiled(g1)
    b = compiled(g2)  # another generator: the graph must not draw from g1 again
    assert same(a, b)
    assert torch.equal(g1.get_state(), g2.get_state())


def builds_an_optimizer(x, w):
    # SGD.__init__ calls super().__init__(...): in a method of torch's own class the trace took
    # the class itself for the namespace to read __init__ from, and called SGD.__init__ again.
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.5)
    return x * 2, type(opt).__name__, opt.defaults["momentum"], len(opt.param_groups)


def test_zero_argument_super_in_a_method_of_a_torch_class():
    compiled, _ = compiled_with_counter(builds_an_optimizer)
    w = torch.nn.Parameter(torch.ones(3))
    x = torch.ones(2)
    assert same(compiled(x, w), builds_an_optimizer(x, w))


def device_flags(x):
    # dcgan's `if input.is_cuda and self.ngpu > 1` style checks, on every device flag.
    flags = (x.is_xpu, x.is_mps, x.is_ipu, x.is_xla, x.is_mtia, x.is_maia, x.is_vulkan,
             x.is_sparse_csr, x.is_cuda, x.is_cpu)
    return (x * 2 if not any(flags[:-1]) else x), flags


def test_device_flags_are_answered_from_the_traced_device():
    compiled, counter = compiled_with_counter(device_flags)
    x = torch.ones(3)
    assert same(compiled(x), device_flags(x))
    assert counter.frame_count == 1


def divided(x, s):
    return x / s


def test_numpy_scalars_are_guarded_by_their_bytes():
    # np.float32(-0.0) == np.float32(0.0): guarded by ==, the graph made for -0.0 gave -inf for
    # 0.0; a NaN never equal to itself compiled again on every call.
    compiled, counter = compiled_with_counter(divided)
    x = torch.ones(3)
    for s in [np.float32(-0.0), np.float32(0.0), np.float64(-0.0), np.float32("nan"),
              np.float32("nan"), np.float32(0.0)]:
        out, expected = compiled(x, s), divided(x, s)
        assert torch.equal(out.isnan(), expected.isnan()) and torch.equal(
            out.nan_to_num(), expected.nan_to_num()), s
    assert counter.frame_count == 4  # -0.0 and 0.0 as float32, -0.0 as float64, one NaN


def noisy(x, g):
    return x + torch.randn(x.shape, generator=g)


def test_a_generator_made_by_each_call_runs_its_draw_in_python():
    # diffusers' `generator=torch.Generator().manual_seed(s)` per call: guarded by identity, each
    # call compiled again up to recompile_limit; held by the graph, the first one's stream went on.
    compiled, counter = compiled_with_counter(noisy)
    x = torch.zeros(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", framejit.FramejitWarning)
        for i in range(12):
            expected = noisy(x, torch.Generator().manual_seed(i))
            assert same(compiled(x, torch.Generator().manual_seed(i)), expected), i
    assert counter.frame_count <= 1


def tensor_of(x, s):
    return torch.tensor([s, s]), torch.full((2,), s), x.new_tensor([s]), torch.as_tensor((s,))


@pytest.mark.parametrize("s", [np.float64(1.5), np.float16(1.5), np.uint8(200), np.bool_(True),
                               np.int8(3)], ids=repr)
def test_a_numpy_scalar_given_to_a_factory_keeps_the_dtype_torch_infers_from_it(s):
    # The graph got the Python number it holds, from which torch infers another dtype
    # (torch.tensor([np.float64(1.5)]) is float64, of 1.5 float32; torch.full of np.bool_ is
    # float, of True bool). Such a call now runs in Python.
    compiled, _ = compiled_with_counter(tensor_of)
    x = torch.ones(3)
    for out, expected in zip(compiled(x, s), tensor_of(x, s)):
        assert out.dtype == expected.dtype and torch.equal(out, expected)


class Parent:
    def scale(self, x):
        return x + 1


class Child(Parent):
    def scale(self, x):
        return super().scale(x) * 2


def calls_super(obj, x):
    return obj.scale(x)


def test_a_method_replaced_on_the_parent_after_the_compile_is_seen_through_super():
    # super().scale was resolved at trace time with no guard on Parent's attribute: assigning
    # Parent.scale afterwards left the compiled call running the old one.
    compiled, counter = compiled_with_counter(calls_super)
    child, x = Child(), torch.ones(2)
    original = Parent.scale
    try:
        assert same(compiled(child, x), calls_super(child, x))
        Parent.scale = lambda self, x: x - 100
        assert same(compiled(child, x), calls_super(child, x))
        assert counter.frame_count == 2
    finally:
        Parent.scale = original
