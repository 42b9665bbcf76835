"""`asrdist decode` of audio at another rate than the model's (issue 59 item 6): a higher rate is
resampled to the model's with the corpus' own resampler (`io.audio.resample`), a note once per
rate, and gives the features of the model-rate original; a lower rate lacks the band the model's
top mel filters read, which resampling cannot add, and is refused in one line naming the file."""
from __future__ import annotations

import numpy as np
import pytest

from asrdist.errors import DataError
from asrdist.features.fbank import compute_fbank
from asrdist.features.frontend import features_of, raw_features
from asrdist.io.audio import resample, write_wav

FRONT = {"sample_rate": 16000, "num_mel_bins": 40, "cmvn": "none"}


def _speechlike(rate: int = 16000, seconds: float = 1.0) -> np.ndarray:
    """Amplitude-modulated partials up to 6.9 kHz over noise: energy in every mel band of 16 kHz."""
    rng = np.random.default_rng(0)
    t = np.arange(int(rate * seconds)) / rate
    x = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) * (1 + np.sin(2 * np.pi * 3 * t))
            for f in (150, 700, 1800, 3300, 5200, 6900))
    x = x + 0.3 * rng.normal(size=len(t))
    return (x / np.abs(x).max() * 12000).astype(np.int16)


@pytest.mark.parametrize("rate", [22050, 44100])
def test_higher_rates_are_resampled_to_the_models_with_one_note_per_rate(tmp_path, capsys, rate):
    original = _speechlike()
    write_wav(tmp_path / "a16.wav", original, 16000)
    for name in ("a.wav", "b.wav"):
        write_wav(tmp_path / name, resample(original, 16000, rate), rate)
    base = raw_features(tmp_path / "a16.wav", FRONT)
    np.testing.assert_array_equal(base, compute_fbank(original, 16000, 40))
    noted: set[int] = set()
    capsys.readouterr()
    for name in ("a.wav", "b.wav"):
        feats = raw_features(tmp_path / name, FRONT, noted=noted)
        assert feats.shape == base.shape
        diff = np.abs(feats - base)
        # the same features, but for the top filter's edge at 8 kHz, where the resampler rolls off
        assert diff.mean() < 0.05 and diff[:, :-1].max() < 0.3, (diff.mean(), diff.max(0))
    err = capsys.readouterr().err.splitlines()
    assert err == [f"[asrdist] note: {tmp_path / 'a.wav'}: resampled from {rate} Hz to the model's 16000 Hz, the "
                   f"rate its features were trained at (noted once per rate)"], err
    assert noted == {rate}
    raw_features(tmp_path / "a16.wav", FRONT, noted=noted)  # the model's own rate: nothing to say
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("rate", [8000, 11025])
def test_a_lower_rate_is_refused_in_one_line(tmp_path, capsys, rate):
    """On the old code an 8 kHz file on a 16 kHz model decoded silently, to other phones: the
    top mel filters read the 4-8 kHz band the file does not hold."""
    path = tmp_path / "low.wav"
    write_wav(path, resample(_speechlike(), 16000, rate), rate)
    for read in (raw_features, features_of):
        with pytest.raises(DataError) as told:
            read(path, FRONT, noted=set())
        line = str(told.value)
        assert "\n" not in line and line.startswith(f"{path}: sample rate {rate} Hz, below the model's 16000 Hz"), line
        assert f"this audio holds nothing above {rate // 2} Hz" in line
    assert capsys.readouterr().err == ""  # no note for a file refused
