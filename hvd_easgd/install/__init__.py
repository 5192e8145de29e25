"""hvd_easgd's set-up command, ``hvd-easgd``: Horovod and the direct MPI ops for an environment.

A pip-installed hvd_easgd has its Python code; what must be compiled against
the environment's own TensorFlow and MPI it builds with ``hvd-easgd setup``,
and ``hvd-easgd doctor`` says what is there. ``make setup`` runs the same
command in the repository's venv, so there is one set-up path.

    stack.py           what a set-up builds, decided without TensorFlow: the supported versions
                       (tf_versions.txt), the variant, Horovod's build switches, the cache key
    horovod_build.py   Horovod: found installed, installed from the cache, or built (patched)
    setup_command.py   hvd-easgd setup: refusals, Horovod, the direct ops, the final check
    doctor.py          hvd-easgd doctor
    cli.py             the command line
    errors.py          refusals (exit 2) and failed steps (exit 1), one line each

Importing this package loads no TensorFlow. Imports ``startup``, ``comm`` and the top-level modules;
nothing in the library imports it.
"""
