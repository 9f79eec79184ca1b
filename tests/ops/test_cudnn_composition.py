"""What ops/conv does around cuDNN, checked on NumPy with a stand-in for cuDNN's graphs: forward on the copy
padded by the part of the padding cuDNN is not given, backward through cuDNN or, where no engine runs it,
through im2col on that copy, then cropped to the input and written into ``gw_out``. The gradients must be the
NumPy path's. tests/ops/test_cuda_ops.py runs the real graphs on a GPU."""

import numpy as np
import pytest

from op_cases import CONV_CASES
from spmdcnn import backend
from spmdcnn.ops import conv
from spmdcnn.ops.cuda import conv as cudnn


class _Graph:
    """A cuDNN graph of ``kind`` computed by ops/conv's im2col on the padded input, with cuDNN's padding."""

    def __init__(self, kind, out_type, padding, stride, dilation):
        self.kind, self.out_dtype = kind, np.dtype(out_type)
        self.geometry = conv.ConvGeometry(stride, padding, dilation, rank=len(stride))

    def __call__(self, out, x=None, w=None, gy=None):
        if self.kind == "fprop":
            out[...] = conv._columns_forward(x, w, None, self.geometry, out.shape[2:])
        elif self.kind == "wgrad":
            out[...] = conv._columns_backward(gy, x, np.zeros(out.shape), False, self.geometry, False, None)[1]
        else:
            out[...] = conv._columns_backward(gy, np.zeros(out.shape), w, False, self.geometry, True, None)[0]
        return True


def _stand_in_for_cudnn(monkeypatch, backward_runs):
    """NumPy arrays take the cuDNN path; its backward graphs exist only when ``backward_runs``."""
    def graph(kind, io_type, out_type, x_shape, w_shape, y_shape, padding, stride, dilation, layout, quiet=False):
        if layout != "nchw" or (kind != "fprop" and not backward_runs):
            return None
        return _Graph(kind, out_type, padding, stride, dilation)
    monkeypatch.setattr(backend, "on_device", lambda x: True)
    monkeypatch.setattr(cudnn, "available", lambda: True)
    monkeypatch.setattr(cudnn, "aligned_contiguous", np.ascontiguousarray)
    monkeypatch.setattr(cudnn, "_graph", graph)
    monkeypatch.setattr(cudnn, "_empty", lambda shape, dtype, layout: np.empty(shape, dtype))
    monkeypatch.setattr(cudnn, "_to", lambda array, layout: array)
    monkeypatch.setattr(cudnn, "_back", lambda array, layout: array)
    monkeypatch.setattr(cudnn, "paths", cudnn.paths.copy())


@pytest.mark.parametrize("need_input_grad", [True, False])
@pytest.mark.parametrize("backward_runs", [True, False], ids=["cudnn_backward", "im2col_backward"])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_the_cudnn_path_gives_the_numpy_paths_gradients(monkeypatch, case, backward_runs, need_input_grad):
    x_shape, w_shape, stride, padding, dilation, bias = CONV_CASES[case]
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    b = rng.standard_normal(w_shape[0]) if bias else None
    geometry = conv.ConvGeometry(stride, padding, dilation, rank=len(x_shape) - 2)
    y, saved = conv.conv_forward(x, w, b, geometry, need_input_grad)
    gy = rng.standard_normal(y.shape)
    gx, gw, gb = conv.conv_backward(gy, saved)

    _stand_in_for_cudnn(monkeypatch, backward_runs)
    y2, saved2 = conv.conv_forward(x, w, b, geometry, need_input_grad)
    assert saved2.kind == "cudnn" and saved2.x_shape == x_shape
    gw_out = np.full(w_shape[::-1], np.nan).T               # not contiguous: the gradient is copied into it
    gx2, gw2, gb2 = conv.conv_backward(gy, saved2, gw_out=gw_out)
    assert gw2 is gw_out
    assert cudnn.paths["backward", "im2col"] == (0 if backward_runs else 1)
    np.testing.assert_allclose(y2, y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gw2, gw, rtol=1e-12, atol=1e-12)
    if bias:
        np.testing.assert_allclose(gb2, gb, rtol=1e-12, atol=1e-12)
    else:
        assert gb2 is None
    if need_input_grad:
        assert gx2.shape == x_shape and gx2.flags.c_contiguous
        np.testing.assert_allclose(gx2, gx, rtol=1e-12, atol=1e-12)
    else:
        assert gx2 is None
