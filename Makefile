# hvd_easgd: the README's two commands are `make demo` and `make test`.
# Both install whatever is missing first (apt packages, .venv, the Horovod
# build and the mpi-direct TF ops, cached under ~/.cache/hvd_easgd so a clean
# clone reuses them).

VENV    ?= .venv
PY      := $(VENV)/bin/python
PYTEST  := $(PY) -m pytest
STAMP   := $(VENV)/.hvd_easgd-ready
# The mpi-direct ops (--collectives mpi-direct), named by their source: a
# changed source builds again; the build itself skips a library already cached
# for this TF, MPI, Python and source.
MPI_OPS := hvd_easgd/comm/_mpi_ops
OPS_STAMP := $(VENV)/.hvd_easgd-mpi-ops-$(shell cat $(MPI_OPS)/mpi_ops.cc $(MPI_OPS)/__init__.py | sha256sum | cut -c1-12)
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup demo test test-unit test-multiproc test-slurm test-multinode bench bench-quick clean

# Re-runs the (idempotent, fast when done) set-up script whenever the pins
# or the script change; otherwise does nothing.
$(STAMP): requirements.txt tools/setup_env.sh setup.py
	bash tools/setup_env.sh
	touch $@

$(OPS_STAMP): $(STAMP)
	$(PY) -m hvd_easgd.comm._mpi_ops.build
	touch $@

setup: $(STAMP) $(OPS_STAMP)

# The ops too: the default collectives take the direct path when they are built.
demo: $(STAMP) $(OPS_STAMP)
	$(VENV)/bin/horovodrun -np 2 $(PY) train.py

test: $(STAMP) $(OPS_STAMP)
	$(PYTEST) -m "unit or multiproc or slurm or multinode" tests

test-unit: $(STAMP) $(OPS_STAMP)
	$(PYTEST) -m unit tests

test-multiproc: $(STAMP) $(OPS_STAMP)
	$(PYTEST) -m multiproc tests

test-slurm: $(STAMP) $(OPS_STAMP)
	$(PYTEST) -m slurm tests

test-multinode: $(STAMP) $(OPS_STAMP)
	$(PYTEST) -m multinode tests

bench: $(STAMP) $(OPS_STAMP)
	$(PY) -m benchmarks.compare

bench-quick: $(STAMP) $(OPS_STAMP)
	$(PY) -m benchmarks.compare --quick

clean:
	rm -rf runs .pytest_cache
