"""`python -m asrdist.native`: build (or find in the cache) every kernel in this package, one line
each. `make test` and `make demo` run it first, so no test or learner pays a first build."""
from __future__ import annotations

import sys
import time

from asrdist.native import SOURCE_DIR, NativeBuildError, load


def main() -> int:
    for source in sorted(SOURCE_DIR.glob("*.cpp")):
        start = time.perf_counter()
        try:
            load(source.stem)
            print(f"asrdist.native: {source.stem} ready ({time.perf_counter() - start:.1f} s)")
        except NativeBuildError as e:  # callers fall back to torch; say why once
            print(f"asrdist.native: {source.stem} unavailable, falling back to torch: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
