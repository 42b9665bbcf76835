"""Running a snippet as a machine without a C++ compiler would: `CXX` pointing at a missing file and
a fresh, empty extensions directory, so no cached build can hide the fallback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_without_compiler(tmp_path: Path, script: str) -> tuple[Path, list[str]]:
    """(the missing compiler's path, the snippet's stdout lines); the snippet must exit 0."""
    missing = tmp_path / "no-such-compiler" / "c++"
    env = {**os.environ, "CXX": str(missing), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "ext").exists() or not any((tmp_path / "ext").rglob("*.so"))
    return missing, proc.stdout.splitlines()
