"""``spmdcnn data cosmo``: universes whose power spectra depend on four parameters, a regression a 3D CNN can learn
(io/cosmo.py)."""

import h5py
import numpy as np
import pytest

from spmdcnn.cli import main
from spmdcnn.io.cosmo import PARAMETERS, SNAPSHOTS, draw, make_cosmo, normalised, universe
from spmdcnn.io.dataset import HDF5Dataset


def test_a_universe_has_the_amplitude_and_the_growth_of_its_parameters():
    size = 32
    for amplitude, growth in ((0.5, 0.5), (1.5, 2.0)):
        fields = universe(size, (amplitude, -2.0, 0.3, growth), np.random.default_rng(4))
        assert fields.shape == (4, size, size, size) and fields.dtype == np.float32
        stds = fields.std(axis=(1, 2, 3))
        # one realisation: its variance lies near the spectrum's (the large scales vary most from one to another)
        assert 0.6 * amplitude < stds[-1] < 1.4 * amplitude
        # the four snapshots are one field grown by a^g: exactly, whatever the realisation
        np.testing.assert_allclose(stds / stds[-1], np.array(SNAPSHOTS) ** growth, rtol=1e-5)
        assert abs(float(fields.mean())) < 1e-6      # no mean: k = 0 carries no power


def test_the_spectral_index_and_the_cutoff_move_power_between_scales():
    def small_scale_share(index, cutoff):
        field = universe(32, (1.0, index, cutoff, 1.0), np.random.default_rng(1))[-1]
        power = np.abs(np.fft.rfftn(field)) ** 2
        k = np.sqrt(np.add.outer(np.add.outer(np.fft.fftfreq(32) ** 2, np.fft.fftfreq(32) ** 2),
                                 np.fft.rfftfreq(32) ** 2)) * 2
        return power[k > 0.3].sum() / power.sum()
    assert small_scale_share(-1.0, 0.5) > 2 * small_scale_share(-3.0, 0.5)
    assert small_scale_share(-2.0, 0.5) > 2 * small_scale_share(-2.0, 0.15)


def test_targets_are_the_parameters_mapped_to_minus_one_one():
    low = [lo for _, lo, _ in PARAMETERS]
    high = [hi for _, _, hi in PARAMETERS]
    np.testing.assert_allclose(normalised([low, high]), [[-1] * 4, [1] * 4])
    drawn = draw(7, 0, 500)
    assert np.all((drawn >= low) & (drawn <= high))
    np.testing.assert_array_equal(draw(7, 100, 3), drawn[100:103])     # a fixed function of (seed, index)


def test_make_cosmo_writes_train_and_held_out_universes_normalised_alike(tmp_path):
    train, val = tmp_path / "train.h5", tmp_path / "val.h5"
    assert make_cosmo(train, val, size=8, samples=20, val_samples=6, seed=3) == (20, 6)
    with h5py.File(train) as t, h5py.File(val) as v:
        assert t["images"].shape == (20, 4, 8, 8, 8) and v["images"].shape == (6, 4, 8, 8, 8)
        assert t["targets"].shape == (20, 4) and list(t["targets"].attrs["names"]) == [p for p, _, _ in PARAMETERS]
        np.testing.assert_array_equal(t["images"].attrs["std"], v["images"].attrs["std"])
        np.testing.assert_allclose(t["targets"][()], normalised(draw(3, 0, 20)), rtol=1e-6)
        np.testing.assert_allclose(v["targets"][()], normalised(draw(3, 20, 6)), rtol=1e-6)
        again = tmp_path / "again.h5"
        make_cosmo(again, tmp_path / "again-val.h5", size=8, samples=20, val_samples=6, seed=3)
        with h5py.File(again) as a:
            np.testing.assert_array_equal(a["images"][()], t["images"][()])
    data = HDF5Dataset(train)
    assert data.answers == "targets" and data.num_targets == 4
    data.close()


def test_the_data_cosmo_command(tmp_path, capsys):
    assert main(["data", "cosmo", "-o", str(tmp_path / "c"), "--size", "8", "--samples", "12"]) == 0
    out = capsys.readouterr().out
    assert "train.h5 (12 universes of 4x8^3)" in out and "(3 held out)" in out
    assert main(["data", "info", str(tmp_path / "c" / "train.h5")]) == 0
    out = capsys.readouterr().out
    assert "12 samples of 4x8x8x8 (C x D x H x W) float32, 4 targets per sample" in out
    assert "amplitude: " in out and "growth_index: " in out


@pytest.mark.parametrize("args", [["--size", "2"], ["--samples", "0"]])
def test_bad_cosmo_settings_say_what_is_wrong(tmp_path, capsys, args):
    assert main(["data", "cosmo", "-o", str(tmp_path / "c"), *args]) == 2
    assert "cosmo: --size must be 4 or more and the sample counts positive" in capsys.readouterr().err
