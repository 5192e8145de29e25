# Shared set-up for the slurm/*.sbatch templates; sourced, never run directly.
#
# SLURM runs a copy of the batch script from its spool directory, so this
# file is found through $SLURM_SUBMIT_DIR: submit from the project root.
#
# Variables (set them in the shell before sbatch; SLURM passes them on):
#   HVD_EASGD_LAUNCH  srun (default) | horovodrun   how the ranks are started
#   HVD_EASGD_VENV    virtual environment to use     (default: $SLURM_SUBMIT_DIR/.venv)
#   HVD_EASGD_SRUN_MPI  srun's --mpi plugin          (default: pmix; see `srun --mpi=list`)

die() { printf 'hvd_easgd sbatch: error: %s\n' "$*" >&2; exit 2; }

[ -n "${SLURM_JOB_ID:-}" ] \
  || die "not inside a SLURM job; HINT: submit with sbatch, e.g. sbatch slurm/train.sbatch --epochs 3"
cd "$SLURM_SUBMIT_DIR"
[ -f train.py ] && [ -d hvd_easgd ] \
  || die "$SLURM_SUBMIT_DIR is not the hvd_easgd project root; HINT: cd to the clone, then sbatch slurm/<name>.sbatch"

HVD_EASGD_VENV=${HVD_EASGD_VENV:-$SLURM_SUBMIT_DIR/.venv}
[ -x "$HVD_EASGD_VENV/bin/python" ] \
  || die "no virtual environment at $HVD_EASGD_VENV;" \
         "HINT: run 'make setup' in $SLURM_SUBMIT_DIR, or export HVD_EASGD_VENV=/path/to/venv before sbatch"
# Puts the venv's python and horovodrun first on PATH for every rank.
export VIRTUAL_ENV=$HVD_EASGD_VENV
export PATH="$HVD_EASGD_VENV/bin:$PATH"

HVD_EASGD_LAUNCH=${HVD_EASGD_LAUNCH:-srun}
case "$HVD_EASGD_LAUNCH" in
  srun|horovodrun) ;;
  *) die "HVD_EASGD_LAUNCH=$HVD_EASGD_LAUNCH; HINT: use srun or horovodrun" ;;
esac

export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# OpenMPI refuses to start as root unless told twice; containers and CI run as root.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Slurm 22.05 stopped passing the job's --cpus-per-task on to srun (23.11
# restored it); without this, every rank of a step could get a single core.
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
  export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
fi

echo "hvd_easgd: job $SLURM_JOB_ID ($SLURM_JOB_NAME) on ${SLURM_JOB_NODELIST:-?}," \
     "${SLURM_NTASKS:-1} task(s), ${SLURM_CPUS_PER_TASK:-1} cpu(s) per task," \
     "launch=$HVD_EASGD_LAUNCH, venv=$HVD_EASGD_VENV, started $(date -Is)"

# launch_ranks ARGS...: starts one rank per SLURM task running `python ARGS...`.
launch_ranks() {
  if [ "$HVD_EASGD_LAUNCH" = srun ]; then
    # One task per rank; Horovod's MPI picks up the ranks through PMIx.
    # --kill-on-bad-exit stops the other ranks at once if one fails, instead
    # of leaving them blocked in an allreduce until the time limit.
    srun --mpi="${HVD_EASGD_SRUN_MPI:-pmix}" --kill-on-bad-exit=1 python "$@"
  else
    # horovodrun runs inside this single batch task and starts the ranks
    # itself (over ssh on the other nodes of a multi-node allocation).
    local hosts
    hosts=$(python -m hvd_easgd.startup.slurm hosts) || die "could not build the horovodrun host list"
    horovodrun -np "$SLURM_NTASKS" -H "$hosts" python "$@"
  fi
}

# run_dir_default ARGS...: prints `--run-dir runs/<job name>-<job id>` unless
# ARGS already choose the run directory (--run-dir, --resume or --config), so
# every job writes to its own directory and two jobs never share one.
run_dir_default() {
  local arg
  for arg in "$@"; do
    case "$arg" in
      --run-dir|--run-dir=*|--resume|--resume=*|--config|--config=*) return 0 ;;
    esac
  done
  printf '%s\n' --run-dir "runs/${SLURM_JOB_NAME}-${SLURM_JOB_ID}"
}

# run_dir_of ARGS...: the run directory ARGS name (--run-dir or --resume, else the
# run_dir key of the --config file, as train.py reads it), or nothing.
run_dir_of() {
  local previous="" arg config=""
  for arg in "$@"; do
    case "$previous" in
      --run-dir|--resume) printf '%s\n' "$arg"; return 0 ;;
      --config) config=$arg ;;
    esac
    case "$arg" in
      --run-dir=*|--resume=*) printf '%s\n' "${arg#*=}"; return 0 ;;
      --config=*) config=${arg#*=} ;;
    esac
    previous=$arg
  done
  [ -n "$config" ] && [ -f "$config" ] || return 0
  python - "$config" <<'PY' 2>/dev/null || true
import sys, yaml
config = yaml.safe_load(open(sys.argv[1])) or {}
value = config.get("run_dir", config.get("run-dir")) if isinstance(config, dict) else None
print(value or "")
PY
}

# launch_requeueable ARGS...: launch_ranks ARGS in the background, and on
# SIGUSR1 (the warning `#SBATCH --signal=B:USR1@SECONDS` asks SLURM to send
# this script before the time limit) has the ranks checkpoint, then requeues
# this job. The ranks are asked through the file RUN_DIR/STOP, which rank 0
# looks for every --agree-every micro-batches (train.py then checkpoints on
# every rank at one step and exits with status 75): a file reaches ranks that
# horovodrun started on other hosts, and a warning that comes before the ranks
# are up is not lost. The run directory is the one ARGS or their --config file
# name. Without one (train.py then refuses --auto-resume anyway) the signal goes
# to the ranks of srun steps only (scancel --signal=USR1): under horovodrun it
# reaches no rank, since horovodrun does not forward it to the ranks it started.
# A requeued job keeps its id, so runs/<job name>-<job id> and --auto-resume
# continue it. Needs train.py's --checkpoint-on-signal (or any agreement) on.
launch_requeueable() {
  local run_dir stop_requested=0 pid status=0
  run_dir=$(run_dir_of "$@")
  [ -z "$run_dir" ] || rm -f "$run_dir/STOP"  # a stale request must not stop this run at once
  if [ -z "$run_dir" ] && [ "$HVD_EASGD_LAUNCH" = horovodrun ]; then
    echo "hvd_easgd: warning: no run directory in the arguments or their --config: under horovodrun" \
         "the time-limit warning cannot reach the ranks (no checkpoint on it); pass --run-dir" >&2
  fi
  ask_ranks_to_checkpoint() {
    stop_requested=1
    echo "hvd_easgd: SIGUSR1 at $(date -Is): the ranks checkpoint, then job $SLURM_JOB_ID requeues"
    if [ -n "$run_dir" ]; then
      mkdir -p "$run_dir" && touch "$run_dir/STOP"
    else
      scancel --signal=USR1 "$SLURM_JOB_ID"
    fi
  }
  trap ask_ranks_to_checkpoint USR1
  launch_ranks "$@" &
  pid=$!
  # `wait` returns early when the trap runs: wait again until the ranks are gone.
  while :; do
    status=0
    wait "$pid" || status=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - USR1
  # 0: the run finished before the warning reached it; nothing to continue.
  if [ "$stop_requested" = 1 ] && [ "$status" != 0 ]; then
    echo "hvd_easgd: ranks ended with status $status after the warning; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
  fi
  return "$status"
}
