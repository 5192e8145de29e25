"""Runs under `horovodrun -np 2`: several Keras-guide scripts (guide_*.py) one after the other in ONE
launch, so that each rank imports TensorFlow once for them all (4-5 s of CPU per rank on the 2-core
test machine), not once per guide. tests/multiproc/test_keras_guides.py asserts on what each wrote.

Usage: guides.py OUT NAME...; guide NAME runs as its own process would run it: as __main__, with
sys.argv [guide_NAME.py, OUT/NAME], so it writes OUT/NAME/rank<r>.json.

Between two guides, Keras starts afresh as in a new process (clear_session: its global state and
layer names; the float32 policy), and every guide seeds its own random sources and calls
hvd_easgd.init(), which returns the communicator the first one made. A guide that raises ends the
launch after this rank's line naming it and the traceback, with status 1: the failure its own launch
had, and no later guide runs.
"""
import os
import runpy
import sys
import traceback

import keras

from hvd_easgd import _compat

OUT = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))

for name in sys.argv[2:]:
    path, directory = os.path.join(HERE, f"{name}.py"), os.path.join(OUT, name)
    os.makedirs(directory, exist_ok=True)
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy("float32")
    sys.argv = [path, directory]
    try:
        runpy.run_path(path, run_name="__main__")
    except Exception:  # noqa: BLE001  its own process would have ended here, with this traceback
        print(f"guides.py: rank {_compat.launcher_rank()}: {name} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        sys.exit(1)
