#!/usr/bin/python3
"""What users feel: time per training step, and time to a target test perplexity, of a
data-parallel job (DDP over gloo, one thread per rank) whose network is slow. Run it
through scripts/train_speed.sh, which shapes the loopback of a private network namespace
with tc (as root; nothing leaves the namespace) and runs every mode below.

  step      ms per step of each method (medians after warm-up) and of the compute-only
            floor (DDP under no_sync), in the same processes, in alternating blocks; bytes per step on the link (the
            namespace's loopback counter, TCP/IP included) and their wire time at --rate;
            compress and decode ms per step (the hook's statistics) and the ms spent inside
            the hook's calls (hook_ms: what backward waits for); achieved/target
            density per step and the capacity.
  converge  training wall time (evaluation excluded) until the test perplexity reaches
            --target, evaluated every --eval-every steps.
  report    markdown tables and a PNG from the JSON the other modes wrote.

Methods: compute (every step without communication), ddp-local (DDP with a hook that
sends nothing: DDP's own cost), none (DDP's dense all-reduce), powersgd (torch's hook, rank
--powersgd-rank, one bucket and its own process group: gloo aborts it otherwise), or a
sidco_torch method (sidco-e, top-k, dgc, ...), optionally with the hook's exchange
(sidco-e:reduce, sidco-e:allgather; without it the hook's "auto"), or with a compact
wire (sidco-e:compact: bfloat16 values, coded indices; sidco-e:compact8: 8-bit values, the
all-gather's), the hook's auto exchange (the all-gather at 2 ranks; from 3 both timed in the
first sparse steps, which the warm-up is extended to cover), or both
(sidco-e:reduce/compact); sidco-e:f1.1 gives the auto exchange a steps factor of 1.1
(State(reduce_steps_factor=1.1)). NAME@previous runs NAME with the package
in --previous (an earlier build's python directory), for before/after comparisons.
"""
import argparse
import contextlib
import json
import math
import os
import queue
import re
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import wikitext  # noqa: E402
from example_cli import count, density  # noqa: E402
from loopback import free_port  # noqa: E402

MODELS = {
    "lstm": dict(kind="lstm", dim=342, layers=2, batch=20, bptt=35, lr=1.0, clip=0.25),  # 11.3M parameters
    "gpt": dict(kind="gpt", dim=256, layers=4, batch=8, bptt=64, lr=0.1, clip=1.0),  # 10.3M
    "tiny": dict(kind="lstm", dim=32, layers=1, batch=8, bptt=16, lr=1.0, clip=0.25),  # for smoke runs
}


def rate_bits(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(f"rate {rate!r}: use e.g. 100mbit, 1gbit, 10gbit")


def link_counters():
    """(bytes sent on this network namespace's loopback, TCP segments retransmitted), from
    /proc (per namespace, unlike /sys, which shows the namespace /sys was mounted in); None
    outside Linux."""
    try:
        with open("/proc/net/dev") as f:
            sent = next(int(line.split(":", 1)[1].split()[8]) for line in f if line.strip().startswith("lo:"))
        with open("/proc/net/snmp") as f:
            tcp = [line.split() for line in f if line.startswith("Tcp:")]
        retransmitted = int(tcp[1][tcp[0].index("RetransSegs")])
        return sent, retransmitted
    except (OSError, StopIteration, ValueError, IndexError):
        return None


class Job:
    """One method's ranks: model, DDP with the method's hook, optimizer, batches."""

    def __init__(self, a, method, rank):
        self.a, self.method, self.rank = a, method, rank
        spec = MODELS[a.model]
        shard, self.test, vocab = wikitext.corpus(rank, a.ranks, a.eval_words)
        self.batches = wikitext.Batches(shard, spec["batch"], spec["bptt"])
        self.bptt, self.clip = spec["bptt"], spec["clip"]
        torch.manual_seed(a.seed)
        self.model = wikitext.make_model(spec["kind"], vocab, spec["dim"], spec["layers"])
        name, _, variant = method.partition("@")
        # sidco-e:reduce, sidco-e:allgather (default: the hook's auto); sidco-e:compact and
        # sidco-e:plain: that wire (default: the hook's auto); sidco-e:reduce/compact: both
        name, _, choices = name.partition(":")
        choices = choices.split("/") if choices else []
        # sidco-e:f1.1: auto's steps factor for this model (State(reduce_steps_factor=1.1))
        factors = [c for c in choices if re.fullmatch(r"f[0-9.]+", c)]
        choices = [c for c in choices if c not in factors]
        named = {"wire": c for c in choices if c in ("compact", "compact8", "plain")}
        named.update({"exchange": c for c in choices if c not in ("compact", "compact8", "plain")})
        named.update({"reduce_steps_factor": float(c[1:]) for c in factors})
        self.state, self.sidco = None, name not in ("compute", "none", "powersgd", "ddp-local")
        if name == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
            dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
            self.ddp = nn.parallel.DistributedDataParallel(self.model, bucket_cap_mb=1024)
            self.state = powersgd.PowerSGDState(process_group=dist.new_group(), matrix_approximation_rank=a.powersgd_rank,
                                                start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
            self.ddp.register_comm_hook(self.state, powersgd.powerSGD_hook)
        else:
            self.ddp = nn.parallel.DistributedDataParallel(self.model, bucket_cap_mb=a.bucket_mb)
        if name == "ddp-local":  # DDP's own machinery: a hook that sends nothing
            def local(state, bucket):
                future = torch.futures.Future()
                future.set_result(bucket.buffer())
                return future
            self.ddp.register_comm_hook(None, local)
        if self.sidco:
            import sidco_torch
            self.state = sidco_torch.State(method=name, density=a.density, start_iter=2, **named)
            self.hook_seconds = 0.0  # this step's time inside the hook's calls (what backward waits for)

            def timed(state, bucket):
                began = time.perf_counter()
                try:
                    return sidco_torch.hook(state, bucket)
                finally:
                    self.hook_seconds += time.perf_counter() - began
            if hasattr(sidco_torch, "register"):
                sidco_torch.register(self.ddp, self.state, comm_hook=timed)
            else:  # an earlier package
                self.ddp.register_comm_hook(self.state, timed)
        self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=spec["lr"], momentum=0.9)
        self.parameters = sum(p.numel() for p in self.model.parameters())

    def step(self, communicate=True):
        """One training step, without any communication when not communicate (or for the
        compute method); its seconds and, with the hook, its statistics."""
        communicate = communicate and self.method != "compute"
        x, y = self.batches.next()
        self.hook_seconds = 0.0
        started = time.perf_counter()
        with contextlib.nullcontext() if communicate else self.ddp.no_sync():
            out, hidden = self.ddp(x, self.batches.hidden)
            self.batches.hidden = hidden
            loss = nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
            self.optimizer.zero_grad()
            loss.backward()
        nn.utils.clip_grad_norm_(self.ddp.parameters(), self.clip)
        self.optimizer.step()
        row = {"seconds": time.perf_counter() - started, "loss": loss.item()}
        if self.sidco and communicate:
            stats = list(self.state.stats().values())
            row["compress"] = sum(s["compress_seconds"] for s in stats)
            row["decode"] = sum(s.get("decode_seconds", 0.0) for s in stats)
            row["hook"] = self.hook_seconds
            row["selected"] = sum(s["selected"] for s in stats)
            row["size"] = sum(s["size"] for s in stats)
            row["capacity"] = sum(s.get("capacity", s["size"]) for s in stats)
            row["sparse"] = all(s["path"] == "sparse" for s in stats)
            row["payload"] = sum(s["bytes_sent"] for s in stats)
            row["buckets"] = len(stats)
        return row


# Tensors made here and handed to gloo, kept for the process's life: a gloo worker that drops
# the last reference to one takes the GIL to free it, and torch 1.13 joins those workers
# holding the GIL when the process group goes (the hook's State keeps its own for that reason).
_handed_to_gloo = []


def agreed(value, src=0):
    """value as rank src has it, on every rank."""
    t = torch.tensor([float(value)], dtype=torch.float64)
    _handed_to_gloo.append(t)
    dist.broadcast(t, src)
    return t.item()


def run_step(job, a):
    """Warm-up, then blocks of a.interleave compute-only steps (DDP under no_sync: this
    job's own floor, in the same processes) alternating with as many steps of the method.
    As many blocks as fit in a.seconds (at least a.min_steps method steps), decided by
    rank 0 so that every rank runs the same steps."""
    rows = [job.step() for _ in range(a.warmup)]
    # exchange="auto" among 3 or more ranks and wire="auto" time their choices in the first
    # sparse steps: the timed blocks start once they chose (every rank at the same step).
    probing = getattr(job, "state", None)
    probes = hasattr(probing, "auto_exchange") and (
        (probing.exchange == "auto" and dist.get_world_size() >= 3) or getattr(probing, "wire", "plain") == "auto")
    while probes and probing.auto_exchange() is None and len(rows) < a.warmup + 60:
        rows.append(job.step())
    mean = statistics.mean(r["seconds"] for r in rows[-3:])
    steps = max(a.min_steps, min(a.steps, int(a.seconds / max(mean, 1e-3))))
    blocks = int(agreed(max(1, math.ceil(steps / a.interleave))))
    floor, timed, sent, retransmitted = [], [], 0, 0
    for _ in range(blocks):
        dist.barrier()
        floor += [job.step(communicate=False) for _ in range(a.interleave)]
        dist.barrier()
        before = link_counters()
        timed += [job.step() for _ in range(a.interleave)]
        after = link_counters()
        if before is not None:
            sent += after[0] - before[0]
            retransmitted += after[1] - before[1]
    out = {"steps": timed, "floor": floor, "parameters": job.parameters}
    if hasattr(probing, "auto_exchange") and probing.auto_exchange() is not None:
        out["auto_exchange"] = probing.auto_exchange()
    if link_counters() is not None:
        out["link_bytes_per_step"] = sent / len(timed)
        out["retransmits_per_step"] = retransmitted / len(timed)
    return out


def run_converge(job, a):
    """Steps until the test perplexity reaches a.target; the clock stops while evaluating."""
    trained, curve = 0.0, []
    for step in range(1, a.max_steps + 1):
        trained += job.step()["seconds"]
        if step % a.eval_every == 0 or step == a.max_steps:
            perplexity = wikitext.evaluate(job.model, job.test, job.bptt) if job.rank == 0 else 0.0
            perplexity = agreed(perplexity)
            curve.append({"step": step, "seconds": trained, "perplexity": perplexity})
            if perplexity <= a.target:
                break
    reached = next((p for p in curve if p["perplexity"] <= a.target), None)
    return {"curve": curve, "reached_step": reached and reached["step"], "reached_seconds": reached and reached["seconds"]}


def worker(rank, a, method, port, package, results):
    try:
        sys.path.insert(0, package)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        torch.set_num_threads(a.threads)
        dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
        job = Job(a, method, rank)
        out = run_step(job, a) if a.mode == "step" else run_converge(job, a)
        dist.barrier()
        # Results first: a teardown that stalls then costs the parent's join, not the run.
        results.put((rank, True, out))
        dist.destroy_process_group()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_method(a, method):
    """The method on a.ranks processes; rank 0's result (retried once if a rank died)."""
    package = a.previous if method.endswith("@previous") else a.package
    for attempt in range(2):
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        port = free_port()
        # OpenBLAS starts a thread per core unless told: with one rank per core they would
        # fight (torch.set_num_threads does not reach the system BLAS).
        env = dict(OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY="PASSIVE")
        os.environ.update(env)
        procs = [ctx.Process(target=worker, args=(r, a, method, port, package, results)) for r in range(a.ranks)]
        for p in procs:
            p.start()
        got, error = {}, None
        deadline = time.time() + a.timeout
        while len(got) < a.ranks and error is None:
            try:
                rank, ok, value = results.get(timeout=5)
            except queue.Empty:
                if time.time() > deadline:
                    error = "timed out"
                elif any(p.exitcode not in (None, 0) for p in procs):
                    error = f"a rank died (exit codes {[p.exitcode for p in procs]})"
                continue
            if ok:
                got[rank] = value
            else:
                error = value
        for rank, p in enumerate(procs):
            p.join(5)
            if p.is_alive():
                print(f"{method}: rank {rank} still running 5 s after the results: killed", file=sys.stderr, flush=True)
                p.kill()
        if error is None:
            return got[0]
        print(f"{method}: attempt {attempt + 1} failed: {error}", file=sys.stderr, flush=True)
    return {"error": error}


def summarize_step(method, out, a):
    if "error" in out:
        return {"method": method, "error": out["error"][-300:]}
    rows = out["steps"]
    s = {"method": method, "steps": len(rows), "ms": 1e3 * statistics.median(r["seconds"] for r in rows),
         "floor_ms": 1e3 * statistics.median(r["seconds"] for r in out["floor"]), "parameters": out["parameters"]}
    if "auto_exchange" in out:
        chosen = out["auto_exchange"]
        s["auto_exchange"] = chosen["chosen"] + (f"/{chosen['wire']}" if "wire" in chosen else "")
        if "seconds" in chosen:  # what the probe measured, per "exchange/wire" (ranks' mean of medians)
            s["auto_ms"] = {pair: round(1e3 * t, 1) for pair, t in chosen["seconds"].items()}
        if "steps_factor" in chosen:  # the f it weighed the reduce exchange's time by
            s["steps_factor"] = chosen["steps_factor"]
    if "link_bytes_per_step" in out:
        s["link_bytes"] = out["link_bytes_per_step"]
        s["retransmits"] = out["retransmits_per_step"]
        s["wire_ms"] = 1e3 * 8 * s["link_bytes"] / rate_bits(a.rate)
    if "compress" in rows[0]:
        sparse = [r for r in rows if r.get("sparse")]
        s["compress_ms"] = 1e3 * statistics.median(r["compress"] for r in rows)
        s["decode_ms"] = 1e3 * statistics.median(r["decode"] for r in rows)
        s["hook_ms"] = 1e3 * statistics.median(r["hook"] for r in rows)
        if sparse:
            ratios = sorted(r["selected"] / (a.density * r["size"]) for r in sparse)
            s["density_p5"] = ratios[int(0.05 * (len(ratios) - 1))]
            s["density_p50"] = ratios[len(ratios) // 2]
            s["density_p95"] = ratios[int(math.ceil(0.95 * (len(ratios) - 1)))]
            s["over_capacity"] = sum(r["selected"] > r["capacity"] for r in sparse)
            s["payload_bytes"] = statistics.median(r["payload"] for r in sparse)
            s["buckets"] = max(r["buckets"] for r in sparse)
    return s


def main():
    if sys.argv[1:2] == ["report"]:
        sys.path.insert(0, HERE)
        import train_speed_report
        return train_speed_report.main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["step", "converge"], help="or report FILES... [--png PATH]")
    ap.add_argument("--methods", default="none,powersgd,sidco-e,top-k")
    ap.add_argument("--density", type=density, default=0.01)
    ap.add_argument("--ranks", type=count, default=2)
    ap.add_argument("--model", choices=sorted(MODELS), default="lstm")
    ap.add_argument("--rate", default="1gbit", help="the link's rate, as given to tc (for the wire time)")
    ap.add_argument("--rounds", type=count, default=2, help="step mode: the method list this many times, interleaved")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=count, default=30)
    ap.add_argument("--min-steps", type=count, default=4)
    ap.add_argument("--interleave", type=count, default=4,
                    help="step mode: compute-only and method steps alternate in blocks of this many")
    ap.add_argument("--seconds", type=float, default=40, help="step mode: timed steps per method at most this long")
    ap.add_argument("--target", type=float, default=600.0, help="converge mode: test perplexity to reach")
    ap.add_argument("--max-steps", type=count, default=600)
    ap.add_argument("--eval-every", type=count, default=25)
    ap.add_argument("--eval-words", type=count, default=10000)
    ap.add_argument("--powersgd-rank", type=count, default=2)
    ap.add_argument("--threads", type=count, default=1)
    ap.add_argument("--bucket-mb", type=float, default=25.0,
                    help="DDP's bucket_cap_mb (its default 25; PowerSGD keeps one bucket)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--package", default=os.path.join(HERE, "..", "build", "python"))
    ap.add_argument("--previous", default="", help="an earlier build's python directory, for NAME@previous")
    ap.add_argument("--json", default="", help="append the results here")
    a = ap.parse_args()
    a.package = os.path.abspath(a.package)
    methods = a.methods.split(",")
    results = []
    rounds = a.rounds if a.mode == "step" else 1
    for r in range(rounds):
        for method in methods:
            out = run_method(a, method)
            if a.mode == "step":
                row = summarize_step(method, out, a)
            else:
                row = {"method": method, **out}
            row.update(mode=a.mode, round=r, ranks=a.ranks, rate=a.rate, model=a.model, density=a.density,
                       bucket_mb=a.bucket_mb)
            print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
            results.append(row)
    if a.json:
        with open(a.json, "a") as f:
            for row in results:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
