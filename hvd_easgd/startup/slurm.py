"""SLURM's environment, read as ranks and hosts.

SLURM describes an allocation through environment variables in a compressed
form (``node[01-04,07]``, ``2(x3),1``). This module expands them and answers
the questions a launcher asks: which hosts, how many ranks on each, which rank
am I. It only reads an environment mapping (``os.environ`` unless one is
injected), so it is testable without a cluster, and it uses the standard
library only, so the sbatch templates can call it before TensorFlow loads.

Command line (used by ``slurm/train.sbatch`` in horovodrun mode)::

    python -m hvd_easgd.startup.slurm hosts   # -> node01:2,node02:2  (horovodrun -H)
    python -m hvd_easgd.startup.slurm np      # -> 4                  (horovodrun -np)
"""
import os
import re
import socket
import sys

__all__ = ["SlurmEnvironment", "SlurmEnvironmentError", "expand_nodelist", "expand_tasks_per_node"]


class SlurmEnvironmentError(RuntimeError):
    """The environment is not a usable SLURM allocation; the message ends with a HINT."""

    def __init__(self, problem, hint):
        super().__init__(f"{problem}; HINT: {hint}")


# ---------------------------------------------------------------- node lists

def _split_top_level(text):
    """Splits on commas that are not inside brackets: 'a[1,2],b' -> ['a[1,2]', 'b']."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in node list {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in node list {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in node list {text!r}")
    parts.append(text[start:])
    return parts


def _expand_range_set(body, text):
    """'01-03,7' -> ['01', '02', '03', '7']. The width of a range's first bound
    is kept, because SLURM writes padded names as node01 and not node1."""
    values = []
    for item in body.split(","):
        low, sep, high = item.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"bad range {item!r} in node list {text!r}")
        if not sep:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"descending range {item!r} in node list {text!r}")
        width = len(low)
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def expand_nodelist(text):
    """Expands a SLURM host list into host names, in order.

    ``node[01-04,07]`` -> node01..node04, node07; ``a1,b[2-3]`` -> a1, b2, b3;
    ``gpu-[1,3-4]-ib`` -> gpu-1-ib, gpu-3-ib, gpu-4-ib. Several bracket groups
    in one name (``r[1-2]n[1-2]``) give every combination, as SLURM does.
    """
    text = (text or "").strip()
    if not text:
        raise ValueError("empty node list")
    hosts = []
    for name in _split_top_level(text):
        if not name:
            raise ValueError(f"empty name in node list {text!r}")
        expanded = [""]
        # Alternate literal text and bracket groups, left to right.
        for match in re.finditer(r"([^\[\]]*)(?:\[([^\]]*)\])?", name):
            literal, body = match.groups()
            expanded = [prefix + literal for prefix in expanded]
            if body is not None:
                expanded = [prefix + value for prefix in expanded for value in _expand_range_set(body, text)]
        hosts.extend(expanded)
    return hosts


def expand_tasks_per_node(text):
    """Expands SLURM's per-node counts: ``2(x3),1`` -> [2, 2, 2, 1].

    This is the format of SLURM_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE.
    """
    text = (text or "").strip()
    if not text:
        raise ValueError("empty per-node count list")
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            raise ValueError(f"bad per-node count {item!r} in {text!r} (expected N or N(xM))")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


# ------------------------------------------------------------- environment

class SlurmEnvironment:
    """Ranks and hosts of the current SLURM job, read from ``environ``.

    Every property raises ``SlurmEnvironmentError`` (with a HINT) when the
    variable it needs is absent or malformed, so a mis-launched job stops
    with a reason instead of training as a silent world of one.
    """

    def __init__(self, environ=None):
        self._env = os.environ if environ is None else environ

    @staticmethod
    def detect(environ=None):
        """True inside a SLURM job (batch script, salloc shell or srun task)."""
        env = os.environ if environ is None else environ
        return "SLURM_JOB_ID" in env or "SLURM_JOBID" in env

    def _get(self, names, hint, problem="not inside a SLURM allocation"):
        """The first of ``names`` (current name, then older spellings) that is set."""
        for name in names:
            value = self._env.get(name)
            if value not in (None, ""):
                return value
        raise SlurmEnvironmentError(f"{problem}: {names[0]} is not set", hint)

    def _get_int(self, names, hint, problem="not inside a SLURM allocation"):
        value = self._get(names, hint, problem)
        if not value.strip().isdigit():
            raise SlurmEnvironmentError(f"{names[0]}={value!r} is not a non-negative integer", hint)
        return int(value)

    @property
    def job_id(self):
        return self._get(["SLURM_JOB_ID", "SLURM_JOBID"], "run under sbatch/salloc")

    @property
    def nodes(self):
        """Host names of the allocation, expanded from SLURM_JOB_NODELIST."""
        text = self._get(["SLURM_JOB_NODELIST", "SLURM_NODELIST"], "run under sbatch/salloc")
        try:
            return expand_nodelist(text)
        except ValueError as err:
            raise SlurmEnvironmentError(f"cannot parse SLURM_JOB_NODELIST: {err}",
                                        "expected SLURM syntax such as node[01-04,07]") from err

    @property
    def world_size(self):
        return self._get_int(["SLURM_NTASKS", "SLURM_NPROCS"],
                             "request tasks, e.g. sbatch --ntasks=4 or --ntasks-per-node=2")

    @property
    def rank(self):
        return self._get_int(["SLURM_PROCID"], "SLURM_PROCID is set per task: launch the ranks with srun",
                             problem="not a SLURM task")

    @property
    def local_rank(self):
        return self._get_int(["SLURM_LOCALID"], "SLURM_LOCALID is set per task: launch the ranks with srun",
                             problem="not a SLURM task")

    @property
    def node_rank(self):
        return self._get_int(["SLURM_NODEID"], "run under sbatch/salloc")

    @property
    def cpus_per_task(self):
        """SLURM_CPUS_PER_TASK, or 1: SLURM sets it only when --cpus-per-task was given."""
        if not self._env.get("SLURM_CPUS_PER_TASK"):
            return 1
        return self._get_int(["SLURM_CPUS_PER_TASK"], "pass --cpus-per-task=N with N >= 1")

    @property
    def tasks_per_node(self):
        """Ranks on each node, aligned with ``nodes``."""
        nodes = self.nodes
        text = self._env.get("SLURM_TASKS_PER_NODE") or self._env.get("SLURM_STEP_TASKS_PER_NODE")
        if not text:
            raise SlurmEnvironmentError("not inside a SLURM allocation: SLURM_TASKS_PER_NODE is not set",
                                        "request tasks, e.g. sbatch --ntasks-per-node=2")
        try:
            counts = expand_tasks_per_node(text)
        except ValueError as err:
            raise SlurmEnvironmentError(f"cannot parse SLURM_TASKS_PER_NODE: {err}",
                                        "expected SLURM syntax such as 2(x3),1") from err
        if len(counts) != len(nodes):
            raise SlurmEnvironmentError(
                f"SLURM_TASKS_PER_NODE={text!r} gives {len(counts)} nodes but SLURM_JOB_NODELIST has {len(nodes)}",
                "both must come from the same allocation; do not set either by hand")
        return counts

    def hosts_string(self, this_host=None):
        """The ``-H`` value for horovodrun: ``host1:slots,host2:slots``.

        A one-node allocation on the machine running this code is written as
        ``localhost:N``: horovodrun then starts every rank locally, with no ssh
        probe and no dependence on how the cluster's DNS resolves node names.
        """
        nodes, counts = self.nodes, self.tasks_per_node
        if len(nodes) == 1:
            here = this_host or self._env.get("SLURMD_NODENAME") or socket.gethostname()
            if here.split(".")[0] == nodes[0].split(".")[0]:
                return f"localhost:{counts[0]}"
        return ",".join(f"{node}:{count}" for node, count in zip(nodes, counts))


# -------------------------------------------------------------- entry point

_COMMANDS = {
    "hosts": lambda env: env.hosts_string(),
    "np": lambda env: str(env.world_size),
    "nodes": lambda env: " ".join(env.nodes),
    "rank": lambda env: str(env.rank),
    "local-rank": lambda env: str(env.local_rank),
    "cpus-per-task": lambda env: str(env.cpus_per_task),
}


def main(argv=None, environ=None, out=None):
    """``python -m hvd_easgd.startup.slurm {hosts,np,...}``; exit 2 with the HINT on error."""
    argv = sys.argv[1:] if argv is None else argv
    out = sys.stdout if out is None else out
    if len(argv) != 1 or argv[0] not in _COMMANDS:
        print(f"usage: python -m hvd_easgd.startup.slurm {{{','.join(_COMMANDS)}}}", file=sys.stderr)
        return 2
    try:
        print(_COMMANDS[argv[0]](SlurmEnvironment(environ)), file=out)
    except SlurmEnvironmentError as err:
        print(f"hvd_easgd.startup.slurm: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
