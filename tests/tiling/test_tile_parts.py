"""Balanced splits and tiles (docs/formats.md#plan-files): part ``i`` of ``E`` in ``d`` parts is
``[floor(i*E/d), floor((i+1)*E/d))``; the tiles of a configuration cover the tensor exactly once and lie on
``devices`` in row-major order of their multi-index."""

import itertools

import numpy as np
import pytest

from spmdcnn.tiling import Box, ParallelConfig, intersect, part, shape_of
from spmdcnn.tiling.boxes import contains, full, is_empty, relative, volume

EXTENT_DEGREE = [(e, d) for e in (1, 2, 3, 5, 7, 8, 13, 16, 31, 64, 100) for d in (1, 2, 3, 4, 5, 7, 8, 16, 31, 64)
                 if d <= e]


@pytest.mark.parametrize("extent,degree", EXTENT_DEGREE)
def test_parts_follow_the_floor_formula(extent, degree):
    for i in range(degree):
        assert part(extent, degree, i) == ((i * extent) // degree, ((i + 1) * extent) // degree)


@pytest.mark.parametrize("extent,degree", EXTENT_DEGREE)
def test_parts_are_balanced_contiguous_and_cover_the_extent(extent, degree):
    ranges = [part(extent, degree, i) for i in range(degree)]
    sizes = [stop - start for start, stop in ranges]
    assert min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == extent
    assert ranges[0][0] == 0 and ranges[-1][1] == extent
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_uneven_split_puts_the_larger_parts_where_the_formula_does():
    assert [part(10, 4, i) for i in range(4)] == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert [part(5, 5, i) for i in range(5)] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert [part(7, 1, 0)] == [(0, 7)]


def config(degrees):
    count = int(np.prod(degrees))
    return ParallelConfig(tuple(degrees), tuple(range(count)))


CASES = [
    ((4, 8, 15, 13), (1, 1, 1, 1)),
    ((4, 8, 15, 13), (4, 1, 1, 1)),
    ((4, 8, 15, 13), (2, 3, 2, 1)),
    ((4, 8, 15, 13), (1, 8, 1, 1)),          # degree == extent
    ((4, 8, 15, 13), (1, 1, 4, 3)),          # uneven splits over h and w
    ((3, 5, 7, 2), (3, 5, 7, 2)),            # every element its own tile
    ((5, 3, 4, 4), (2, 1, 3, 2)),
    ((7, 360), (3, 4)),                      # rank 2 (linear, flatten)
    ((7, 10), (7, 10)),
    ((6, 11), (1, 5)),
    ((9,), (4,)),                            # rank 1 (the loss)
    ((9,), (9,)),
    ((1,), (1,)),
]


@pytest.mark.parametrize("shape,degrees", CASES)
def test_tiles_cover_every_element_exactly_once(shape, degrees):
    count = np.zeros(shape, dtype=np.int64)
    tiles = config(degrees).tiles(shape)
    assert len(tiles) == int(np.prod(degrees))
    for _, box in tiles:
        assert not is_empty(box)
        count[tuple(slice(a, b) for a, b in box)] += 1
    assert (count == 1).all()


@pytest.mark.parametrize("shape,degrees", CASES)
def test_tile_boxes_are_the_parts_of_each_dimension(shape, degrees):
    cfg = config(degrees)
    for (device, box), index in zip(cfg.tiles(shape), itertools.product(*(range(d) for d in degrees))):
        assert box == tuple(part(e, d, i) for e, d, i in zip(shape, degrees, index))
        assert cfg.box(shape, index) == box
        assert cfg.index_of(device) == index


@pytest.mark.parametrize("shape,degrees", CASES)
def test_tile_shapes_differ_by_at_most_one_per_dimension(shape, degrees):
    shapes = np.array([shape_of(box) for _, box in config(degrees).tiles(shape)])
    assert (shapes.max(axis=0) - shapes.min(axis=0) <= 1).all()


def test_tiles_lie_on_the_devices_in_row_major_order():
    cfg = ParallelConfig((2, 1, 2, 1), (5, 2, 7, 0))
    shape = (4, 3, 6, 5)
    assert cfg.tiles(shape) == [
        (5, ((0, 2), (0, 3), (0, 3), (0, 5))),
        (2, ((0, 2), (0, 3), (3, 6), (0, 5))),
        (7, ((2, 4), (0, 3), (0, 3), (0, 5))),
        (0, ((2, 4), (0, 3), (3, 6), (0, 5))),
    ]
    assert [cfg.index_of(d) for d in (5, 2, 7, 0)] == [(0, 0, 0, 0), (0, 0, 1, 0), (1, 0, 0, 0), (1, 0, 1, 0)]


def test_a_device_without_a_tile_has_none():
    cfg = ParallelConfig((1, 2, 1, 1), (3, 1))
    shape = (4, 6, 5, 5)
    assert cfg.size == 2
    assert cfg.tile_of(3, shape) == ((0, 4), (0, 3), (0, 5), (0, 5))
    assert cfg.tile_of(1, shape) == ((0, 4), (3, 6), (0, 5), (0, 5))
    for device in (0, 2, 4):
        assert cfg.tile_of(device, shape) is None
        assert cfg.index_of(device) is None


def test_replicas_group_devices_by_channel_part():
    cfg = ParallelConfig((2, 3, 1, 1), (0, 1, 2, 3, 4, 5))
    assert cfg.replicas() == {0: [0, 3], 1: [1, 4], 2: [2, 5]}
    assert ParallelConfig((4, 1, 1, 1), (3, 2, 1, 0)).replicas() == {0: [3, 2, 1, 0]}
    assert ParallelConfig((4,), (0, 1, 2, 3)).replicas() == {0: [0, 1, 2, 3]}       # the loss: no channels


@pytest.mark.parametrize("degrees,devices,text", [
    ((1, 1, 1, 1), (0,), "{n: 1, devices: [0]}"),
    ((1, 1, 1, 1), (3,), "{n: 1, devices: [3]}"),
    ((2, 1, 2, 1), (0, 1, 2, 3), "{n: 2, h: 2, devices: [0, 1, 2, 3]}"),
    ((1, 3), (2, 0, 1), "{c: 3, devices: [2, 0, 1]}"),
    ((4,), (0, 1, 2, 3), "{n: 4, devices: [0, 1, 2, 3]}"),
])
def test_describe_writes_plan_flow_style(degrees, devices, text):
    assert ParallelConfig(degrees, devices).describe() == text


def test_box_helpers():
    a: Box = ((0, 4), (2, 6))
    b: Box = ((3, 8), (0, 3))
    assert intersect(a, b) == ((3, 4), (2, 3))
    assert intersect(a, ((4, 8), (0, 9))) is None                 # touching is not overlapping
    assert intersect(a, ((0, 4), (3, 3))) is None                 # an empty box meets nothing
    assert shape_of(a) == (4, 4) and volume(a) == 16 and volume(((2, 2), (0, 5))) == 0
    assert full((3, 5)) == ((0, 3), (0, 5))
    assert contains(a, ((1, 3), (2, 6))) and not contains(a, ((1, 5), (2, 6)))
    array = np.arange(100).reshape(10, 10)
    origin = ((2, 8), (1, 9))
    local = array[2:8, 1:9]
    assert (local[relative(((3, 5), (4, 7)), origin)] == array[3:5, 4:7]).all()
