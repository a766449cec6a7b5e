"""Models of the kinds users compile: each builds its own inputs with `example(batch)`."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=16, hidden=32, d_out=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.Tanh(), nn.Linear(hidden, d_out))

    def forward(self, x):
        return self.net(x)

    @staticmethod
    def example(batch):
        return (torch.randn(batch, 16),)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.drop = nn.Dropout(0.25)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(self.drop(x))

    @staticmethod
    def example(batch):
        return (torch.randn(batch, 3, 12, 12),)


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm and a projected shortcut."""

    def __init__(self, c_in=8, c_out=16, stride=2):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))

    @staticmethod
    def example(batch):
        return (torch.randn(batch, 8, 10, 10),)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        batch, time, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        head = channels // self.n_heads
        q = q.view(batch, time, self.n_heads, head).transpose(1, 2)
        k = k.view(batch, time, self.n_heads, head).transpose(1, 2)
        v = v.view(batch, time, self.n_heads, head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, time, channels))


class GPTBlock(nn.Module):
    """A GPT-style transformer block: pre-LayerNorm, causal self-attention, GELU MLP, residuals."""

    def __init__(self, d_model=32, n_heads=4):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * d_model, d_model), nn.Dropout(0.1))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    @staticmethod
    def example(batch):
        return (torch.randn(batch, 6, 32),)


class LSTMCellLoop(nn.Module):
    """An LSTM cell run over the time steps in a Python loop (unrolled by the tracer)."""

    def __init__(self, d_in=6, hidden=12, steps=5):
        super().__init__()
        self.hidden = hidden
        self.steps = steps
        self.cell = nn.LSTMCell(d_in, hidden)
        self.out = nn.Linear(hidden, 2)

    def forward(self, xs):
        h = xs.new_zeros(xs.shape[1], self.hidden)
        c = xs.new_zeros(xs.shape[1], self.hidden)
        outputs = []
        for t in range(self.steps):
            h, c = self.cell(xs[t], (h, c))
            outputs.append(self.out(h))
        return torch.stack(outputs), (h, c)

    @staticmethod
    def example(batch):
        return (torch.randn(5, batch, 6),)


class EmbeddingClassifier(nn.Module):
    def __init__(self, vocab=50, dim=16, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.classify = nn.Linear(dim, classes)

    def forward(self, tokens):
        features = self.norm(self.embed(tokens)).mean(dim=1)
        return F.log_softmax(self.classify(features), dim=-1)

    @staticmethod
    def example(batch):
        return (torch.randint(0, 50, (batch, 7)),)


class TinyViT(nn.Module):
    """Patch embedding (a strided conv), a class token, learned positions, one
    nn.TransformerEncoderLayer (torch's own module, traced through) and a linear head."""

    def __init__(self, image=16, patch=4, dim=32, heads=4, classes=10):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.positions = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.encoder = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1,
                                                  batch_first=True, norm_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, images):
        tokens = self.patches(images).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat((cls, tokens), dim=1) + self.positions
        return self.head(self.encoder(tokens)[:, 0])

    @staticmethod
    def example(batch):
        return (torch.randn(batch, 3, 16, 16),)


class GRUSequence(nn.Module):
    """A GRU cell stepped over a sequence by iterating the tensor (`for x_t in xs`), the outputs
    collected in a list and stacked."""

    def __init__(self, d_in=6, hidden=10):
        super().__init__()
        self.hidden = hidden
        self.cell = nn.GRUCell(d_in, hidden)
        self.out = nn.Linear(hidden, 3)

    def forward(self, xs):
        h = torch.zeros(xs.size(1), self.hidden, device=xs.device)
        outputs = []
        for x_t in xs:
            h = self.cell(x_t, h)
            outputs.append(self.out(h))
        return torch.stack(outputs)

    @staticmethod
    def example(batch):
        return (torch.randn(4, batch, 6),)


ZOO = {
    "mlp": MLP,
    "cnn": SmallCNN,
    "resnet_block": BasicBlock,
    "gpt_block": GPTBlock,
    "lstm_loop": LSTMCellLoop,
    "embedding_classifier": EmbeddingClassifier,
    "vit_encoder": TinyViT,
    "gru_sequence": GRUSequence,
}


def run_seeded(model, args, seed=0):
    """model(*args) after seeding torch's generator, so dropout draws the same mask in a compiled
    and an eager run."""
    torch.manual_seed(seed)
    return model(*args)


def backward_and_compare_gradients(model, eager, out, ref, rtol=1e-4, atol=1e-5):
    """Backward of the sum of every output of a compiled run (`model`, `out`) and an eager run
    (`eager`, `ref`); asserts that each parameter's gradient is the same in both."""
    from framejit.testing import same

    leaves = torch.utils._pytree.tree_leaves
    sum(t.float().sum() for t in leaves(out)).backward()
    sum(t.float().sum() for t in leaves(ref)).backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert same(p.grad, q.grad, rtol=rtol, atol=atol), name
