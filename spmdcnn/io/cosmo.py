"""Universes to learn from: Gaussian random fields whose power spectra depend on four parameters, a stand-in for
CosmoFlow's simulated universes that any machine can make in seconds (``spmdcnn data cosmo``).

Each sample is one universe on a periodic ``size``^3 grid: white noise drawn from a generator keyed by (seed,
sample), shaped in Fourier space by the power spectrum

    P(k) = (k / k_nyquist)^n * exp(-(k / (k_c * k_nyquist))^2),       normalised to a variance of A^2,

and seen at four times, its four channels, as CosmoFlow's four channels are four redshift snapshots of one
simulation: channel ``j`` is the field grown by ``D_j = a_j^g``, ``a_j = (j + 1) / 4`` (linear growth, the same
phases at every time). The four parameters, the sample's targets, are drawn uniformly from their ranges
(:data:`PARAMETERS`): the amplitude ``A`` (the field's standard deviation today), the spectral index ``n`` (how
power is spread over scales), the cutoff ``k_c`` (the smallest structures, a fraction of the Nyquist frequency)
and the growth index ``g`` (how fast structure grew between the snapshots). Each target is mapped linearly from its
range to [-1, 1], as CosmoFlow normalises its cosmological parameters.

The amplitude shows in every channel's variance, the spectral index and cutoff in how that variance is spread over
scales, the growth index in the ratios between channels: a 3D CNN learns all four, a constant guess learns none
(its mean absolute error is 0.5 for uniform targets in [-1, 1]).
"""

import numpy as np

from .dataset import write_blocks

# name, low, high: the uniform range each parameter is drawn from
PARAMETERS = (("amplitude", 0.5, 1.5), ("spectral_index", -3.0, -1.0), ("cutoff", 0.15, 0.5),
              ("growth_index", 0.5, 2.0))
SNAPSHOTS = (0.25, 0.5, 0.75, 1.0)      # the scale factor of each channel
BLOCK = 64                              # universes made and written at a time
SAMPLES = 1024                          # training universes unless told (data cosmo --samples, data.num_samples)


def held_out(samples):
    """How many universes are held out for ``samples`` training ones unless told: a quarter of them."""
    return max(1, samples // 4)


def _wavenumbers(size):
    """``|k|`` over the grid of a real FFT of ``size``^3 (the last axis halved), in units of the Nyquist
    frequency, and the weight of each entry in the full spectrum (1 or 2: the halved axis's mirrored entries)."""
    full = np.fft.fftfreq(size) * 2
    half = np.fft.rfftfreq(size) * 2
    k = np.sqrt(full[:, None, None] ** 2 + full[None, :, None] ** 2 + half[None, None, :] ** 2)
    weight = np.full(half.shape, 2.0)
    weight[0] = 1.0
    if size % 2 == 0:
        weight[-1] = 1.0                 # the Nyquist plane has no mirror
    return k, weight


def universe(size, parameters, rng, k=None):
    """The four channels (4, size, size, size) float32 of one universe of ``parameters`` (A, n, k_c, g), from
    ``rng``'s white noise."""
    amplitude, index, cutoff, growth = parameters
    if k is None:
        k = _wavenumbers(size)
    k, weight = k
    with np.errstate(divide="ignore"):
        shape = np.where(k > 0, k ** (index / 2) * np.exp(-0.5 * (k / cutoff) ** 2), 0.0)   # sqrt(P(k)); no mean
    expected = float((shape ** 2 * weight).sum()) / size ** 3          # the shaped field's variance (E over noise)
    noise = np.fft.rfftn(rng.standard_normal((size,) * 3))
    field = np.fft.irfftn(noise * shape, s=(size,) * 3, axes=(0, 1, 2)) * (amplitude / np.sqrt(expected))
    return np.stack([field * a ** growth for a in SNAPSHOTS]).astype(np.float32)


def normalised(values):
    """Parameters (rows of A, n, k_c, g) mapped linearly from their ranges to [-1, 1]."""
    low = np.array([lo for _, lo, _ in PARAMETERS])
    high = np.array([hi for _, _, hi in PARAMETERS])
    return (2 * (np.asarray(values) - low) / (high - low) - 1).astype(np.float32)


def draw(seed, first, count):
    """The parameters (count, 4) of universes ``first .. first + count - 1`` of ``seed``: a fixed function of
    (seed, index), so that the training and held-out universes never repeat one another."""
    rows = []
    for index in range(first, first + count):
        rng = np.random.default_rng([int(seed), 0xC05, index])
        rows.append([rng.uniform(lo, hi) for _, lo, hi in PARAMETERS])
    return np.array(rows).reshape(count, len(PARAMETERS))


def write_universes(path, size, first, count, seed, progress=None, statistics=None):
    """Write universes ``first .. first + count - 1`` of ``seed`` to ``path`` as a dataset of (4, size, size,
    size) float32 volumes with their normalised parameters as /targets, and the per-channel mean and std of its
    own volumes, or ``statistics`` (a held-out set takes the training set's); returns those. ``progress(n)`` is
    told the index just past the last universe made, block by block."""
    parameters = draw(seed, first, count)
    k = _wavenumbers(size)
    sums = np.zeros((2, len(SNAPSHOTS)))

    def blocks():
        for start in range(0, count, BLOCK):
            stop = min(count, start + BLOCK)
            block = np.stack([universe(size, parameters[i], np.random.default_rng([int(seed), 0x5EED, first + i]),
                                       k) for i in range(start, stop)])
            values = block.astype(np.float64).reshape(len(block), len(SNAPSHOTS), -1)
            sums[0] += values.sum(axis=(0, 2))
            sums[1] += (values ** 2).sum(axis=(0, 2))
            if progress is not None:
                progress(first + stop)      # universes made so far, counting from the training set's first
            yield block

    def own():
        n = count * size ** 3
        mean = sums[0] / n
        found[:] = mean, np.sqrt(np.maximum(sums[1] / n - mean ** 2, 1e-30))
        return found
    found = list(statistics) if statistics is not None else [None, None]
    description = (f"Gaussian random fields of {size}^3 (spmdcnn data cosmo, seed {seed}, universes {first} to "
                   f"{first + count - 1}): four snapshots of one universe each, targets the normalised "
                   f"{', '.join(name for name, _, _ in PARAMETERS)}")
    ranges = "; ".join(f"{name} [{lo}, {hi}]" for name, lo, hi in PARAMETERS)
    write_blocks(path, (len(SNAPSHOTS), size, size, size), np.float32, normalised(parameters), blocks(),
                 own if statistics is None else tuple(statistics), {"description": description,
                                                                    "parameter_ranges": ranges},
                 target_names=[name for name, _, _ in PARAMETERS])
    return tuple(found)


def make_cosmo(train_path, val_path, size=32, samples=SAMPLES, val_samples=None, seed=0, progress=None):
    """Write ``samples`` training universes to ``train_path`` and ``val_samples`` (a quarter of them by default)
    held-out ones to ``val_path``, normalised alike (the training set's mean and std); returns the two counts."""
    val_samples = held_out(samples) if val_samples is None else val_samples
    if size < 4 or samples < 1 or val_samples < 1:
        raise ValueError(f"cosmo: --size must be 4 or more and the sample counts positive, got size {size}, "
                         f"{samples} and {val_samples} samples")
    statistics = write_universes(train_path, size, 0, samples, seed, progress)
    write_universes(val_path, size, samples, val_samples, seed, progress, statistics)
    return samples, val_samples
