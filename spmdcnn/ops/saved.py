"""What each op's forward keeps for its backward, as named records: one module that the NumPy ops (``ops/*.py``)
and the CUDA kernels (``ops/cuda``) both build and read, without importing each other. The memory model counts
them by the op table's ``keeps`` (``graph/optable.py``). relu keeps its mask, flatten and global pooling their
input's shape, concat its inputs' channel counts and add its input count: one value each, not a record.
"""

from typing import NamedTuple


class ConvSaved(NamedTuple):
    """The forward's record; ``kind`` names the path it took and which fields it fills.

    - ``direct`` (im2col or pointwise) and ``onednn`` (``ops/onednn.py``): ``x``, ``w``, ``has_bias``,
      ``geometry``, ``need_input_grad``;
    - ``subsample`` (a strided kernel-1 convolution without padding): ``inner``, the record of the pointwise
      convolution of the subsampled input, ``x_shape`` and ``geometry``;
    - ``cudnn``: ``x``, the input padded by the part of ``geometry``'s padding cuDNN was not given,
      ``padding``, the symmetric padding per spatial axis it was given, ``w`` (the master weight), ``wio``
      (the weight in the input's type, as cuDNN read it), ``has_bias``, ``geometry``, ``need_input_grad`` and
      ``x_shape`` (the unpadded input's).
    """

    kind: str
    geometry: object
    x: object = None
    w: object = None
    has_bias: bool = False
    need_input_grad: bool = True
    x_shape: tuple = None
    wio: object = None
    padding: tuple = None
    inner: "ConvSaved" = None


class PoolSaved(NamedTuple):
    """What forward keeps for backward: the input's shape, the geometry and, for max pooling, the index of each
    window's maximum."""

    x_shape: tuple
    geometry: object
    argmax: object = None


class DropoutSaved(NamedTuple):
    """What forward keeps for backward: the one-byte ``keep`` mask and the ``scale`` of kept values."""

    keep: object
    scale: float


class LinearSaved(NamedTuple):
    """What forward keeps for backward: the input in the weights' type, the weight, whether there is a bias,
    whether the input's gradient is wanted, and the activations' type."""

    x: object
    w: object
    has_bias: bool
    need_input_grad: bool
    dtype: object


class LossSaved(NamedTuple):
    """What the cross-entropy keeps for backward: the softmax ``probs`` (N, K, M), the ``labels`` (N, 1, M), which
    of them ``counts`` (labelled), the ``total`` the sum divides by, the logits' type, the ``counted`` elements
    and the logits' ``shape``."""

    probs: object
    labels: object
    counts: object
    total: float
    dtype: object
    counted: int
    shape: tuple


class MSESaved(NamedTuple):
    """What the mean squared error keeps for backward: ``y - t`` (zero on padding rows), the ``count`` the sum
    divides by, the predictions' type and the ``counted`` values (those not padding)."""

    difference: object
    count: float
    dtype: object
    counted: int


class BatchNormSaved(NamedTuple):
    """What forward keeps for backward: in ``eval`` mode the per-channel ``scale`` alone; in ``train`` the input as
    (N, C, S) (S the positions per channel of a sample), the batch ``mean``, ``gamma``, ``inv_std``, the ``count``
    of values per channel and the ``reduce`` that sums over the replica group."""

    mode: str
    scale: object
    x3: object = None
    mean: object = None
    gamma: object = None
    inv_std: object = None
    count: int = 0
    reduce: object = None


class GhostSaved(NamedTuple):
    """Ghost batch norm's training state for backward: the input as (N, C, S), the ``spans`` of samples of each
    group, per group (rows) the ``mean`` and ``inv_std``, ``gamma``, the ``count`` of values per channel of a
    group and the ``reduce`` that sums over the tiles sharing the groups."""

    x3: object
    spans: tuple
    mean: object
    gamma: object
    inv_std: object
    count: int
    reduce: object = None
