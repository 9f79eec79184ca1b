"""Convolution and pooling cases shared by the gradient and PyTorch tests: every path, odd sizes, per-side
padding, over 1, 2 and 3 spatial axes (a case's rank is its input's: (N, C, S...))."""

# name: x shape, w shape, stride, padding, dilation, bias
CONV_CASES = {
    "pointwise": ((2, 3, 4, 5), (4, 3, 1, 1), 1, 0, 1, True),
    "pointwise_nobias": ((3, 2, 3, 3), (5, 2, 1, 1), 1, 0, 1, False),
    "stride1_3x3_pad1": ((2, 3, 5, 7), (4, 3, 3, 3), 1, 1, 1, True),
    "stride1_rect_pad_hw": ((2, 2, 6, 5), (3, 2, 2, 3), 1, [1, 2], 1, True),
    "stride1_dilated_per_side": ((2, 3, 7, 6), (2, 3, 3, 2), 1, [[2, 0], [1, 3]], [2, 3], True),
    "stride1_1x1_padded": ((1, 2, 3, 4), (3, 2, 1, 1), 1, 1, 1, False),
    "stride1_kernel_fills_input": ((2, 2, 4, 5), (3, 2, 4, 5), 1, 0, 1, True),
    "stride1_7x7_pad3": ((2, 3, 9, 11), (8, 3, 7, 7), 1, 3, 1, True),
    "strided_2_pad1_odd": ((2, 3, 7, 9), (4, 3, 3, 3), 2, 1, 1, True),
    "strided_rect": ((3, 2, 8, 11), (3, 2, 3, 2), [2, 3], [1, 0], 1, False),
    "strided_dilated_per_side": ((2, 3, 9, 10), (2, 3, 3, 3), [3, 2], [[1, 2], [0, 1]], [2, 3], True),
    "strided_only_w": ((2, 2, 5, 6), (2, 2, 3, 3), [1, 2], 1, 1, True),
    "strided_only_h_dilated": ((2, 2, 8, 5), (2, 2, 2, 3), [2, 1], [[0, 1], [2, 0]], [3, 1], False),
    "strided_1x1": ((2, 3, 5, 5), (2, 3, 1, 1), 2, 0, 1, True),
    "stride_beyond_kernel": ((1, 2, 7, 7), (2, 2, 2, 2), 3, 0, 1, True),
    "alexnet_conv1_like": ((2, 3, 23, 23), (4, 3, 11, 11), 4, 2, 1, True),
    # volumes (N, C, D, H, W)
    "volume_pointwise": ((2, 3, 3, 4, 5), (4, 3, 1, 1, 1), 1, 0, 1, True),
    "volume_3x3x3_pad1": ((2, 2, 5, 6, 7), (3, 2, 3, 3, 3), 1, 1, 1, True),
    "volume_even_kernel_same": ((2, 3, 5, 4, 7), (2, 3, 2, 2, 2), 1, [[0, 1], [0, 1], [0, 1]], 1, True),
    "volume_per_side_dilated": ((1, 2, 7, 6, 5), (2, 2, 3, 2, 2), 1, [[2, 0], [1, 1], [0, 3]], [2, 3, 1], False),
    "volume_strided_odd": ((2, 2, 7, 9, 5), (3, 2, 3, 3, 3), 2, 1, 1, True),
    "volume_strided_rect_dilated": ((1, 3, 9, 8, 10), (2, 3, 2, 3, 2), [3, 1, 2], [[1, 0], [2, 1], [0, 1]],
                                    [2, 1, 3], True),
    "volume_strided_1x1x1": ((2, 2, 5, 6, 7), (3, 2, 1, 1, 1), [2, 1, 3], 0, 1, True),
    "volume_kernel_fills_input": ((2, 2, 3, 4, 2), (2, 2, 3, 4, 2), 1, 0, 1, True),
    # sequences (N, C, W)
    "sequence_k3_pad1": ((2, 3, 11), (4, 3, 3), 1, 1, 1, True),
    "sequence_strided_dilated": ((3, 2, 13), (2, 2, 3), 2, [[2, 1]], 2, False),
}


# name: x shape, kernel, stride, padding
POOL_CASES = {
    "k2_default_stride": ((2, 3, 6, 8), 2, None, 0),
    "k3_s2_pad1_odd": ((2, 2, 7, 9), 3, 2, 1),
    "rect_pad_hw": ((1, 3, 7, 6), [3, 2], [2, 1], [1, 0]),
    "overlapping_s1": ((2, 2, 5, 5), 3, 1, 1),
    "per_side_padding": ((2, 2, 6, 7), [2, 3], [2, 2], [[1, 0], [0, 2]]),
    "stride_beyond_kernel": ((1, 2, 9, 8), 2, 3, 0),
    "floor_drops_last_rows": ((3, 2, 8, 10), 3, 2, 0),
    "kernel_16x16": ((1, 2, 17, 18), 16, 1, 0),
    "kernel_17x17_wide_index": ((1, 2, 18, 19), 17, 1, 0),
    "volume_k2": ((2, 3, 4, 6, 8), 2, None, 0),
    "volume_k3_s2_pad1_odd": ((2, 2, 7, 5, 9), 3, 2, 1),
    "volume_rect_per_side": ((1, 2, 6, 7, 5), [2, 3, 2], [1, 2, 2], [[1, 0], [0, 1], [1, 1]]),
    "volume_7x7x7_wide_index": ((1, 1, 8, 7, 9), 7, 1, 0),
    "sequence_k3_s2_pad1": ((2, 3, 11), 3, 2, 1),
}


# name: x shape, w shape (C_in, C_out, k...), stride, padding, output_padding, dilation, bias
TRANSPOSE_CASES = {
    "k3_s2_p1_op1_deepcam": ((2, 3, 5, 6), (3, 4, 3, 3), 2, 1, 1, 1, True),
    "k2_s2_unet": ((2, 4, 3, 5), (4, 2, 2, 2), 2, 0, 0, 1, True),
    "k3_s1_p1": ((1, 2, 4, 5), (2, 3, 3, 3), 1, 1, 0, 1, False),
    "k4_s2_p1": ((2, 2, 5, 4), (2, 3, 4, 4), 2, 1, 0, 1, True),
    "rect_per_axis": ((2, 3, 4, 5), (3, 2, 3, 2), [2, 3], [1, 0], [1, 2], 1, True),
    "dilated_op_below_dilation": ((1, 2, 5, 5), (2, 2, 3, 3), 1, 1, 1, 2, True),
    "strided_dilated": ((2, 2, 4, 3), (2, 3, 3, 2), [2, 3], [2, 1], [1, 0], [2, 3], False),
    "pointwise": ((2, 3, 4, 5), (3, 4, 1, 1), 1, 0, 0, 1, True),
    "k1_strided": ((2, 3, 4, 3), (3, 2, 1, 1), 2, 0, 1, 1, True),
    "padding_beyond_kernel": ((1, 2, 7, 6), (2, 2, 3, 3), 3, 2, 2, 1, True),
    "odd_one_pixel": ((2, 2, 1, 1), (2, 3, 3, 3), 2, 0, 1, 1, True),
    "volume_k2_s2_unet3d": ((1, 3, 3, 4, 2), (3, 2, 2, 2, 2), 2, 0, 0, 1, True),
    "volume_k3_s2_p1_op1": ((2, 2, 3, 2, 4), (2, 3, 3, 3, 3), 2, 1, 1, 1, False),
    "volume_rect": ((1, 2, 4, 3, 3), (2, 2, 2, 3, 1), [1, 2, 3], [0, 1, 0], [0, 1, 2], [2, 1, 1], True),
    "sequence_k5_s3_p2_op2": ((2, 3, 7), (3, 2, 5), 3, 2, 2, 1, True),
}

# grouped convolutions (N, C, S...), (K, C/groups, k...): stride, padding, dilation, bias, groups
GROUPED_CASES = {
    "depthwise_3x3": ((2, 4, 6, 7), (4, 1, 3, 3), 1, 1, 1, True, 4),
    "depthwise_x2_strided": ((2, 3, 7, 9), (6, 1, 3, 3), 2, 1, 1, False, 3),
    "grouped_pointwise": ((2, 4, 5, 5), (6, 2, 1, 1), 1, 0, 1, True, 2),
    "grouped_strided_1x1": ((2, 4, 5, 6), (4, 2, 1, 1), 2, 0, 1, True, 2),
    "grouped_dilated_per_side": ((2, 6, 8, 9), (6, 2, 3, 2), 1, [[2, 0], [1, 1]], [2, 1], True, 3),
    "grouped_strided_rect": ((3, 4, 8, 11), (8, 1, 3, 2), [2, 3], [1, 0], 1, False, 4),
    "volume_depthwise": ((2, 3, 5, 6, 4), (3, 1, 3, 3, 3), 1, 1, 1, True, 3),
    "volume_grouped_strided": ((2, 4, 7, 5, 6), (4, 2, 3, 3, 3), 2, 1, 1, False, 2),
    "sequence_grouped": ((3, 4, 11), (8, 2, 3), 2, 1, 1, True, 2),
}
