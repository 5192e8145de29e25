#!/usr/bin/env bash
# Installs everything hvd_easgd needs on a fresh Debian machine, and nothing
# that is already there:
#   1. Debian packages (OpenMPI 4.1, cmake, g++; SLURM and iproute2 for the
#      tests), with one `apt-get update`;
#   2. a virtual environment with the pinned stack from requirements.txt, for
#      the default TensorFlow (.venv) or for another supported one
#      (TF=2.19.1 -> .venv-tf2.19.1; the list is tools/tf_versions.txt);
#   3. Horovod 0.28.1 built from its sdist with hvd_easgd's patch
#      (tools/horovod/) against that TensorFlow, with MPI and Gloo (and NCCL
#      where CUDA is present). The built wheel is cached outside the clone,
#      keyed by the Horovod, TF, Python, GPU variant and patch, so a clean
#      clone (CI) reuses it instead of rebuilding;
#   4. a check that the build really has TensorFlow, MPI and Gloo.
# Re-running it is cheap: every step checks first and skips what is done.
#
#   tools/setup_env.sh          install (what `make setup` runs)
#   tools/setup_env.sh --plan   print what would be installed and built, install nothing
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3.11}
CACHE=${HVD_EASGD_CACHE:-$HOME/.cache/hvd_easgd}
REQS=$ROOT/requirements.txt
VERSIONS=$ROOT/tools/tf_versions.txt
PATCH=$ROOT/tools/horovod/horovod-0.28.1.patch
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
HOROVOD_VERSION=$(pin horovod)
[ -n "$DEFAULT_TF" ] && [ -n "$HOROVOD_VERSION" ] || die "requirements.txt must pin tensorflow-cpu and horovod with =="

# --- which TensorFlow ---------------------------------------------------------
# TF= picks another supported version; each lives in its own venv, so the
# default one (.venv, what `make test` uses) is never replaced.
TF_VERSION=${TF:-$DEFAULT_TF}
supported=$(grep -vE '^[[:space:]]*(#|$)' "$VERSIONS" | awk '{print $1}' | tr '\n' ' ')
case " $supported " in
  *" $TF_VERSION "*) ;;
  *) die "TensorFlow $TF_VERSION is not supported: hvd_easgd is tested on ${supported% } (tools/tf_versions.txt); a version outside that list has no Horovod build recipe here" ;;
esac
if [ "$TF_VERSION" = "$DEFAULT_TF" ]; then
  VENV=${VENV:-$ROOT/.venv}
else
  VENV=${VENV:-$ROOT/.venv-tf$TF_VERSION}
fi
# Pins that differ for this TF (e.g. the tensorboard that an older TF requires itself).
overrides=$(awk -v v="$TF_VERSION" '$1 == v { for (i = 2; i <= NF; i++) print $i }' "$VERSIONS")
patch_hash=$(sha256sum "$PATCH" | cut -c1-8)

# --- GPU detection: one place decides the variant --------------------------
if [ -n "${HVD_EASGD_FORCE_CPU:-}" ]; then
  VARIANT=cpu
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  VARIANT=cuda
else
  VARIANT=cpu
fi

# The requirements for this TF and variant: requirements.txt with the TF line
# for the variant and this version's overrides; every other pin as written.
resolved_reqs=$(mktemp)
trap 'rm -f "$resolved_reqs"' EXIT
override_names=$(for o in $overrides; do printf '%s|' "${o%%==*}"; done)
grep -vE "^(horovod|tensorflow-cpu|${override_names}__none__)==" "$REQS" > "$resolved_reqs"
for o in $overrides; do echo "$o" >> "$resolved_reqs"; done
HOROVOD_BUILD_ENV=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
                   HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1)
if [ "$VARIANT" = cuda ]; then
  echo "tensorflow[and-cuda]==$TF_VERSION" >> "$resolved_reqs"
  echo "nvidia-nccl-cu12" >> "$resolved_reqs"
  # Horovod's GPU reductions over NCCL (NCCL's home is found once the venv exists).
  HOROVOD_BUILD_ENV+=(HOROVOD_GPU_OPERATIONS=NCCL)
else
  echo "tensorflow-cpu==$TF_VERSION" >> "$resolved_reqs"
fi
WHEEL_KEY="horovod-$HOROVOD_VERSION-tf-$TF_VERSION-cp311-$VARIANT-patch-$patch_hash"
if [ "$VARIANT" = cuda ]; then
  # Horovod's GPU build compiles CUDA kernels: it needs the toolkit's nvcc,
  # which no pip wheel provides in full.
  NVCC=$(command -v nvcc || true)
  [ -z "$NVCC" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
fi
if [ -n "$PLAN_ONLY" ]; then
  [ "$VARIANT" = cuda ] && echo "cuda toolkit: ${NVCC:-missing (install the CUDA 12 toolkit or set CUDA_HOME)}"
  echo "tensorflow: $TF_VERSION"
  echo "variant: $VARIANT"
  echo "venv: $VENV"
  echo "requirements: $(grep -vE '^[[:space:]]*(#|$)' "$resolved_reqs" | tr '\n' ' ')"
  echo "horovod build: ${HOROVOD_BUILD_ENV[*]}"
  echo "horovod wheel cache: $CACHE/wheels/$WHEEL_KEY"
  exit 0
fi

[ "$VARIANT" = cuda ] && [ -z "$NVCC" ] && die "nvidia-smi sees a GPU but there is no CUDA toolkit (nvcc) to build Horovod's NCCL ops: install the CUDA 12 toolkit or set CUDA_HOME; HVD_EASGD_FORCE_CPU=1 builds for CPU instead"

# --- 1. Debian packages -----------------------------------------------------
# MPI and the Horovod build; then what `make test` needs: a one-node SLURM
# cluster (slurm-wlm, munge, PMIx for srun --mpi=pmix) and `ip`, which sets up
# the tests' loopback-only network namespace (tests/loopback_network.py), and
# ssh for the virtual cluster's hosts (tools/vcluster.py). The tests run
# without network access, so nothing can be installed from there. And the real
# data sets that ship inside Debian packages: Fashion-MNIST's idx files
# (--data fashion_mnist) and the Python docs' reStructuredText sources
# (--data python_docs, the language model's corpus).
APT_PACKAGES="libopenmpi-dev openmpi-bin cmake g++ make patch slurm-wlm munge libpmix-dev iproute2 openssh-client openssh-server dataset-fashion-mnist python3.11-doc"
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

# --- 2. virtual environment with the pinned stack ---------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"

stamp="$VENV/.hvd_easgd-reqs-$VARIANT-$(sha256sum "$resolved_reqs" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  say "installing the pinned stack ($VARIANT) into $VENV"
  $PIP install --upgrade "pip<25" "setuptools<76" wheel
  $PIP install -r "$resolved_reqs"
  touch "$stamp"
fi

# --- 3. Horovod, built once per (Horovod, TF, Python, variant, patch) --------
WHEEL_DIR="$CACHE/wheels/$WHEEL_KEY"  # cp311: the only Python checked above
# Where setup records which TF this Horovod was built against, for the job's
# start-up check (hvd_easgd._compat.horovod_problem).
BUILD_RECORD_NAME=hvd_easgd_build.txt
BUILD_RECORD="$TF_VERSION patch-$patch_hash"
# The installed Horovod is this build: its version, its TF extension loads, and
# its record names this TF and this patch (a changed patch installs anew).
have_horovod() {
  "$VENV/bin/python" - "$HOROVOD_VERSION" "$BUILD_RECORD" "$BUILD_RECORD_NAME" <<'PY' 2>/dev/null
import os, sys, horovod, horovod.tensorflow  # noqa: F401  (import proves the TF extension loads)
record = os.path.join(os.path.dirname(horovod.tensorflow.__file__), sys.argv[3])
built = open(record).read().strip() if os.path.exists(record) else ""
sys.exit(0 if horovod.__version__ == sys.argv[1] and built == sys.argv[2] else 1)
PY
}
if ! have_horovod; then
  wheel=$(ls "$WHEEL_DIR"/horovod-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    say "building horovod==$HOROVOD_VERSION against TF $TF_VERSION ($VARIANT, patched: $(basename "$PATCH")); takes a few minutes"
    mkdir -p "$WHEEL_DIR"
    build_env=("${HOROVOD_BUILD_ENV[@]}" MAKEFLAGS="-j$(nproc)")
    if [ "$VARIANT" = cuda ]; then
      # NCCL from the nvidia-nccl-cu12 wheel unless the system provides one.
      nccl_home=${HOROVOD_NCCL_HOME:-$("$VENV/bin/python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)}
      if [ -n "$nccl_home" ]; then
        # The wheel ships lib/libnccl.so.2 only; Horovod's CMake looks for libnccl.so.
        [ -e "$nccl_home/lib/libnccl.so" ] || ln -s libnccl.so.2 "$nccl_home/lib/libnccl.so"
        build_env+=(HOROVOD_NCCL_HOME="$nccl_home" HOROVOD_NCCL_LINK=SHARED)
      fi
      build_env+=(HOROVOD_CUDA_HOME="$(dirname "$(dirname "$NVCC")")")
    fi
    log="$WHEEL_DIR/build.log"
    src=$(mktemp -d)
    build_started=$(date +%s)
    # The sdist, patched, then built from its folder. --no-cache-dir: pip's own
    # wheel cache is keyed by the sdist alone and would hand back a build made
    # against another TensorFlow, or without the patch.
    if ! { $PIP download --no-deps --no-binary horovod --no-cache-dir "horovod==$HOROVOD_VERSION" -d "$src" \
           && tar -xzf "$src"/horovod-"$HOROVOD_VERSION".tar.gz -C "$src" \
           && patch -d "$src/horovod-$HOROVOD_VERSION" -p1 --forward < "$PATCH" \
           && env "${build_env[@]}" "$VENV/bin/python" -m pip wheel --no-deps --no-build-isolation --no-cache-dir \
                "$src/horovod-$HOROVOD_VERSION" -w "$WHEEL_DIR"; } >"$log" 2>&1; then
      rm -rf "$src"
      tail -n 30 "$log" >&2
      die "the Horovod build against TF $TF_VERSION failed; full log: $log"
    fi
    rm -rf "$src"
    # Kept beside the wheel: `make matrix` reports how long this TF's build
    # took (docs/supported-versions.md) even once the wheel is reused.
    echo $(( $(date +%s) - build_started )) > "$WHEEL_DIR/build-seconds"
    wheel=$(ls "$WHEEL_DIR"/horovod-*.whl | head -n1)
  else
    say "reusing cached $wheel"
  fi
  $PIP install --no-deps --force-reinstall "$wheel"
  "$VENV/bin/python" - "$BUILD_RECORD" "$BUILD_RECORD_NAME" <<'PY'
import os, sys
import importlib.util
spec = importlib.util.find_spec("horovod")
with open(os.path.join(os.path.dirname(spec.origin), "tensorflow", sys.argv[2]), "w") as f:
    f.write(sys.argv[1] + "\n")
PY
fi

# --- 4. verify the build ------------------------------------------------------
check=$("$VENV/bin/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed: $check"
for feature in TensorFlow MPI Gloo; do
  echo "$check" | grep -qE "\[X\] $feature\b" \
    || die "Horovod was built without $feature (horovodrun --check-build):\n$check"
done
if [ "$VARIANT" = cuda ]; then
  echo "$check" | grep -qE '\[X\] NCCL' || die "CUDA found but Horovod was built without NCCL"
fi

# --- 5. the project itself ----------------------------------------------------
if ! (cd / && "$VENV/bin/python" -c "import hvd_easgd, os, sys; sys.exit(os.path.dirname(os.path.dirname(hvd_easgd.__file__)) != sys.argv[1])" "$ROOT") >/dev/null 2>&1; then
  $PIP install --no-deps --no-build-isolation -e "$ROOT"
fi
say "ready: tensorflow $TF_VERSION, horovod $HOROVOD_VERSION ($VARIANT) in $VENV"
