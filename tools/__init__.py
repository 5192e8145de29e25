"""Developer tools: the environment set-up script and the virtual cluster (vcluster.py)."""
