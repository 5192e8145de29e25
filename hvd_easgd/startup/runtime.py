"""Process start-up: Horovod initialisation, threads per rank, GPU pinning.

With runtime.py, comm/horovod_comm.py is the only module that imports Horovod,
and comm/mpi_direct.py (with the build of its ops) the only one that imports mpi4py.
"""
import os
import warnings

from .. import _compat, validation
from . import tuning

_STATE = {"comm": None, "horovod_settings": None, "collectives": None, "collectives_reason": None}

# How the job's collectives travel: Horovod (MPI, Gloo or NCCL), or straight
# over MPI through hvd_easgd's own TF ops (comm/mpi_direct.py; MPI launches
# only). "auto", the default, picks one per job (choose_collectives).
COLLECTIVES = ("auto", "horovod", "mpi-direct")
DEFAULT_COLLECTIVES = "auto"
# init() also takes "local": one process that talks to no other (LocalCommunicator),
# starting neither Horovod nor MPI. A launched job never wants it, so train.py does
# not offer it; "auto" already falls back to it for one process without Horovod.
LOCAL = "local"
INIT_COLLECTIVES = COLLECTIVES + (LOCAL,)
# Settings that ask for Horovod's own tools, which only its path has.
HOROVOD_TOOLS = ("HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE", "HOROVOD_ELASTIC")

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
                      validation.ConfigurationWarning, stacklevel=3)
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


PROCESS_SETS = (None, "dynamic")


def _device():
    """``"gpu"`` where TensorFlow sees a GPU (Horovod then reduces with NCCL), else ``"cpu"``."""
    import tensorflow as tf

    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def _apply_horovod_defaults(mpi_built):
    """Sets hvd_easgd's Horovod defaults (``tuning``) where the user set nothing; returns the record."""
    controller = tuning.controller_from_environ(os.environ, mpi_built)
    chosen = tuning.horovod_defaults(_device(), controller, os.environ)
    os.environ.update(chosen)
    return dict(controller=controller, settings=tuning.settings_in_force(os.environ, chosen))


def horovod_settings():
    """The controller and Horovod tunables in force and who set each (``None`` before
    ``init()`` or without Horovod): what config.yaml and benchmark results record."""
    return _STATE["horovod_settings"]


def gloo_launch(environ=None):
    """True when horovodrun started this process over Gloo (``--gloo``, or by
    default where Horovod has no MPI): then there is no MPI job to join."""
    environ = os.environ if environ is None else environ
    return ("HOROVOD_GLOO_RENDEZVOUS_ADDR" in environ
            or environ.get("HOROVOD_CONTROLLER", "").lower() == "gloo")


def mpi_launch(environ=None):
    """True when an MPI launcher started this process (``horovodrun --mpi``, ``mpirun``,
    ``srun --mpi=pmix``): there is an MPI job to join, and Horovod is not needed for it."""
    environ = os.environ if environ is None else environ
    return not gloo_launch(environ) and any(
        marker in environ for marker in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"))


def check_collectives(collectives, environ=None):
    """Refuses an unknown choice, and ``"mpi-direct"`` under a Gloo launch (the one
    place that refusal is made; train.py asks it before anything starts)."""
    if collectives not in COLLECTIVES:
        raise ValueError(f"`collectives` must be one of {COLLECTIVES}. Received: collectives={collectives!r}")
    if collectives == "mpi-direct" and gloo_launch(environ):
        raise ValueError("`collectives` must be \"auto\" or \"horovod\" under a Gloo launch (horovodrun --gloo): "
                         "mpi-direct needs an MPI launch (horovodrun --mpi, mpirun, srun --mpi=pmix). "
                         "Received: collectives='mpi-direct'")


def choose_collectives(environ=None, gpu=None, direct_ops=None):
    """``(path, why)`` for ``collectives="auto"``: the direct MPI path where it
    applies, Horovod's path elsewhere.

    The direct path applies to a CPU job under an MPI launch whose ops are built
    for the running TensorFlow, MPI and Python: there it runs SyncAverage at
    about 1.4-1.7x Horovod's samples/s at np = 2 (docs/default-collectives.md). Horovod's
    path stays for Gloo launches (no MPI to use), one process without a launcher
    (nothing to reduce), GPUs (Horovod reduces on the device with NCCL; the
    direct ops are CPU-only) and Horovod's own tools (timeline, autotune, elastic).

    ``gpu`` (a bool) and ``direct_ops`` (``True`` when built, else why not) say
    what to assume instead of looking (``None``), so tests decide without a GPU or MPI.
    """
    environ = os.environ if environ is None else environ
    if gloo_launch(environ):
        return "horovod", "a Gloo launch (horovodrun --gloo) has no MPI for the direct path"
    if not mpi_launch(environ):
        return "horovod", "this is not an MPI launch"
    tools = [name for name in HOROVOD_TOOLS if environ.get(name, "") not in ("", "0")]
    if tools:
        return "horovod", f"{', '.join(tools)} asks for Horovod's own tools"
    if gpu is None:
        gpu = _device() == "gpu"
    if gpu:
        return "horovod", "GPUs are visible, and Horovod reduces on them with NCCL (the direct ops are CPU-only)"
    problem = _direct_ops_problem() if direct_ops is None else (None if direct_ops is True else direct_ops)
    if problem:
        return "horovod", problem
    return "mpi-direct", "this is an MPI launch on CPU and the direct ops are built for this TensorFlow, MPI and Python"


def _direct_ops_problem():
    """Why the direct ops cannot load here, or None (reads MPI's version without starting MPI)."""
    from ..comm import _mpi_ops

    try:
        path = _mpi_ops.library_path(_mpi_ops.mpi_library_version())
    except ImportError as err:  # no mpi4py: no MPI to reach directly
        return f"the direct path is unavailable ({err})"
    if not os.path.exists(path):
        return (f"the direct ops are not built for this TensorFlow, MPI and Python ({path}; "
                "`hvd-easgd setup` builds them)")
    return None


def collectives_in_use():
    """``(path, why)`` of the job's collectives once ``init()`` ran (else ``(None, None)``)."""
    return _STATE["collectives"], _STATE["collectives_reason"]


def init(threads_per_rank=None, use_horovod=None, process_sets=None, collectives=DEFAULT_COLLECTIVES):
    """Initialises the process's collectives once and returns its communicator.

    Exposes ``rank``, ``size``, ``local_rank`` and ``local_size`` on the
    returned communicator (and as ``hvd_easgd.rank()`` etc.). Sizes each
    rank's TF thread pools to its share of the cores and pins one GPU per
    local rank where GPUs exist.

    Args:
      threads_per_rank: TF intra-op threads of this rank (default: see
        ``threads_per_rank()``).
      use_horovod: deprecated, goes in the next release: ``False`` is
        ``collectives="local"``, ``True`` is ``collectives="horovod"``
        (a ``DeprecationWarning``; a ``collectives`` that says otherwise is an error).
      process_sets: ``"dynamic"`` starts Horovod with dynamic process sets,
        so that ``comm.split(groups)`` can create sub-communicators
        (Hierarchical's groups) once the ranks know their hosts. Off by
        default (``None``): Horovod's process sets are otherwise fixed at its start.
      collectives: how the job's collectives travel, one of ``INIT_COLLECTIVES``:

        - ``"horovod"``: Horovod's collectives.
        - ``"mpi-direct"``: every collective straight over MPI through
          hvd_easgd's own TF ops (``DirectMPICommunicator``), without
          starting Horovod; MPI launches only. Its ``split`` needs no
          process sets (MPI splits communicators at any time).
        - ``"local"``: one process alone (``LocalCommunicator``), touching
          neither Horovod nor MPI (for tests and machines without them).
        - ``"auto"`` (default): one of the first two (``choose_collectives``),
          and rank 0 prints which, and why, in one line.

        With ``"horovod"`` or ``"auto"``, a process without a usable Horovod
        trains alone when no launcher started it, and stops with
        ``StackMismatchError`` under a launcher (each rank would train on
        its own). After the first call, ``"auto"`` returns the communicator
        made then, whatever it chose; another choice is an error.

    Returns:
      The communicator (``Communicator``).
    """
    collectives = _collectives_from_use_horovod(use_horovod, collectives)
    if process_sets not in PROCESS_SETS:
        raise ValueError(f"`process_sets` must be one of {PROCESS_SETS}. Received: process_sets={process_sets!r}")
    if collectives not in INIT_COLLECTIVES:
        raise ValueError(f"`collectives` must be one of {INIT_COLLECTIVES}. Received: collectives={collectives!r}")
    if _STATE["comm"] is not None:
        comm = _STATE["comm"]
        if collectives != DEFAULT_COLLECTIVES and collectives != _STATE["collectives"]:
            raise ValueError(f"`collectives` must be {_STATE['collectives']!r} or \"auto\": hvd_easgd.init() "
                             "already started those, and one process has one kind of collectives. "
                             f"Received: collectives={collectives!r}")
        if process_sets == "dynamic" and not getattr(comm, "dynamic_process_sets", True):
            raise RuntimeError("hvd_easgd.init() already started Horovod without dynamic process sets; "
                               "call hvd_easgd.init(process_sets='dynamic') first, before anything initialises")
        return comm
    _compat.quiet_tensorflow()
    os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(STALL_CHECK_SECONDS))
    os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(STALL_SHUTDOWN_SECONDS))
    if collectives != LOCAL:
        check_collectives(collectives)
    collectives, reason = _resolve_collectives(collectives)
    _STATE["collectives_reason"] = reason
    if collectives == "mpi-direct":
        comm = _init_mpi_direct(threads_per_rank)
        _STATE.update(comm=comm, collectives=collectives)
        return comm
    use_horovod = collectives == "horovod"
    if use_horovod:
        import horovod.tensorflow as hvd

        # Horovod reads its tunables once, in hvd.init(process_sets=process_sets): set them before.
        _STATE["horovod_settings"] = _apply_horovod_defaults(hvd.mpi_built())
        hvd.init(process_sets=process_sets)
        local_rank, local_size = hvd.local_rank(), hvd.local_size()
    else:
        local_rank, local_size = 0, 1
    _configure_threads(local_size, threads_per_rank)
    _pin_gpu(local_rank)
    if use_horovod:
        from ..comm.horovod_comm import HorovodCommunicator

        comm = HorovodCommunicator(dynamic_process_sets=process_sets == "dynamic")
    else:
        from ..comm import LocalCommunicator

        comm = LocalCommunicator()
    _STATE.update(comm=comm, collectives=collectives)
    return comm


def _collectives_from_use_horovod(use_horovod, collectives):
    """``collectives`` as the deprecated ``use_horovod`` asks for it (``None``: as given)."""
    if collectives is None:  # the default of releases before "local" joined the choices
        collectives = DEFAULT_COLLECTIVES
    if use_horovod is None:
        return collectives
    if not isinstance(use_horovod, bool):
        raise ValueError(f"`use_horovod` must be True, False or None. Received: use_horovod={use_horovod!r}")
    implied = "horovod" if use_horovod else LOCAL
    warnings.warn(f"`use_horovod` is deprecated and goes in the next release: pass collectives={implied!r} "
                  f"instead of use_horovod={use_horovod}", DeprecationWarning, stacklevel=3)
    if collectives not in (DEFAULT_COLLECTIVES, implied):
        raise ValueError(f"`use_horovod={use_horovod}` means collectives={implied!r}, and `collectives` asks for "
                         f"another; pass `collectives` alone. Received: use_horovod={use_horovod!r}, "
                         f"collectives={collectives!r}")
    return implied


def resolve_collectives(collectives=DEFAULT_COLLECTIVES, environ=None, gpu=None, direct_ops=None):
    """``(path, why)``: the collectives ``init(collectives=...)`` takes in ``environ``, ``"auto"``
    decided by ``choose_collectives`` (``gpu`` and ``direct_ops`` as there).

    Where Horovod's path cannot be served (``_compat.horovod_problem``), one process without a
    launcher falls back to ``"local"``, and a launched rank raises ``StackMismatchError``: each rank
    would otherwise train on its own. ``hvd-easgd doctor`` asks this for the launches it names.
    """
    environ = os.environ if environ is None else environ
    if collectives == "auto":
        path, why = choose_collectives(environ, gpu=gpu, direct_ops=direct_ops)
    else:
        path, why = collectives, "chosen by the caller"
    if path == "horovod":
        problem = _compat.horovod_problem()
        if problem is not None:
            if _compat.under_launcher(environ):
                raise _compat.StackMismatchError(problem)
            path, why = LOCAL, f"one process without a launcher, and Horovod cannot serve it ({problem})"
    return path, why


def _resolve_collectives(collectives):
    """``resolve_collectives`` for this process; rank 0 says what ``"auto"`` chose."""
    path, why = resolve_collectives(collectives)
    if collectives == "auto" and _compat.launcher_rank() == 0:
        print(f"hvd_easgd: collectives {path}, because {why} (train.py --collectives or "
              "hvd_easgd.init(collectives=...) forces one)", flush=True)
    return path, why


def _init_mpi_direct(threads_per_rank):
    # Open MPI reads how to wait when MPI starts, which importing the module does.
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", tuning.OMPI_YIELD_WHEN_IDLE)
    from ..comm import mpi_direct

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
