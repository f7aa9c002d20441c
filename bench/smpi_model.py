#!/usr/bin/python3
"""The alpha-beta model of the MPI exchanges' communication time, checked against SimGrid's
SMPI (bench/smpi_exchange.sh's JSON lines). A message of s bytes on a path of latency alpha
and bandwidth beta takes

    lat_factor(s) alpha + s / (bw_factor(s) beta)

where the factors are SMPI's piecewise calibration (its defaults, SimGrid 3.32's
`smpi/lat-factor` and `smpi/bw-factor`: a message under 1.4 KB pays about 2 alpha and reaches
a third to four fifths of the link; one of 64 KiB or more pays 11.6 alpha, the rendezvous). The
plain model (both factors 1, `--plain`) is what bench/cost_model.py charges; the table shows
how far it falls from SMPI. alpha is the route's latency (host link, backbone, host link),
beta the host link's bandwidth; a shared backbone slower than the ranks' links together
divides among the ranks.

    dense      Open MPI's choice for 2^18 float32 values (SMPI's ompi selector picks rab_rdb,
               measured: Rabenseifner's recursive halving, then recursive doubling): for
               s_i = 4N / 2^i, i = 1 .. log2 P, twice sum(message(s_i)) (P a power of 2)
    two hops   each phase of the schedule (bench/smpi_exchange.cpp records the messages each
               rank posts between two MPI_Waitall calls): message(mean size) + (the most
               bytes a rank posted - one mean message) / (bw_factor beta), phases in sequence

Rows of other modes, and runs with the ranks' compute (COMPUTE=1), are shown without a
model. With --check TOL, exits 1 when a modelled row is further than TOL (relative) from SMPI.

    RANKS="16 64 256" MODES="dense reduce-two-hop" bench/smpi_exchange.sh > runs.jsonl
    /usr/bin/python3 bench/smpi_model.py runs.jsonl [--check 0.25] [--plain]
"""
import argparse
import json
import math
import os
import re
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
# SimGrid 3.32's defaults (smpirun --help-cfg: smpi/lat-factor, smpi/bw-factor): size threshold
# in bytes, factor; the first threshold at or below a message's size applies.
LAT_FACTOR = "65472:11.6436;15424:3.48845;9376:2.59299;5776:2.18796;3484:1.88101;1426:1.61075;732:1.9503;257:1.95341;0:2.01467"
BW_FACTOR = "65472:0.940694;15424:0.697866;9376:0.58729;5776:1.08739;3484:0.77493;1426:0.608902;732:0.341987;257:0.338112;0:0.812084"

UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def piecewise(text):
    pairs = [tuple(float(x) for x in item.split(":")) for item in text.split(";")]
    return sorted(pairs, reverse=True)


def factor(table, size):
    for threshold, value in table:
        if size >= threshold:
            return value
    return table[-1][1]


def quantity(text, unit):
    """'10Gbps' -> bytes/s, '5us' -> s."""
    m = re.fullmatch(r"([0-9.]+)\s*([kKmMgGtT]?)(bps|Bps|s|us|ms|ns)", text.strip())
    if not m:
        sys.exit(f"smpi_model: cannot read {text!r} as a {unit}")
    value, prefix, kind = float(m.group(1)), m.group(2).lower(), m.group(3)
    if kind == "bps":
        return value * UNITS[prefix] / 8
    if kind == "Bps":
        return value * UNITS[prefix]
    return value * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[kind]


class Platform:
    def __init__(self, path):
        cluster = ET.parse(path).getroot().find(".//cluster")
        if cluster is None:
            sys.exit(f"smpi_model: {path} holds no <cluster>")
        self.beta = quantity(cluster.get("bw"), "bandwidth")
        self.link_latency = quantity(cluster.get("lat"), "latency")
        self.backbone = quantity(cluster.get("bb_bw"), "bandwidth") if cluster.get("bb_bw") else math.inf
        self.backbone_latency = quantity(cluster.get("bb_lat", "0us"), "latency")
        self.alpha = 2 * self.link_latency + self.backbone_latency


class Model:
    def __init__(self, platform, plain=False):
        self.p = platform
        self.lat = [(0.0, 1.0)] if plain else piecewise(LAT_FACTOR)
        self.bw = [(0.0, 1.0)] if plain else piecewise(BW_FACTOR)

    def rate(self, size, ranks):
        """A rank's bytes per second for messages of size bytes, all ranks sending at once."""
        return min(factor(self.bw, size) * self.p.beta, self.p.backbone / ranks)

    def message(self, size, ranks):
        return factor(self.lat, size) * self.p.alpha + size / self.rate(size, ranks)

    def dense(self, n, ranks):
        if ranks & (ranks - 1):
            return None  # rab_rdb adds a step for the ranks over a power of 2: not modelled
        steps = int(math.log2(ranks))
        return 2 * sum(self.message(4 * n / 2**i, ranks) for i in range(1, steps + 1))

    def two_hop(self, phases, ranks):
        total = 0.0
        for messages, most_bytes, mean_size in phases:
            if messages == 0:
                continue
            # The first message's latency, then the rest of the rank's bytes at the link's rate.
            total += self.message(mean_size, ranks) + max(most_bytes - mean_size, 0) / self.rate(mean_size, ranks)
        return total

    def predict(self, run):
        if run.get("compute"):
            return None  # the ranks' compute, timed on the machine that ran SMPI: not modelled
        if run["mode"] == "dense":
            return self.dense(run["n"], run["ranks"])
        if run["mode"].startswith("reduce-two-hop") and run.get("phases"):
            return self.two_hop(run["phases"], run["ranks"])
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", help="JSON lines of bench/smpi_exchange.sh")
    parser.add_argument("--platforms", default=os.path.join(HERE, "smpi"),
                        help="where cluster-PLATFORM.xml lie (default: bench/smpi)")
    parser.add_argument("--plain", action="store_true", help="without SMPI's factors (both 1)")
    parser.add_argument("--check", type=float, default=None, metavar="TOL",
                        help="exit 1 when a modelled row is further than TOL from SMPI")
    args = parser.parse_args()
    runs = [json.loads(line) for line in open(args.runs) if line.strip().startswith("{")]
    if not runs:
        sys.exit(f"smpi_model: no runs in {args.runs}")
    print("| link | P | mode | gradient | SMPI ms | model ms | model / SMPI |")
    print("|---|---|---|---|---|---|---|")
    models = {name: Model(Platform(os.path.join(args.platforms, f"cluster-{name}.xml")), args.plain)
              for name in sorted({run["platform"] for run in runs})}
    worst, misses = 0.0, []
    for run in runs:
        predicted = models[run["platform"]].predict(run)
        ratio = None if predicted is None else predicted * 1e3 / run["sim_ms"]
        shown = "—" if predicted is None else f"{predicted * 1e3:.3f}"
        print(f"| {run['platform']} | {run['ranks']} | {run['mode']} | {run['gradient']} | {run['sim_ms']:.3f} | "
              f"{shown} | {'—' if ratio is None else f'{ratio:.2f}'} |")
        if ratio is not None:
            error = abs(ratio - 1)
            worst = max(worst, error)
            if args.check is not None and error > args.check:
                misses.append(f"{run['mode']} at {run['ranks']} ranks on {run['platform']}: model "
                              f"{predicted * 1e3:.3f} ms, SMPI {run['sim_ms']:.3f} ms")
    print(f"\nlargest relative error of a modelled row: {worst:.2f}")
    if misses:
        sys.exit("smpi_model: beyond the tolerance:\n  " + "\n  ".join(misses))


if __name__ == "__main__":
    main()
