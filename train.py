"""The main job: `horovodrun -np 2 python train.py [options]` (see --help)."""
from hvd_easgd import _compat

# Here, not in hvd_easgd.app: users' own scripts reach the app's modules too (hvd_easgd.data,
# hvd_easgd.models) and keep Keras's galleries and scikit-learn wrappers; only train.py's ranks go without.
_compat.import_keras_for_ranks()

from hvd_easgd.app.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
