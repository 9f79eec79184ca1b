"""Flatten (N, C, H, W) -> (N, C*H*W), C-major as PyTorch."""


def flatten_forward(x):
    return x.reshape(x.shape[0], -1), x.shape


def flatten_backward(gy, x_shape):
    return gy.reshape(x_shape)
