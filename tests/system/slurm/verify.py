"""The checks of `make slurm-check` (tests/system/slurm/check.sh) on what the Slurm jobs did, read from scontrol and
from the files the jobs wrote. Each command prints what it checked and exits 1 naming the first failure.

    verify.py wait RUNS... [--jobs ID...] [--timeout S]   until every job is over (none pending or running)
    verify.py recipe RUNS --stopped NAME --twin DIR       submit_all.sh's run: states, order, outputs, logs,
                                                          the stopped and requeued job against its twin
    verify.py cancelled RUNS                              a run whose first jobs fail: the rest cancelled
    verify.py nodes ONE TWO [--killed]                    a 2-node run of 04 against a 1-process run
"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

OVER = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "DEADLINE",
        "BOOT_FAIL"}


class Failed(Exception):
    pass


def check(ok: bool, message: str) -> None:
    if not ok:
        raise Failed(message)


def tasks(job_id: str) -> list[dict]:
    """scontrol's fields of a job, or of every task of an array job."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        fields = {}
        for token in line.split():
            key, _, value = token.partition("=")
            fields.setdefault(key, value)
        rows.append(fields)
    return rows


def submitted(runs: Path) -> list[dict]:
    """submit_all.sh's record: name, job, after (names), command."""
    with open(runs / "logs" / "submitted.tsv", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def when(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S")


def wait(args) -> None:
    ids = list(args.jobs or []) + [job["job"] for runs in args.runs for job in submitted(Path(runs))]
    deadline = time.monotonic() + args.timeout
    while True:
        states = {task["JobId"]: task["JobState"] for job_id in ids for task in tasks(job_id)}
        left = {k: v for k, v in states.items() if v not in OVER}
        if not left:
            print(f"all {len(states)} jobs are over")
            return
        check(time.monotonic() < deadline, f"after {args.timeout} s, jobs still not over: {left}")
        time.sleep(2)


def recipe(args) -> None:
    runs = Path(args.runs)
    jobs = submitted(runs)
    check(len(jobs) == 16, f"{len(jobs)} jobs in submitted.tsv, not 16")
    by_name = {job["name"]: (job, tasks(job["job"])) for job in jobs}
    for name, (job, rows) in by_name.items():
        for row in rows:
            check(row["JobState"] == "COMPLETED", f"{name}: job {row['JobId']} is {row['JobState']} ({row['Reason']})")
            log = Path(row["StdOut"])
            check(log.is_file(), f"{name}: no log {log}")
            text = log.read_text()
            check("Traceback" not in text, f"{name}: a traceback in {log}")
            check(row["KillOInInvalidDependent"] == "Yes", f"{name}: submitted without --kill-on-invalid-dep=yes")
        for parent in job["after"].split():
            ends = [when(row["EndTime"]) for row in by_name[parent][1]]
            starts = [when(row["StartTime"]) for row in rows]
            check(min(starts) >= max(ends), f"{name} started at {min(starts)}, before {parent} ended at {max(ends)}")
    print(f"16 jobs ({sum(len(rows) for _, rows in by_name.values())} with the array tasks) completed, each after "
          "the jobs it depends on, each log without a traceback")

    outputs = ["saliency.h5", "selfgen.jsonl", "paraphrased.jsonl", "trusted/model.safetensors", "extended/model.safetensors",
               "scoring/model.safetensors", "quality.h5", "clid/model.safetensors", "eval/metrics.json", "eval/report.md"]
    for output in outputs:
        check((runs / output).is_file(), f"no {runs / output}")
    parts = [p.name for p in runs.glob("*.part-*")]
    check(not parts, f"shard parts left after the merges: {parts}")
    metrics = json.loads((runs / "eval" / "metrics.json").read_text())
    check(len(metrics) > 0, "eval/metrics.json is empty")
    print(f"every output is there: {', '.join(outputs)}; no shard part left")

    for name in ("trusted", "extended", "scoring", "selection", "eval"):
        text = Path(by_name[name][1][0]["StdOut"]).read_text()
        check("staged " in text or "already staged" in text, f"{name}: the features were not staged:\n{text[:2000]}")
    stage = Path(args.stage)
    check(not any(stage.iterdir()), f"staged copies left in {stage}: {sorted(p.name for p in stage.iterdir())}")
    print("the training and evaluation jobs read a node-local copy of the features, removed at their end")

    (job, (row,)) = by_name[args.stopped]
    check(int(row["Restarts"]) == 1, f"{args.stopped}: restarted {row['Restarts']} times, not once")
    log = Path(row["StdOut"]).read_text()
    for needed in ("attempt 1;", "stopped by SIGTERM at step", "torchrun: stopped by SIGTERM",
                   "was told to stop (SIGTERM) and saved its checkpoint; requeued", "attempt 2;"):
        check(needed in log, f"{args.stopped}: its log lacks '{needed}':\n{log}")
    check(not any(line.startswith("error:") for line in log.splitlines()), f"{args.stopped}: an error in its log:\n{log}")
    check(log.index("attempt 1;") < log.index("requeued") < log.index("attempt 2;"), f"{args.stopped}: log out of order")
    same_weights(runs / "trusted", Path(args.twin) / "trusted", tolerance=0.0)
    print(f"{args.stopped} was told to stop, requeued once and resumed; its log keeps both attempts; its weights "
          "equal those of an uninterrupted run")


def same_weights(a: Path, b: Path, tolerance: float) -> float:
    """The largest difference of a tensor between two checkpoints, relative to the tensor's largest value, or to
    0.01 for a tensor smaller than that: the attention key biases get no gradient (the softmax ignores them) and
    stay at rounding noise (about 1e-7), which the optimizer's normalised steps move differently under any other
    summation order."""
    from safetensors.torch import load_file

    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    check(wa.keys() == wb.keys(), f"{a} and {b} hold different tensors")
    worst = 0.0
    for key in wa:
        scale = max(float(wb[key].abs().max()), 0.01)
        difference = float((wa[key].double() - wb[key].double()).abs().max()) / scale
        check(difference <= tolerance, f"{key}: {a} and {b} differ by {difference:.3g} of its largest value "
                                       f"(allowed {tolerance:g})")
        worst = max(worst, difference)
    return worst


def cancelled(args) -> None:
    jobs = submitted(Path(args.runs))
    by_name = {job["name"]: tasks(job["job"]) for job in jobs}
    states = {name: {row["JobState"] for row in rows} for name, rows in by_name.items()}
    check(states.pop("convert") == {"FAILED"}, "the 00 convert job did not fail")
    check(states.pop("features") == {"FAILED"}, "the 00 features tasks did not all fail")
    for row in by_name["features"]:
        shard = row["ArrayTaskId"]
        text = Path(row["StdOut"]).read_text()
        line = f"error: clid-00-features shard {shard} of 2 (job {row['ArrayJobId']}_{shard}) failed with exit code 1"
        check(line in text, f"the log of shard {shard} does not name it ('{line}'):\n{text}")
    check(all(s == {"CANCELLED"} for s in states.values()), f"jobs not cancelled: {states}")
    reasons = {row["Reason"] for rows in by_name.values() for row in rows if row["JobState"] == "CANCELLED"}
    check(reasons == {"DependencyNeverSatisfied"}, f"cancelled for {reasons}")
    print(f"the failed 00 jobs name their shards; the {len(states)} jobs after them were cancelled "
          "(DependencyNeverSatisfied), none left pending")


def losses(run: Path) -> dict[int, float]:
    lines = (run / "train_log.jsonl").read_text().splitlines()
    return {record["step"]: record["loss"] for record in map(json.loads, lines)}


def nodes(args) -> None:
    one, two = Path(args.one) / "trusted", Path(args.two) / "trusted"
    (log_file,) = Path(args.two, "logs").glob("clid-04-base-*.out")
    (row,) = tasks(log_file.stem.rsplit("-", 1)[1])  # (the job id ends the log's name)
    check(row["JobState"] == "COMPLETED" and row["Restarts"] == "0",
          f"{args.two}: job {row['JobId']} is {row['JobState']}, requeued {row['Restarts']} times")
    log = Path(row["StdOut"]).read_text()
    check("2 process(es) on cpu" in log, f"{args.two}: not 2 processes:\n{log}")
    if args.killed:  # torchrun restarted the workers, which resumed from the last checkpoint
        check("failed (exitcode: -9)" in log and "resumed from" in log, f"{args.two}: no restart and resume:\n{log}")
    log_one, log_two = losses(one), losses(two)
    check(log_one.keys() == log_two.keys(), f"logged steps differ: {sorted(log_one)} and {sorted(log_two)}")
    worst_step = max(abs(log_one[s] - log_two[s]) for s in log_one)
    check(worst_step <= 1e-5, f"the losses differ by up to {worst_step:.3g} (at most 1e-5): "
                              f"{[(s, log_one[s], log_two[s]) for s in sorted(log_one)]}")
    worst_weight = same_weights(two, one, tolerance=1e-4)
    killed = ", rank 1 killed and restarted from the last checkpoint" if args.killed else ""
    print(f"2 nodes x 1 process{killed} against 1 process, {len(log_one)} steps: losses within {worst_step:.2g}, "
          f"weights within {worst_weight:.2g} of each tensor's largest value")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("wait")
    p.add_argument("runs", nargs="*")
    p.add_argument("--jobs", nargs="*")
    p.add_argument("--timeout", type=float, default=900)
    p = commands.add_parser("recipe")
    p.add_argument("runs")
    p.add_argument("--stopped", required=True)
    p.add_argument("--twin", required=True)
    p.add_argument("--stage", required=True)
    p = commands.add_parser("cancelled")
    p.add_argument("runs")
    p = commands.add_parser("nodes")
    p.add_argument("one")
    p.add_argument("two")
    p.add_argument("--killed", action="store_true", help="TWO's rank 1 was killed mid-run")
    args = parser.parse_args(argv)
    try:
        {"wait": wait, "recipe": recipe, "cancelled": cancelled, "nodes": nodes}[args.command](args)
    except Failed as failure:
        print(f"slurm-check FAILED: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
