"""spmdcnn: layer-wise parallel training of convolutional networks on MPI ranks."""

__version__ = "0.1.0"
