"""train.py's application, built on the library above it.

``cli`` turns the command line (and a YAML file, or a resumed run's saved
options) into one frozen ``TrainConfig``; ``trainer`` runs the job that
config describes. ``data`` and ``models`` are the datasets and models
train.py offers. It may import every part of the library; the library
(``training``, ``strategies``, ``callbacks``, ``checkpoint``, ...) never imports
this package (``tests/unit/test_import_graph.py``).
"""
