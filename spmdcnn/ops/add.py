"""Element-wise sum of inputs of the same shape; each input receives the whole output gradient."""


def add_forward(xs, inplace=None):
    """``inplace=i`` accumulates into ``xs[i]`` (the caller guarantees nothing else reads it)."""
    if inplace is None:
        y = xs[0] + xs[1]
        rest = xs[2:]
    else:
        y = xs[inplace]
        rest = xs[:inplace] + xs[inplace + 1:]
    for x in rest:
        y += x
    return y, len(xs)


def add_backward(gy, count):
    return [gy] * count
