"""The route tests' shared scenario: a square of four appliances with one link slowing down."""

import numpy as np
import pyarrow as pa

from appliance.ops.telemetry import routes_job
from appliance.ops.telemetry.synth import synthetic_windows

T0 = 1_735_732_800 * 1_000_000_000
S = 1_000_000_000
LINKS = [("a", "b"), ("b", "a"), ("b", "d"), ("d", "b"),
         ("a", "c"), ("c", "a"), ("c", "d"), ("d", "c")]
WINDOWS = 20
DEGRADED_FROM = 10


def scenario(first=0, last=WINDOWS):
    """a-b, b-d: 100 us, a-c: 150 us, c-d: 170 us (no ties); b->d goes to 1 ms at window 10;
    c->a loses 2 % of its probes throughout."""
    base = {"ab": 100.0, "ba": 100.0, "bd": 100.0, "db": 100.0, "ac": 150.0, "ca": 150.0,
            "cd": 170.0, "dc": 170.0}
    lat = np.array([[base[u + v]] * WINDOWS for u, v in LINKS])
    lat[LINKS.index(("b", "d")), DEGRADED_FROM:] = 1_000.0
    loss = np.zeros_like(lat)
    loss[LINKS.index(("c", "a")), :] = 0.02
    table = synthetic_windows(LINKS, lat, start_ns=T0, loss=loss, seed=11)
    starts = table["window_start_ns"].to_numpy()
    keep = (starts >= T0 + first * S) & (starts < T0 + last * S)
    return table.filter(pa.array(keep))


def job(spark, directory, **kw):
    return routes_job.compute(spark, directory, eval_ns=2 * S, margin=0.2, k=2, **kw)


def routes_of(doc):
    return {(r["source"], r["destination"]): (r["path"], r["backup"]) for r in doc["routes"]}
