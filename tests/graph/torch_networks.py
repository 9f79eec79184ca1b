"""PyTorch networks for ``spmdcnn model import``'s tests (a FILE.py:CALLABLE source): torchvision's models with
random weights and batch-norm statistics (so that their outputs, not their initial near-uniform logits, are
compared), a plain network written here, and networks the importer must refuse."""

import collections
import functools

import torch
from torch import nn

from spmdcnn.graph.torchimport import load_torchvision, randomized

ZOO = ["efficientnet_b0", "convnext_tiny", "resnext50_32x4d", "regnet_y_400mf", "mobilenet_v3_large"]


def randomized_torchvision(name, seed=0):
    """torchvision's ``name`` with every parameter and buffer drawn at random (running variances positive)."""
    return randomized(load_torchvision().models.get_model(name), seed)


for _name in ZOO:
    globals()[_name] = functools.partial(randomized_torchvision, _name)


class Plain(nn.Module):
    """Not torchvision's: a stem, a ConvNeXt-style channels-last stretch, a squeeze-and-excitation gate, a concat,
    functional activations, a grouped transposed convolution, a ceil-mode pooling and a classifier."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(2, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.depthwise = nn.Conv2d(8, 8, 5, padding=2, groups=8)
        self.norm = nn.LayerNorm(8, eps=1e-6)
        self.expand = nn.Linear(8, 16)
        self.project = nn.Linear(16, 8)
        self.gamma = nn.Parameter(torch.full((8,), 0.5))
        self.squeeze = nn.AdaptiveAvgPool2d(1)
        self.excite = nn.Conv2d(8, 8, 1)
        self.side = nn.Conv2d(8, 4, 1, groups=4)
        self.up = nn.ConvTranspose2d(12, 12, 2, stride=2, groups=4)
        self.pool = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.0), nn.Linear(12 * 10 * 10, classes))

    def forward(self, x):
        x = self.stem(x)
        y = self.depthwise(x).permute(0, 2, 3, 1)
        y = self.gamma * self.project(nn.functional.gelu(self.expand(self.norm(y))))     # channels last
        x = x + y.permute(0, 3, 1, 2)
        x = x * torch.sigmoid(self.excite(self.squeeze(x)))
        x = torch.cat([x, nn.functional.silu(self.side(x))], dim=1)
        return self.head(self.pool(self.up(x)))


def plain():
    torch.manual_seed(3)
    module = Plain()
    with torch.no_grad():
        module.stem[1].running_mean.uniform_(-0.5, 0.5)
        module.stem[1].running_var.uniform_(0.5, 1.5)
    return module


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(10, 4, batch_first=True)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.lstm(x)[0][:, -1])


def recurrent():
    return Recurrent()


class Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        x = self.conv(x)
        if x.sum() > 0:                 # a choice on the data: torch.export cannot capture it
            x = x.relu()
        return self.fc(x.mean((2, 3)))


def branching():
    return Branching()


class Sequence(nn.Module):
    """One spatial axis: average pooling (which has no divisor_override in 1D), functional leaky ReLU, a dropout
    and a stochastic depth that evaluation turns off (training=False), a flatten written with its end axis."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, padding=1)
        self.norm = nn.BatchNorm1d(4)
        self.pool = nn.AvgPool1d(2)
        self.flat = nn.Flatten(1, 2)
        self.fc = nn.Linear(4 * 6, 3)

    def forward(self, x):
        x = nn.functional.leaky_relu(self.norm(self.conv(x)), 0.2)
        x = nn.functional.dropout(self.pool(x), 0.3, False)
        return self.fc(self.flat(x))


def sequence():
    torch.manual_seed(5)
    return Sequence()


class Sized(nn.Module):
    """A transposed convolution told its output size (8x8 from 3x3 by stride 2: an output padding of 1)."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(2, 2, 3, stride=2)
        self.fc = nn.Linear(2 * 8 * 8, 2)

    def forward(self, x):
        return self.fc(self.up(x, output_size=[8, 8]).flatten(1))


def sized():
    torch.manual_seed(10)
    return Sized()


class PooledLast(nn.Module):
    """A global pool of a channels-last value: it would average over the wrong axes."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(nn.functional.adaptive_avg_pool2d(x.permute(0, 2, 3, 1), 1).flatten(1))


def pooled_last():
    return PooledLast()


class Segmenter(nn.Module):
    """A small encoder-decoder returning per-pixel logits (N, K, H, W), with an auxiliary head (a dict, as
    torchvision's segmentation models return: ``out`` and ``aux``), a mean over both spatial axes feeding a gate,
    and a concatenation of one tensor (DenseNet's first layer)."""

    def __init__(self, classes=3, aux=True, tuple_output=False):
        super().__init__()
        self.aux, self.tuple_output = aux, tuple_output
        self.enc = nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.down = nn.MaxPool2d(2)
        self.mid = nn.Conv2d(6, 6, 3, padding=1)
        self.gate = nn.Conv2d(6, 6, 1)
        self.up = nn.ConvTranspose2d(6, 6, 2, stride=2)
        self.head = nn.Conv2d(12, classes, 1)
        self.aux_head = nn.Conv2d(6, classes, 1)

    def forward(self, x):
        skip = torch.cat([self.enc(x)], 1)
        y = torch.relu(self.mid(self.down(skip)))
        y = y * torch.sigmoid(self.gate(y.mean((2, 3), keepdim=True)))
        out = self.head(torch.cat([skip, self.up(y)], dim=1))
        if self.tuple_output:
            return out, self.aux_head(y)
        return {"out": out, "aux": self.aux_head(y)} if self.aux else out


def segmenter():
    torch.manual_seed(7)
    return Segmenter()


def segmenter_tuple():
    torch.manual_seed(7)
    return Segmenter(tuple_output=True)


class Pooled(nn.Module):
    """``x.mean((2, 3))``: the most common global pooling idiom, without keepdim."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


def pooled():
    torch.manual_seed(8)
    return Pooled()


class Unmapped(nn.Module):
    """Two modules and a function spmdcnn maps to nothing: all three named in one message."""

    def __init__(self):
        super().__init__()
        self.shuffle = nn.PixelShuffle(2)
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.soft = nn.Softplus()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        x = self.soft(self.conv(self.shuffle(x)))
        return self.fc(torch.logsumexp(x, (2, 3)))


def unmapped():
    return Unmapped()


Outputs = collections.namedtuple("Outputs", ["logits", "aux"])


class NamedOutputs(Pooled):
    """A classifier returning a named tuple built in its forward (GoogLeNet's outputs while training)."""

    def __init__(self):
        super().__init__()
        self.aux = nn.Linear(4, 3)

    def forward(self, x):
        features = self.conv(x).mean((2, 3))
        return Outputs(self.fc(features), self.aux(features))


def named_outputs():
    torch.manual_seed(8)
    return NamedOutputs()


class FunctionalPools(nn.Module):
    """Pooling written as functions (Inception-v3's): a max pooling with its stride left out, an average pooling
    with padding, a ceil-mode one."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 3 * 3, 3)

    def forward(self, x):
        x = nn.functional.max_pool2d(self.conv(x), 2)
        x = nn.functional.avg_pool2d(x, kernel_size=3, stride=1, padding=1)
        return self.fc(nn.functional.max_pool2d(x, 2, 2, ceil_mode=True).flatten(1))


def functional_pools():
    torch.manual_seed(9)
    return FunctionalPools()


class Stochastic(nn.Module):
    """What evaluation mode erases from a graph: a dropout module, a functional dropout bound to the module's mode
    (timm's classifiers), a stochastic depth (torchvision's), and a batch norm of another momentum."""

    def __init__(self):
        super().__init__()
        from torchvision.ops import StochasticDepth
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4, momentum=0.3)
        self.drop = nn.Dropout(0.25)
        self.branch = nn.Conv2d(4, 4, 3, padding=1)
        self.depth = StochasticDepth(0.2, "row")
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = self.drop(torch.relu(self.norm(self.conv(x))))
        x = x + self.depth(self.branch(x))
        return self.fc(nn.functional.dropout(x.mean((2, 3)), 0.1, self.training))


def stochastic():
    load_torchvision()
    torch.manual_seed(11)
    return randomized(Stochastic(), 11).eval()          # given in evaluation mode: imported as it trains


class Attending(nn.Module):
    """A transformer's block on a convolution's patches: refused as attention over activations, in one line."""

    def __init__(self):
        super().__init__()
        self.patches = nn.Conv2d(2, 8, 2, stride=2)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        attended, _ = self.attention(tokens, tokens, tokens)
        return self.fc(attended.mean(1))


def attending():
    return Attending()


class Idioms(nn.Module):
    """Today's CNN idioms: Res2Net's split, CSPNet's chunk, a slice and a narrow (ReXNet's partial residual),
    ShuffleNet's channel shuffle, a TF-'same' constant pad, Inception-v4's average pooling that leaves the padding
    out of its divisors, MobileOne's branch that is 0, HGNetV2's learned factor and shift of one number each, a
    learned shift per channel, RepViT's batch norm of features."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(2, 8, 3, padding=1)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.left = nn.Conv2d(4, 4, 3, padding=1)
        self.mix = nn.Conv2d(8, 8, 3, stride=2)
        self.gain, self.offset = nn.Parameter(torch.tensor([1.5])), nn.Parameter(torch.tensor([0.1]))
        self.channel_bias = nn.Parameter(torch.linspace(-0.5, 0.5, 6))
        self.norm = nn.BatchNorm1d(6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        x = self.pool(self.stem(x) + 0)
        a, b = torch.split(x, [4, 4], dim=1)
        c, d = b.chunk(2, 1)
        x = torch.cat([self.left(a), d, c], 1)
        n, channels, h, w = x.shape
        x = x.view(n, 2, channels // 2, h, w).transpose(1, 2).contiguous().view(n, -1, h, w)
        x = self.mix(nn.functional.pad(x, (0, 1, 0, 1), value=0.1))
        x = self.gain * (x[:, :6] + x.narrow(1, 2, 6)) + self.offset       # HGNetV2's learnable affine
        x = nn.functional.relu(x + self.channel_bias.view(1, -1, 1, 1))
        return self.head(self.norm(x.mean((2, 3))))                         # RepViT's batch norm of features


def idioms():
    torch.manual_seed(5)
    return Idioms()


class SpaceToDepth(nn.Module):
    """timm's (TResNet's stem), as timm writes it: imported by its type as one layer."""

    def __init__(self, block_size=4):
        super().__init__()
        self.bs = block_size

    def forward(self, x):
        n, c, h, w = x.size()
        x = x.view(n, c, h // self.bs, self.bs, w // self.bs, self.bs)
        x = x.permute(0, 3, 5, 1, 2, 4).contiguous()
        return x.view(n, c * self.bs * self.bs, h // self.bs, w // self.bs)


class Stems(nn.Module):
    """Positions moved into channels: TResNet's space to depth and PyTorch's pixel unshuffle."""

    def __init__(self):
        super().__init__()
        self.s2d = SpaceToDepth(2)
        self.unshuffle = nn.PixelUnshuffle(2)
        self.conv = nn.Conv2d(8, 4, 3, padding=1)
        self.head = nn.Linear(64, 3)

    def forward(self, x):
        x = self.conv(self.s2d(x) + self.unshuffle(x))
        return self.head(torch.flatten(self.unshuffle(x), 1))


def stems():
    torch.manual_seed(7)
    return Stems()


class SimpleNorm2d(nn.Module):
    """timm's (ConvNeXt-RMS's norm), as timm computes it: imported by its type as a layer norm that does not
    centre and divides the variance by C - 1."""

    def __init__(self, channels, eps=1e-6):
        super().__init__()
        self.normalized_shape, self.eps = (channels,), eps
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, channels))

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = x * torch.rsqrt(torch.var(x, dim=-1, keepdim=True) + self.eps) * self.weight
        return x.permute(0, 3, 1, 2)


class SimplyNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 6, 3, padding=1)
        self.norm = SimpleNorm2d(6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        x = nn.functional.mish(nn.functional.selu(self.norm(self.conv(x))))
        return self.head(nn.functional.hardtanh(nn.functional.elu(x, 0.5), -0.25, 2.0).mean((2, 3)))


def simply_normed():
    torch.manual_seed(9)
    return SimplyNormed()


class RadixSoftmax(nn.Module):
    """timm's (ResNeSt's), as timm computes it: imported by its type as a softmax across groups of channels."""

    def __init__(self, radix, cardinality=1):
        super().__init__()
        self.radix, self.cardinality = radix, cardinality

    def forward(self, x):
        batch = x.size(0)
        x = x.view(batch, self.cardinality, self.radix, -1).transpose(1, 2)
        return torch.softmax(x, dim=1).reshape(batch, -1)


class SplitAttention(nn.Module):
    """SKNet's selective kernel (paths stacked, summed, weighted by a softmax across them) and ResNeSt's split
    attention (a convolution's channels reshaped into radix groups, its radix softmax)."""

    def __init__(self):
        super().__init__()
        self.paths = nn.ModuleList([nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(2, 4, 3, padding=2, dilation=2)])
        self.select = nn.Conv2d(4, 8, 1)
        self.radix_conv = nn.Conv2d(4, 8, 3, padding=1)
        self.attend = nn.Conv2d(4, 8, 1)
        self.rsoftmax = RadixSoftmax(2)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        stacked = torch.stack([path(x) for path in self.paths], dim=1)               # (N, 2, 4, H, W)
        weights = self.select(stacked.sum(1).mean((2, 3), keepdim=True))
        weights = torch.softmax(weights.view(x.shape[0], 2, 4, 1, 1), dim=1)
        x = (stacked * weights).sum(1)
        n, rc, h, w = (x := self.radix_conv(x)).shape
        grouped = x.reshape(n, 2, rc // 2, h, w)
        gap = self.attend(grouped.sum(dim=1).mean((2, 3), keepdim=True))
        attention = self.rsoftmax(gap).view(n, -1, 1, 1)
        x = (grouped * attention.reshape(n, 2, rc // 2, 1, 1)).sum(dim=1)
        return self.head(x.mean((2, 3)))


def split_attention():
    torch.manual_seed(13)
    return SplitAttention()


class Reduced(nn.Module):
    """Global reductions written as tensor methods (a sum and a max over the spatial axes, an adaptive max pooling
    to one position), arithmetic with numbers (x - c, c - x, x + c, x - y), channels repeated and expanded."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.gate = nn.Conv2d(4, 4, 1)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        x = torch.relu(self.conv(x) - 0.25)
        x = x * torch.sigmoid(self.gate(x.sum((2, 3), keepdim=True) / 100))
        x = (1.5 - x) - torch.relu(x + 1)
        x = x + x[:, :2].repeat(1, 2, 1, 1) + x[:, 3:].expand(-1, 4, -1, -1).clamp(min=-0.5)
        return self.head(x.amax((2, 3)) + nn.functional.adaptive_max_pool2d(x, 1).flatten(1) + x.mean((2, 3)))


def reduced():
    torch.manual_seed(17)
    return Reduced()
