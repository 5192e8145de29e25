"""Runs under any launcher (horovodrun --gloo or --mpi, mpirun) or none: train.py's own entry
(hvd_easgd.app.cli.main) once per run, in sequence, in one launch, so that a resume test pays
TensorFlow's import (4-5 s of CPU per rank on the 2-core test machine) once, not once per run.

Usage: train_runs.py OUT SIZE RUNS_JSON STEP_SECONDS; RUNS_JSON a list of runs
``{"name": NAME, "argv": [train.py's options], "stopped_at": [RUN_DIR, CHECKPOINT, DIR], "env": {VAR: VALUE}}``
run in its order; ``stopped_at`` (optional) has rank 0 first make DIR as a run of RUN_DIR's configuration
stopped right after its checkpoint CHECKPOINT leaves it (tests/multiproc/helpers.py), for an argv
with ``--resume DIR``; ``env`` (optional) is set in os.environ for that run alone (a test hook read
during the run, such as HVD_EASGD_TEST_SLOW_RANKS; not one read at import). SIZE is the launch's
number of ranks.

main() runs again in the same process as it ran the first time: hvd_easgd.init() returns the
communicator it made, and every run seeds every random source itself and builds its own model,
optimizer and callbacks. Its limits: signal handlers of --checkpoint-on-signal are never
uninstalled, --threads-per-rank applies on the first call only, the Horovod path cannot switch to
hierarchical after another strategy, and a module a run imports (a --plugin) is not imported again
by the next.

Each rank writes, per run NAME: OUT/NAME/rank<r>.stdout and .stderr (what the rank printed during that
run, file descriptors 1 and 2) and OUT/NAME/rank<r>.json (its argv and exit status, as train.py's process
would have ended: 0, main()'s SystemExit code, or 1 with the traceback of an uncaught exception).

The ranks agree through files, so this needs no transport of its own: after each run every rank
waits for every rank's OUT/NAME/rank<r>.json. All statuses alike: the ranks are in step and the next
run starts, so a failed run fails its own test only. Otherwise the remaining runs are recorded as not
run, with why. Deadlocks end the launch, never hang it: a run that lasts more than STEP_SECONDS on a
rank (stuck in a collective) dumps that rank's stacks into its log and exits the process with status
70, and so does a rank whose peers do not all arrive at an agreement within STEP_SECONDS.
"""
import faulthandler
import json
import os
import sys
import time
import traceback

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # first, as train.py does

from hvd_easgd.app.cli import main  # noqa: E402
from tests.multiproc.helpers import stopped_at  # noqa: E402

OUT = sys.argv[1]
SIZE = int(sys.argv[2])
RUNS = json.loads(sys.argv[3])
STEP_SECONDS = float(sys.argv[4])
RANK = _compat.launcher_rank()
EXIT_STUCK = 70


def run_logged(argv, directory):
    """main(argv) with this rank's stdout and stderr (file descriptors 1 and 2, so TensorFlow's C++
    lines too) in ``directory``/rank<r>.stdout and .stderr; returns ``(exit status, error or None)``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(os.path.join(directory, f"rank{RANK}.stdout"), "w") as out, \
            open(os.path.join(directory, f"rank{RANK}.stderr"), "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        # A run stuck past its bound: its stacks into the stderr file, then the process ends (a crash, not a hang).
        faulthandler.dump_traceback_later(STEP_SECONDS, exit=True)
        try:
            main(argv)
            status, error = 0, None
        except SystemExit as exit_:  # train.py's way out on an error: the status its process would end with
            code = exit_.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
            error = None if status == 0 else f"SystemExit({code!r})"
        except Exception:  # noqa: BLE001  train.py's process would end with 1 and this traceback
            status, error = 1, traceback.format_exc()
            print(error, file=sys.stderr)
        finally:
            faulthandler.cancel_dump_traceback_later()
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return status, error


def wait_for(paths, what):
    """Waits until every path exists; ends the process if that takes more than STEP_SECONDS."""
    deadline = time.monotonic() + STEP_SECONDS
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            missing = [p for p in paths if not os.path.exists(p)]
            print(f"train_runs.py: rank {RANK}: {what}: still missing after {STEP_SECONDS:.0f} s: {missing}; "
                  "ending this rank", flush=True)
            os._exit(EXIT_STUCK)
        time.sleep(0.1)


def record(name, outcome):
    path = os.path.join(OUT, name, f"rank{RANK}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(outcome, f)
    os.replace(path + ".tmp", path)  # whole or absent: a peer waiting for it never reads half of it


for i, run in enumerate(RUNS):
    name, directory = run["name"], os.path.join(OUT, run["name"])
    os.makedirs(directory, exist_ok=True)
    if "stopped_at" in run:
        ready = os.path.join(directory, "stopped-run")
        if RANK == 0:
            try:
                stopped_at(*run["stopped_at"])
                why = ""
            except (OSError, ValueError) as err:  # e.g. the run it comes from failed before that checkpoint
                why = f"not run: its stopped run could not be made from {run['stopped_at'][:2]}: {err}"
            with open(ready + ".tmp", "w") as f:
                f.write(why)
            os.replace(ready + ".tmp", ready)
        wait_for([ready], f"{name}'s stopped run")
        with open(ready) as f:
            why = f.read()
        if why:  # every rank alike: still in step
            record(name, {"status": None, "error": why, "argv": run["argv"]})
            continue
    before = {var: os.environ.get(var) for var in run.get("env", {})}
    os.environ.update(run.get("env", {}))
    try:
        status, error = run_logged(run["argv"], directory)
    finally:
        for var, value in before.items():
            if value is None:
                os.environ.pop(var)
            else:
                os.environ[var] = value
    record(name, {"status": status, "error": error, "argv": run["argv"]})
    print(f"train_runs.py: rank {RANK}: {name} ended with status {status}", flush=True)
    outcomes = [os.path.join(directory, f"rank{r}.json") for r in range(SIZE)]
    wait_for(outcomes, f"the ranks' ends of {name}")
    statuses = [json.load(open(p))["status"] for p in outcomes]
    if len(set(statuses)) > 1:
        why = f"not run: the ranks left {name} with statuses {statuses} (by rank), so they may be out of step"
        for rest in RUNS[i + 1:]:
            os.makedirs(os.path.join(OUT, rest["name"]), exist_ok=True)
            record(rest["name"], {"status": None, "error": why, "argv": rest["argv"]})
        break
