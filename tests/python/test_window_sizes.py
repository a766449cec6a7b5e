"""Python comparing a size that a convolution, a pooling or a constant slice made (wav2vec2's
`is_causal = q_length > 1` after its feature extractor's strided convolutions): the answer holds
on a range of the input size it was made from, and that range is guarded
(`L['x'].size(1) >= 30`), so a new length compiles nothing until the answer would change. Before,
the input length was pinned and every new length compiled again (recompile_limit after 8). Each
test compares with eager and counts graphs."""
import logging

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, same

torch.manual_seed(0)
conv_a = torch.nn.Conv1d(1, 4, 10, stride=5)
conv_b = torch.nn.Conv1d(4, 4, 3, stride=2)


def run(fn, inputs, backend=None):
    counter = CompileCounter(backend)
    compiled = framejit.compile(fn, backend=counter)
    with torch.no_grad():
        for args in inputs:
            assert same(compiled(*args), fn(*args), rtol=1e-4, atol=1e-5), [a.shape for a in args]
    return counter


def strided_features(x):
    h = conv_b(torch.relu(conv_a(x[:, None])))
    if h.shape[-1] > 1:  # floor((floor((n - 10) / 5) + 1 - 3) / 2) + 1 > 1: n >= 30
        return h.mean(-1)
    return h.sum(-1)


def test_a_branch_on_a_convolutions_length_guards_a_range_of_the_input(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    lengths = [80, 90, 100, 35, 30, 29, 25, 20, 200, 31]
    counter = run(strided_features, [(torch.randn(2, n),) for n in lengths])
    # n >= 30 one graph; below (one step of the second convolution, or none: eager's error) the
    # other
    assert counter.frame_count == 2
    assert "L['x'].size(1) >= 30: a comparison of a size a convolution" in caplog.text
    assert "L['x'].size(1) <= 29: a comparison" in caplog.text
    assert "L['self']" not in caplog.text and "L['x'].size(1): a size used" not in caplog.text


@pytest.mark.parametrize("backend", ["native", "callable"])
def test_other_backends_get_the_range_too(backend):
    # A backend that compiles per size compiles the first size static and then one symbolic
    # graph (torch.compile: 3 as well, as 29 takes the other branch).
    chosen = framejit.backends.native if backend == "native" else (lambda gm, example_inputs: gm.forward)
    lengths = [80, 90, 100, 35, 29, 25, 200]
    counter = run(strided_features, [(torch.randn(2, n),) for n in lengths], backend=chosen)
    assert counter.frame_count == (2 if backend == "native" else 3)


def pooled(image):
    h = torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(image, kernel, padding=1), 2)
    h = torch.nn.functional.avg_pool2d(h, kernel_size=2, stride=1)
    if h.shape[-1] >= 3:  # floor(w / 2) - 1 >= 3: w >= 8
        return h.amax(-1)
    return h.mean(-1)


kernel = torch.randn(4, 3, 3, 3)


def test_pooling_and_an_unpinned_height():
    sizes = [(16, 16), (20, 24), (24, 9), (12, 8), (7, 7), (6, 6), (30, 40)]
    counter = run(pooled, [(torch.randn(1, 3, h, w),) for h, w in sizes])
    assert counter.frame_count == 2


def ceil_pooled(x):
    h = torch.nn.functional.max_pool1d(x, 2, ceil_mode=True)
    return h * 2 if h.shape[-1] > 3 else h


def test_ceil_mode_is_not_modelled_and_pins_the_size():
    lengths = [9, 10, 11, 12, 5]
    counter = run(ceil_pooled, [(torch.randn(1, 2, n),) for n in lengths])
    assert counter.frame_count == len(lengths)


def trimmed(x):
    h = x[:, 2:-1]
    if h.shape[1] > 3:  # n - 3 > 3
        return h.sum(1)
    return h.mean(1)


def test_a_constant_slices_length():
    counter = run(trimmed, [(torch.randn(2, n),) for n in (10, 12, 7, 40, 6, 5, 3, 1)])
    # n >= 7 one graph, n <= 6 another (x[:, 2:-1] of a short row is empty or short: eager's)
    assert counter.frame_count == 2


def end_to_start(x):
    h = x[:, -5:7]  # longer, then shorter, as x grows: not monotone, so pinned
    return h.sum(1) if h.shape[1] == 2 else h.mean(1)


def test_a_slice_from_the_end_to_a_place_from_the_start_is_pinned():
    lengths = [9, 10, 12, 11, 4]
    counter = run(end_to_start, [(torch.randn(2, n),) for n in lengths])
    assert counter.frame_count == len(lengths)


proj = torch.nn.Linear(4, 32)
pos_conv = torch.nn.Conv1d(32, 32, 16, padding=8, groups=4)
qkv = torch.nn.Linear(32, 96)


def attention(x):
    # wav2vec2's shape: strided convolutions, a padded positional convolution trimmed by one
    # and added back (two sizes equal for any length, though not as sums), heads, and
    # is_causal decided by the length and passed to sdpa as it is.
    h = proj(conv_b(torch.nn.functional.gelu(conv_a(x[:, None]))).transpose(1, 2))
    h = h + pos_conv(h.transpose(1, 2))[:, :, :-1].transpose(1, 2)
    b, t = h.shape[:-1]
    q, k, v = qkv(h).view(b, -1, 4, 24).transpose(1, 2).chunk(3, dim=-1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1)


def test_a_positional_convolution_added_back_and_is_causal_from_the_length():
    lengths = [880, 760, 1200, 1000, 500, 300, 31, 2000]
    counter = run(attention, [(torch.randn(2, n),) for n in lengths])
    assert counter.frame_count == 1
    run(attention, [(torch.randn(1, n),) for n in (29, 25)])  # one step long: not causal


def two_inputs(x, y):
    a = conv_a(x[:, None])
    b = conv_a(y[:, None])
    return a.sum() if a.shape[-1] > b.shape[-1] else b.sum()


def test_two_lengths_compared_are_pinned():
    counter = run(two_inputs, [(torch.randn(1, n), torch.randn(1, m)) for n, m in ((40, 30), (50, 20), (20, 40))])
    assert counter.frame_count == 3


def short_of_huge(x):
    h = x[:, 2:]
    return torch.zeros(1) if h.shape[1] < 2 ** 40 else torch.ones(1)


def test_the_searched_range_has_an_upper_bound_too():
    # An empty tensor can be longer than the search's 2**40: it compiles again.
    counter = run(short_of_huge, [(torch.randn(2, 10),), (torch.empty(0, 2 ** 40 + 5),)])
    assert counter.frame_count == 2


@torch.library.custom_op("framejit_tests::max_pool1d", mutates_args=())
def named_like_a_pool(x: torch.Tensor, k: int) -> torch.Tensor:
    n = x.shape[-1]
    return x[..., : n // k if n % 7 else n].clone()


@named_like_a_pool.register_fake
def _(x, k):
    n = x.shape[-1]
    return x.new_empty(*x.shape[:-1], n // k if n % 7 else n)


def custom_pooled(x):
    h = torch.ops.framejit_tests.max_pool1d(x, 2)
    return x.sum(-1) + 1 if h.shape[-1] < 8 else x.sum(-1)


def test_a_custom_op_named_like_a_pooling_is_not_taken_for_it():
    run(custom_pooled, [(torch.randn(2, n),) for n in (10, 12, 14, 15, 21, 6)])


image_conv = torch.nn.Conv2d(3, 8, 3, padding=1)


def guarded_contiguous(x):
    # diffusers' upsampler: `if hidden_states.numel() * scale_factor > pow(2, 31)`
    h = image_conv(x)
    if h.numel() * 2 > 20000:
        return h.sum() + 1
    return h.sum()


def test_a_product_of_sizes_keeps_them_free_within_a_box(caplog):
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    shapes = [(1, 8, 8), (1, 8, 9), (1, 9, 8), (2, 8, 8), (1, 8, 100), (2, 8, 80), (3, 8, 80), (1, 30, 30), (1, 8, 8)]
    counter = run(guarded_contiguous, [(torch.randn(b, 3, h, w),) for b, h, w in shapes])
    # batch, height and width grow together while 2 * 8 * B * H * W stays <= 20000 (the
    # product grows with each, so a box of them keeps the answer); each box is its own graph
    assert counter.frame_count == 4
    assert "L['x'].size(3) <= 14: a product of sizes compared" in caplog.text
    assert "L['x'].size(0) >= 2: a product of sizes compared" in caplog.text


def upsampled(x):
    h = torch.nn.functional.interpolate(conv_b(conv_a(x[:, None])), scale_factor=2.0, mode="nearest")
    return h.mean(-1) if h.shape[-1] > 4 else h.sum(-1)


def test_an_interpolation_by_a_scale_factor():
    # floor(2 * (floor((floor((n - 10) / 5) + 1 - 3) / 2) + 1)) > 4: n >= 40
    counter = run(upsampled, [(torch.randn(2, n),) for n in (80, 50, 40, 39, 30, 120)])
    assert counter.frame_count == 2


def numel_of_sizes_of_two_inputs(x, y):
    return x.sum() if x.shape[0] * y.shape[0] >= 12 else y.sum()


def test_two_inputs_sizes_multiplied():
    argsets = [(torch.randn(a), torch.randn(b)) for a, b in ((3, 4), (4, 4), (6, 2), (2, 5), (1, 3), (12, 1), (20, 20))]
    run(numel_of_sizes_of_two_inputs, argsets)


def product_against_huge(x, y):
    return y + 1 if x.shape[0] * y.shape[0] > 2 ** 44 else y - 1


def test_a_product_past_the_searched_sizes_is_pinned():
    huge = lambda n: torch.zeros(1).expand(n)  # no memory
    run(product_against_huge, [(huge(2 ** 45), torch.zeros(1)), (huge(2 ** 40 + 5), torch.zeros(1))])


def constant_first(x, y):
    return x.sum() if 12 <= x.shape[0] * y.shape[0] else y.sum()


def test_a_constant_on_the_left_of_a_product():
    argsets = [(torch.randn(a), torch.randn(b)) for a, b in ((3, 4), (4, 4), (2, 7), (1, 3), (2, 2))]
    counter = run(constant_first, argsets)
    # (3, 4): true on the box x >= 3, y >= 4, which (4, 4) is in; (2, 7): true on x >= 2, y >= 7;
    # (1, 3): false on x <= 2, y <= 4, which (2, 2) is in
    assert counter.frame_count == 3


def padded_downsample(x, w):
    # diffusers' Downsample2D (pad right and bottom by one, then a stride-2 convolution), its
    # VAE's latent split in two along the channels, and the Upsample2D batch check on the half.
    h = torch.nn.functional.pad(x, (0, 1, 0, 1), mode="constant", value=0)
    h = torch.nn.functional.conv2d(h, w, stride=2)
    mean, logvar = torch.chunk(h, 2, dim=1)
    if mean.shape[0] >= 64:
        mean = mean.contiguous()
    if mean.shape[-1] > 4:  # floor((n + 1 - 3) / 2) + 1 > 4: n >= 10
        return mean * torch.exp(0.5 * logvar)
    return mean - logvar


def test_a_padded_size_is_the_input_size_plus_the_padding(caplog):
    # The batch through F.pad, a convolution and chunk is the input's: compared, it is a range
    # of it (it was pinned: AutoencoderKL compiled again for every batch size). A padded width
    # is the input's plus the pair, then a convolution's atom over it.
    framejit.set_logs("guards", handler=False)
    caplog.set_level(logging.INFO, logger="framejit")
    w = torch.randn(8, 3, 3, 3)
    shapes = [(2, 16), (3, 16), (5, 12), (1, 9), (4, 8), (2, 7), (6, 5), (2, 30)]
    counter = run(padded_downsample, [(torch.randn(b, 3, n, n), w) for b, n in shapes])
    assert counter.frame_count == 2  # n >= 10, and n < 10
    assert "L['x'].size(0) < 64" in caplog.text
    assert "L['x'].size(3) >= 10: a comparison of a size a convolution" in caplog.text
    assert "L['x'].size(0): a size used" not in caplog.text


def padded_by_a_size(x):
    h = torch.nn.functional.pad(x, (0, x.shape[-1] // 2))  # a pad that is a size expression
    if h.shape[-1] > 12:
        return h * 2
    return h - 1


def test_a_pad_made_of_sizes_is_not_taken_as_a_constant():
    # Not exact (only constant pads are): the compared size stays pinned, one graph per width,
    # each right.
    counter = run(padded_by_a_size, [(torch.randn(2, n),) for n in (6, 8, 9, 10, 6)])
    assert counter.frame_count == 4
