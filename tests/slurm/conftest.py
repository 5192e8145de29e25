"""A real one-node SLURM cluster for the slurm tier, started by the tests.

The session fixture ``slurm_cluster`` checks that Debian's SLURM and MUNGE
are installed (`make setup` installs them), writes a one-node configuration for this host into a
temporary directory, starts munged, slurmctld and slurmd there (all on
loopback, on free ports), waits for the node to be idle and stops the three
daemons by pid at the end. If SLURM cannot start, every test using the
fixture errors with the daemons' logs: a tier that silently skipped would
prove nothing. The cluster itself is tests/slurm/helpers.py's ``SlurmCluster``.
"""
import os

import pytest

from tests.slurm.helpers import SlurmCluster, require_packages


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the slurm tier starts slurmd, which launches jobs and must run as root; "
                    "HINT: run as root (CI does)")
    require_packages()
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.write_config()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
