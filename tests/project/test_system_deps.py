"""scripts/system_deps.sh: as another user than root it says what to install, failing only for a
needed package (chromium and flac are optional: a note, and `make` goes on); as root it installs
what is missing and goes on where an optional package cannot be installed. Run against stand-in
commands on a PATH of their own: nothing is installed."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "system_deps.sh"


def _bin(tmp_path: Path, present: set[str], uid: int) -> Path:
    """A directory of stand-ins: the commands in `present`, `id`, `ldconfig` (listing libespeak-ng
    when "libespeak-ng1" is present) and an `apt-get` that logs its arguments (and fails for chromium)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("grep", "cat"):
        os.symlink(shutil.which(tool), bin_dir / tool)

    def stub(name: str, body: str) -> None:
        (bin_dir / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (bin_dir / name).chmod(0o755)

    for name in present - {"libespeak-ng1"}:
        stub(name, "exit 0")
    stub("id", f"echo {uid}")
    stub("ldconfig", "echo '	libespeak-ng.so.1 (libc6,x86-64) => /x'" if "libespeak-ng1" in present else "exit 0")
    stub("apt-get", f'echo "$@" >> {tmp_path / "apt.log"}; case "$*" in *chromium*) exit 100;; esac')
    return bin_dir


def _run(tmp_path: Path, present: set[str], uid: int) -> subprocess.CompletedProcess:
    env = {"PATH": str(_bin(tmp_path, present, uid)), "HOME": str(tmp_path)}
    return subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


NEEDED = {"espeak-ng", "libespeak-ng1", "flite", "ip", "tc"}


def test_a_user_without_the_optional_packages_is_told_and_goes_on(tmp_path: Path):
    done = _run(tmp_path, NEEDED, uid=1000)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    note = "asrdist: note: optional Debian package missing: "
    assert len(lines) == 2 and all(line.startswith(note) for line in lines)
    assert "chromium: the test that renders the comparison report in a browser is skipped" in lines[1]
    assert "sudo apt-get install chromium" in lines[1] and "sudo apt-get install flac" in lines[0]
    assert not (tmp_path / "apt.log").exists()


def test_a_user_without_a_needed_package_is_told_and_stopped(tmp_path: Path):
    done = _run(tmp_path, NEEDED - {"flite"} | {"chromium", "flac"}, uid=1000)
    assert done.returncode == 1
    assert done.stderr.strip() == ("asrdist: missing Debian packages: flite; install them with: "
                                   "sudo apt-get install flite")


def test_nothing_missing_says_nothing(tmp_path: Path):
    done = _run(tmp_path, NEEDED | {"chromium", "flac"}, uid=1000)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize("present", [NEEDED, NEEDED - {"ip"}])
def test_root_installs_and_goes_on_when_an_optional_package_cannot_be(tmp_path: Path, present: set[str]):
    done = _run(tmp_path, present, uid=0)
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "apt.log").read_text().splitlines()
    assert calls[0] == "update -qq"
    assert ("install -y -qq iproute2" in calls) == ("ip" not in present)
    assert "install -y -qq flac" in calls and "install -y -qq chromium" in calls
    assert "could not install chromium; the test that renders the comparison report in a browser is skipped" \
        in done.stderr
