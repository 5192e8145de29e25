"""Horovod's tunables: the values ``hvd_easgd.init()`` sets unless the user has.

Horovod 0.28.1 is tuned for a framework that hands it many tensors one by
one (Horovod's own ``DistributedOptimizer`` hooks every gradient): its
background thread wakes every ``HOROVOD_CYCLE_TIME`` (1 ms), so that
tensors arriving within a cycle can be negotiated and fused together. A
tensor waits for the next cycle, then for one negotiation round (a
collective of its own), before its data moves.

hvd_easgd hands Horovod ONE grouped call per communicating step (every
strategy, in a custom loop and in ``model.fit`` alike), fused by Horovod's
group table whatever the cycle: fusion across cycles buys nothing, and the
wait for the cycle is pure latency (a 153 KB grouped allreduce over MPI took
9.8x less at 0.1 ms than at 1 ms). But every cycle is a negotiation
collective even when nothing is queued, so a shorter cycle keeps the
background thread of every rank busy: where the ranks' TF threads already
fill the cores (``runtime.threads_per_rank`` gives each rank its share of
them) it takes their CPU. At 0.1 ms the no-communication baseline (and so
every step that does not communicate: EASGD's, accumulation's) slowed on
both a loaded machine (0.82 of its speed over MPI, 0.69 over Gloo, 3 pairs)
and a quiet one (0.83 over MPI, 4 pairs; 0.96 over Gloo, 2), while
SyncAverage gained only when quiet (1.35x MPI, 1.29x Gloo; loaded: 0.64x,
0.44x). So the cycle, the response cache,
the fusion threshold and the thread affinity stay at Horovod's values
(docs/collectives.md, "Horovod settings hvd_easgd chooses"; set
``HOROVOD_CYCLE_TIME=0.1`` yourself where every rank has a core to spare).

What hvd_easgd sets is how MPI waits: Open MPI busy-polls inside the
background thread's every collective unless told to yield.

The choice depends on

* the controller, MPI or Gloo, which runs the negotiation (and, on CPUs,
  the data): known before ``hvd.init()`` from the environment, as Horovod
  itself decides it (``controller_from_environ``);
* the device, which changes nothing today: on GPUs NCCL moves the data,
  but the controller still negotiates every cycle on the CPU, next to the
  input pipeline's threads; without a GPU measurement Horovod's values stay.

Nothing here imports Horovod or TensorFlow: ``runtime.init`` asks this
module what to set, sets it, and records ``settings_in_force``.
"""

# Horovod 0.28.1's own values (horovod/common/operations.cc,
# BackgroundThreadLoop), for the record and for benchmarks that run "as
# Horovod ships".
HOROVOD_OWN_DEFAULTS = {
    "HOROVOD_CYCLE_TIME": "1",  # ms
    "HOROVOD_CACHE_CAPACITY": "1024",  # responses; 0 disables the cache
    "HOROVOD_FUSION_THRESHOLD": str(128 * 1024 * 1024),  # bytes
    "HOROVOD_THREAD_AFFINITY": None,  # unset: the background thread floats
}

# The tunables hvd_easgd reports, whether it sets them or not.
TUNABLES = tuple(HOROVOD_OWN_DEFAULTS) + ("OMPI_MCA_mpi_yield_when_idle",)

CONTROLLERS = ("mpi", "gloo")
DEVICES = ("cpu", "gpu")

# Launchers that start every rank under MPI: horovodrun --mpi (through
# mpirun: Open MPI's variables), mpirun itself, and srun (PMI/PMIx).
# horovodrun --gloo instead sets HOROVOD_CONTROLLER=gloo (gloo_run.py).
_MPI_LAUNCH_MARKERS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")

# Horovod's background thread waits inside MPI every cycle; Open MPI
# busy-polls there by default and takes the CPU from the training threads
# when ranks share cores (measured: 11.7-13.6k vs 17-19k samples/s at np=2
# on 2 cores). Yielding costs nothing measurable where cores are spare.
OMPI_YIELD_WHEN_IDLE = "1"


def controller_from_environ(environ, mpi_built=True):
    """``"mpi"`` or ``"gloo"``: the controller ``hvd.init()`` will choose.

    Horovod reads ``HOROVOD_CONTROLLER`` (``horovodrun --gloo`` sets it to
    ``gloo``; ``horovodrun --mpi``, ``mpirun`` and ``srun`` set nothing) and
    otherwise takes MPI when it was built with MPI (``mpi_built``), Gloo if
    not (horovod/common/utils/env_parser.cc, ParseControllerOpsFromEnv).
    """
    chosen = environ.get("HOROVOD_CONTROLLER")
    if chosen:
        if chosen.lower() not in CONTROLLERS:
            raise ValueError(f"`HOROVOD_CONTROLLER` must be one of {CONTROLLERS}. "
                             f"Received: HOROVOD_CONTROLLER={chosen!r}")
        return chosen.lower()
    return "mpi" if mpi_built else "gloo"


def launched_under_mpi(environ):
    """True when an MPI launcher (mpirun, horovodrun --mpi, srun) started this process."""
    return any(marker in environ for marker in _MPI_LAUNCH_MARKERS)


def horovod_defaults(device, controller, environ):
    """The Horovod settings hvd_easgd adds to ``environ``, as ``{name: value}``.

    A variable already in ``environ`` is the user's choice and is left out:
    the user's setting always wins. Pure: reads ``environ``, changes nothing.

    Args:
      device: ``"cpu"`` or ``"gpu"`` (GPUs: NCCL moves the data).
      controller: ``"mpi"`` or ``"gloo"`` (see ``controller_from_environ``).
      environ: the process environment (a mapping).
    """
    if device not in DEVICES:
        raise ValueError(f"`device` must be one of {DEVICES}. Received: device={device!r}")
    if controller not in CONTROLLERS:
        raise ValueError(f"`controller` must be one of {CONTROLLERS}. Received: controller={controller!r}")
    chosen = {}
    if controller == "mpi" or launched_under_mpi(environ):
        # Also under Gloo when mpirun started the ranks: MPI is initialised
        # then and polls the same way.
        chosen["OMPI_MCA_mpi_yield_when_idle"] = OMPI_YIELD_WHEN_IDLE
    # Left at Horovod's values, measured (benchmarks/studies/tuning_ab.py):
    # HOROVOD_CYCLE_TIME (0.1 ms cut the latency of a small allreduce 11x but
    # cost every row's throughput on cores the ranks already fill),
    # HOROVOD_CACHE_CAPACITY (the cache turns every repeated negotiation into
    # one bit-vector allreduce), HOROVOD_FUSION_THRESHOLD (one group per step
    # is fused whatever the threshold below 128 MB), HOROVOD_THREAD_AFFINITY
    # (no core is spare to pin the background thread to).
    return {name: value for name, value in chosen.items() if name not in environ}


def settings_in_force(environ, chosen):
    """Every tunable's value and who set it, for config.yaml and results.json.

    ``{name: {"value": str or None, "set_by": "user" | "hvd_easgd" | "horovod"}}``:
    ``chosen`` is what ``horovod_defaults`` returned (and was then set);
    a variable in ``environ`` not chosen by hvd_easgd was set by the user;
    anything else runs at Horovod's (or Open MPI's) own default.
    """
    record = {}
    for name in TUNABLES:
        if name in chosen:
            record[name] = {"value": chosen[name], "set_by": "hvd_easgd"}
        elif name in environ:
            record[name] = {"value": environ[name], "set_by": "user"}
        else:
            record[name] = {"value": HOROVOD_OWN_DEFAULTS.get(name), "set_by": "horovod"}
    return record
