"""What Jia et al. (ICML 2018, "Exploring Hidden Dimensions in Parallelizing Convolutional Neural Networks", PMLR
v80) report, as numbers: section 6 on 1-16 P100 GPUs (4 nodes of 4, NVLink within a node, 100 Gb/s EDR InfiniBand
between nodes), 32 images per GPU.

Figures 7 and 8 are bar charts; their values here are the bar heights of the vector figures embedded in the
camera-ready PDF (``./figures/training_throughput.pdf`` and ``./figures/communication_overhead.pdf``, page 8),
converted with the axes' tick positions: every Figure 7 bar comes out a whole number of images/s to four decimals,
and the text's figures follow from them (layer-wise over the best other strategy at 16 GPUs: 9045 / 4260 = 2.12x,
2715 / 1990 = 1.36x, 2430 / 1745 = 1.39x; layer-wise scaling 12.1x, 14.8x, 15.5x). Table 3 and Table 5 are the
paper's tables. The copy read: github.com/DicardoX/Notes_for_Papers at f23739b, "Graph Optimization/OptCNN/
OptCNN.pdf" (the PMLR camera-ready, created 2018-06-08).
"""

DEVICES = (1, 2, 4, 8, 16)
MODELS = ("alexnet", "vgg16", "inception_v3")
STRATEGIES = ("data", "model", "owt", "optimal")       # "optimal": the paper's layer-wise parallelism

# Figure 7: training throughput, images/s, at 1, 2, 4, 8, 16 GPUs
THROUGHPUT = {
    "alexnet": {"data": (745, 1181, 1760, 2484, 3230), "model": (745, 1303, 1824, 2460, 3303),
                "owt": (745, 1400, 2029, 3043, 4260), "optimal": (745, 1492, 2741, 4934, 9045)},
    "vgg16": {"data": (184, 343, 632, 1080, 1660), "model": (184, 313, 502, 778, 1048),
              "owt": (184, 360, 700, 1216, 1990), "optimal": (184, 364, 727, 1417, 2715)},
    "inception_v3": {"data": (157, 305, 503, 966, 1690), "model": (157, 220, 264, 224, 160),
                     "owt": (157, 310, 522, 992, 1745), "optimal": (157, 316, 632, 1248, 2430)},
}

# Figure 8: total data transferred per step, GiB (the axis says GB; one GPU's bar is exactly one input batch in
# GiB: 32 x 3 x 224^2 x 4 B = 0.0179, 32 x 3 x 299^2 x 4 B = 0.0320), at 1, 2, 4, 8, 16 GPUs. Data parallelism's
# is 2 x its parameters x the GPUs: every replica's gradients pushed and parameters pulled.
TRANSFERRED_GIB = {
    "alexnet": {"data": (.0179, 1.1134, 2.2269, 4.4538, 8.9076), "model": (.0179, .2826, .5653, 1.1305, 2.2610),
                "owt": (.0179, .0487, .1214, .3385, 1.0599), "optimal": (.0179, .0487, .0975, .1950, .3900)},
    "vgg16": {"data": (.0179, 2.0564, 4.1127, 8.2254, 16.4509), "model": (.0179, 3.6033, 7.2065, 14.4130, 28.8261),
              "owt": (.0179, .2389, .5412, 1.3363, 3.6883), "optimal": (.0179, .2076, .3356, .6868, 1.6275)},
    "inception_v3": {"data": (.0320, .3546, .7093, 1.4185, 2.8371),
                     "model": (.0320, 3.4458, 6.8916, 13.7831, 27.5662),
                     "owt": (.0320, .3261, .6560, 1.3277, 2.7179), "optimal": (.0320, .2814, .5628, 1.1256, 2.2511)},
}

# Table 3: time to find the optimal strategy on 4 GPUs, seconds (Algorithm 1; the depth-first baseline took 2.1 h
# for AlexNet and more than 24 h for VGG-16 and Inception-v3)
SEARCH_S = {"alexnet": 0.02, "vgg16": 0.1, "inception_v3": 0.4}

# Table 5: the VGG-16 strategy found for 4 GPUs of one node
VGG16_4 = (("conv blocks 1-4 (convolutions and pooling)", "{n: 4}"), ("conv block 5 (convolutions and pooling)",
           "{h: 2, w: 2}"), ("fc6, fc7", "{c: 4}"), ("fc8", "{c: 2}"), ("softmax", "{n: 1} (one GPU)"))


def single(model):
    return THROUGHPUT[model]["data"][0]


def over_best(model, devices=16):
    """Layer-wise over the best other strategy at ``devices`` GPUs, from Figure 7."""
    i = DEVICES.index(devices)
    cells = THROUGHPUT[model]
    return cells["optimal"][i] / max(cells[s][i] for s in ("data", "model", "owt"))


def scaling(model, devices=16):
    """Layer-wise at ``devices`` GPUs over one GPU, from Figure 7."""
    cells = THROUGHPUT[model]["optimal"]
    return cells[DEVICES.index(devices)] / cells[0]
