import os
from unittest import mock

import pytest

from hvd_easgd import _compat, runtime

pytestmark = pytest.mark.unit


def test_threads_share_the_affinity_mask_between_local_ranks():
    with mock.patch.object(runtime, "cores_available", return_value=8):
        assert runtime.threads_per_rank(local_size=2, environ={}) == 4
        assert runtime.threads_per_rank(local_size=16, environ={}) == 1


def test_slurm_cpus_per_task_and_override_take_precedence():
    with mock.patch.object(runtime, "cores_available", return_value=8):
        assert runtime.threads_per_rank(2, environ={"SLURM_CPUS_PER_TASK": "3"}) == 3
        assert runtime.threads_per_rank(2, override=5, environ={"SLURM_CPUS_PER_TASK": "3"}) == 5
    with pytest.raises(ValueError, match="threads_per_rank"):
        runtime.threads_per_rank(2, override=0, environ={})


def test_launcher_rank_from_environment():
    with mock.patch.dict(os.environ, {"OMPI_COMM_WORLD_RANK": "3"}, clear=True):
        assert _compat.launcher_rank() == 3
    with mock.patch.dict(os.environ, {"HOROVOD_RANK": "1", "SLURM_PROCID": "5"}, clear=True):
        assert _compat.launcher_rank() == 1
    with mock.patch.dict(os.environ, {}, clear=True):
        assert _compat.launcher_rank() == 0
