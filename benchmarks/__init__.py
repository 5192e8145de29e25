"""hvd_easgd's benchmarks, in four parts: ``python -m benchmarks <subcommand>`` runs them (``__main__.py``).

* ``suite/``: the strategy comparison itself: the configurations, one launch of them all interleaved,
  the runner every program launches through, the rated-link runs and the suite's report.
* ``costmodel/``: what feeds the library's cost model (``hvd_easgd/choosing/cost_model.py``) here, its checks
  against the virtual cluster and two papers, and the projection pages.
* ``accuracy/``: what a strategy does to a model's quality and to its time to a target, and the pages
  rendered from those runs.
* ``studies/``: one-off investigations, each with its own command (``studies/README.md``).

The allowed imports between the parts point one way, studies → accuracy → costmodel → suite →
hvd_easgd (a part may skip a layer, never go back up); ``tests/unit/test_benchmark_parts.py``
checks it. ``data/`` holds the committed measurements and tables the cost model reads,
``figures/`` the PNGs the reports write (served as ``figures/`` by the docs site).
"""
