"""What a convolution's forward keeps for its backward: one record type for the three paths forward can take.

It has a module of its own so that ``ops/conv.py`` and ``ops/cuda/conv.py`` both build and read it without
importing each other's internals.
"""

from typing import NamedTuple


class ConvSaved(NamedTuple):
    """The forward's record; ``kind`` names the path it took and which fields it fills.

    - ``direct`` (im2col or pointwise): ``x``, ``w``, ``has_bias``, ``geometry``, ``need_input_grad``;
    - ``subsample`` (a strided 1x1 convolution without padding): ``inner``, the record of the pointwise
      convolution of the subsampled input, ``x_shape`` and ``geometry``;
    - ``cudnn``: ``x``, the input padded by the part of ``geometry``'s padding cuDNN was not given,
      ``padding``, the symmetric ``(height, width)`` padding it was given, ``w`` (the master weight), ``wio``
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
