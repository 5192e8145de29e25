"""Runs under `horovodrun -np N --mpi`: train.py's own entry (hvd_easgd.app.cli.main) once per
configuration, in sequence, in one launch; tests/multiproc/test_every_strategy_at_np8.py asserts on
what each run wrote, and test_train.py's resume tests on their uninterrupted runs (one launch) and on
their resumed ones (a second launch, `--resume` of stopped runs made from the first's checkpoints).

Usage: every_strategy.py OUT RUNS_JSON AGREE_SECONDS; RUNS_JSON a mapping {name: train.py argv},
run in its order.

Why one launch: a launch of 8 ranks on a 2-core machine spends 35-40 s importing TensorFlow, about
twice what a configuration trains. main() runs again in the same process as it ran the first time:
hvd_easgd.init() returns the communicator it made, and every run seeds every random source itself and
builds its own model, optimizer and callbacks; each configuration's metrics.json is the one its own
launch writes, epoch by epoch (the test module's docstring).

Each rank writes, per configuration NAME: OUT/NAME/rank<r>.log (what the rank printed during that run,
file descriptors 1 and 2, so TensorFlow's C++ lines too) and OUT/NAME/rank<r>.json (its argv and exit
status, as train.py's process would have ended: 0, main()'s SystemExit code, or 1 with the traceback
of an uncaught exception); the run directory is OUT/NAME/run.

After each configuration the ranks agree on their statuses. All alike (train.py's errors leave every
rank alike): the ranks are in step, and the next configuration runs, so a failed one fails its own
test only. Otherwise the ranks may be out of step in their collectives, and the remaining
configurations are recorded as not run, with why. A rank that does not reach the agreement within
AGREE_SECONDS (stuck in a collective another rank left) aborts the job: a crash, not a hang.
"""
import atexit
import json
import os
import sys
import time
import traceback

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # first, as train.py does

import mpi4py  # noqa: E402
import numpy as np  # noqa: E402

mpi4py.rc.initialize = False
from mpi4py import MPI  # noqa: E402

from hvd_easgd import tuning  # noqa: E402
from hvd_easgd.app.cli import main  # noqa: E402

OUT = sys.argv[1]
RUNS = json.loads(sys.argv[2])
AGREE_SECONDS = float(sys.argv[3])

# The agreement's communicator is made here, by every rank in step before any run, and is never the
# training's: it cannot meet a training collective, whatever a run leaves behind. MPI started as the
# direct path starts it (comm/mpi_direct.py), which then finds it started: the runs are unchanged.
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", tuning.OMPI_YIELD_WHEN_IDLE)
MPI.Init_thread(MPI.THREAD_MULTIPLE)
atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())
AGREEMENT = MPI.COMM_WORLD.Dup()
RANK, SIZE = AGREEMENT.Get_rank(), AGREEMENT.Get_size()


def run_logged(argv, log_path):
    """main(argv) with this rank's output in ``log_path``; returns ``(exit status, error or None)``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            main(argv)
            status, error = 0, None
        except SystemExit as err:  # train.py's way out on an error: the status its process would end with
            code = err.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
            error = None if status == 0 else f"SystemExit({code!r})"
        except Exception:  # noqa: BLE001  train.py's process would end with 1 and this traceback
            status, error = 1, traceback.format_exc()
            print(error, file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return status, error


def agree(name, status):
    """Every rank's status after ``name``, by rank; aborts the job if they do not all arrive in time."""
    every = np.empty(SIZE, dtype=np.int64)
    request = AGREEMENT.Iallgather(np.array([status], dtype=np.int64), every)
    deadline = time.monotonic() + AGREE_SECONDS
    while not request.Test():
        if time.monotonic() > deadline:
            print(f"every_strategy.py: rank {RANK}: the ranks did not all end {name} within {AGREE_SECONDS:.0f} s "
                  "of each other (one is stuck in a collective another left?); aborting the job", flush=True)
            AGREEMENT.Abort(1)
        time.sleep(0.2)
    return every.tolist()


def record(name, outcome):
    with open(os.path.join(OUT, name, f"rank{RANK}.json"), "w") as f:
        json.dump(outcome, f)


names = list(RUNS)
for i, name in enumerate(names):
    directory = os.path.join(OUT, name)
    os.makedirs(directory, exist_ok=True)
    argv = [*RUNS[name], "--run-dir", os.path.join(directory, "run")]
    status, error = run_logged(argv, os.path.join(directory, f"rank{RANK}.log"))
    record(name, {"status": status, "error": error, "argv": argv})
    print(f"every_strategy.py: rank {RANK}: {name} ended with status {status}", flush=True)
    statuses = agree(name, status)
    if len(set(statuses)) > 1:
        why = f"not run: the ranks left {name} with statuses {statuses} (by rank), so they may be out of step"
        for rest in names[i + 1:]:
            os.makedirs(os.path.join(OUT, rest), exist_ok=True)
            record(rest, {"status": None, "error": why, "argv": RUNS[rest]})
        break
