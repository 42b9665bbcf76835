# Two entry points: `make demo` and `make test`. Both set themselves up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: demo test setup system-deps clean

setup: $(STAMP) system-deps

# pyproject.toml states ranges; constraints.txt pins today's exact versions, which the suite runs with
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first: the CPU build (pinned in constraints.txt) lies on local disk, a bare `torch` pulls CUDA.
	$(VENV)/bin/pip install -q -c constraints.txt torch
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[test]'
	touch $@

system-deps:
	@bash scripts/system_deps.sh

# `make demo REPEATS=K`: each strategy of the comparison K times, in interleaved rounds, with intervals
# (asrdist demo --repeats; its default: asrdist/demo_cli.py's DEMO_REPEATS)
demo: setup
	$(PY) -m asrdist.native
	$(VENV)/bin/asrdist demo $(if $(REPEATS),--repeats $(REPEATS))

# four test processes (pytest-xdist), a test file each at a time, the files in the order
# tests/conftest.py gives them (longest first; xdist's own order is most tests first): most tests
# start learner processes, whose CPU (above all each one's import of torch, about 1.5 s) fills the
# 2 cores, and wait on them (timeouts, emulated links); a fourth process fills the gaps the waits leave
# (2026-11-29, idle, steal under 1%: 705 s with three, 673 s with four, 1,189 CPU-seconds in all;
# a fresh clone of the session's last change: 652 s. The evening before, with the host taking up to
# 44% of the CPU, 17.5 min with three or four. 2026-12-03, idle: 679 s with four, 818 s with six;
# later that day 814-860 s, then 668 s once learners stopped importing torch._dynamo: optim/light.py)
# asrdist's bytecode is compiled once up front: PYTHONDONTWRITEBYTECODE (above, and in some
# environments) would otherwise make each of the suite's hundreds of learner processes compile it;
# the native kernels are built (or found in the cache) once, before the tests that use them start.
# pytest writes its rewritten test modules' bytecode only where bytecode may be written (so not under
# PYTHONDONTWRITEBYTECODE): the suite runs with it unset, and a collection beside the kernels' build
# writes that cache once, rather than every test process rewriting every test file's asserts
# (about 5 CPU-seconds each, 2026-12-03)
test: setup
	$(PY) -m compileall -q asrdist
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q --collect-only -p no:cacheprovider tests >/dev/null & \
	  $(PY) -m asrdist.native; built=$$?; wait $$!; exit $$built
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -x -n 4 --dist loadfile --no-loadscope-reorder --durations=30 -m "not install" tests

clean:
	rm -rf $(VENV) build *.egg-info
