"""Does Horovod's in-process elastic mode (``hvd.elastic``) carry hvd_easgd's state from 3 ranks to 2?

The evidence behind the docs' (docs/checkpoints.md) "restart from a checkpoint, not hvd.elastic" (issue 17).
One trial: ``horovodrun --gloo -np 3 --min-np 2 --host-discovery-script D`` starts 3 workers on two
"hosts" that are both this machine (``localhost:2`` and ``127.0.0.1:1``: Horovod's elastic driver
blacklists the *host* of a failed worker, so the killed worker must be alone on its host name). Once
every worker has committed its first epoch, the worker on ``127.0.0.1`` is killed (SIGKILL) and the
discovery script then lists ``localhost:2`` only. A trial recovers when the job exits 0 after the two
survivors trained the remaining epochs at size 2.

Each worker tries Horovod's own state for Keras models,
``horovod.tensorflow.elastic.TensorFlowKerasState(model, optimizer)``, inside ``hvd.elastic.run``
around one ``model.fit`` per epoch, ``state.commit()`` after each; it reports every step on stderr.
Stock (the default), that is all. With ``--workarounds all`` (``state``: 1 only), where Horovod breaks
the worker steps around it:

1. ``TensorFlowKerasState`` raises under Keras 3 (it calls ``optimizer.variables()``, a list there):
   ``ObjectState`` subclassed with hvd_easgd's whole state instead (model, optimizer slots, strategy
   state: what a checkpoint shard holds), broadcast from rank 0, hvd_easgd's communicator rebuilt
   after each reset (it holds the rank and size it was made with);
2. ``hvd.elastic.run``'s wrapper (horovod/tensorflow/elastic.py, ``run``) turns a failed collective
   into ``HorovodInternalError`` only when the error names ``HorovodAllreduce``, ``HorovodAllgather``
   or ``HorovodBroadcast``, and otherwise *returns None*, swallowing the error: hvd_easgd's step uses
   ``hvd.grouped_allreduce`` (``HorovodGroupedAllreduce``), so the survivors would end "successfully"
   in the middle of training. The worker converts that error itself.

Usage (root: the trial enters a loopback-only network namespace, as the tests do, because the
elastic driver's servers bind to every address)::

    python -m benchmarks.studies.elastic_trial --trials 5 --timeout 120                   # stock hvd.elastic
    python -m benchmarks.studies.elastic_trial --trials 1 --timeout 120 --workarounds state  # 1.: shows 2.
    python -m benchmarks.studies.elastic_trial --trials 5 --timeout 120 --workarounds all    # with 1. and 2.
"""
import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time

from .digits_cnn import sync_average_cnn
from ..suite import runner

KILLED_HOST = "127.0.0.1"
EPOCHS = 4
# The op names horovod/tensorflow/elastic.py's run.wrapper turns into HorovodInternalError.
RECOGNISED = ("HorovodAllreduce", "HorovodAllgather", "HorovodBroadcast")


# --- the worker (runs under horovodrun) --------------------------------------------------
def worker(progress_dir, workarounds):
    import horovod.tensorflow as hvd
    import horovod.tensorflow.elastic as hvd_elastic
    import numpy as np
    from horovod.common.elastic import ObjectState
    from horovod.common.exceptions import HorovodInternalError

    from hvd_easgd.startup import runtime
    from hvd_easgd.checkpoint import state_groups
    from hvd_easgd.app.data import steps_per_epoch, training_dataset

    comm = runtime.init(threads_per_rank=1)
    host = os.environ.get("HOROVOD_HOSTNAME", "?")
    me = f"{host}[{os.environ.get('HOROVOD_LOCAL_RANK', '?')}]"

    def say(text):
        print(f"elastic_trial {me} rank {hvd.rank()}/{hvd.size()}: {text}", file=sys.stderr, flush=True)

    with open(os.path.join(progress_dir, f"pid-{host}-{os.environ.get('HOROVOD_LOCAL_RANK')}"), "w") as f:
        f.write(str(os.getpid()))
    data, model, optimizer = sync_average_cnn(comm, 0.05)
    optimizer.attach(model)
    optimizer.build(model.trainable_variables)

    try:
        state = hvd_elastic.TensorFlowKerasState(model, optimizer, epoch=0)
        say("TensorFlowKerasState: constructed")
    except Exception as err:  # noqa: BLE001 (the evidence is the exception itself)
        say(f"TensorFlowKerasState failed: {type(err).__name__}: {err}")
        if workarounds is None:
            raise

        class HvdEasgdState(ObjectState):
            """hvd_easgd's whole per-rank state (a checkpoint shard's groups), kept in memory."""

            def __init__(self, **kwargs):
                self._groups = state_groups(model, optimizer)
                self._saved = None
                self._save_values()
                super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **kwargs)

            def _variables(self):
                return [v for vs in self._groups.values() for v in vs]

            def _save_values(self):
                self._saved = [np.array(v.numpy()) for v in self._variables()]

            def save(self):
                self._save_values()
                super().save()

            def restore(self):
                for v, value in zip(self._variables(), self._saved):
                    v.assign(value)
                super().restore()

            def sync(self):
                # hvd_easgd's communicator holds rank and size from before the reset: rebuild it.
                runtime._STATE["comm"] = None
                fresh = runtime.init(threads_per_rank=1)
                optimizer._comm = fresh
                optimizer.strategy.bind(fresh)
                fresh.broadcast_variables(self._variables(), 0)
                self._save_values()
                super().sync()

        state = HvdEasgdState(epoch=0)
        say("ObjectState with hvd_easgd's state: constructed")

    @hvd_elastic.run
    def train(state):
        while state.epoch < EPOCHS:
            size, rank = hvd.size(), hvd.rank()
            steps = steps_per_epoch(len(data.y_train), 32, size)
            ds, _ = training_dataset(data, 32, 1, rank, size, state.epoch, state.epoch + 1, steps)
            say(f"epoch {state.epoch + 1} at size {size}")
            try:
                history = model.fit(ds, epochs=state.epoch + 1, initial_epoch=state.epoch, steps_per_epoch=steps,
                                    verbose=0)
            except Exception as err:  # noqa: BLE001 (logged, then handed to hvd.elastic.run)
                text = str(err)
                ops = sorted(set(re.findall(r"Horovod[A-Za-z]+", text)))
                first = text.strip().splitlines()[0][:200] if text.strip() else ""
                say(f"fit raised {type(err).__module__}.{type(err).__name__}: {first} (Horovod ops named: {ops}; "
                    f"{[line.strip()[:200] for line in text.splitlines() if 'Horovod' in line][:2]})")
                if workarounds == "all" and ops and not any(op in text for op in RECOGNISED):
                    # hvd.elastic.run's wrapper would swallow it (see the module docstring): hand it over
                    # as the HorovodInternalError Horovod would have made of a recognised op's failure.
                    say("converting it to HorovodInternalError (hvd.elastic.run does not recognise the op)")
                    raise HorovodInternalError(err) from err
                raise
            state.epoch += 1
            state.commit()
            say(f"committed epoch {state.epoch}, loss {history.history['loss'][-1]:.4f}")
            with open(os.path.join(progress_dir, f"epoch-{host}-{os.environ.get('HOROVOD_LOCAL_RANK')}"), "w") as f:
                f.write(json.dumps({"epoch": state.epoch, "size": size}))
        return "done"

    returned = train(state)
    # hvd.elastic.run's wrapper (horovod/tensorflow/elastic.py, run.wrapper) returns None when it
    # swallows an exception: the epoch count says whether training really finished.
    say(f"hvd.elastic.run returned {returned!r} after epoch {state.epoch} of {EPOCHS}")
    if state.epoch == EPOCHS:
        say(f"finished {EPOCHS} epochs at size {hvd.size()}")
    else:
        sys.exit(3)


# --- the driver -------------------------------------------------------------------------
def _discovery(path, hosts):
    with open(path + ".hosts", "w") as f:
        f.write("\n".join(hosts) + "\n")


def trial(timeout, workarounds):
    """One 3 -> 2 trial; returns ``(recovered, seconds, status, log text, work directory)``."""
    work = tempfile.mkdtemp(prefix="elastic-trial-")
    progress = os.path.join(work, "progress")
    os.makedirs(progress)
    discovery = os.path.join(work, "discover.sh")
    _discovery(discovery, ["localhost:2", f"{KILLED_HOST}:1"])
    with open(discovery, "w") as f:
        f.write(f"#!/bin/sh\ncat {discovery}.hosts\n")
    os.chmod(discovery, 0o755)
    cmd = [runner.horovodrun(), "--gloo", "-np", "3", "--min-np", "2", "--max-np", "3", "--network-interface", "lo",
           "--host-discovery-script", discovery, "--start-timeout", "60",
           sys.executable, "-m", "benchmarks.studies.elastic_trial", "--worker", progress]
    cmd += ["--workarounds", workarounds] if workarounds else []
    started = time.time()
    killed = []

    def kill_once_every_worker_committed():
        done = [n for n in os.listdir(progress) if n.startswith("epoch-")]
        if not killed and len(done) >= 3:  # every worker committed epoch 1
            pid_file = [n for n in os.listdir(progress) if n.startswith(f"pid-{KILLED_HOST}-")][0]
            killed.append(int(open(os.path.join(progress, pid_file)).read()))
            os.kill(killed[0], signal.SIGKILL)
            _discovery(discovery, ["localhost:2"])
            print(f"  killed the worker on {KILLED_HOST} (pid {killed[0]}) {time.time() - started:.0f}s in",
                  flush=True)

    outcome = runner.run_bounded(cmd, os.path.join(work, "log"), timeout,
                                 while_running=kill_once_every_worker_committed)
    status = "timeout" if outcome.status is None else outcome.status
    with open(outcome.log_path) as f:
        text = f.read()
    finished = text.count(f"finished {EPOCHS} epochs at size 2")
    recovered = bool(killed) and status == 0 and finished == 2
    return recovered, outcome.seconds, status, text, work


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.elastic_trial",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--worker", metavar="PROGRESS_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--workarounds", choices=("state", "all"), default=None,
                        help="state: workaround 1 of the module docstring; all: 1 and 2")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.workarounds)
    from tools import loopback_network

    print(f"network: {loopback_network.enter()}", flush=True)
    results = []
    for i in range(args.trials):
        print(f"trial {i + 1}/{args.trials}", flush=True)
        recovered, seconds, status, text, work = trial(args.timeout, args.workarounds)
        results.append(recovered)
        evidence = [line for line in text.splitlines()
                    if "elastic_trial" in line or "Error" in line or "error" in line or "blacklist" in line]
        print(f"  {'recovered' if recovered else 'NOT recovered'} in {seconds:.0f}s, horovodrun status {status}, "
              f"log {work}/log", flush=True)
        for line in evidence[-25:]:
            print("   | " + line[:400], flush=True)
    print(f"recovered {sum(results)}/{len(results)}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
