"""`--device` of `asrdist eval`, `decode` and `align`: where the model computes (the GPU where torch
sees one, by default), checked when the command line is read, so a device this torch cannot use is
one line naming the flag before anything is read or written. The figures on a GPU against the CPU's:
tests/train/test_cuda.py."""
from __future__ import annotations

import pytest
import torch

from asrdist.checks import cli_device, compute_device
from asrdist.cli import main
from asrdist.errors import ConfigError
from asrdist.eval.evaluate import model_device, on_model_device

NO_CUDA = not torch.cuda.is_available()


def test_the_default_is_the_gpu_where_torch_sees_one_else_the_cpu():
    assert compute_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert compute_device("cpu") == cli_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name, why", [
    ("tpu0", "expected cpu, cuda or cuda:N, got 'tpu0'"),
    ("meta", "expected cpu, cuda or cuda:N, got 'meta'"),
    ("", "expected cpu, cuda or cuda:N, got ''"),
    pytest.param("cuda", "'cuda': this torch (", marks=pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is here")),
    ("cuda:4096", "'cuda:4096': this "),  # no CUDA, or too few devices
])
def test_a_device_this_torch_cannot_use_is_refused_naming_the_option(name, why):
    with pytest.raises(ConfigError) as refused:
        compute_device(name, "--device")
    assert str(refused.value).startswith(f"--device: {why}")


@pytest.mark.parametrize("argv", [
    ["eval", "RUN", "--data", "DATA", "--out", "out.json"],
    ["decode", "RUN", "a.wav", "--out", "out.txt"],
    ["align", "RUN", "--data", "DATA"],
])
@pytest.mark.parametrize("device", ["tpu0", pytest.param("cuda", marks=pytest.mark.skipif(
    not NO_CUDA, reason="a CUDA device is here"))])
def test_a_bad_device_is_one_usage_line_and_nothing_written(argv, device, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "RUN").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--device", device])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and err.startswith(f"asrdist: error: {argv[0]}: argument --device: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RUN"] and not any((tmp_path / "RUN").iterdir())


class _PriorsOnly(torch.nn.Module):
    """A model of buffers alone, as the demo's prior-only baseline."""

    kind = "frame"

    def __init__(self):
        super().__init__()
        self.register_buffer("log_priors", torch.zeros(3))


def test_a_model_computes_where_its_parameters_or_buffers_are():
    for model in (torch.nn.Linear(2, 3), _PriorsOnly(), torch.nn.Identity()):
        assert model_device(model) == torch.device("cpu")
        assert on_model_device(model, torch.ones(2)).device == torch.device("cpu")
    with torch.device("meta"):
        on_meta = (torch.nn.Linear(2, 3), _PriorsOnly())
    for model in on_meta:
        assert model_device(model).type == "meta" and on_model_device(model, torch.ones(2)).device.type == "meta"
