"""MONAI's 3D U-Net, as a MONAI user builds it, for ``spmdcnn model import`` (README.md, "Bring your own network"):

    spmdcnn model import examples/monai_unet3d.py:unet --input 1 32 32 32 --check -o out/monai_unet3d.yaml
"""


def unet(classes=4):
    """Residual units of two convolutions each, instance norm and PReLU, strided convolutions down and transposed
    ones up (MONAI's ``UNet``): four classes, the background and the discs, boxes and rings of ``spmdcnn data
    shapes``."""
    from monai.networks.nets import UNet
    return UNet(spatial_dims=3, in_channels=1, out_channels=classes, channels=(8, 16, 32, 64), strides=(2, 2, 2),
                num_res_units=2)
