"""The cost model's inputs, checks and reports; its formulas are the library's (``hvd_easgd/choosing/cost_model.py``).

* inputs: the traffic table from the strategies' own hooks (``traffic_table.py``), this machine's
  calibration and the virtual cluster's token-bucket links (``calibration.py``), the models it
  projects (``workloads.py``) and the compute a gradient format adds (``format_compute.py``);
* checks: against the virtual cluster's measured step times (``cluster_check.py``,
  ``python -m benchmarks validate``), the Horovod paper's table (``paper_check.py``) and Streaming
  DiLoCo's simulation (``diloco_paper_check.py``);
* reports: ``python -m benchmarks project`` (``projection.py``) and its pages (``projection_report.py``).

May import: ``hvd_easgd`` (the formulas, ``link_probe``) and ``benchmarks.suite`` (the validation
runs the suite across rated links; the table builds the suite's configurations). Not ``accuracy``
or ``studies``.
"""
