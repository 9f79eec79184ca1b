"""The plan picture's colours: one meaning per colour (a dimension of the split, or a kind of time)."""

from spmdcnn.planner.plot import COLOURS, TIMES


def test_no_colour_means_both_a_dimension_and_a_kind_of_time():
    dimensions, times = set(COLOURS.values()), {colour for _, _, colour in TIMES}
    assert len(dimensions) == len(COLOURS) and len(times) == len(TIMES)
    assert dimensions.isdisjoint(times)
