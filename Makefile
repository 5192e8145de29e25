# hvd_easgd: the README's two commands are `make demo` and `make test`.
# Both install whatever is missing first (apt packages, .venv, the Horovod
# build and the mpi-direct TF ops, cached under ~/.cache/hvd_easgd so a clean
# clone reuses them).
#
# TF=<version> (one of hvd_easgd/install/tf_versions.txt) works on that TensorFlow instead,
# in its own venv: `make setup TF=2.19.1` builds .venv-tf2.19.1 and
# `make smoke TF=2.19.1` runs the smoke subset there. Without TF (or with the
# default, requirements.txt's pin) it is .venv, as tools/setup_env.sh decides.
DEFAULT_TF := $(shell sed -n 's/^tensorflow-cpu==//p' requirements.txt)
ifeq ($(filter-out $(DEFAULT_TF),$(TF)),)
VENV    ?= .venv
else
VENV    ?= .venv-tf$(TF)
endif
# No `export TF`: make already hands a TF given on its command line (or found in
# the environment) to tools/setup_env.sh, and without one the script sees none.
PY      := $(VENV)/bin/python
PYTEST  := $(PY) -m pytest
# What the set-up builds from (hvd_easgd/install/: the set-up command, its patch to
# Horovod and the TF list; the mpi-direct ops' source), named by its contents: a
# changed source runs the set-up again, which rebuilds only what changed (Horovod
# and the ops are cached per stack and source, outside the clone).
MPI_OPS := hvd_easgd/comm/_mpi_ops
SETUP_SOURCES := $(sort $(wildcard hvd_easgd/install/*.py hvd_easgd/install/*.patch hvd_easgd/install/*.txt)) $(MPI_OPS)/mpi_ops.cc $(MPI_OPS)/__init__.py
STAMP   := $(VENV)/.hvd_easgd-ready-$(shell cat $(SETUP_SOURCES) | sha256sum | cut -c1-12)
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup demo dist docs test test-fast test-unit test-multiproc test-slurm test-multinode smoke matrix supported-versions bench bench-quick clean

# Re-runs the (idempotent, fast when done) set-up script whenever the pins, the
# script or the set-up's sources change; otherwise does nothing. The script
# installs the apt packages and the venv, then runs `hvd-easgd setup` in it
# (Horovod and the mpi-direct ops): the command a pip-installed user runs. The
# stamp lives in the venv, so each TF's venv has its own.
$(STAMP): requirements.txt tools/setup_env.sh setup.py
	bash tools/setup_env.sh
	touch $@

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/horovodrun -np 2 $(PY) train.py

# What a user pip-installs: the sdist, and the wheel built from it (pip builds
# the wheel as it would from the sdist, so the sdist is proved complete), into dist/.
dist: $(STAMP)
	rm -rf dist build
	$(PY) setup.py -q sdist -d dist
	$(PY) -m pip wheel -q --no-deps --no-build-isolation --no-index -w dist dist/hvd_easgd-*.tar.gz

# Every tier, every test; --durations: the slowest tests' times in the log (CI's too).
# The whole unit tier on both cores, as make test-unit runs it; the tiers that launch
# ranks after it, one test at a time (their ranks share the two cores). Both
# run, whatever the first's result, and a failure in either fails the target.
test: $(STAMP)
	@status=0; \
	$(PYTEST) -m unit -n 2 --durations=15 tests || status=$$?; \
	$(PYTEST) -m "multiproc or slurm or multinode" --durations=40 tests || status=$$?; \
	exit $$status

# The unit tier, in-process only. It launches no train.py, horovodrun or mpirun
# (tests/unit/test_tests_layout.py keeps it that way), and needs no C++ op
# build: it runs against an ops cache that never exists, so a test that needed
# the ops would fail here even on a machine that has them built. Two worker
# processes (pytest-xdist), one per core. test-fast, a developer's loop of about
# a minute, leaves out the tests marked slow (pytest.ini: the modules of many
# simulated ranks, and fresh interpreters importing TensorFlow), which hold
# about 40 % of the tier's time in 10 % of its tests; test-unit and test run them.
UNIT = HVD_EASGD_CACHE=$(abspath $(VENV))/.no-ops-cache $(PYTEST) -n 2

test-fast: $(STAMP)
	$(UNIT) -m "unit and not slow" tests

test-unit: $(STAMP)
	$(UNIT) -m unit tests

test-multiproc: $(STAMP)
	$(PYTEST) -m multiproc tests

test-slurm: $(STAMP)
	$(PYTEST) -m slurm tests

test-multinode: $(STAMP)
	$(PYTEST) -m multinode tests

# A few minutes' check of one venv (TF=<version>): the core checks under
# horovodrun --gloo and --mpi, train.py on both collective paths (Horovod's
# under --gloo, the direct one under --mpi), the GAN guide and the kept model
# reloaded (the tests marked smoke). SMOKE_ARGS: more pytest
# options (make matrix passes --junitxml).
smoke: $(STAMP)
	$(PYTEST) -m smoke tests $(SMOKE_ARGS)

# Every TF in hvd_easgd/install/tf_versions.txt: setup, then smoke, one at a time; writes
# docs/results/tf-versions/<version>.json and renders docs/supported-versions.md.
# Not part of `make test`: it builds a venv (and Horovod) per version.
matrix:
	python3 -m tools.tf_matrix run

# docs/supported-versions.md again from the committed results (no runs).
supported-versions:
	python3 -m tools.tf_matrix render

bench: $(STAMP)
	$(PY) -m benchmarks compare

bench-quick: $(STAMP)
	$(PY) -m benchmarks compare --quick

# The docs site (mkdocs.yml) into site/, never committed. --strict: a broken link,
# a missing include or an API reference that does not resolve fails the build.
# NO_MKDOCS_2_WARNING: Material's start-up banner about MkDocs 2, not about this site.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf runs .pytest_cache site dist build
