"""What the cost model (``hvd_easgd/choosing/cost_model.py``) is fed on this machine: the committed traffic table,
the named link rates the projection reports, and the virtual cluster's token-bucket links.

Standard library only, no TensorFlow. The formulas live in the library; the calibration against this
machine's virtual cluster (``TokenBucketLink``, validated by ``python -m benchmarks validate``) and the
table the benchmarks project from stay here.
"""
import json
import pathlib

TABLE_PATH = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results" / "traffic" / "traffic.json"
LINKS = {"100mbit": 100e6 / 8, "1gbit": 1e9 / 8, "10gbit": 10e9 / 8, "25gbit": 25e9 / 8, "100gbit": 100e9 / 8,
         "400gbit": 400e9 / 8}


class TokenBucketLink:
    """A link shaped by tc tbf, as the virtual cluster's are (``tools/vcluster.py``).

    tbf sends at ``rate`` (bytes/s) but keeps a bucket of ``bucket`` bytes,
    which fills at that rate while the host sends nothing; the bytes it
    covers leave at the line's own rate (``line``: the veth pair and the
    copies, what the α sweep's small messages see). Beyond the bucket, the
    rate a transfer gets depends on its size, as measured here:

    * a burst of up to ``SHORT_BURST`` bytes gets the tbf's rate. The digits
      CNN's bursts (13–230 KB) ran at it at 10 Mbit/s, 100 Mbit/s and 1 Gbit/s:
      such a transfer ends within a few round trips of TCP's slow start, and
      a loss in it costs a fast retransmit while the queue keeps the link busy;
    * a longer one gets the rate the link probe measured (``probe``: 32 MB,
      4 MB at 10 Mbit/s). That is not the tbf's: plain TCP crosses it at 94 %
      of its rate, both ways at once, and the tbf drops nothing. It is Open
      MPI's TCP transport, which with its one connection a pair of ranks
      crossed at 48–66 % (and 49–95 % at 2 × 2, by launch and by pattern), and
      with two (``btl_tcp_links``) at 76–96 %
      (``benchmarks/studies/link_transport.py``). The validation launches use
      two, so that every long transfer of a launch shares the probe's rate.

    A real link has neither the bucket nor this queue: the projection uses the
    plain (α, B) of ``comm_time``.
    """

    SHORT_BURST = 1e6

    def __init__(self, rate, bucket, probe, line=float("inf")):
        self.rate, self.bucket, self.probe, self.line = rate, bucket, probe, line

    def bandwidth(self, burst):
        """The rate a burst of ``burst`` bytes gets: the tbf's up to ``SHORT_BURST``, else the probe's."""
        return self.rate if burst <= self.SHORT_BURST else self.probe

    def credit(self, burst, period, idle):
        """Seconds per step the bucket saves a ``burst`` sent every ``period`` steps after ``idle`` seconds
        of not sending: it holds min(bucket, rate·idle, burst) bytes, which leave at the line's rate."""
        tokens = min(self.bucket, self.rate * idle, burst)
        return tokens * (1 / self.bandwidth(burst) - 1 / self.line) / period


def load_table(path=TABLE_PATH):
    return json.loads(pathlib.Path(path).read_text())
