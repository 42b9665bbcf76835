# Two entry points: `make demo` and `make test`. Both set themselves up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: demo test setup system-deps clean

setup: $(STAMP) system-deps

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first and by exact version: the CPU build lies on local disk, a bare `torch` pulls CUDA.
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

system-deps:
	@bash scripts/system_deps.sh

demo: setup
	$(PY) -m asrdist.native
	$(VENV)/bin/asrdist demo

# three test processes (pytest-xdist), a test file each at a time: most tests start learner
# processes and wait on them (timeouts, emulated links), so a third fills the 2 cores' idle gaps
# (measured one evening: 11 min 22 s with two for 719 tests; 10 min 20 s with three, after two trims)
# (2026-11-29, fresh clones, idle: 17 min 46 s with four for 1677 tests, every core busy throughout;
# 17 min 32 s with three for 1679 an hour later: the suite is bound by its CPU, not by its waits)
# asrdist's bytecode is compiled once up front: PYTHONDONTWRITEBYTECODE (above, and in some
# environments) would otherwise make each of the suite's hundreds of learner processes compile it;
# the native kernels are built (or found in the cache) once, before the tests that use them start
test: setup
	$(PY) -m compileall -q asrdist
	$(PY) -m asrdist.native
	$(PY) -m pytest -q -x -n 3 --dist loadfile --durations=30 tests

clean:
	rm -rf $(VENV) build *.egg-info
