# hvd_easgd: the README's two commands are `make demo` and `make test`.
# Both install whatever is missing first (apt packages, .venv, the Horovod
# build, cached under ~/.cache/hvd_easgd so a clean clone reuses it).

VENV    ?= .venv
PY      := $(VENV)/bin/python
PYTEST  := $(PY) -m pytest
STAMP   := $(VENV)/.hvd_easgd-ready
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup demo test test-unit test-multiproc test-slurm test-multinode bench bench-quick clean

# Re-runs the (idempotent, fast when done) set-up script whenever the pins
# or the script change; otherwise does nothing.
$(STAMP): requirements.txt tools/setup_env.sh setup.py
	bash tools/setup_env.sh
	touch $@

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/horovodrun -np 2 $(PY) train.py

test: $(STAMP)
	$(PYTEST) -m "unit or multiproc or slurm or multinode" tests

test-unit: $(STAMP)
	$(PYTEST) -m unit tests

test-multiproc: $(STAMP)
	$(PYTEST) -m multiproc tests

test-slurm: $(STAMP)
	$(PYTEST) -m slurm tests

test-multinode: $(STAMP)
	$(PYTEST) -m multinode tests

bench: $(STAMP)
	$(PY) -m benchmarks.compare

bench-quick: $(STAMP)
	$(PY) -m benchmarks.compare --quick

clean:
	rm -rf runs .pytest_cache
