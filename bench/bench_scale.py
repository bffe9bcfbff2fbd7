"""Benchmark of the host side at COCO scale: start-up and per-step host work of 04, 05 and 06 on a synthetic
COCO-sized set, today's path (the code of an earlier commit, --peer) beside this tree's, in the same run.

In:  nothing: it writes a synthetic set into --work: --images train images with 5 trusted captions each (the
     Karpathy train + restval split: 113,287 images), --captions N self-generated captions of 8 to 60 words
     (one in 20 with an accented word) of those images, random quality scores u, tiny region features.
Out: a table on stdout (and --json FILE): per stage, the start-up, the host time spent choosing the batch,
     and the peak resident memory of today's path, this tree's, and this tree's with a warm --token-cache,
     with the ratio today / new.

    python bench/bench_scale.py --captions 2000000                           # COCO's self-generated set at scale
    python bench/bench_scale.py --captions 20000 --images 300 --paths new    # the CI smoke test

The paths: "today", the code of the commit --peer (default: the one before the host-side work), unpacked
with `git archive` into WORK/peer beside this tree's compiled extension (their csrc/ must agree); "new",
this tree; "new, cache", this tree with --token-cache, the cache built beforehand. Every stage runs in its
own process with one thread, under a probe that wraps a few functions and then runs the script:
- 04 (--data extended) and 06 (--strategy clid): the start-up is the time from the process's start to the
  end of the first optimizer step; then --steps steps (06: rounds of --eta steps, so round changes count);
- 05: the start-up is the time to its first batch (the first encoder pass), where the probe ends it;
- the CPU time of the start-up (the process's, every thread's): on a loaded machine the wall-clock start-up
  is longer, this is not (one thread per stage);
- choosing the batch: the time in the batch function at each step plus, in 06, the time between two rounds
  (the next round's draw); "first step" is the first step's, "per step" the mean of the others;
- peak RSS: the process's maximum resident memory; "beyond the model": minus its resident memory when the
  model is built (the interpreter, torch, the imports).
The load average is printed before and after: on a shared machine, compare only the columns of one run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER = "6478524"  # main before the host-side work: every caption preprocessed four times, a permutation per step
WORDS = ("a an the man woman person people child boy girl dog cat horse cow sheep bird elephant giraffe zebra bear "
         "car bus truck train bicycle motorcycle boat plane kite umbrella surfboard skateboard skis frisbee ball "
         "table chair bench couch bed tv laptop phone book clock vase pizza sandwich cake banana apple orange "
         "bowl cup plate fork knife bottle sink toilet oven refrigerator street road field grass beach water "
         "snow sky tree building wall window room kitchen park city ocean wave hill mountain fence sign light "
         "is are sitting standing walking riding holding eating playing flying lying looking parked covered "
         "filled next to on in of with near under over behind front top side while and its their some two "
         "three several large small big little white black red blue green yellow brown old young tall wooden "
         "colorful busy empty open grassy sandy snowy cloudy sunny dirt plastic metal glass stone brick").split()
ACCENTED = ("café", "naïve", "jalapeño", "crème", "façade", "piñata", "résumé", "Zoë")


# ---------------------------------------------------------------------------------------------
# The synthetic set


def caption(rng: random.Random, low: int, high: int) -> str:
    words = rng.choices(WORDS, k=rng.randint(low, high))
    if rng.random() < 0.05:
        words[rng.randrange(len(words))] = rng.choice(ACCENTED)
    return " ".join(words).capitalize() + "."


def write_world(work: Path, n_images: int, n_selfgen: int, seed: int = 0) -> dict:
    """captions.json (Karpathy; 5 captions per train image, 50 val and 50 test images), selfgen.jsonl,
    features.h5 (4 regions of 16 numbers per image) and quality.h5 (random u, with 05's text digests)."""
    import numpy as np

    from clid.base.files import write_h5_groups, write_quality
    from clid.data.examples import text_digest
    from clid.selection.quality import eq1_quality

    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    images = [{"cocoid": k, "filename": f"{k}.jpg", "split": "train" if k < n_images else "val" if k < n_images + 50
               else "test", "sentences": [{"raw": caption(rng, 8, 20)} for _ in range(5)]}
              for k in range(n_images + 100)]
    (work / "captions.json").write_text(json.dumps({"images": images}))
    ids, texts = [], []
    with open(work / "selfgen.jsonl", "w") as f:
        for k in range(n_selfgen):
            ids.append(f"sg{k}")
            texts.append(caption(rng, 8, 60))
            f.write(json.dumps({"id": ids[-1], "image_id": rng.randrange(n_images), "caption": texts[-1]},
                               ensure_ascii=False) + "\n")
    boxes = np.array([[0, 0, 80, 80], [40, 40, 120, 120], [10, 60, 150, 150], [0, 0, 160, 160]], np.float32)
    noise = np.random.default_rng(seed)
    write_h5_groups(work / "features.h5", ((str(k), {"features": noise.normal(size=(4, 16)).astype(np.float32),
                                                     "boxes": boxes}, {"width": 160, "height": 160})
                                           for k in range(n_images + 50)),
                    root_attrs={"feature_kind": "synthetic", "feature_dim": 16})
    logp = noise.normal(-2.0, 0.3, size=(2, n_selfgen))
    write_quality(work / "quality.h5", ids, logp[0], logp[1], eq1_quality(*logp), text_digest=[text_digest(t) for t in texts])
    return {"captions": work / "captions.json", "selfgen": work / "selfgen.jsonl", "features": work / "features.h5",
            "quality": work / "quality.h5"}


def peer_tree(work: Path, ref: str) -> Path:
    """The code of commit ``ref``, with this tree's compiled extension (the two csrc/ must agree)."""
    tree = work / "peer"
    if subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", ref, "--", "csrc", "setup.py"]).returncode != 0:
        raise SystemExit(f"error: --peer {ref}: its csrc/ differs from this tree's; build it there and compare by hand")
    if not tree.exists():
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for built in (ROOT / "clid").glob("_C*.so"):
            shutil.copy(built, tree / "clid" / built.name)
    return tree


# ---------------------------------------------------------------------------------------------
# The probe: `python bench_scale.py --probe TREE OUT SCRIPT ARGS...` runs SCRIPT of TREE with a few functions
# wrapped, and writes what it saw to OUT (JSON).


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def probe(tree: str, out: str, script: str, argv: list[str]) -> None:
    import atexit
    import resource
    import runpy

    sys.path.insert(0, tree)
    import torch

    import clid
    import clid.model.captioner as captioner
    import clid.training.loop as loop
    import clid.training.stage as stage

    assert Path(clid.__file__).resolve().is_relative_to(Path(tree).resolve()), clid.__file__
    seen = {"steps": 0, "runs": [], "first_step": None, "first_batch": None, "rss_model": None, "cpu_startup": None,
            "cpu_children": None}

    def children_cpu() -> float:  # (the processes that read a long caption file, once they have ended)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def finish() -> None:
        seen["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        Path(out).write_text(json.dumps(seen))

    step, run, encode, new_model = torch.optim.AdamW.step, loop.Trainer.run, captioner.Captioner.encode, stage.new_model

    def timed_step(self, *a, **k):
        result = step(self, *a, **k)
        seen["steps"] += 1
        if seen["first_step"] is None:
            seen["first_step"], seen["cpu_startup"] = time.time(), time.process_time()
            seen["cpu_children"] = children_cpu()
        return result

    def timed_run(self, end_step, batch_for, *a, **k):  # (06 calls it once per round)
        this = {"start": time.time(), "end": None, "choose": []}
        seen["runs"].append(this)

        def timed_batch(s):
            started = time.perf_counter()
            batch = batch_for(s)
            this["choose"].append(time.perf_counter() - started)
            return batch
        try:
            return run(self, end_step, timed_batch, *a, **k)
        finally:
            this["end"] = time.time()

    def first_encode(self, *a, **k):
        if os.environ.get("CLID_PROBE_STOP_AT_BATCH"):
            seen["first_batch"], seen["cpu_startup"] = time.time(), time.process_time()
            seen["cpu_children"] = children_cpu()
            finish()
            os._exit(0)
        return encode(self, *a, **k)

    def measured_model(*a, **k):
        seen["rss_model"] = rss_bytes()
        return new_model(*a, **k)

    torch.optim.AdamW.step, loop.Trainer.run, captioner.Captioner.encode = timed_step, timed_run, first_encode
    stage.new_model = measured_model  # (the stages import it by name: patched before they are loaded)
    atexit.register(finish)
    sys.argv = [script] + argv
    os.chdir(tree)
    runpy.run_path(script, run_name="__main__")


# ---------------------------------------------------------------------------------------------
# Running the stages


def run_stage(tree: Path, script: str, args: list, work: Path, name: str, limit: float, stop_at_batch=False) -> dict:
    """Run one stage under the probe; what it saw, with ``started`` (the launch time) and the exit status."""
    out = work / f"probe-{name}.json"
    out.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", CLID_PROGRESS_SECONDS="600")
    env.pop("CLID_PROBE_STOP_AT_BATCH", None)
    if stop_at_batch:
        env["CLID_PROBE_STOP_AT_BATCH"] = "1"
    log = work / f"{name}.log"
    started = time.time()
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--probe", str(tree), str(out), script,
                               *map(str, args)], stdout=f, stderr=subprocess.STDOUT, env=env, timeout=limit)
    if proc.returncode != 0 or not out.exists():
        tail = log.read_text()[-2000:]
        raise SystemExit(f"error: {name} failed (exit {proc.returncode}; log {log}):\n{tail}")
    seen = json.loads(out.read_text())
    return {**seen, "started": started, "log": str(log)}


def summary(seen: dict, eta: int | None = None) -> dict:
    """The table's numbers of one stage run."""
    out = {"peak_rss_gb": seen["peak_rss"] / 1e9}
    if seen["rss_model"]:
        out["beyond_model_gb"] = (seen["peak_rss"] - seen["rss_model"]) / 1e9
    out["startup_cpu_s"] = seen["cpu_startup"]
    out["startup_children_cpu_s"] = seen.get("cpu_children")
    if seen["first_batch"]:
        out["startup_s"] = seen["first_batch"] - seen["started"]
    if seen["first_step"]:
        out["startup_s"] = seen["first_step"] - seen["started"]
        runs = seen["runs"]
        firsts = [r["choose"][0] for r in runs if r["choose"]]  # a round's first step: its first permutation
        later = [t for r in runs for t in r["choose"][1:]]
        out["first_choice_ms"] = 1e3 * sum(firsts) / len(firsts)
        out["per_step_us"] = 1e6 * sum(later) / max(1, len(later))
        if len(runs) > 1:
            gaps = [b["start"] - a["end"] for a, b in zip(runs, runs[1:])]  # between rounds: the next one's set
            out["per_round_ms"] = 1e3 * sum(gaps) / len(gaps)
            # a round of eta steps pays its set and its first step once, then eta - 1 later steps
            out["per_step_at_eta_us"] = 1e6 * ((sum(gaps) / len(gaps) + sum(firsts) / len(firsts)) / eta
                                               + sum(later) / max(1, len(later)) * (eta - 1) / eta)
    return out


def measure(tree: Path, tag: str, world: dict, work: Path, args, checkpoints: dict, cache: bool) -> dict:
    common = ["--features", world["features"], "--preset", "tiny", "--output-vocab", world["captions"], world["selfgen"],
              "--batch-size", "64", "--warmup", "1", "--eval-every", "0", "--save-every", "100000", "--seed", "0"]
    extra = ["--token-cache"] * cache
    results = {}
    seen = run_stage(tree, "04_train_base.py", ["--captions", world["captions"], "--data", "extended", "--selfgen",
                                                world["selfgen"], "--out", work / f"04-{tag}", "--max-steps",
                                                args.steps, *common, *extra], work, f"04-{tag}", args.limit)
    results["04"] = summary(seen)
    seen = run_stage(tree, "05_score_quality.py", ["--trusted", checkpoints["trusted"], "--extended",
                                                   checkpoints["extended"], "--selfgen", world["selfgen"], "--features",
                                                   world["features"], "--captions", world["captions"], "--out",
                                                   work / f"05-{tag}.h5", "--mode", "onepass", "--device", "cpu",
                                                   *extra], work, f"05-{tag}", args.limit, stop_at_batch=True)
    results["05"] = summary(seen)
    seen = run_stage(tree, "06_train_selection.py", ["--captions", world["captions"], "--selfgen", world["selfgen"],
                                                     "--quality", world["quality"], "--out", work / f"06-{tag}",
                                                     "--eta", args.eta, "--max-steps", 3 * args.eta, *common, *extra],
                     work, f"06-{tag}", args.limit)
    results["06"] = summary(seen, 1200)
    return results


ROWS = [  # (stage, key, label, format)
    ("04", "startup_s", "04 extended: start-up to the first optimizer step (s)", ".1f"),
    ("04", "startup_cpu_s", "04: the start-up's CPU time (s)", ".1f"),
    ("04", "startup_children_cpu_s", "04: the CPU time of its reading processes (s)", ".1f"),
    ("04", "first_choice_ms", "04: choosing the first batch (ms; once an epoch)", ".1f"),
    ("04", "per_step_us", "04: choosing the batch, per later step (µs)", ".1f"),
    ("04", "peak_rss_gb", "04: peak RSS (GB)", ".2f"),
    ("05", "startup_s", "05: start-up to its first batch (s)", ".1f"),
    ("05", "startup_cpu_s", "05: the start-up's CPU time (s)", ".1f"),
    ("05", "startup_children_cpu_s", "05: the CPU time of its reading processes (s)", ".1f"),
    ("05", "peak_rss_gb", "05: peak RSS (GB)", ".2f"),
    ("06", "startup_s", "06 clid: start-up to the first optimizer step (s)", ".1f"),
    ("06", "startup_cpu_s", "06: the start-up's CPU time (s)", ".1f"),
    ("06", "startup_children_cpu_s", "06: the CPU time of its reading processes (s)", ".1f"),
    ("06", "first_choice_ms", "06: choosing a round's first batch (ms)", ".1f"),
    ("06", "per_step_us", "06: choosing the batch, per later step in a round (µs)", ".1f"),
    ("06", "per_round_ms", "06: between two rounds, the next round's set (ms)", ".1f"),
    ("06", "per_step_at_eta_us", "06: choosing the batch per step with eta 1200 (µs)", ".1f"),
    ("06", "peak_rss_gb", "06: peak RSS (GB)", ".2f"),
    ("06", "beyond_model_gb", "06: peak RSS beyond the model (GB)", ".2f"),
]


def table(columns: dict[str, dict]) -> str:
    names = list(columns)
    ratio = "today" in names and "new" in names
    lines = ["| what | " + " | ".join(names) + (" | today / new |" if ratio else " |"),
             "|---" * (len(names) + 1 + ratio) + "|"]
    for stage, key, label, fmt in ROWS:
        values = [columns[n].get(stage, {}).get(key) for n in names]
        if all(v is None for v in values):
            continue
        cells = ["" if v is None else format(v, fmt) for v in values]
        if ratio:
            today, new = columns["today"][stage].get(key), columns["new"][stage].get(key)
            cells.append(f"{today / new:.1f}x" if today is not None and new else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--probe":
        return probe(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    from clid.run.cli import HelpFormatter
    from clid.run.measured import load_text

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--captions", type=int, required=True, help="self-generated captions N")
    p.add_argument("--images", type=int, default=113_287, help="train images (5 trusted captions each)")
    p.add_argument("--steps", type=int, default=20, help="04's optimizer steps")
    p.add_argument("--eta", type=int, default=10, help="06's steps per round (3 rounds)")
    p.add_argument("--peer", default=PEER, help="the commit whose code is today's path")
    p.add_argument("--paths", nargs="+", choices=("today", "new", "cache"), default=["today", "new", "cache"],
                   help="the columns: today's path, this tree's, this tree's with a warm --token-cache")
    p.add_argument("--work", type=Path, default=Path("/tmp/clid-bench-scale"),
                   help="folder for the set and the runs (emptied first when an earlier run of this benchmark made it)")
    p.add_argument("--limit", type=float, default=3600, help="seconds allowed to one stage run")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args(argv)
    if args.captions < 1 or args.images < 1 or args.steps < 2 or args.eta < 1:
        p.error("--captions, --images and --eta must be positive, --steps at least 2")
    marker = args.work / ".bench-scale"  # (a folder this benchmark made; anything else is never deleted)
    if marker.exists():
        shutil.rmtree(args.work)
    elif args.work.exists() and any(args.work.iterdir()):
        p.error(f"--work {args.work} holds files this benchmark did not write: give a new or empty folder")
    args.work.mkdir(parents=True, exist_ok=True)
    marker.touch()
    print(f"load average (1, 5, 15 min) before: {load_text()} ({os.cpu_count()} cores)", flush=True)
    started = time.time()
    world = write_world(args.work, args.images, args.captions)
    print(f"synthetic set: {args.images:,} train images, {5 * args.images:,} trusted and {args.captions:,} "
          f"self-generated captions ({time.time() - started:.0f} s)", flush=True)

    # the two checkpoints 05 reads (only its start-up is measured): two tiny models, initialised apart
    import torch

    from clid.model.captioner import build_model, preset_config
    from clid.model.checkpoints import save_model

    checkpoints = {}
    for seed, name in enumerate(("trusted", "extended")):
        checkpoints[name] = args.work / f"ckpt-{name}"
        torch.manual_seed(seed)
        save_model(build_model(preset_config("tiny", 16, "caption")), checkpoints[name], {"feature_kind": "synthetic"})
    columns = {}
    if "today" in args.paths:
        columns["today"] = measure(peer_tree(args.work, args.peer), "today", world, args.work, args, checkpoints, False)
        print(f"today's path measured ({time.time() - started:.0f} s)", flush=True)
    if "new" in args.paths:
        columns["new"] = measure(ROOT, "new", world, args.work, args, checkpoints, False)
    if "cache" in args.paths:  # the cache of the self-generated captions, built first (as by a run with --token-cache)
        from clid.base.text import load_tokenizer
        from clid.data.inputs import CaptionFiles

        CaptionFiles("caption", cache=True).selfgen_table(world["selfgen"], load_tokenizer())
        columns["new, cache"] = measure(ROOT, "cache", world, args.work, args, checkpoints, True)
    print(f"\n{args.captions:,} self-generated + {5 * args.images:,} trusted captions; one thread per stage; "
          f"load average (1, 5, 15 min) after: {load_text()}; {time.time() - started:.0f} s in all\n")
    print(table(columns))
    if args.json:
        args.json.write_text(json.dumps({"captions": args.captions, "images": args.images, "columns": columns}, indent=1))


if __name__ == "__main__":
    main()
