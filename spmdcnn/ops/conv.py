"""Convolution over 1, 2 or 3 spatial axes (cross-correlation, as PyTorch's conv1d/2d/3d): forward and backward
on oneDNN where it runs them (host float32, ``ops/onednn.py``), else through im2col + GEMM, one implementation for
every spatial rank.

    y[n, k, i...] = b[k] + sum_{c, p...} w[k, c, p...] * xpad[n, g*Cg + c, i*s + p*d ...]     (per spatial axis)

Shapes: x (N, C, S...), w (K, Cg, k...), y (N, K, O...), with ``S``, ``k``, ``O`` one extent per spatial axis
(``(D, H, W)`` for a volume). With ``groups`` G (PyTorch's), the channels fall in G groups: output channel ``k``
belongs to group ``g = k // (K/G)`` and reads the ``Cg = C/G`` input channels of that group alone (depthwise when
G = C); every product below is then a stack of G products, one per group (``matmul`` over a leading G axis),
which for G = 1 is the plain product. A tile of some of the output channels (a split over ``c``, in whole groups)
is the convolution of its groups: the input channels they read (:func:`group_inputs`), its rows of the weight.

Samples are processed in chunks so that the column buffer stays near ``im2col.COLUMN_BYTES``: blocks of whole samples,
or of one sample's output planes where its columns alone would exceed it (a volume's); a chunk's columns are laid
out (C, k..., Nb, positions) so that one GEMM covers it (``ops/im2col.py``: where each window lies). Backward
rebuilds the columns chunk by chunk rather than keeping them from forward: memory stays proportional to the
activations, not to prod(k) times them. Copies are split between threads (``parallel.parallel_for``).

Paths (NumPy's, where oneDNN does not run a case: float64, bfloat16, oneDNN missing or declining; and a weight
gradient oneDNN would run on its GEMM fallback, ``onednn.conv_backward``):
- pointwise (kernel 1, stride 1, no padding): no columns at all, one batched matmul per direction; a strided
  kernel-1 convolution without padding subsamples its input first and then takes this path;
- shifted rows: every output position is computed over the full padded extents of all axes but the first (of the
  stride's phases, where strided), so the window of a kernel position is one contiguous run (for a stride-1 image,
  ``xpad_flat[n, c, p*dh*Wp + q*dw :][: oH*Wp]``); im2col and col2im become long contiguous copies, at the price
  of computing discarded positions (``Wp - oW`` per row of an image), so this path is taken when those are at most
  ``SHIFTED_WASTE`` of the kept ones;
- implicit GEMM (on shifted rows, host float32/float64, enough channels and positions): no columns, a GEMM per
  kernel position on the padded input in place, accumulated with the BLAS's ``beta`` (``ops/implicit.py``);
- strided windows (narrow maps): classic im2col with strided window views;
- depthwise (groups equal to the input's channels, on the host): no columns, tap by tap over cached blocks of
  channels (``ops/depthwise.py``).

CuPy arrays go to cuDNN (``ops/cuda/conv.py``) and take these paths only where cuDNN cannot run a case. What
forward keeps for backward is a :class:`~spmdcnn.ops.saved.ConvSaved`.
"""

from math import prod

from .. import backend
from .saved import ConvSaved
from .cuda import conv as cudnn
from . import depthwise
from . import im2col
from . import implicit
from . import onednn
from .im2col import Layout
from .scratch import scratch
from .window import interior, is_padded, ntuple, output_extents, rank_of, sides


def group_inputs(k0, k1, out_channels, in_channels, groups):
    """The input channels ``[c0, c1)`` that output channels ``[k0, k1)`` of a convolution with ``groups`` groups
    read: those of the groups the output channels fall in."""
    per_output, per_input = out_channels // groups, in_channels // groups
    if k1 <= k0:
        return k0 // per_output * per_input, k0 // per_output * per_input
    return k0 // per_output * per_input, -(-k1 // per_output) * per_input


class ConvGeometry:
    """Stride, per-side padding and dilation of a convolution, one value per spatial axis (``rank`` of them: given,
    or the length of the first one given as a sequence, else 2); the kernel size comes from the weight.

    ``groups``: the groups its channels fall in (PyTorch's ``groups``; for a tile, the tile's groups)."""

    __slots__ = ("stride", "padding", "dilation", "groups")

    def __init__(self, stride=1, padding=0, dilation=1, rank=None, groups=1):
        rank = rank or rank_of(stride, padding, dilation)
        self.stride = ntuple(stride, rank, "stride")
        self.padding = sides(padding, rank)
        self.dilation = ntuple(dilation, rank, "dilation")
        self.groups = groups

    @property
    def rank(self):
        return len(self.stride)

    def output_shape(self, spatial, kernel):
        """The output's extents for an input of ``spatial`` extents and a kernel of ``kernel`` extents."""
        return output_extents(spatial, kernel, self.stride, self.padding, self.dilation)

    def is_pointwise(self, kernel):
        return all(k == 1 for k in kernel) and all(s == 1 for s in self.stride) and not is_padded(self.padding)

    def __repr__(self):
        grouped = f", groups={self.groups}" if self.groups != 1 else ""
        return f"ConvGeometry(stride={self.stride}, padding={self.padding}, dilation={self.dilation}{grouped})"


def workspace_elements(x_shape, kernel, out_channels, geometry, itemsize):
    """Elements of the scratch arrays the host path holds while it convolves an input of ``x_shape`` (the memory
    model's workspace, ``cost/memory.py``): im2col's block of columns, their product with the weight and the padded
    block; the implicit GEMM's padded samples and products (``ops/implicit.py``, where it runs); none for a
    pointwise convolution or an empty input; a depthwise one's channel blocks (``ops/depthwise.py``)."""
    if min(x_shape) == 0:
        return 0
    if itemsize == 4 and onednn.available():                           # float32 on oneDNN
        out = (x_shape[0], out_channels) + tuple(geometry.output_shape(x_shape[2:], kernel))
        return onednn.workspace_elements(x_shape, (out_channels, x_shape[1] // geometry.groups) + tuple(kernel), out)
    if geometry.is_pointwise(kernel):
        return 0
    if geometry.groups > 1 and geometry.groups == x_shape[1]:         # no columns: blocks of channels
        return depthwise.workspace_elements(x_shape, kernel, geometry)
    layout = Layout(x_shape, kernel, geometry, itemsize)
    floating = {4: "float32", 8: "float64"}.get(itemsize)
    if floating and implicit.takes(layout, geometry.groups, floating):
        return implicit.workspace_elements(layout, x_shape[0], out_channels, geometry.groups, itemsize)
    C, positions = x_shape[1], layout.block * layout.P
    return (C * prod(kernel) + out_channels) * positions + layout.block * C * layout.phases * layout.phase_size


def conv_forward(x, w, b, geometry, need_input_grad=True):
    """``y = conv(x, w) + b`` for x (N, C, S...), w (K, C, k...), b (K,) or None, over ``geometry.rank`` spatial
    axes.

    Returns ``y, saved``; ``need_input_grad=False`` (the network's first layer) lets backward skip ``gx``.
    """
    C, kernel = x.shape[1], w.shape[2:]
    if x.ndim != w.ndim or x.ndim - 2 != geometry.rank:
        raise ValueError(f"conv: input {x.shape}, weight {w.shape} and {geometry} disagree in spatial rank")
    if w.shape[1] * geometry.groups != C:
        raise ValueError(f"conv: input has {C} channels, weight expects {w.shape[1]} in each of {geometry.groups} "
                         f"group{'s' * (geometry.groups != 1)}")
    out = geometry.output_shape(x.shape[2:], kernel)
    if min(out) <= 0:
        raise ValueError(f"conv: a {'x'.join(map(str, kernel))} kernel with {geometry} over a "
                         f"{'x'.join(map(str, x.shape[2:]))} input gives an empty output")
    if w.shape[0] % geometry.groups:
        raise ValueError(f"conv: {w.shape[0]} output channels do not fall evenly in {geometry.groups} groups")
    if backend.on_device(x) and cudnn.available():
        result = cudnn.conv_forward(x, w, b, geometry, need_input_grad)
        if result is not None:
            return result
    if onednn.applies(x, w, b):
        result = onednn.conv_forward(x, w, b, geometry, need_input_grad)
        if result is not None:
            return result
    return _host_forward(x, w, b, geometry, need_input_grad, out)


def _host_forward(x, w, b, geometry, need_input_grad, out):
    """im2col + GEMM (on NumPy, or on CuPy where cuDNN is missing or cannot run a case)."""
    kernel = w.shape[2:]
    if all(k == 1 for k in kernel) and not is_padded(geometry.padding) and any(s > 1 for s in geometry.stride):
        # a strided kernel-1 convolution reads every s-th element: subsample, then a pointwise product
        subsampled = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in geometry.stride)].copy()
        y, inner = conv_forward(subsampled, w, b, ConvGeometry(rank=geometry.rank, groups=geometry.groups),
                                need_input_grad)
        return y, ConvSaved("subsample", geometry, x_shape=x.shape, inner=inner)
    y = _columns_forward(x, w, b, geometry, out)
    return y, ConvSaved("direct", geometry, x=x, w=w, has_bias=b is not None, need_input_grad=need_input_grad)


def _bias_shape(K, rank):
    return (1, K) + (1,) * rank


def _by_group(array, groups, positions=None):
    """A (K, rest...) array as its groups' stack (G, K/G, prod(rest)), or with ``positions``, columns (C, k...,
    Nb, P) as (G, C/G * prod(k), positions) (a view where the array allows one)."""
    if positions is not None:
        return array.reshape(groups, -1, positions)
    return array.reshape(groups, array.shape[0] // groups, -1)


def _columns_forward(x, w, b, geometry, out):
    if depthwise.applies(x, geometry):
        y = depthwise.forward(x, w, geometry, out)
        if b is not None:
            y += b.reshape(_bias_shape(w.shape[0], geometry.rank))
        return y
    xp = backend.array_module(x)
    N, C = x.shape[:2]
    K, kernel = w.shape[0], w.shape[2:]
    G = geometry.groups
    y = xp.empty((N, K) + tuple(out), dtype=x.dtype)
    w3 = _by_group(w, G)                                                # (G, K/G, C/G * taps)
    if geometry.is_pointwise(kernel):
        xp.matmul(w3, x.reshape(N, G, C // G, -1), out=y.reshape(N, G, K // G, -1))      # (N, G, K/G, S)
        if b is not None:
            y += b.reshape(_bias_shape(K, geometry.rank))
        return y
    layout = Layout(x.shape, kernel, geometry, x.itemsize)
    if implicit.applies(layout, x, G, w):
        return implicit.forward(x, w, b, layout, G, y)
    Nb, P = layout.block, layout.P
    columns = scratch(xp, "conv.columns", (C,) + tuple(kernel) + (Nb, P), x.dtype)
    product = scratch(xp, "conv.product", (K, Nb * P), x.dtype)
    bias = None if b is None else b.reshape(_bias_shape(K, geometry.rank))
    for n0, nb, o0, o1 in layout.chunks(N):
        if o0 == 0:
            xpad = layout.padded_block(x[n0:n0 + nb])
        positions = (o1 - o0) * layout.plane
        cols = layout.im2col(xpad, columns[..., :nb, :positions], o0, o1)
        part = product[:, :nb * positions]
        xp.matmul(w3, _by_group(cols, G, nb * positions), out=_by_group(part, G))
        layout.copy_out(part, nb, bias, y[n0:n0 + nb, :, o0:o1])
    return y


def conv_backward(gy, saved, gw_out=None):
    """Gradients ``gx, gw, gb`` of :func:`conv_forward` (``gx`` is None when it was not asked for).

    ``gw`` is written into ``gw_out`` (shaped like the weight) when given.
    """
    if saved.kind == "cudnn":
        return _backward_on_cudnn(gy, saved, gw_out)
    if saved.kind == "onednn":
        gradients = onednn.conv_backward(gy, saved, gw_out)
        if gradients is not None:
            return gradients
        return _columns_backward(gy, saved.x, saved.w, saved.has_bias, saved.geometry, saved.need_input_grad, gw_out)
    if saved.kind == "subsample":
        gx_sub, gw, gb = conv_backward(gy, saved.inner, gw_out)
        gx = None
        if gx_sub is not None:
            gx = backend.array_module(gy).zeros(saved.x_shape, dtype=gy.dtype)
            gx[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in saved.geometry.stride)] = gx_sub
        return gx, gw, gb
    return _columns_backward(gy, saved.x, saved.w, saved.has_bias, saved.geometry, saved.need_input_grad, gw_out)


def _backward_on_cudnn(gy, saved, gw_out):
    """Gradients of a forward that ran on cuDNN: through cuDNN, or where no engine runs them, through im2col;
    computed for the padded input cuDNN read, then cropped to the input."""
    gy = cudnn.aligned_contiguous(gy)
    gradients = cudnn.conv_backward(gy, saved, gw_out)
    if gradients is None:
        gradients = _padded_columns_backward(gy, saved)
    gxpad, gw, gb = gradients
    return _cropped(gxpad, saved), _into(gw, gw_out, gw is gw_out), gb


def _padded_columns_backward(gy, saved):
    """im2col's gradients of the convolution cuDNN ran (the padded input, the symmetric padding), ``gw`` and
    ``gb`` in the master weights' type."""
    symmetric = ConvGeometry(saved.geometry.stride, saved.padding, saved.geometry.dilation,
                             groups=saved.geometry.groups)
    gxpad, gw, gb = _columns_backward(gy, saved.x, saved.wio, saved.has_bias, symmetric, saved.need_input_grad, None)
    master = saved.w.dtype
    return gxpad, gw.astype(master, copy=False), None if gb is None else gb.astype(master, copy=False)


def _cropped(gxpad, saved):
    """The input's gradient from that of its padded copy a cuDNN forward read (None when not asked for)."""
    if gxpad is None or gxpad.shape == tuple(saved.x_shape):
        return gxpad
    extra = tuple((before - shared, 0) for (before, _), shared in zip(saved.geometry.padding, saved.padding))
    return backend.array_module(gxpad).ascontiguousarray(gxpad[interior(extra, saved.x_shape[2:])])


def _columns_backward(gy, x, w, has_bias, geometry, need_input_grad, gw_out):
    if depthwise.applies(x, geometry):
        direct = gw_out is not None and gw_out.flags.c_contiguous
        gx, gw = depthwise.backward(gy, x, w, geometry, need_input_grad, gw_out if direct else None)
        gb = gy.sum(axis=(0,) + tuple(range(2, gy.ndim))) if has_bias else None
        return gx, _into(gw, gw_out, direct), gb
    xp = backend.array_module(gy)
    N, C = x.shape[:2]
    K, kernel = w.shape[0], w.shape[2:]
    G = geometry.groups
    w3 = _by_group(w, G)                                                # (G, K/G, C/G * taps)
    gb = gy.sum(axis=(0,) + tuple(range(2, gy.ndim))) if has_bias else None
    direct = gw_out is not None and gw_out.flags.c_contiguous
    gw3 = _by_group(gw_out, G) if direct else None
    if geometry.is_pointwise(kernel):
        gw3, gx = _pointwise_backward(gy, x, w3, gw3, need_input_grad)
        return gx, _into(gw3.reshape(w.shape), gw_out, direct), gb
    layout = Layout(x.shape, kernel, geometry, x.itemsize)
    if implicit.applies(layout, x, G, w, gy):
        gwt = scratch(xp, "conv.gw", implicit.weight_gradient_shape(w), x.dtype)
        gx, gwt = implicit.backward(gy, x, w, layout, G, need_input_grad, gwt)
        gw = gw_out if direct else xp.empty(w.shape, dtype=x.dtype)
        gw.reshape(K, w.shape[1], -1)[...] = gwt.transpose(1, 2, 0)
        return gx, _into(gw, gw_out, direct), gb
    if N == 0:                                                          # no chunk runs: a zero weight gradient
        return xp.empty_like(x) if need_input_grad else None, _into(xp.zeros(w.shape, x.dtype), gw_out, False), gb
    Nb, P = layout.block, layout.P
    columns = scratch(xp, "conv.columns", (C,) + tuple(kernel) + (Nb, P), x.dtype)
    positions = scratch(xp, "conv.product", (K, Nb * P), x.dtype)
    chunks = layout.chunks(N)
    gw_block = scratch(xp, "conv.gw", w3.shape, x.dtype) if len(chunks) > 1 else None
    gx = xp.empty_like(x) if need_input_grad else None
    for n0, nb, o0, o1 in chunks:
        if o0 == 0:
            xpad = layout.padded_block(x[n0:n0 + nb])
            gpad = layout.zeros(xp, nb, x.dtype, "conv.gpad") if need_input_grad else None
        count = nb * (o1 - o0) * layout.plane
        cols = _by_group(layout.im2col(xpad, columns[..., :nb, :count // nb], o0, o1), G, count)
        g = _by_group(layout.to_positions(gy[n0:n0 + nb, :, o0:o1], positions[:, :count]), G)    # (G, K/G, count)
        if n0 == 0 and o0 == 0:
            gw3 = xp.matmul(g, cols.swapaxes(1, 2), out=gw3)
        else:
            gw3 += xp.matmul(g, cols.swapaxes(1, 2), out=gw_block)
        if need_input_grad:
            _input_chunk(layout, w3, g, cols, gpad, gx[n0:n0 + nb], o0, o1)
    assert gx is None or gx.shape == x.shape
    return gx, _into(gw3.reshape(w.shape), gw_out, direct), gb


def _input_chunk(layout, w3, g, cols, gpad, gx, o0, o1):
    """A chunk's part of its samples' input gradient ``gx`` (nb, C, S...), from the output gradient of planes
    ``[o0, o1)`` as positions ``g`` (G, K/G, nb*positions), the weight as its groups ``w3``: the columns' gradient
    (written over ``cols``, (G, C/G * taps, nb*positions)), added back by col2im into the samples' zeroed padded
    block ``gpad``, whose interior is ``gx`` after their last chunk."""
    xp = backend.array_module(g)
    nb = gx.shape[0]
    xp.matmul(w3.swapaxes(1, 2), g, out=cols)
    layout.col2im(cols.reshape((layout.C,) + layout.kernel + (nb, -1)), gpad, o0, o1)
    if o1 == layout.out[0]:
        layout.unpad(gpad, gx)


def conv_input_gradient(gy, w, x_shape, geometry):
    """The gradient of :func:`conv_forward`'s input of ``x_shape`` alone, from the output gradient ``gy``: the
    transposed convolution of ``gy`` (``ops/conv_transpose.py`` runs its forward through this); cuDNN's data
    gradient on a GPU where an engine runs it."""
    xp = backend.array_module(gy)
    if backend.on_device(gy) and cudnn.available():
        gx = cudnn.input_gradient(gy, w, x_shape, geometry)
        if gx is not None:
            return gx
    if onednn.applies(gy, w):
        gx = onednn.input_gradient(gy, w, x_shape, geometry)
        if gx is not None:
            return gx
    N, C = x_shape[:2]
    K, kernel = w.shape[0], w.shape[2:]
    G = geometry.groups
    w3 = _by_group(w, G)
    gx = xp.empty(tuple(x_shape), dtype=gy.dtype)
    if geometry.is_pointwise(kernel):
        xp.matmul(w3.swapaxes(1, 2), gy.reshape(N, G, K // G, -1), out=gx.reshape(N, G, C // G, -1))
        return gx
    layout = Layout(x_shape, kernel, geometry, gy.itemsize)
    if implicit.applies(layout, gy, G, w):
        return implicit.backward(gy, None, w, layout, G, need_weight_grad=False)[0]
    Nb, P = layout.block, layout.P
    columns = scratch(xp, "conv.columns", (C * prod(kernel), Nb * P), gy.dtype)
    positions = scratch(xp, "conv.product", (K, Nb * P), gy.dtype)
    for n0, nb, o0, o1 in layout.chunks(N):
        if o0 == 0:
            gpad = layout.zeros(xp, nb, gy.dtype, "conv.gpad")
        count = nb * (o1 - o0) * layout.plane
        g = layout.to_positions(gy[n0:n0 + nb, :, o0:o1], positions[:, :count])
        _input_chunk(layout, w3, _by_group(g, G), _by_group(columns[:, :count], G, count), gpad, gx[n0:n0 + nb],
                     o0, o1)
    return gx


def _into(gw, gw_out, direct):
    """``gw`` in ``gw_out`` when one was given: already there when the GEMMs wrote it ``direct``ly (a
    contiguous ``gw_out``), copied otherwise."""
    if gw_out is None:
        return gw
    if not direct:
        gw_out[...] = gw
    return gw_out


def _pointwise_backward(gy, x, w3, gw3, need_input_grad):
    """1x1 convolution, the weight as its groups ``w3`` (G, K/G, C/G): ``gw = sum_n gy[n] @ x[n].T`` per group
    over sample blocks (bounded copies), ``gx = w.T @ gy``."""
    xp = backend.array_module(gy)
    N, C = x.shape[:2]
    G, K = w3.shape[0], w3.shape[0] * w3.shape[1]
    HW = prod(x.shape[2:])                                              # positions per sample
    gy_nkp, x_ncp = gy.reshape(N, K, HW), x.reshape(N, C, HW)
    Nb = max(1, min(N, im2col.COLUMN_BYTES // max((K + C) * HW * x.itemsize, 1)))
    if gw3 is None:
        gw3 = xp.empty(w3.shape, dtype=x.dtype)
    part = scratch(xp, "conv.gw", w3.shape, x.dtype) if N > Nb else None
    for n0 in range(0, N, Nb):
        nb = min(N, n0 + Nb) - n0
        g = scratch(xp, "conv.product", (K, nb, HW), x.dtype)
        g[...] = gy_nkp[n0:n0 + nb].transpose(1, 0, 2)                   # (K, Nb, HW)
        xs = scratch(xp, "conv.columns", (C, nb, HW), x.dtype)
        xs[...] = x_ncp[n0:n0 + nb].transpose(1, 0, 2)                   # (C, Nb, HW)
        product = xp.matmul(_by_group(g, G), _by_group(xs, G, nb * HW).swapaxes(1, 2), out=gw3 if n0 == 0 else part)
        if n0:
            gw3 += product
    gx = None
    if need_input_grad:                                                 # (N, G, C/G, HW)
        gx = xp.matmul(w3.swapaxes(1, 2), gy.reshape(N, G, K // G, HW)).reshape(x.shape)
    return gw3, gx
