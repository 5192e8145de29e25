"""Process start-up: Horovod initialisation, threads per rank, GPU pinning.

With runtime.py, comm/horovod_comm.py is the only module that imports Horovod,
and comm/mpi_direct.py the only one that imports mpi4py.
"""
import os
import warnings

from . import _compat

_STATE = {"comm": None, "collectives": None}

# How the job's collectives travel: Horovod (MPI, Gloo or NCCL), or straight
# over MPI with mpi4py (comm/mpi_direct.py; MPI launches only).
COLLECTIVES = ("horovod", "mpi-direct")

# Horovod's stall inspector warns after CHECK seconds and, with SHUTDOWN set,
# aborts the job instead of hanging forever when a rank stops answering.
STALL_CHECK_SECONDS = 30
STALL_SHUTDOWN_SECONDS = 60


def cores_available():
    """Cores this process may use: CPU affinity, capped by SLURM_CPUS_PER_TASK."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores)


def threads_per_rank(local_size, override=None, environ=None):
    """TF intra-op threads for one of ``local_size`` ranks sharing this machine.

    Order of precedence: ``override`` (``--threads-per-rank``), then
    ``SLURM_CPUS_PER_TASK`` (SLURM already gave each task its cores), then an
    even share of the cores in this process's affinity mask.
    """
    environ = os.environ if environ is None else environ
    if override is not None:
        if int(override) < 1:
            raise ValueError(f"`threads_per_rank` must be >= 1. Received: threads_per_rank={override!r}")
        return int(override)
    slurm = environ.get("SLURM_CPUS_PER_TASK")
    if slurm and slurm.isdigit() and int(slurm) > 0:
        return int(slurm)
    return max(1, cores_available() // max(1, local_size))


def _configure_threads(local_size, override):
    import tensorflow as tf

    threads = threads_per_rank(local_size, override)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        # One inter-op thread per rank keeps ranks from oversubscribing cores
        # with independent ops; Horovod's own background thread runs apart.
        tf.config.threading.set_inter_op_parallelism_threads(threads if threads > 1 else 1)
    except RuntimeError:
        warnings.warn("TensorFlow was initialised before hvd_easgd.init(); thread counts left as they are",
                      stacklevel=3)
    return threads


def _pin_gpu(local_rank):
    """One GPU per local rank (the NCCL layout); a no-op on CPU-only machines."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    if local_rank >= len(gpus):
        raise RuntimeError(f"local rank {local_rank} has no GPU: only {len(gpus)} visible on this node; "
                           "start one rank per GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpus[local_rank], "GPU")
    return gpus[local_rank].name


def gloo_launch(environ=None):
    """True when horovodrun started this process over Gloo (``--gloo``, or by
    default where Horovod has no MPI): then there is no MPI job to join."""
    environ = os.environ if environ is None else environ
    return ("HOROVOD_GLOO_RENDEZVOUS_ADDR" in environ
            or environ.get("HOROVOD_CONTROLLER", "").lower() == "gloo")


def check_collectives(collectives, environ=None):
    """Refuses an unknown choice, and ``"mpi-direct"`` under a Gloo launch."""
    if collectives not in COLLECTIVES:
        raise ValueError(f"`collectives` must be one of {COLLECTIVES}. Received: collectives={collectives!r}")
    if collectives == "mpi-direct" and gloo_launch(environ):
        raise ValueError("`collectives` must be \"horovod\" under a Gloo launch (horovodrun --gloo): "
                         "\"mpi-direct\" needs an MPI launch (horovodrun --mpi, mpirun, srun --mpi=pmix). "
                         "Received: collectives='mpi-direct'")


def init(threads_per_rank=None, use_horovod=None, collectives=None):
    """Initialises Horovod once and returns the process's communicator.

    Exposes ``rank``, ``size``, ``local_rank`` and ``local_size`` on the
    returned communicator (and as ``hvd_easgd.rank()`` etc.). Sizes each
    rank's TF thread pools to its share of the cores and pins one GPU per
    local rank where GPUs exist.

    ``use_horovod=False`` gives a one-process ``LocalCommunicator`` without
    touching Horovod (for tests and machines without it).

    ``collectives="mpi-direct"`` sends every collective of the job straight
    over MPI through mpi4py (``DirectMPICommunicator``) and does not start
    Horovod at all; MPI launches only. ``None`` (default) is ``"horovod"``
    on the first call, and whatever the first call chose on later ones.
    """
    if _STATE["comm"] is not None:
        if collectives is not None and collectives != _STATE["collectives"]:
            raise ValueError(f"hvd_easgd.init() already ran with collectives={_STATE['collectives']!r}; "
                             f"one process has one kind of collectives. Received: collectives={collectives!r}")
        return _STATE["comm"]
    collectives = collectives or "horovod"
    check_collectives(collectives)
    _compat.quiet_tensorflow()
    os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(STALL_CHECK_SECONDS))
    os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(STALL_SHUTDOWN_SECONDS))
    # Horovod's background thread enters MPI every cycle; Open MPI busy-polls
    # there by default and takes CPU from the training threads when ranks
    # share cores (measured: 11.7-13.6k vs 17-19k samples/s at np=2 on 2 cores).
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    if collectives == "mpi-direct":
        comm = _init_mpi_direct(threads_per_rank)
        _STATE.update(comm=comm, collectives=collectives)
        return comm
    if use_horovod is None:
        use_horovod = _compat.horovod_available()
    if use_horovod:
        import horovod.tensorflow as hvd

        hvd.init()
        local_rank, local_size = hvd.local_rank(), hvd.local_size()
    else:
        local_rank, local_size = 0, 1
    _configure_threads(local_size, threads_per_rank)
    _pin_gpu(local_rank)
    if use_horovod:
        from .comm.horovod_comm import HorovodCommunicator

        comm = HorovodCommunicator()
    else:
        from .comm import LocalCommunicator

        comm = LocalCommunicator()
    _STATE.update(comm=comm, collectives=collectives)
    return comm


def _init_mpi_direct(threads_per_rank):
    # Importing the module initialises MPI (after OMPI_MCA_mpi_yield_when_idle is set).
    from .comm import mpi_direct

    _, _, local_rank, local_size, _, _ = mpi_direct.launch_layout()
    # Thread pools first: creating the communicator's account variable starts TF's runtime.
    _configure_threads(local_size, threads_per_rank)
    _pin_gpu(local_rank)
    return mpi_direct.DirectMPICommunicator()


def communicator():
    """The communicator made by ``init()``; initialises on first use."""
    return _STATE["comm"] if _STATE["comm"] is not None else init()


def rank():
    return communicator().rank


def size():
    return communicator().size


def local_rank():
    return communicator().local_rank


def local_size():
    return communicator().local_size
