"""The training benchmark runs and measures what it claims, on the tiny model.
  unshaped  every method completes, a sparse payload is a fraction of the dense gradient,
            the converge mode stops at its target, the report renders.
  shaped    scripts/train_speed.sh shapes a private loopback to 10 Mbit/s, where the dense
            all-reduce must be several times slower than sidco-e (exit 77 without root or
            unshare -n)."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
# The package under test: the build's, as the test's PYTHONPATH names it.
PACKAGE = os.environ["PYTHONPATH"].split(os.pathsep)[0]
BENCH = [sys.executable, os.path.join(ROOT, "bench", "train_speed.py"), "--package", PACKAGE]
QUICK = ["--model", "tiny", "--ranks", "2", "--warmup", "2", "--steps", "4", "--interleave", "2", "--seconds", "1",
         "--rounds", "1", "--timeout", "240"]


def rows(path):
    with open(path) as f:
        return {r["method"]: r for r in map(json.loads, f)}


def refusals():
    """Counts below 1 and densities outside (0, 1] end the run before any rank starts (exit 2,
    naming the argument), instead of ranks that never start or a division by zero in each."""
    for args, text in ((["--ranks", "0"], "argument --ranks: 0 is below 1"),
                       (["--eval-every", "0"], "argument --eval-every: 0 is below 1"),
                       (["--density", "0"], "argument --density: 0.0 is outside (0, 1]")):
        run = subprocess.run(BENCH + ["step"] + args, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and text in run.stderr, (args, run.returncode, run.stderr)


def unshaped(tmp):
    refusals()
    step = os.path.join(tmp, "step.jsonl")
    subprocess.run(BENCH + ["step", "--methods", "none,powersgd,sidco-e,top-k", "--json", step] + QUICK, check=True)
    got = rows(step)
    assert set(got) == {"none", "powersgd", "sidco-e", "top-k"}, got
    for method, r in got.items():
        assert "error" not in r, (method, r)
        assert r["ms"] > 0 and r["floor_ms"] > 0 and r["steps"] >= 4, (method, r)
    dense = 4 * got["none"]["parameters"]
    for method in ("sidco-e", "top-k"):
        # δ = 0.01: at most capacity (1.25 δ n) entries of 8 bytes, and headers.
        assert got[method]["payload_bytes"] <= 0.1 * dense + 64 * 16, (method, got[method]["payload_bytes"], dense)
        assert got[method]["over_capacity"] == 0, got[method]
    converge = os.path.join(tmp, "converge.jsonl")
    subprocess.run(BENCH + ["converge", "--model", "tiny", "--methods", "sidco-e", "--max-steps", "20",
                            "--eval-every", "5", "--eval-words", "2000", "--target", "1e9", "--timeout", "240",
                            "--json", converge],
                   check=True)
    r = rows(converge)["sidco-e"]
    assert r["reached_step"] == 5 and len(r["curve"]) == 1, r
    report = subprocess.run(BENCH[:2] + ["report", step, converge], check=True, capture_output=True, text=True).stdout
    assert "| sidco-e |" in report and "steps to perplexity" in report, report
    print("unshaped: every method ran; payloads", {m: int(got[m].get("payload_bytes", 0)) for m in got},
          "of", dense, "dense bytes")
    return 0


def shaped(tmp):
    shaped = os.path.join(tmp, "shaped")
    # A few steps each: at 10 Mbit/s a dense step takes seconds.
    env = dict(os.environ, MODELS="tiny", RANKS="2", RATES="10mbit", ROUNDS="1", METHODS="none,sidco-e",
               CONVERGE="0", PNG="", PACKAGE=PACKAGE,
               STEP_ARGS="--warmup 1 --steps 3 --min-steps 3 --interleave 3 --seconds 5")
    run = subprocess.run(["bash", os.path.join(ROOT, "scripts", "train_speed.sh"), shaped], env=env)
    if run.returncode == 77:
        return 77  # not root, or unshare -n not permitted
    assert run.returncode == 0, run.returncode
    got = rows(os.path.join(shaped, "step.jsonl"))
    none, sidco = got["none"], got["sidco-e"]
    # 3.6 MB dense per step and rank at 10 Mbit/s is seconds on the wire; sidco-e's tens of kB are not.
    assert none["link_bytes"] >= 4 * none["parameters"], none
    assert none["ms"] > 4 * sidco["ms"], (none["ms"], sidco["ms"])
    print(f"shaped 10mbit: none {none['ms']:.0f} ms/step, sidco-e {sidco['ms']:.0f} ms/step")
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit({"unshaped": unshaped, "shaped": shaped}[sys.argv[1]](tmp))
