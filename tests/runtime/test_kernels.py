from spmdcnn.graph.opspec import KEYS
from spmdcnn.runtime import kernels


def test_every_model_op_has_a_forward_and_a_backward():
    assert set(kernels.FORWARD) == set(KEYS) == set(kernels.BACKWARD)
