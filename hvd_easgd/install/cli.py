"""The ``hvd-easgd`` command (setup.py's console entry point; also ``python -m hvd_easgd.install``).

    hvd-easgd setup [--plan [--tensorflow VERSION]]
    hvd-easgd doctor

A refusal is one line on stderr and exit status 2, a failed step one line and
exit status 1 (``errors``); ``doctor`` exits 1 when something is not ready.
Importing this module loads no TensorFlow: ``setup --plan`` runs with the
system Python before a venv exists (tools/setup_env.sh --plan).
"""
import argparse
import sys

from .errors import EXIT_FAILED, EXIT_REFUSED, Failed, Refused

PROG = "hvd-easgd"


def _say(message):
    print(f"[setup] {message}", flush=True)


def _setup(args):
    from . import setup_command

    if args.tensorflow and not args.plan:
        raise Refused("--tensorflow plans for a TensorFlow that is not installed here, so it needs --plan; "
                      "setup itself builds for the installed one")
    if args.plan:
        for field, value in setup_command.plan(args.tensorflow):
            print(f"{field}: {value}")
    else:
        setup_command.setup(_say)
    return 0


def _doctor(args):
    from . import doctor

    lines, ready = doctor.report(doctor.gather())
    print("\n".join(lines), flush=True)
    return 0 if ready else EXIT_FAILED


def parser():
    p = argparse.ArgumentParser(prog=PROG, description="Sets up and checks hvd_easgd's native parts (Horovod, "
                                "the direct MPI ops) in the Python environment it runs in.")
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    setup = commands.add_parser("setup", help="build Horovod and the direct MPI ops for this environment (cached)",
                                description="Builds Horovod 0.28.1 (patched; MPI, Gloo, and NCCL where CUDA is "
                                "present) and the direct MPI ops against this environment's TensorFlow, or installs "
                                "them from ~/.cache/hvd_easgd ($HVD_EASGD_CACHE) where they were built before.")
    setup.add_argument("--plan", action="store_true", help="print what would be built and installed, do nothing")
    setup.add_argument("--tensorflow", metavar="VERSION",
                       help="with --plan: plan for this TensorFlow instead of the installed one")
    setup.set_defaults(run=_setup)
    doctor = commands.add_parser("doctor", help="what is built, against which TensorFlow, and the collectives a "
                                 "launch here would get", description="Reports the TensorFlow, the Horovod build "
                                 "and the direct MPI ops in this environment, and which collectives each launcher "
                                 "would get (--collectives auto) and why; exit status 1 when something is missing.")
    doctor.set_defaults(run=_doctor)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except Refused as err:
        print(f"[{args.command}] error: {err}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    except Failed as err:
        print(f"[{args.command}] error: {err}", file=sys.stderr, flush=True)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
