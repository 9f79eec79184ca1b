"""Element-wise sum of inputs of the same shape; each input receives the whole output gradient."""


def add_forward(xs):
    y = xs[0] + xs[1]
    for x in xs[2:]:
        y += x
    return y, len(xs)


def add_backward(gy, count):
    return [gy] * count
