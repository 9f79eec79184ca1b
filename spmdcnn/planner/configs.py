"""The configurations the planner considers for a layer.

For every device count that divides the job's devices, every way of writing it as a product of degrees over the
dimensions the op may split (``tiling.config.dims_of``), each degree at most the output's extent along it, a grouped
convolution's channels split in whole groups (``tiling.config.keeps_groups``). The
tiles go to the contiguous devices ``0 .. count-1``: a layer on fewer devices than the job runs on the first ones.
relu and dropout are not searched: they take their input's configuration (docs/formats.md#plan-files).
"""

from ..tiling.config import ParallelConfig, device_range, dims_of, keeps_groups, names_of, output_shape
from ..tiling.plan import inherits


def divisors(number):
    return [d for d in range(1, number + 1) if number % d == 0]


def factorizations(number, parts):
    """Every ordered tuple of ``parts`` positive integers whose product is ``number``."""
    if parts == 1:
        return [(number,)]
    return [(first,) + rest for first in divisors(number) for rest in factorizations(number // first, parts - 1)]


def configurations(layer, batch, devices):
    """The :class:`ParallelConfig` choices of ``layer`` for a job on ``devices`` devices."""
    shape = output_shape(layer, batch)
    names = names_of(len(shape))
    allowed = [names.index(d) for d in dims_of(layer)]
    result = []
    for count in divisors(devices):
        on = device_range(count)            # one tuple for every configuration on these devices
        for split in factorizations(count, len(allowed)):
            degrees = [1] * len(shape)
            for axis, degree in zip(allowed, split):
                degrees[axis] = degree
            if all(degree <= extent for degree, extent in zip(degrees, shape)) and \
                    (len(shape) < 2 or keeps_groups(layer, degrees[1])):
                result.append(ParallelConfig(tuple(degrees), on))
    return result


def searched(graph):
    """``{layer name: name of the layer whose configuration it takes}``: itself, or for relu and dropout, the
    first layer up their input chain that is searched."""
    root = {}
    for layer in graph.layers:
        root[layer.name] = root[layer.inputs[0]] if inherits(layer, root) else layer.name
    return root
