"""``hvd-easgd doctor``: what is built here, against which TensorFlow, and what a launch would get.

In the spirit of ``horovodrun --check-build``, for hvd_easgd's whole stack:
the TensorFlow (and whether it is supported), the Horovod (its version, the
TensorFlow and patch it was built with, whether its extension loads, and with
MPI, Gloo and NCCL or not), the direct MPI ops (built for this TensorFlow, MPI
and Python or not), and, for each way of launching, the collectives
``--collectives auto`` would take and why. That last answer is the library's
own (``runtime.resolve_collectives``, which ``hvd_easgd.init`` uses), asked
with the environment each launcher gives its ranks.

``gather`` loads TensorFlow and Horovod (a few seconds); ``report`` only formats.
"""
import os
import platform
import shutil
import sys

from .. import _compat
from ..version import __version__
from . import horovod_build, stack

# Each way of launching, with what its launcher puts in a rank's environment that the choice reads.
GLOO_LAUNCH = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_CONTROLLER": "gloo", "HOROVOD_RANK": "0"}
MPI_LAUNCH = {"OMPI_COMM_WORLD_RANK": "0"}
HOROVODRUN = "horovodrun -np N python SCRIPT"
LAUNCHES = (("horovodrun -np N --gloo python SCRIPT", GLOO_LAUNCH),
            ("horovodrun -np N --mpi, mpirun or srun --mpi=pmix", MPI_LAUNCH),
            ("python SCRIPT (one process, no launcher)", {}))
# What a launcher sets, removed from this process's environment before one is simulated.
_LAUNCH_VARIABLES = set(_compat.LAUNCHER_MARKERS) | set(GLOO_LAUNCH) | {"PMIX_RANK", "PMI_RANK"}


def launch_environ(launch, environ=None):
    """This process's environment as a rank started by ``launch`` (one of ``LAUNCHES``' environments)
    would see it: the user's settings (``HOROVOD_TIMELINE``, ...) kept, any launcher's markers replaced."""
    environ = os.environ if environ is None else environ
    return {**{k: v for k, v in environ.items() if k not in _LAUNCH_VARIABLES}, **launch}


def launches(horovodrun_default=None, environ=None, gpu=None, direct_ops=None):
    """``[(launch, path, why)]`` for ``LAUNCHES``, led by plain ``horovodrun`` when its default controller
    here is known (``"mpi"`` or ``"gloo"``); ``path`` is None where the job would stop at start-up
    (``why`` then says why). ``gpu`` and ``direct_ops`` as ``runtime.choose_collectives`` takes them."""
    from ..startup import runtime

    named = list(LAUNCHES)
    if horovodrun_default:
        # horovodrun without --gloo or --mpi: MPI where Horovod has it and mpirun is found, else Gloo.
        named.insert(0, (f"{HOROVODRUN} (over {'MPI' if horovodrun_default == 'mpi' else 'Gloo'} here: "
                         "horovodrun's default)", MPI_LAUNCH if horovodrun_default == "mpi" else GLOO_LAUNCH))
    answers = []
    for name, launch in named:
        try:
            path, why = runtime.resolve_collectives("auto", launch_environ(launch, environ), gpu, direct_ops)
        except _compat.StackMismatchError as err:
            path, why = None, str(err)
        answers.append((name, path, why))
    return answers


def gather(environ=None):
    """Everything ``report`` prints, as a dict; loads TensorFlow and Horovod where they are installed."""
    facts = {"hvd_easgd": __version__, "python": platform.python_version(), "prefix": sys.prefix,
             "tensorflow": _compat.installed_tensorflow_version(), "variant": stack.variant(environ),
             "horovod": horovod_build.installed(), "patch": stack.patch_hash()}
    if facts["tensorflow"] is None:
        return facts
    import tensorflow as tf

    from ..comm import _mpi_ops

    facts["gpus"] = len(tf.config.list_physical_devices("GPU"))
    facts["horovod_problem"] = _compat.horovod_problem() if facts["horovod"] else None
    if facts["horovod"] and facts["horovod_problem"] is None:
        import horovod.tensorflow as hvd

        facts["built"] = {"MPI": hvd.mpi_built(), "Gloo": hvd.gloo_built(), "NCCL": bool(hvd.nccl_built())}
        horovodrun_default = "mpi" if facts["built"]["MPI"] and shutil.which("mpirun") else "gloo"
    else:
        horovodrun_default = None
    try:
        facts["ops"] = _mpi_ops.library_path(_mpi_ops.mpi_library_version())
    except ImportError as err:
        facts["ops"] = None
        facts["ops_problem"] = f"mpi4py does not import ({err})"
    facts["launches"] = launches(horovodrun_default, environ)
    return facts


def report(facts, exists=os.path.exists):
    """``(lines, ready)``: the doctor's report, and whether a launch here has everything hvd_easgd
    builds (a supported TensorFlow, this Horovod build loading with MPI and Gloo, the direct ops)."""
    lines = [f"hvd_easgd {facts['hvd_easgd']} (Python {facts['python']}, {facts['prefix']})"]
    problems = []
    tensorflow = facts["tensorflow"]
    if tensorflow is None:
        lines.append("TensorFlow: not installed in this environment")
        return lines + ["not ready: install a supported TensorFlow, then run `hvd-easgd setup`"], False
    unsupported = stack.unsupported_tensorflow(tensorflow)
    devices = f"{facts['gpus']} GPU(s) visible" if facts.get("gpus") else "no GPU visible"
    lines.append(f"TensorFlow: {tensorflow}, {'not supported' if unsupported else 'supported'}; {devices}")
    if unsupported:
        problems.append(unsupported)
    lines.append(f"Horovod: {_horovod_line(facts, tensorflow, problems)}")
    lines.append(f"direct MPI ops: {_ops_line(facts, exists, problems)}")
    lines.append("collectives a launch here would get (--collectives auto):")
    for name, path, why in facts["launches"]:
        lines.append(f"  {name}: {path}, because {why}" if path else f"  {name}: stops at start-up: {why}")
    if problems:
        return lines + [f"not ready: {problems[0]}"], False
    return lines + ["ready"], True


def _horovod_line(facts, tensorflow, problems):
    found = facts["horovod"]
    if found is None:
        problems.append("Horovod is not installed: run `hvd-easgd setup`")
        return "not installed"
    version, record, _ = found
    if record is None:
        origin = "not built by hvd-easgd setup (no build record)"
    else:
        built_for, _, patch = record.partition(" ")
        origin = f"built against TensorFlow {built_for} with hvd_easgd's {patch}"
        if patch != f"patch-{facts['patch']}":
            origin += f" (this package's patch is patch-{facts['patch']})"
    line = f"{version}, {origin}"
    if facts.get("horovod_problem"):
        problems.append(f"{facts['horovod_problem']}")
        return f"{line}; does not load: {facts['horovod_problem']}"
    built = facts["built"]
    line += "; " + ", ".join(f"{name} {'yes' if built[name] else 'no'}" for name in ("MPI", "Gloo", "NCCL"))
    wanted = ("MPI", "Gloo") + (("NCCL",) if facts["variant"] == "cuda" else ())
    missing = [name for name in wanted if not built[name]]
    if missing:
        problems.append(f"Horovod was built without {' and '.join(missing)}: run `hvd-easgd setup`")
    elif version != stack.HOROVOD_VERSION or record != f"{tensorflow} patch-{facts['patch']}":
        problems.append(f"the installed Horovod is not hvd_easgd's build of {stack.HOROVOD_VERSION} for TensorFlow "
                        f"{tensorflow}: run `hvd-easgd setup`")
    return line


def _ops_line(facts, exists, problems):
    if facts["ops"] is None:
        problems.append(f"the direct MPI ops cannot be built: {facts['ops_problem']}")
        return f"unavailable: {facts['ops_problem']}"
    if exists(facts["ops"]):
        return f"built for this TensorFlow, MPI and Python ({facts['ops']})"
    problems.append("the direct MPI ops are not built for this TensorFlow, MPI and Python: run `hvd-easgd setup`")
    return f"not built for this TensorFlow, MPI and Python (would be {facts['ops']})"
