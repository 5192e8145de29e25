"""The slurm tier's helpers: ``SlurmCluster`` (munged, slurmctld and slurmd for this host, on
loopback) and the checks for the packages it needs. The session fixture ``slurm_cluster`` in
tests/slurm/conftest.py starts one; the multinode tier subclasses it (tests/multinode/slurm_on_cluster.py).

Tests import these from here, never from a conftest.py.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import bounded

REPO = Path(__file__).resolve().parents[2]
# slurm-wlm: slurmctld, slurmd and the clients; munge: authentication;
# libpmix-dev: SLURM's mpi_pmix plugin dlopens the unversioned libpmix.so,
# which Debian ships only in the -dev package.
APT_PACKAGES = ("slurm-wlm", "munge", "libpmix-dev")
START_TIMEOUT = 60     # seconds for the node to show up idle
COMMAND_TIMEOUT = 30   # any single SLURM client command
POLL = 0.2             # seconds between two looks at a job (one `scontrol show job` each)
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


# ------------------------------------------------------------------ installing

def _missing_packages():
    if shutil.which("dpkg-query") is None:
        pytest.fail("the slurm tier installs SLURM with apt and needs a Debian-like system; "
                    "HINT: run it on Debian/Ubuntu, or install slurmctld, slurmd and munged yourself")
    missing = []
    for package in APT_PACKAGES:
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                                capture_output=True, text=True).stdout
        if "install ok installed" not in status:
            missing.append(package)
    return missing


def require_packages():
    # `make setup` installs them: the tests run in a network namespace with
    # loopback alone (tools/loopback_network.py), where apt cannot reach a mirror.
    missing = _missing_packages()
    if missing:
        pytest.fail(f"SLURM packages missing: {' '.join(missing)}; HINT: `make setup` installs them "
                    f"(or: sudo apt-get install -y {' '.join(missing)})")


# ------------------------------------------------------------------ the cluster

def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_hardware():
    """'CPUs=2 Boards=1 ... RealMemory=24105' for this host, as slurmd sees it."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT).stdout
    first = out.splitlines()[0] if out else ""
    fields = dict(re.findall(r"(\w+)=(\S+)", first))
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    if not all(key in fields for key in keys):
        pytest.fail(f"cannot read this node's hardware from `slurmd -C`: {out!r}")
    return " ".join(f"{key}={fields[key]}" for key in keys), int(fields["CPUs"])


def _client_env(conf):
    """The environment for SLURM clients and jobs: ours, minus any SLURM job we
    might be running inside (its SLURM_* variables would steer sbatch/srun)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env.update(SLURM_CONF=str(conf), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               # One node: MPI ranks talk through shared memory and open no TCP
               # listener (horovodrun's own `-mca btl` flags override this).
               OMPI_MCA_btl="self,vader", OMPI_MCA_oob_tcp_if_include="lo")
    return env


class SlurmCluster:
    """munged + slurmctld + slurmd for this host, rooted at ``root``."""

    def __init__(self, root):
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.env = _client_env(self.conf)
        self.daemons = {}  # name -> Popen, in start order
        self.cpus = 0

    # --- set-up --------------------------------------------------------------------
    def write_config(self):
        hardware, self.cpus = node_hardware()
        self._write_config(
            about="One-node cluster for hvd_easgd's slurm tier (written by tests/slurm/helpers.py).",
            site=f"""ClusterName=hvdeasgdtest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
# Bind to the node's own address (127.0.0.1 here), never to every interface.""",
            nodes=f"""NodeName={self.host} NodeHostname={self.host} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN
PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP""",
            node_names=[])

    def _write_config(self, about, site, nodes, node_names):
        """Writes slurm.conf (``site`` lines, the settings every test cluster
        shares, then ``nodes``) and a fresh munge key. With ``node_names``, each
        slurmd on this file system gets its own spool, pid and log file (%n)."""
        r = self.root
        for sub in ["state", "spool", "log", "munge"] + [f"spool/{name}" for name in node_names]:
            (r / sub).mkdir(parents=True, exist_ok=True)
        # munged wants its socket directory reachable by everyone and its key private.
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o711)
        per_node = "-%n" if node_names else ""
        self.conf.write_text(f"""\
# {about}
{site}
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job may start again only once its old credential
# expired (120 s by default; the hold is cred_expire + 1 s). 5 s is the least
# SLURM takes (below it, slurm_cred.c logs an error and keeps 120 s), and ample
# for a credential here: no prolog, no user environment to load, and a launch
# that reaches slurmd within the same second.
AuthInfo=socket={r}/munge/munge.socket,cred_expire=5
# A pass of the main scheduler every second (sched_interval, 60 s by default; a few jobs
# here make a pass cheap): a submitted batch job starts within a second, not after
# batch_sched_delay's 3 s, and a requeued job, whose hold (cred_expire) ends with no
# event that would schedule it, within a second of the hold's end, not up to a minute on.
SchedulerParameters=sched_interval=1
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool{"/%n" if node_names else ""}
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd{per_node}.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd{per_node}.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# No cgroups: the tier must run inside containers and VMs without them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
InactiveLimit=0
KillWait=5
# Finished jobs stay visible to `scontrol show job` (there is no slurmdbd).
MinJobAge=600
{nodes}
""")
        subprocess.run(["mungekey", "--create", "--keyfile", str(r / "munge" / "munge.key")],
                       check=True, capture_output=True, timeout=COMMAND_TIMEOUT)

    def node_hosts(self):
        """The hosts that run a slurmd, one node each."""
        return [self.host]

    def _on_host(self, host, cmd):
        """``cmd`` as it runs on ``host`` (here every daemon runs on this machine)."""
        return cmd

    def _spawn(self, name, cmd, host=None):
        log = open(self.root / "log" / f"{name}.console", "w")
        self.daemons[name] = subprocess.Popen(self._on_host(host, cmd), stdout=log, stderr=subprocess.STDOUT,
                                              env=self.env, start_new_session=True)
        log.close()

    def start(self):
        m = self.root / "munge"
        # Foreground (-F/-D) daemons are our own children: we know their pids.
        self._spawn("munged", ["munged", "-F", "--force", f"--socket={m}/munge.socket",
                               f"--key-file={m}/munge.key", f"--log-file={m}/munged.log",
                               f"--pid-file={m}/munged.pid", f"--seed-file={m}/munged.seed"])
        self._wait_for(lambda: (m / "munge.socket").exists(), "munged's socket", timeout=15)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for host in self.node_hosts():
            self._spawn(f"slurmd-{host}", ["slurmd", "-D", "-f", str(self.conf), "-N", host], host=host)
        self._wait_for(self._nodes_idle, "every node idle in sinfo", timeout=START_TIMEOUT)
        self._check_listeners()

    def _nodes_idle(self):
        out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.split()
        return len(out) == len(self.node_hosts()) and set(out) == {"idle"}

    def _wait_for(self, ready, what, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    pytest.fail(f"{name} exited with status {proc.returncode} while waiting for {what}\n"
                                + self.logs())
            if ready():
                return
            time.sleep(0.5)
        pytest.fail(f"SLURM did not start: no {what} after {timeout}s\n" + self.logs())

    def _check_listeners(self):
        """Every daemon listens on loopback only (this one-node cluster's address)."""
        import psutil

        for name, proc in self.daemons.items():
            for conn in psutil.Process(proc.pid).net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN and not conn.laddr.ip.startswith(("127.", "::1")):
                    pytest.fail(f"{name} listens on {conn.laddr.ip}:{conn.laddr.port}, not on loopback; "
                                f"HINT: make `{self.host}` resolve to 127.0.0.1 (e.g. in /etc/hosts)")

    # --- tear-down -------------------------------------------------------------------
    def stop(self):
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            # Every job on this private cluster is ours: end them so no slurmstepd lingers.
            self.run(["scancel", "--quiet", "--full", "--partition=debug"], check=False)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.run(["squeue", "-h"], check=False).stdout.strip():
                time.sleep(0.5)
        for name in reversed(list(self.daemons)):  # slurmd, slurmctld, munged
            proc = self.daemons[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)

    def logs(self, lines=40):
        parts = []
        for path in sorted((self.root / "log").glob("*")) + [self.root / "munge" / "munged.log"]:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} ---\n" + "\n".join(tail))
        return "\n".join(parts)

    # --- clients -----------------------------------------------------------------------
    def run(self, cmd, check=True, timeout=COMMAND_TIMEOUT, env=None, cwd=REPO):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                                  env=env or self.env)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(map(str, cmd))}` took over {timeout}s\n" + self.logs())
        if check and done.returncode != 0:
            pytest.fail(f"`{' '.join(map(str, cmd))}` failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def submit(self, script, sbatch_args=(), script_args=(), env=None):
        """sbatch from the project root; returns the job id."""
        done = self.run(["sbatch", "--parsable", *sbatch_args, str(script), *script_args],
                        env=dict(self.env, **(env or {})))
        return done.stdout.strip().split(";")[0]

    def job(self, job_id):
        """`scontrol show job` as a dict (values without spaces are enough here)."""
        out = self.run(["scontrol", "-o", "show", "job", job_id]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, job_id, timeout):
        """Polls until the job ends; a job still running at ``timeout`` is cancelled and fails the test."""
        timeout = bounded(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in TERMINAL_STATES:
                return info
            time.sleep(POLL)
        self.run(["scancel", job_id], check=False)
        info = self.job(job_id)
        out = Path(info.get("StdOut", ""))
        text = out.read_text(errors="replace")[-3000:] if out.is_file() else "(no output file)"
        pytest.fail(f"job {job_id} still {info.get('JobState')} after {timeout}s; cancelled.\n{text}\n" + self.logs())
