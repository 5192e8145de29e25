#!/usr/bin/env bash
# Installs everything hvd_easgd needs on a fresh Debian machine, and nothing
# that is already there:
#   1. Debian packages (OpenMPI 4.1, cmake, g++; SLURM, iproute2 and headless
#      Chromium for the tests), with one `apt-get update`;
#   2. a virtual environment with the pinned stack from requirements.txt, for
#      the default TensorFlow (.venv) or for another supported one
#      (TF=2.19.1 -> .venv-tf2.19.1; the list is hvd_easgd/install/tf_versions.txt),
#      and hvd_easgd itself, editable, with its command `hvd-easgd`;
#   3. `$VENV/bin/hvd-easgd setup`: Horovod 0.28.1 built with hvd_easgd's patch
#      against that TensorFlow, with MPI and Gloo (and NCCL where CUDA is
#      present), and the direct MPI ops, both cached under ~/.cache/hvd_easgd
#      so a clean clone (CI) reuses them; then a check that Horovod loads with
#      MPI and Gloo. A user who pip-installed hvd_easgd runs the same command
#      (hvd_easgd/install/), so there is one set-up path.
# Re-running it is cheap: every step checks first and skips what is done.
#
#   tools/setup_env.sh          install (what `make setup` runs)
#   tools/setup_env.sh --plan   print what would be installed and built, install nothing
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3.11}
REQS=$ROOT/requirements.txt
VERSIONS=$ROOT/hvd_easgd/install/tf_versions.txt
say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
PLAN_ONLY=
case "${1:-}" in
  "") ;;
  --plan) PLAN_ONLY=1 ;;
  *) die "unknown option: $1 (tools/setup_env.sh [--plan])" ;;
esac

pin() { grep -E "^$1==" "$REQS" | head -n1 | cut -d= -f3; }
DEFAULT_TF=$(pin tensorflow-cpu)
[ -n "$DEFAULT_TF" ] || die "requirements.txt must pin tensorflow-cpu with =="

# --- which TensorFlow ---------------------------------------------------------
# TF= picks another supported version; each lives in its own venv, so the
# default one (.venv, what `make test` uses) is never replaced.
TF_VERSION=${TF:-$DEFAULT_TF}
if [ "$TF_VERSION" = "$DEFAULT_TF" ]; then
  VENV=${VENV:-$ROOT/.venv}
else
  VENV=${VENV:-$ROOT/.venv-tf$TF_VERSION}
fi

# --- the plan: hvd-easgd's own, for this TF, made before the venv exists ------
# `hvd-easgd setup --plan --tensorflow V` from the clone, with the system Python
# (it loads no TensorFlow): it refuses an unsupported TF in one line, and
# decides the variant (cuda where `nvidia-smi -L` answers), Horovod's build and
# its cache key, exactly as the set-up in the venv will. Before the apt step
# where a Python is already there (an unsupported TF is refused at once); else
# after it, which installs one.
PLAN=
make_plan() {
  PLAN=$(PYTHONPATH=$ROOT "$PYTHON" -m hvd_easgd.install setup --plan --tensorflow "$TF_VERSION") || exit $?
  VARIANT=$(printf '%s\n' "$PLAN" | sed -n 's/^variant: //p')
}
if ! command -v "$PYTHON" >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1; then PYTHON=python3; fi
if command -v "$PYTHON" >/dev/null 2>&1; then
  make_plan
elif [ -n "$PLAN_ONLY" ]; then
  die "--plan needs Python 3.11 ($PYTHON); set PYTHON=/path/to/python3.11"
fi

# The requirements for this TF and variant: requirements.txt with the TF line
# for the variant and this version's overrides; every other pin as written.
resolve_requirements() {
  local overrides override_names
  overrides=$(awk -v v="$TF_VERSION" '$1 == v { for (i = 2; i <= NF; i++) print $i }' "$VERSIONS")
  override_names=$(for o in $overrides; do printf '%s|' "${o%%==*}"; done)
  grep -vE "^(tensorflow-cpu|${override_names}__none__)==" "$REQS"
  for o in $overrides; do echo "$o"; done
  if [ "$VARIANT" = cuda ]; then
    echo "tensorflow[and-cuda]==$TF_VERSION"
    echo "nvidia-nccl-cu12"
  else
    echo "tensorflow-cpu==$TF_VERSION"
  fi
}
if [ -n "$PLAN_ONLY" ]; then
  echo "$PLAN"
  echo "venv: $VENV"
  echo "requirements: $(resolve_requirements | grep -vE '^[[:space:]]*(#|$)' | tr '\n' ' ')"
  exit 0
fi

# --- 1. Debian packages -----------------------------------------------------
# MPI and the Horovod build; then what `make test` needs: a one-node SLURM
# cluster (slurm-wlm, munge, PMIx for srun --mpi=pmix) and `ip`, which sets up
# the tests' loopback-only network namespace (tests/loopback_network.py), and
# ssh for the virtual cluster's hosts (tools/vcluster.py). The tests run
# without network access, so nothing can be installed from there. And the real
# data sets that ship inside Debian packages: Fashion-MNIST's idx files
# (--data fashion_mnist) and the Python docs' reStructuredText sources
# (--data python_docs, the language model's corpus). And headless Chromium
# with its WebDriver, which renders the docs site in
# tests/multiproc/test_docs_browser.py (broken images, console errors).
APT_PACKAGES="libopenmpi-dev openmpi-bin cmake g++ make patch slurm-wlm munge libpmix-dev iproute2 openssh-client openssh-server dataset-fashion-mnist python3.11-doc chromium chromium-driver"
command -v "$PYTHON" >/dev/null 2>&1 || APT_PACKAGES="$APT_PACKAGES python3 python3-venv python3-dev"
missing=""
for p in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  [ "$(id -u)" = 0 ] || die "missing Debian packages:$missing (run as root, or: sudo apt-get install$missing)"
  say "apt-get install$missing"
  export DEBIAN_FRONTEND=noninteractive
  case " $missing " in *" openssh-server "*)
    # sshd is only ever started by tools/vcluster.py, inside the virtual
    # hosts' namespaces. This machine gets no sshd on its own interfaces:
    # sshd_not_to_be_run stops Debian's ssh service for good (boot included),
    # and a policy-rc.d answering 101 stops the package starting it now.
    mkdir -p /etc/ssh && touch /etc/ssh/sshd_not_to_be_run
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
      made_policy_rc_d=1
      trap 'rm -f /usr/sbin/policy-rc.d' EXIT  # also if apt-get fails
    fi ;;
  esac
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
  # Ours only for this install: later services on this machine start as usual.
  if [ -n "${made_policy_rc_d:-}" ]; then
    rm -f /usr/sbin/policy-rc.d
    trap - EXIT
  fi
fi
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || die "hvd_easgd needs Python 3.11; set PYTHON=/path/to/python3.11"
[ -n "$PLAN" ] || make_plan
case "$PLAN" in *"cuda toolkit: missing"*)
  die "nvidia-smi sees a GPU but there is no CUDA toolkit (nvcc) to build Horovod's NCCL ops: install the CUDA 12 toolkit or set CUDA_HOME; HVD_EASGD_FORCE_CPU=1 builds for CPU instead" ;;
esac

# --- 2. virtual environment with the pinned stack ---------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"

resolved_reqs=$(mktemp)
trap 'rm -f "$resolved_reqs"' EXIT
resolve_requirements > "$resolved_reqs"
stamp="$VENV/.hvd_easgd-reqs-$VARIANT-$(sha256sum "$resolved_reqs" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  say "installing the pinned stack ($VARIANT) into $VENV"
  $PIP install --upgrade "pip<25" "setuptools<76" wheel
  $PIP install -r "$resolved_reqs"
  touch "$stamp"
fi

# The project itself, editable, with its command: installed again where the
# venv's hvd_easgd is another clone's, or predates the command.
if [ ! -x "$VENV/bin/hvd-easgd" ] || ! (cd / && "$VENV/bin/python" -c "import hvd_easgd, os, sys; sys.exit(os.path.dirname(os.path.dirname(hvd_easgd.__file__)) != sys.argv[1])" "$ROOT") >/dev/null 2>&1; then
  $PIP install --no-deps --no-build-isolation -e "$ROOT"
fi

# --- 3. Horovod and the direct MPI ops: the set-up a pip user runs ------------
"$VENV/bin/hvd-easgd" setup
