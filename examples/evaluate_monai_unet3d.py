"""The U-Net spmdcnn trained, back in MONAI: its checkpoint exported as a state dict loads into MONAI's ``UNet``
(examples/monai_unet3d.py), which scores the held-out shapes as spmdcnn's evaluation does (README.md, "Bring your
own network"): the labelled voxels predicted right, and the mean IoU and Dice over the classes.

    spmdcnn checkpoint export ckpt/monai_unet3d.h5 --torch monai_unet3d.pt
    python examples/evaluate_monai_unet3d.py monai_unet3d.pt data/shapes3d/val.h5
"""

import argparse

import h5py
import numpy as np
import torch

from monai_unet3d import unet


def scores(net, images, labels, batch=8):
    """``(voxel accuracy, mean IoU, mean Dice)`` of ``net`` over ``images`` (N, C, D, H, W) float32 and their
    ``labels`` (N, D, H, W), summed over the set per class, averaged over the classes that occur."""
    classes = None
    with torch.no_grad():
        for start in range(0, len(images), batch):
            logits = net(torch.from_numpy(images[start:start + batch]))
            predicted, answer = logits.argmax(1).numpy(), labels[start:start + batch]
            if classes is None:
                classes = np.zeros((3, logits.shape[1]))
            for k in range(classes.shape[1]):
                classes[:, k] += (((predicted == k) & (answer == k)).sum(), (predicted == k).sum(), (answer == k).sum())
    right, predicted, labelled = classes
    occur = (predicted + labelled) > 0
    iou = right[occur] / (predicted + labelled - right)[occur]
    dice = 2 * right[occur] / (predicted + labelled)[occur]
    return right.sum() / labelled.sum(), iou.mean(), dice.mean()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("state", help="the state dict spmdcnn checkpoint export --torch wrote")
    parser.add_argument("val", help="the held-out set (spmdcnn data shapes --volumes)")
    args = parser.parse_args()
    net = unet()
    net.load_state_dict(torch.load(args.state, weights_only=True))
    net.eval()
    with h5py.File(args.val) as file:
        images, labels = file["images"][:].astype(np.float32), file["labels"][:]
        if file["images"].dtype == np.uint8:            # the dataset files' rule: /255, then mean and std
            images /= 255
        for key, apply in (("mean", np.subtract), ("std", np.divide)):
            if key in file["images"].attrs:
                apply(images, np.asarray(file["images"].attrs[key], np.float32).reshape(1, -1, 1, 1, 1), out=images)
    accuracy, iou, dice = scores(net, images, labels)
    print(f"MONAI's UNet with spmdcnn's weights: voxel acc {accuracy:.4f}  mIoU {iou:.4f}  Dice {dice:.4f} "
          f"({len(images)} held-out volumes)")


if __name__ == "__main__":
    main()
