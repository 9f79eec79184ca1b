"""Networks of MONAI and segmentation-models-pytorch as ``spmdcnn model import`` writes them, small enough for the
MPI suite: their model files are in tests/mpi/imported/ (the ranks train them under random plans without importing
the libraries); tests/graph/test_torchimport.py checks each file is what the importer writes today and that the
network takes one SGD step as the import does."""

import os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi", "imported")

# name -> (library, the constructor call, the input (C, S...))
NETWORKS = {
    "monai_unet": ("monai", "monai.networks.nets.UNet(3, 1, 3, (4, 6, 8), (2, 2), num_res_units=1)", (1, 8, 8, 8)),
    # group norm of one group: its deepest level is 1x1x1 at 16^3, where instance norm has one value per channel
    "monai_basicunet": ("monai", "monai.networks.nets.BasicUNet(3, 1, 2, features=(2, 2, 3, 3, 4, 2), "
                                 "norm=('group', {'num_groups': 1}))", (1, 16, 16, 16)),
    "monai_segresnet": ("monai", "monai.networks.nets.SegResNet(3, init_filters=4, in_channels=1, out_channels=2, "
                                 "norm=('group', {'num_groups': 2}), blocks_down=(1, 2), blocks_up=(1,))",
                        (1, 8, 8, 8)),
    "monai_dynunet": ("monai", "monai.networks.nets.DynUNet(3, 1, 2, kernel_size=(3, 3, 3), strides=(1, 2, 2), "
                               "upsample_kernel_size=(2, 2), filters=(4, 6, 8))", (1, 8, 8, 8)),
    "monai_densenet": ("monai", "monai.networks.nets.DenseNet(3, 1, 3, init_features=4, growth_rate=2, "
                                "block_config=(2, 2), bn_size=2)", (1, 8, 8, 8)),
    "monai_resnet": ("monai", "monai.networks.nets.ResNet('basic', (1, 1, 1, 1), (4, 4, 6, 6), spatial_dims=3, "
                              "n_input_channels=1, num_classes=3)", (1, 8, 8, 8)),
    "smp_unet": ("segmentation_models_pytorch", "segmentation_models_pytorch.Unet('resnet18', encoder_weights=None, "
                                                "encoder_depth=2, decoder_channels=(4, 3), classes=2)", (3, 8, 8)),
}


def path(name):
    return os.path.join(HERE, f"{name}.yaml")


def build(name):
    """The network ``name`` (random weights, its library's own)."""
    import importlib

    import torch
    library, call, _ = NETWORKS[name]
    torch.manual_seed(0)
    return eval(call, {library: importlib.import_module(library)})      # noqa: S307 (our own table)
