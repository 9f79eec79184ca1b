"""Receptive fields against brute force: every kernel tap of every output position of a tile reads a row (column)
inside the need box or in the padding the tile adds, the box is no larger than it must be, and the padded box
gives the tile exactly its own output positions."""

import itertools

import numpy as np
import pytest

from tiling_cases import SMALL_MODELS, handmade, model
from spmdcnn.ops.window import output_extent
from spmdcnn.tiling import ParallelConfig, part
from spmdcnn.tiling.config import output_shape
from spmdcnn.tiling.fields import Need, needs, window_range



def check_window(o0, o1, kernel, stride, pad, dilation, extent):
    """Brute-force check of ``window_range`` for output positions ``[o0, o1)`` along one dimension."""
    (a, b), (before, after) = window_range(o0, o1, kernel, stride, pad, dilation, extent)
    assert 0 <= a <= b <= extent and before >= 0 and after >= 0
    # the padded box yields exactly the tile's output positions
    assert output_extent(b - a, kernel, stride, before, after, dilation) == o1 - o0
    # the padded local array holds, at local index (o - o0)*s + d*t, what tap t of output o reads globally
    x = np.arange(1, extent + 1)               # nonzero, distinct values; padding reads as 0
    local = np.concatenate([np.zeros(before, int), x[a:b], np.zeros(after, int)])
    reads = []
    for o in range(o0, o1):
        for t in range(kernel):
            g = o * stride - pad + dilation * t
            expected = x[g] if 0 <= g < extent else 0
            assert local[(o - o0) * stride + dilation * t] == expected, (o, t, g)
            reads.append(g)
    # every in-range read lies in the box
    inside = sorted({g for g in reads if 0 <= g < extent})
    assert all(a <= g < b for g in inside)
    # tightness: the box is the window [o0*s - p, (o1-1)*s - p + d*(k-1] + 1) clipped to the tensor, and when the
    # taps read that window without gaps, the box is exactly the hull of the rows read
    lo, hi = o0 * stride - pad, (o1 - 1) * stride - pad + dilation * (kernel - 1) + 1
    if a < b:
        assert (a, b) == (max(lo, 0), min(hi, extent))
    else:
        assert not inside
    if set(reads) == set(range(lo, hi)):
        assert (a, b) == ((inside[0], inside[-1] + 1) if inside else (a, a))
    return (a, b), (before, after)


def tiles_of(count):
    """Interesting output ranges of ``count`` positions: every short range, the whole, and balanced parts."""
    ranges = {(o0, o1) for o0 in range(count) for o1 in range(o0 + 1, min(o0 + 3, count) + 1)}
    ranges |= {part(count, d, i) for d in (1, 2, 3, 5) if d <= count for i in range(d)}
    return sorted(ranges)


@pytest.mark.parametrize("kernel,stride,dilation,pad", [
    (k, s, d, p) for k in (1, 2, 3, 5) for s in (1, 2, 3) for d in (1, 2, 3) for p in (0, 1, 2, 4)])
def test_window_range_matches_brute_force(kernel, stride, dilation, pad):
    for extent in (1, 2, 3, 5, 8, 13):
        count = output_extent(extent, kernel, stride, pad, pad, dilation)
        for o0, o1 in tiles_of(count) if count > 0 else []:
            check_window(o0, o1, kernel, stride, pad, dilation, extent)


@pytest.mark.parametrize("o0,o1,expected", [
    (0, 2, ((0, 0), (2, 0))),       # top tile: reads only the top padding
    (2, 4, ((0, 2), (0, 0))),
    (4, 6, ((2, 4), (0, 0))),
    (6, 8, ((4, 4), (2, 0))),       # bottom tile: reads only the bottom padding
    (1, 3, ((0, 1), (1, 0))),       # half padding, half data
    (0, 8, ((0, 4), (2, 2))),       # the whole output
])
def test_a_tile_can_read_only_padding(o0, o1, expected):
    # kernel 1, padding 2 over 4 rows gives 8 outputs, the first two and the last two are pure padding
    assert output_extent(4, 1, 1, 2, 2) == 8
    assert check_window(o0, o1, 1, 1, 2, 1, 4) == expected


def test_strided_window_keeps_unread_rows_between_padding_and_first_read():
    # kernel 1, stride 2, padding 1 over 5 rows: output 0 reads row -1 (padding), output 1 reads row 1. Row 0 is
    # never read, but the box is the contiguous window clipped to the tensor, so it starts at row 0.
    assert window_range(0, 2, 1, 2, 1, 1, 5) == ((0, 2), (1, 0))
    check_window(0, 2, 1, 2, 1, 1, 5)


def window_layers():
    for name in SMALL_MODELS:
        for layer in model(name).layers:
            if layer.spec.window:
                yield pytest.param(name, layer.name, id=f"{name}:{layer.name}")


def spatial_configs(layer, batch):
    shape = output_shape(layer, batch)
    choices = ((1, 2), (1, 3)) + ((1, 2, 3, 4), (1, 2, 3))[-(len(shape) - 2):] if len(shape) < 5 else \
        ((1, 2), (1, 3), (1, 2, 3), (1, 2, 3), (1, 3))
    for degrees in itertools.product(*choices):
        if all(d <= extent for d, extent in zip(degrees, shape)):
            yield ParallelConfig(degrees, tuple(range(int(np.prod(degrees)))))


@pytest.mark.parametrize("model_name,layer_name", list(window_layers()))
def test_window_layer_needs_match_brute_force(model_name, layer_name):
    layer = model(model_name).by_name[layer_name]
    batch = 3
    geometry = layer.window
    in_shape = (batch,) + tuple(layer.in_shapes[0])
    for cfg in spatial_configs(layer, batch):
        for _, out_box in cfg.tiles(output_shape(layer, batch)):
            [need] = needs(layer, out_box, [in_shape])
            n, c, *ranges = need.box
            assert n == out_box[0]
            assert c == ((0, in_shape[1]) if layer.spec.family == "conv" else out_box[1])
            checks = [check_window(*o, k, s, before, d, extent) for o, k, s, (before, after), d, extent in
                      zip(out_box[2:], geometry.kernel, geometry.stride, geometry.padding, geometry.dilation,
                          in_shape[2:])]
            # the padding after comes out of the window's reach: a per-side padding's own after only bounds it
            assert tuple(ranges) == tuple(box for box, _ in checks)
            assert need.padding == tuple(pads for _, pads in checks)


def test_border_and_interior_tiles_of_a_strided_dilated_conv():
    # tiny_cnn conv2: kernel [3, 2], stride [2, 1], padding [1, 0], dilation [1, 2]; input 8x7, output 4x5
    layer = model("tiny_cnn").by_name["conv2"]
    shapes = [(2, 8, 8, 7)]
    top_left = needs(layer, ((0, 2), (0, 12), (0, 2), (0, 2)), shapes)[0]
    assert top_left == Need(((0, 2), (0, 8), (0, 4), (0, 4)), ((1, 0), (0, 0)))
    bottom_right = needs(layer, ((0, 2), (0, 12), (2, 4), (3, 5)), shapes)[0]
    assert bottom_right == Need(((0, 2), (0, 8), (3, 8), (3, 7)), ((0, 0), (0, 0)))
    interior = needs(layer, ((1, 2), (4, 8), (1, 3), (1, 4)), shapes)[0]
    assert interior == Need(((1, 2), (0, 8), (1, 6), (1, 6)), ((0, 0), (0, 0)))


def test_avgpool_with_padding_pads_only_the_border_sides():
    # tiny_cnn pool2: avgpool kernel 2, stride 1, padding 1 over 4x5 gives 5x6
    layer = model("tiny_cnn").by_name["pool2"]
    shapes = [(2, 12, 4, 5)]
    assert needs(layer, ((0, 2), (0, 12), (0, 5), (0, 6)), shapes)[0].padding == ((1, 1), (1, 1))
    top = needs(layer, ((0, 2), (0, 6), (0, 2), (0, 6)), shapes)[0]
    assert top == Need(((0, 2), (0, 6), (0, 2), (0, 5)), ((1, 0), (1, 1)))
    bottom = needs(layer, ((0, 2), (6, 12), (2, 5), (3, 6)), shapes)[0]
    assert bottom == Need(((0, 2), (6, 12), (1, 4), (2, 5)), ((0, 1), (0, 1)))


def test_conv_with_padding_beyond_the_kernel_has_padding_only_tiles():
    graph = handmade([{"name": "conv", "op": "conv2d", "out_channels": 2, "kernel": 1, "padding": 2}],
                     input_shape=(3, 4, 5))
    layer = graph.by_name["conv"]
    assert layer.out_shape == (2, 8, 9)
    shapes = [(2, 3, 4, 5)]
    top = needs(layer, ((0, 2), (0, 2), (0, 2), (0, 9)), shapes)[0]
    assert top == Need(((0, 2), (0, 3), (0, 0), (0, 5)), ((2, 0), (2, 2)))
    corner = needs(layer, ((0, 2), (0, 2), (6, 8), (7, 9)), shapes)[0]
    assert corner.box[2:] == ((4, 4), (5, 5))
    assert corner.padding == ((2, 0), (2, 0))
    assert output_extent(0, 1, 1, 2, 0) == 2


def test_dilated_taps_can_skip_the_whole_input():
    # kernel 2, dilation 4, padding 2 over 2 rows: output 0 reads rows -2 and 2, output 1 reads -1 and 3. No tap
    # reads the tensor, yet the window [-2, 4) overlaps it: the box holds rows 0 and 1, which no tap reads.
    assert output_extent(2, 2, 1, 2, 2, 4) == 2
    assert check_window(0, 2, 2, 1, 2, 4, 2) == ((0, 2), (2, 2))


def shapes_of(layer, batch):
    return [(batch,) + tuple(shape) for shape in layer.in_shapes]


@pytest.mark.parametrize("model_name,layer_name", [
    ("small_resnet", "layer1.0.add"), ("small_resnet", "layer2.0.add"), ("small_resnet", "relu"),
    ("small_resnet", "bn1"), ("tiny_cnn", "relu2"), ("tiny_cnn", "relu3"), ("tiny_cnn", "drop"),
    ("cifar_cnn", "drop6"), ("cifar_cnn", "conv3.bn"),
])
def test_elementwise_and_add_need_their_own_output_box(model_name, layer_name):
    layer = model(model_name).by_name[layer_name]
    shape = output_shape(layer, 4)
    degrees = (2, 2, 2, 1)[:len(shape)]
    for _, box in ParallelConfig(degrees, tuple(range(int(np.prod(degrees))))).tiles(shape):
        result = needs(layer, box, shapes_of(layer, 4))
        assert len(result) == len(layer.inputs)
        assert all(need == Need(box) for need in result)


@pytest.mark.parametrize("model_name,layer_name", [
    ("tiny_cnn", "flat"), ("tiny_cnn", "fc1"), ("tiny_cnn", "fc2"), ("tiny_cnn", "loss"),
    ("small_inception", "flat"), ("cifar_cnn", "fc1"), ("cifar_cnn", "loss"),
])
def test_flatten_linear_and_loss_need_every_feature_of_their_samples(model_name, layer_name):
    layer = model(model_name).by_name[layer_name]
    batch = 5
    shape = output_shape(layer, batch)
    in_shape = shapes_of(layer, batch)[0]
    degrees = (3, 2) if layer.op == "linear" else (3,) + (1,) * (len(shape) - 1)
    for _, box in ParallelConfig(degrees, tuple(range(int(np.prod(degrees))))).tiles(shape):
        [need] = needs(layer, box, [in_shape])
        assert need.box == (box[0],) + tuple((0, extent) for extent in in_shape[1:])
        assert need.padding is None and need.steps is None


def test_global_avgpool_needs_the_whole_plane_of_its_channels():
    layer = model("small_resnet").by_name["avgpool"]
    [need] = needs(layer, ((1, 3), (4, 8), (0, 1), (0, 1)), [(4, 12, 8, 8)])
    assert need.box == ((1, 3), (4, 8), (0, 8), (0, 8))


def concat_brute_force(channel_counts, c0, c1):
    """For each input, the range of its channels that the output channels [c0, c1) take (None: none)."""
    owners = [(i, local) for i, count in enumerate(channel_counts) for local in range(count)]
    taken = {}
    for c in range(c0, c1):
        i, local = owners[c]
        taken.setdefault(i, []).append(local)
    return [(min(taken[i]), max(taken[i]) + 1) if i in taken else None for i in range(len(channel_counts))]


@pytest.mark.parametrize("model_name,layer_name", [
    ("small_inception", "mixed1.concat"), ("small_inception", "reduce1.concat"),
    ("small_inception", "mixed2.concat"),
])
def test_concat_needs_take_the_right_channels_of_each_input(model_name, layer_name):
    layer = model(model_name).by_name[layer_name]
    counts = [shape[0] for shape in layer.in_shapes]
    total = sum(counts)
    batch = 2
    for c0 in range(total):
        for c1 in range(c0 + 1, total + 1):
            box = ((0, batch), (c0, c1), (1, 4), (2, 5))
            result = needs(layer, box, shapes_of(layer, batch))
            for need, expected, count in zip(result, concat_brute_force(counts, c0, c1), counts):
                n, (lo, hi), rows, cols = need.box
                assert (n, rows, cols) == box[:1] + box[2:]
                if expected is None:
                    assert lo == hi and 0 <= lo <= count
                else:
                    assert (lo, hi) == expected


def test_concat_tile_touching_only_some_inputs():
    layer = model("small_inception").by_name["mixed1.concat"]          # inputs of 5, 5, 4 and 3 channels
    assert [s[0] for s in layer.in_shapes] == [5, 5, 4, 3]
    result = needs(layer, ((0, 2), (5, 11), (0, 17), (0, 17)), shapes_of(layer, 2))
    assert [need.box[1] for need in result] == [(5, 5), (0, 5), (0, 1), (0, 0)]
    assert [need.box[1] for need in needs(layer, ((0, 2), (14, 17), (0, 17), (0, 17)), shapes_of(layer, 2))] == [
        (5, 5), (5, 5), (4, 4), (0, 3)]


@pytest.mark.parametrize("stride", [2, 3, 4])
@pytest.mark.parametrize("pad", [0, 1, 2])
@pytest.mark.parametrize("extent", [1, 5, 8, 11])
def test_a_strided_one_wide_window_reads_only_its_rows(stride, pad, extent):
    """A 1x1 window with stride s reads rows o*s - p: the need is exactly those in the tensor, every s-th row,
    and the outputs whose row is padding are counted before and after."""
    from spmdcnn.ops.window import output_extent
    from spmdcnn.tiling.fields import strided_range
    outputs = output_extent(extent, 1, stride, pad, pad)
    for o0 in range(outputs):
        for o1 in range(o0 + 1, outputs + 1):
            (start, stop), (before, after) = strided_range(o0, o1, stride, pad, extent)
            rows = [o * stride - pad for o in range(o0, o1)]
            inside_rows = [r for r in rows if 0 <= r < extent]
            assert list(range(start, stop, stride)) == inside_rows
            assert before == sum(r < 0 for r in rows) and after == sum(r >= extent for r in rows)
            assert before + len(inside_rows) + after == o1 - o0


def test_strided_needs_of_a_one_by_one_convolution_split_over_height_and_width():
    graph = handmade([{"name": "c", "op": "conv2d", "out_channels": 2, "kernel": 1, "stride": [2, 3],
                       "padding": [0, 1]}], input_shape=[3, 9, 10])
    layer = graph.by_name["c"]                      # output 5 x 4: columns read -1, 2, 5, 8
    need, = needs(layer, ((0, 2), (0, 2), (1, 4), (0, 2)), [(2, 3, 9, 10)])
    assert need.box == ((0, 2), (0, 3), (2, 7), (2, 3)) and need.steps == (1, 1, 2, 3)
    assert need.padding == ((0, 0), (1, 0)) and need.stride((2, 3)) == (1, 1)
    whole, = needs(layer, ((0, 2), (0, 2), (0, 1), (0, 4)), [(2, 3, 9, 10)])
    assert whole.steps == (1, 1, 1, 3) and whole.box[2] == (0, 1) and whole.stride((2, 3)) == (2, 1)


def test_boxes_read_with_steps():
    from spmdcnn.tiling.boxes import intersect, packed, relative, shape_of
    need, steps = ((0, 2), (3, 12)), (1, 3)                 # columns 3, 6, 9
    assert shape_of(need, steps) == (2, 3)
    assert intersect(((0, 2), (4, 10)), need, steps) == ((0, 2), (6, 10))     # columns 6 and 9
    assert intersect(((0, 2), (4, 6)), need, steps) is None                  # nothing on the progression
    part = intersect(((0, 2), (4, 10)), need, steps)
    assert packed(part, need, steps) == (slice(0, 2), slice(1, 3))
    assert relative(part, ((0, 2), (4, 10)), steps) == (slice(0, 2, 1), slice(2, 6, 3))
