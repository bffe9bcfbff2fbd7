"""A researcher's first hour: a checkpoint in minutes (`--recipe demo`, `make checkpoint`), nothing
fetched from a hub unless asked, the README's caption commands and every demo-world command of
docs/running.md run exactly as the documents print them, and a README short enough to read.

The documents' commands run in a fresh checkout (the repository's tracked files linked into a new
folder, with this interpreter's environment), with the documented knobs that make them quick:
``SMALL=1`` (the tests' tiny demo world) and ``CLID_DEMO_STEPS=2`` (the steps of ``--recipe demo``).
A stand-in hub records every request a command makes; none may come without ``--allow-download``.
"""
from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT, import_script

README = ROOT / "README.md"
RUNNING = ROOT / "docs" / "running.md"
NOT_IN_A_CHECKOUT = {".git", ".venv", "data", "runs", "build", ".pytest_cache"}


# ---------------------------------------------------------------------------------------------
# A stand-in hub, a fresh checkout, and the documents' blocks


@pytest.fixture
def hub():
    """A local HTTP server standing in for the Hugging Face hub: every request is recorded, every answer
    is 404. Yields (its URL, the list of requested paths)."""
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self):
            requests.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_POST = answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()
    server.server_close()


def hub_env(url: str, home: Path, **extra) -> dict:
    """The environment of a user's shell: no offline variables set (the commands must set them), the hub
    at ``url`` with an empty cache in ``home``, this interpreter first on the PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "CLID_ALLOW_DOWNLOAD")}
    env.update(HF_ENDPOINT=url, HF_HOME=str(home), PATH=f"{Path(sys.executable).parent}:{env['PATH']}", **extra)
    return env


def fresh_checkout(folder: Path) -> Path:
    """A folder holding the repository's files (linked) and its environment, as a fresh clone after `make venv`."""
    folder.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in NOT_IN_A_CHECKOUT and not entry.name.endswith(".egg-info"):
            (folder / entry.name).symlink_to(entry)
    venv = folder / ".venv"
    if (ROOT / ".venv" / ".installed").exists():
        venv.symlink_to(ROOT / ".venv")
    else:  # (tests run outside make's .venv: make's stamp, newer than what it depends on, and this interpreter)
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").symlink_to(sys.executable)
        (venv / ".installed").touch()
    return folder


def fenced_blocks(path: Path, language: str) -> list[str]:
    """The fenced code blocks of a Markdown file in one language, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.S | re.M)


def run_block(block: str, cwd: Path, env: dict, timeout: int = 1800) -> subprocess.CompletedProcess:
    """Run a document's bash block as written, in one shell that stops at the first failing command."""
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{block}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return proc


def photos(folder: Path) -> list[str]:
    """A folder of four real photographs (scikit-image's samples), two PNGs and two JPEGs; returns their names."""
    import skimage.data
    from PIL import Image

    folder.mkdir()
    names = ["astronaut", "chelsea", "coffee", "rocket"]
    for k, name in enumerate(names):
        Image.fromarray(getattr(skimage.data, name)()).convert("RGB").save(folder / f"{name}.{('png', 'jpg')[k % 2]}")
    return names


# ---------------------------------------------------------------------------------------------
# Done means: a new user's path, as the README prints it; every docs command; nothing fetched


@pytest.mark.slow
def test_a_new_users_path_as_the_readme_prints_it(tmp_path, hub):
    """Quick checkpoint, features of a folder of photos, captions, gallery and control-precision report,
    then the README's Python lines, in a fresh checkout; the hub hears nothing."""
    url, requests = hub
    checkout = fresh_checkout(tmp_path / "clone")
    names = photos(checkout / "photos")
    shell, python = fenced_blocks(README, "bash"), fenced_blocks(README, "python")
    assert len(shell) == 1 and shell[0].startswith("make checkpoint\n") and len(python) == 1
    env = hub_env(url, home=tmp_path / "hf", SMALL="1", CLID_DEMO_STEPS="2")
    printed = run_block(shell[0], checkout, env).stdout

    # make checkpoint: 00 to 03 on the tiny world, then M_theta~ with --recipe demo, for CLID_DEMO_STEPS steps
    train = json.loads((checkout / "runs/quick/model/config.json").read_text())["train"]
    assert (train["recipe"], train["preset"], train["max_steps"], train["lr"], train["data"]) == ("demo", "tiny", 2, 2e-3, "extended")
    card = (checkout / "runs/quick/model/MODEL_CARD.md").read_text()  # the model card beside the checkpoint
    assert "Steps trained: 2 of --max-steps 2" in card and "## What it cannot do" in card
    # its self-generated captions, which alone teach it the long levels, are sentences (03 --model sentences)
    from clid.evaluation.repetition import repetition
    selfgen = [json.loads(line) for line in (checkout / "runs/quick/paraphrased.jsonl").read_text().splitlines()]
    assert {r["paraphraser"] for r in selfgen} == {"sentences"}
    for level in (3, 4):
        at = repetition(r["caption"] for r in selfgen if r["level"] == level)
        assert at["n"] >= 20 and at["listed"] <= 0.05, (level, at)
    assert "ids (--ids auto): 0 of 4 images mapped from COCO file names" in printed
    # one call: the photos' region features computed on the fly by the checkpoint's encoder, beside the captions
    assert (checkout / "captions.features.h5").is_file()
    # one caption per photo and level asked for, with its length and whether it is in range
    records = [json.loads(line) for line in (checkout / "captions.jsonl").read_text().splitlines()]
    assert sorted((r["image_id"], r["level"]) for r in records) == [(n, level) for n in names for level in (1, 3, 6)]
    assert all(isinstance(r["length"], int) and isinstance(r["in_range"], bool) for r in records)
    assert {r["image_id"]: r["file"] for r in records} == {n: f"{n}.{('png', 'jpg')[k % 2]}" for k, n in enumerate(names)}
    gallery = (checkout / "gallery.html").read_text()
    assert "<h1>Captions at length levels 1, 3 and 6</h1>" in gallery
    assert gallery.count('src="data:image/jpeg;base64,') == 4 and gallery.count("<tr data-control=") == 3
    # 07 without --refs: control precision per level asked for, as the caption file's own in_range says
    metrics = json.loads((checkout / "eval/metrics.json").read_text())
    assert metrics["refs"] is None and metrics["n_test_images"] == 4
    for level in (1, 3, 6):
        inside = sum(r["in_range"] for r in records if r["level"] == level)
        row = metrics["methods"]["captions"]["levels"][str(level)]
        assert row["control_precision"] == inside / 4 and row["mean_length"] > 0
    assert set(metrics["methods"]["captions"]["levels"]) == {"1", "3", "6"}
    report = (checkout / "eval/report.md").read_text()
    assert "No references were given" in report and "CIDEr" not in report
    assert {p.name for p in (checkout / "eval").glob("*.png")} == {"control_precision.png", "length_histograms.png"}

    # the README's Python lines, as printed: images in, captions with their lengths out, as the command wrote them
    shown = "\nprint(json.dumps([{n: [c[n], c[n].length, c[n].in_range] for n in c} for c in captions]))"
    proc = subprocess.run([sys.executable, "-c", "import json\n" + python[0] + shown],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    in_python = json.loads(proc.stdout.strip().splitlines()[-1])
    in_file = {(r["image_id"], r["level"]): [r["caption"], r["length"], r["in_range"]] for r in records}
    assert in_python == [{str(n): in_file[(name, n)] for n in (1, 3, 6)} for name in sorted(names)]

    # --images takes a file and a glob too; each line names its file
    proc = subprocess.run([sys.executable, "-m", "clid.caption", "--checkpoint", "runs/quick/model", "--images",
                           "photos/astronaut.png", "photos/c*", "--levels", "1", "--out", "some.jsonl"],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    some = [json.loads(line) for line in (checkout / "some.jsonl").read_text().splitlines()]
    assert [(r["image_id"], r["file"]) for r in some] == [("astronaut", "astronaut.png"), ("chelsea", "chelsea.jpg"),
                                                          ("coffee", "coffee.png")]
    assert "--images: 3 of 3 files read" in proc.stdout

    check_the_quick_checkpoints_captions(checkout, env)
    assert requests == []


def check_the_quick_checkpoints_captions(checkout: Path, env: dict) -> None:
    """The quick checkpoint's captions of the demo world's test images, as `clid.caption` writes them by
    default (n-gram blocking): at L1 to L4 no more captions repeat a 3-gram than the world's own texts of
    the level do (its long descriptions; its trusted captions at L1 and L2), plus 5 points; no caption holds
    a 4-gram three times; at most 5% break a phrase (the world's texts: none); every length is inside its level. (That the blocking bites:
    test_blocking_fills_a_repeated_phrase_with_other_words.)

    The model is the one `make checkpoint` trains here: the tests' tiny world and CLID_DEMO_STEPS=2
    (minutes of training do not fit the suite), a model that repeats far more than a trained one, so
    the decoding alone must keep the targets. The real quick checkpoint's figures: docs/decoding.md."""
    from clid.base.text import get_levels
    from clid.evaluation.metrics import load_refs
    from clid.evaluation.repetition import reference_texts, repetition

    world = checkout / "data/demo"
    refs = load_refs(world / "captions.json", "test", None)[0]
    texts = reference_texts(world)
    rates = {}
    for block in ("3",):
        out = checkout / f"quick-{block}.jsonl"
        command = [sys.executable, "-m", "clid.caption", "--checkpoint", "runs/quick/model", "--features",
                   str(world / "features.h5"), "--ids", str(world / "captions.json"), "--levels", "1", "2", "3", "4",
                   "--out", str(out)]
        proc = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert {r["image_id"] for r in records} == set(refs)
        for level in (1, 2, 3, 4):
            at = [r for r in records if r["level"] == level]
            rates[block, level] = repetition(r["caption"] for r in at)
            low, high = get_levels("caption")[level - 1]
            assert all(r["in_range"] and low <= r["length"] <= high for r in at), [r for r in at if not r["in_range"]]
    for level in (1, 2, 3, 4):
        own = repetition(texts[level][1])["repeats_3gram"] if level in texts else 0.0
        assert rates["3", level]["repeats_3gram"] <= own + 0.05, (level, rates["3", level], own)
        assert rates["3", level]["max_4gram"] < 3, (level, rates["3", level])
        assert rates["3", level]["broken"] <= 0.05, (level, rates["3", level])  # (the world's own texts: 0%)



def test_blocking_fills_a_repeated_phrase_with_other_words():
    """The decoding remedy itself: where the model's best words would repeat a 3-gram ("a dress and a dress
    and"), double a word, or end the caption before its level, the next best candidates are taken."""
    import torch

    from clid.model.decode import fill_without_repeats

    MASK, END = 0, 99
    a, dress, and_, woman, red, on = 5, 6, 7, 8, 9, 10
    row = torch.tensor([[a, dress, and_, MASK, MASK, MASK, MASK, MASK]])
    best = {3: [a, woman], 4: [dress, red], 5: [and_, on], 6: [on, a], 7: [END, woman]}  # best first
    candidates = torch.tensor([[[t, t] for t in row[0].tolist()[:3]] + [best[i] for i in range(3, 8)]])
    chosen = fill_without_repeats(row, row == MASK, candidates, torch.rand(1, 8, 2), 3, {MASK, END}, END, first_end=8)[1]
    # "a dress and a dress" | "and" would repeat "a dress and": on | "on on": a | the end before the level: woman
    assert chosen[0, 3:].tolist() == [a, dress, on, a, woman]
    # the authors' decoding takes the best words, "a dress and a dress and on" and the end
    assert [best[i][0] for i in range(3, 8)] == [a, dress, and_, on, END]


def test_blocking_takes_no_word_that_breaks_a_phrase():
    """The phrase rules of the decoding remedy: no article before a function word, no function word before the
    end (the "." or the last position), no adjective before an article, no word piece after a function word;
    the next best candidate is taken, and "a"/"an" are mended after decoding, keeping the length."""
    import torch

    from clid.base.text import eos_id, load_tokenizer
    from clid.model.decode import PhraseIds, fill_without_repeats

    tokenizer = load_tokenizer()
    ids = dict(zip(*[["a", "the", "woman", "on", "in", "road", "and", "sand", "gray", "##ered", "tree"],
                     tokenizer.convert_tokens_to_ids(["a", "the", "woman", "on", "in", "road", "and", "sand", "gray",
                                                      "##ered", "tree"])]))
    MASK, END = tokenizer.mask_token_id, eos_id(tokenizer)
    row = torch.tensor([[ids["a"], ids["woman"], ids["on"], MASK, MASK, MASK, MASK]])
    best = {3: ["the", "a"], 4: ["in", "road"], 5: ["and", "sand"], 6: ["and", "tree"]}  # best first
    candidates = torch.tensor([[[t, t] for t in row[0].tolist()[:3]] + [[ids[w] for w in best[i]] for i in range(3, 7)]])
    fill = lambda r, c, phrase: fill_without_repeats(r, r == MASK, c, torch.rand(1, r.shape[1], 2), 3, {MASK, END},
                                                     END, first_end=0, phrase=phrase)[1][0].tolist()
    phrase = PhraseIds(tokenizer)
    # "the in": road | "road and" then "and" last: the row's end takes no function word: tree
    assert fill(row, candidates, phrase)[3:] == [ids[w] for w in ("the", "road", "and", "tree")]
    assert fill(row, candidates, None)[3:] == [ids[w] for w in ("the", "in", "and", "tree")]  # without: "the in"
    # a function word before a fixed ".", an adjective before an article, a word piece after "a"
    row = torch.tensor([[ids["a"], MASK, END]])
    candidates = torch.tensor([[[ids["a"]] * 3, [ids["and"], ids["road"], ids["tree"]], [END] * 3]])
    assert fill(row, candidates, phrase)[1] == ids["road"]
    row = torch.tensor([[ids["gray"], MASK, ids["road"]]])
    candidates = torch.tensor([[[ids["gray"]] * 3, [ids["the"], ids["sand"], ids["tree"]], [ids["road"]] * 3]])
    assert fill(row, candidates, phrase)[1] == ids["sand"]
    row = torch.tensor([[ids["a"], MASK, END]])
    candidates = torch.tensor([[[ids["a"]] * 3, [ids["##ered"], ids["tree"], ids["road"]], [END] * 3]])
    assert fill(row, candidates, phrase)[1] == ids["tree"]


@pytest.mark.slow
def test_every_docs_command_runs_as_written(tmp_path, hub):
    """docs/running.md's demo-world blocks (every stage, CLID's peers), in order in one shell, in a fresh
    checkout; the hub hears nothing."""
    url, requests = hub
    checkout = fresh_checkout(tmp_path / "clone")
    blocks = fenced_blocks(RUNNING, "bash")
    assert len(blocks) == 2 and blocks[0].startswith("python 00_demo_data.py --out data/small --small")
    run_block("\n".join(blocks), checkout, hub_env(url, home=tmp_path / "hf", CLID_DEMO_STEPS="2"))
    evaluated = json.loads((checkout / "runs/eval/metrics.json").read_text())
    assert set(evaluated["methods"]) == {"trusted-only", "extended-only", "CLID", "mine"}
    scoring = json.loads((checkout / "runs/scoring/config.json").read_text())["train"]
    assert scoring["continue_from"] == "runs/extended" and scoring["max_steps"] == 4  # its 2 steps after M_theta~'s 2
    assert json.loads((checkout / "lengths-mine/metrics.json").read_text())["refs"] is None
    for peer in ("remove", "curriculum"):
        assert (checkout / "runs" / peer / "model.safetensors").is_file(), peer
    assert requests == []


def test_the_bert_folder_command_fetches_what_the_labert_preset_reads(tmp_path):
    """docs/running.md's COCO blocks fill --bert with one `hf download` of the hub's bert-base-uncased: a folder
    holding the files it names (made here from a small BERT) is one the labert preset trains from."""
    import torch
    from transformers import BertConfig, BertModel

    from clid.base.text import default_tokenizer_path, load_tokenizer
    from clid.model.captioner import build_model, preset_config

    blocks = [b for b in fenced_blocks(RUNNING, "sh") if "--bert $D/bert-base-uncased" in b]
    assert len(blocks) == 2  # your own photos on COCO; the paper's recipe
    named = []
    for block in blocks:
        command = re.search(r"^hf download (\S+) ([^\n]*?) \\\n\s*--local-dir (\S+)", block, re.M)
        assert command, block
        repo, folder = command.group(1), command.group(3)
        assert repo == "google-bert/bert-base-uncased" and folder == "$D/bert-base-uncased"
        assert block.index("hf download") < block.index("04_train_base.py")
        named.append(command.group(2).split())
    files = named[0]
    assert named[1] == files
    full, bert = tmp_path / "full", tmp_path / "bert"
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64))
    model.save_pretrained(full)  # config.json, model.safetensors
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):  # bert-base-uncased's, as the hub has them
        shutil.copy(default_tokenizer_path() / name, full / name)
    bert.mkdir()
    for name in files:  # the named files alone, as the command leaves them
        shutil.copy(full / name, bert / name)
    config = preset_config("labert", region_dim=16, bert=str(bert))
    assert (config.hidden_size, config.num_layers) == (32, 2)
    captioner = build_model(config)
    assert torch.equal(captioner.encoder.layer[1].attention.self.query.weight, model.encoder.layer[1].attention.self.query.weight)
    assert load_tokenizer(str(bert)).vocab == load_tokenizer().vocab


@pytest.mark.slow
def test_offline_unless_the_user_allows_downloads(tmp_path, hub):
    """A model named by a hub name that is not on disk: one error line, and no request, unless the user
    allows downloads (then the hub is asked, and its refusal is still one line)."""
    url, requests = hub
    captions = ROOT / "tests" / "fixtures" / "dataset_coco_sample.json"
    command = [sys.executable, "-m", "clid.stats", str(captions), "--tokenizer", "no-such-org/no-such-tokenizer"]
    env = hub_env(url, home=tmp_path / "hf")
    offline = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert offline.returncode == 1 and requests == []
    assert offline.stderr.strip().splitlines() == [offline.stderr.strip()] and "--allow-download" in offline.stderr
    allowed = subprocess.run(command + ["--allow-download"], env=env, capture_output=True, text=True, timeout=300)
    assert allowed.returncode == 1 and requests, allowed.stderr
    assert "Traceback" not in allowed.stderr and "error: cannot load the tokenizer" in allowed.stderr


@pytest.mark.slow
def test_a_hub_that_never_answers_is_given_seconds_not_minutes(tmp_path):
    """--allow-download (abbreviated) against a hub that takes the connection and never answers: a warning line
    within seconds, then the run goes on offline, and a model not on disk is one error line."""
    import socket
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # (connections complete in the backlog; nothing is ever read or answered)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    captions = ROOT / "tests" / "fixtures" / "dataset_coco_sample.json"
    command = [sys.executable, "-m", "clid.stats", str(captions), "--tokenizer", "no-such-org/no-such-tokenizer",
               "--allow-d"]
    start = time.monotonic()
    try:
        done = subprocess.run(command, env=hub_env(url, home=tmp_path / "hf"), capture_output=True, text=True, timeout=300)
    finally:
        silent.close()
    assert time.monotonic() - start < 120
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith(f"warning: downloads are allowed, but the hub {url} did not answer within 10 s")
    assert len(lines) == 2 and lines[1].startswith("error: cannot load the tokenizer"), done.stderr


def test_without_the_venv_one_line_names_the_fix():
    """An interpreter without the requirements (here: torch hidden from it) gets one line, not a traceback."""
    hide_torch = "import runpy, sys; sys.modules['torch'] = None; runpy.run_module('clid.features', run_name='__main__')"
    proc = subprocess.run([sys.executable, "-c", hide_torch, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "has no module 'torch'" in proc.stderr and "source .venv/bin/activate" in proc.stderr


@pytest.mark.parametrize("rank", ["0", "1", None])
def test_under_torchrun_rank_0_alone_prints_a_data_error(rank, monkeypatch, capsys):
    """Every rank meets the same bad file: the job shows its line once (rank 0), and every rank exits 1."""
    from clid.base.files import DataError
    from clid.run.cli import run_main

    for name in ("TORCHELASTIC_RUN_ID", "RANK"):
        monkeypatch.delenv(name, raising=False)
    if rank is not None:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
        monkeypatch.setenv("RANK", rank)

    def bad_file(argv):
        raise DataError("captions.json", "images[3]", "no 'sentences'")

    with pytest.raises(SystemExit) as stop:
        run_main(bad_file, [])
    assert stop.value.code == 1
    printed = capsys.readouterr().err
    assert printed == ("" if rank == "1" else "error: captions.json: images[3]: no 'sentences'\n")


def test_stay_offline_is_the_default(monkeypatch, hub):
    from clid.base.hub import is_offline
    from clid.run.cli import ALLOW_DOWNLOAD_ENV, stay_offline

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", ALLOW_DOWNLOAD_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub[0])  # (a hub that answers)
    assert not stay_offline(["--allow-download"]) and not is_offline()
    monkeypatch.setenv(ALLOW_DOWNLOAD_ENV, "1")
    assert not stay_offline([]) and not is_offline()
    monkeypatch.delenv(ALLOW_DOWNLOAD_ENV)
    assert stay_offline(["--out", "x"]) and is_offline() and os.environ["TRANSFORMERS_OFFLINE"] == "1"


# ---------------------------------------------------------------------------------------------
# --recipe demo, and a warm-up as long as the run


def test_recipe_demo_sets_the_demos_settings_and_flags_still_win(tmp_path, monkeypatch, capsys):
    from clid.base.files import DataError

    monkeypatch.delenv("CLID_DEMO_STEPS", raising=False)
    train = import_script("04_train_base.py", "recipe_04").parse_args
    select = import_script("06_train_selection.py", "recipe_06").parse_args
    files = ["--captions", str(tmp_path / "c.json"), "--features", str(tmp_path / "f.h5"), "--out", str(tmp_path / "o")]

    paper = train(files)
    assert (paper.preset, paper.lr, paper.warmup, paper.dropout, paper.max_steps) == ("labert", 5e-5, 1000, 0.1, 100_000)
    demo = train(files + ["--recipe", "demo"])
    assert (demo.preset, demo.lr, demo.warmup, demo.dropout, demo.region_norm, demo.eval_every) == (
        "tiny", 2e-3, 100, 0.0, "standardize", 0)
    assert (demo.max_steps, demo.lr_horizon, demo.output_vocab) == (1000, 0, [str(tmp_path / "c.json")])
    extended = train(files + ["--recipe", "demo", "--data", "extended", "--selfgen", str(tmp_path / "s.jsonl")])
    assert extended.lr_horizon == 3000 and extended.output_vocab == [str(tmp_path / "c.json"), str(tmp_path / "s.jsonl")]
    own = train(files + ["--recipe", "demo", "--lr", "1e-3", "--max-steps", "50", "--preset", "minilm"])
    assert (own.lr, own.max_steps, own.preset, own.warmup) == (1e-3, 50, "minilm", 100)
    assert capsys.readouterr().err.startswith("warning: --warmup 100 is not below --max-steps 50")

    pool = files + ["--selfgen", str(tmp_path / "s.jsonl"), "--quality", str(tmp_path / "q.h5")]
    clid = select(pool + ["--recipe", "demo"])
    assert (clid.eta, clid.lr_horizon, clid.max_steps, clid.preset) == (18, 0, 1000, "tiny")  # 50 iterations: 90% of the steps
    assert (select(pool).eta, select(pool).lr_horizon) == (1200, 300_000)
    monkeypatch.setenv("CLID_DEMO_STEPS", "200")
    assert select(pool + ["--recipe", "demo"]).eta == 4
    monkeypatch.setenv("CLID_DEMO_STEPS", "many")
    with pytest.raises(DataError, match="CLID_DEMO_STEPS must be a positive integer"):
        train(files + ["--recipe", "demo"])
    assert capsys.readouterr().err == ""  # (no warning for a warm-up shorter than the run)


def test_recipes_are_files_read_by_name_or_path_and_flags_still_win(tmp_path, monkeypatch):
    """--recipe NAME reads recipes/NAME.toml ([train] for every model, [extended] or [scoring] for one), or a
    .toml file; a recipe may extend another; flags given still win."""
    monkeypatch.delenv("CLID_DEMO_STEPS", raising=False)
    train = import_script("04_train_base.py", "recipe_files_04").parse_args
    select = import_script("06_train_selection.py", "recipe_files_06").parse_args
    files = ["--captions", str(tmp_path / "c.json"), "--features", str(tmp_path / "f.h5"), "--out", str(tmp_path / "o")]

    coco = train(files + ["--recipe", "coco", "--data", "extended", "--selfgen", str(tmp_path / "s.jsonl")])
    assert (coco.preset, coco.batch_size, coco.lr_horizon, coco.max_steps, coco.output_vocab) == (
        "labert", 64, 300_000, 100_000, None)
    assert train(files + ["--recipe", "coco"]).lr_horizon == 0  # (the trusted-only baseline: its own cosine)
    pool = files + ["--selfgen", str(tmp_path / "s.jsonl"), "--quality", str(tmp_path / "q.h5")]
    assert (select(pool + ["--recipe", "coco"]).eta, select(pool + ["--recipe", "coco"]).lr_horizon) == (1200, 300_000)

    paragraph = select(pool + ["--recipe", "paragraph"])  # the demo's, with paragraphs and fewer steps
    assert (paragraph.levels, paragraph.max_steps, paragraph.eta, paragraph.preset, paragraph.lr) == (
        "paragraph", 400, 7, "tiny", 2e-3)

    mine = tmp_path / "mine.toml"
    mine.write_text('extends = "demo"\n[train]\nlr = 1e-3\n[resolved]\nsteps = 300\n')
    own = train(files + ["--recipe", str(mine), "--warmup", "10"])
    assert (own.recipe, own.lr, own.max_steps, own.warmup, own.preset) == (str(mine), 1e-3, 300, 10, "tiny")


def test_the_recipe_reader_prints_one_setting_for_a_shell(tmp_path):
    """python clid/run/recipes.py get NAME TABLE.KEY (demo.sh, slurm/common.sh): one value, or one error line."""
    def reader(*args):
        return subprocess.run([sys.executable, "clid/run/recipes.py", *args], cwd=ROOT, capture_output=True, text=True)

    assert reader("get", "demo", "resolved.steps").stdout == "1000\n"
    assert reader("get", "demo", "train.lr").stdout == "0.002\n"
    assert reader("get", "paragraph", "train.batch_size").stdout == "64\n"  # (demo's, extended)
    assert reader("get", "coco", "scoring.max_steps").stdout == "200000\n"
    assert reader("get", "demo", "resolved.shortlist").stdout == "1\n"
    assert (reader("eta", "demo").stdout, reader("eta", "paragraph").stdout) == ("18\n", "7\n")
    for args, says in [(("get", "demo", "train.nope"), "has no setting train.nope"), (("get", "demo", "train"), "is a table"),
                       (("get", "fast", "train.lr"), "no recipe "), (("eta", "coco"), "has no setting resolved.steps")]:
        done = reader(*args)
        assert done.returncode == 1 and done.stderr.startswith("error: ") and says in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1
    loop = tmp_path / "loop.toml"
    loop.write_text(f'extends = "{loop}"\n')
    assert "extends itself" in reader("get", str(loop), "train.lr").stderr


def test_the_recipe_checker_checks_every_setting_as_the_stages_will(tmp_path):
    """python clid/run/recipes.py check NAME (demo.sh, submit_all.sh): the shipped recipes pass; a bad value is one
    line naming the file, the table and the key, as 04 would refuse it."""
    def check(recipe):
        return subprocess.run([sys.executable, "clid/run/recipes.py", "check", str(recipe)], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)

    for name in ("demo", "coco", "paragraph"):
        assert check(name).returncode == 0, check(name).stderr
    mine = tmp_path / "mine.toml"
    mine.write_text('extends = "demo"\n[selection]\neta = "many"\n')
    done = check(mine)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f'error: {mine}: [selection] eta = "many": must be a number, not the text')


@pytest.mark.parametrize("setting, value, says", [
    ("STEPS", "HOME[$(touch {marker})]", "STEPS must be a positive whole number"),
    ("STEPS", "many", "STEPS must be a positive whole number"),
    ("BATCH", "0", "BATCH must be a positive whole number"),
    ("N_TRAIN", "1e3", "N_TRAIN must be a positive whole number"),
    ("CURATE_EVERY", "$(touch {marker})", "CURATE_EVERY must be a positive whole number"),
    ("LR", "fast", "LR must be a positive number"),
    ("LR", "0", "LR must be a positive number"),
    ("LR", "1e999", "LR must be a positive number"),
    ("STEPS", "0009", "STEPS must be a positive whole number"),
    ("STEPS", "3\n4", "STEPS must be a positive whole number (digits, at most 9), not $'3\\n4'"),
    ("SEEDS", "99999999999", "SEEDS must be a positive whole number"),
    ("PARAPHRASER", "pegasus", "PARAPHRASER must be rules, sentences or a model folder"),
    ("OMP_NUM_THREADS", "two", "OMP_NUM_THREADS must be a positive whole number"),
    ("OMP_NUM_THREADS", "0", "OMP_NUM_THREADS must be a positive whole number"),
    ("TABLES", "docs/measurements/x-demo", "TABLES holds the tables of several seeds (07 --combine): give SEEDS=2"),
])
def test_demo_sh_checks_its_numbers_before_anything_runs(tmp_path, setting, value, says):
    """A variable given to demo.sh is checked before the shell computes with it (no text of it evaluated) and before
    any stage runs: one line, no folder made."""
    marker = tmp_path / "ran"
    env = dict(os.environ, **{setting: value.format(marker=marker)}, PY=sys.executable)
    done = subprocess.run(["bash", "demo.sh", str(tmp_path / "data"), str(tmp_path / "runs")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and not marker.exists(), done.stdout + done.stderr
    assert done.stdout.strip().startswith("error: ") and says in done.stdout and done.stdout.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("make, says", [
    (lambda d: d / "tables.csv", "is a file, not a folder"),
    (lambda d: d / "tables", "results.csv: was not written by 07 --tables (or was edited since): it is kept"),
])
def test_demo_sh_checks_tables_before_anything_runs(tmp_path, make, says):
    """TABLES names a folder 07 --combine --tables could write into, checked before the hours of the run: a file, or
    a folder holding a results.csv of the user's, is one line and nothing runs."""
    given = tmp_path / "given"
    (given / "tables").mkdir(parents=True)
    (given / "tables.csv").write_text("mine\n")
    (given / "tables" / "results.csv").write_text("model,mine\n")
    env = dict(os.environ, SEEDS="2", TABLES=str(make(given)), PY=sys.executable)
    done = subprocess.run(["bash", "demo.sh", str(tmp_path / "data"), str(tmp_path / "runs")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and done.stdout.count("\n") == 1, done.stdout + done.stderr
    assert done.stdout.startswith("error: ") and says in done.stdout, done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given"]
    assert (given / "tables" / "results.csv").read_text() == "model,mine\n"


def test_demo_sh_takes_a_python_whose_path_holds_a_space(tmp_path):
    """PY is a path with a space (a checkout under "my dir"): it runs whole, not cut at the space."""
    folder = tmp_path / "my dir"
    folder.mkdir()
    (folder / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # (a link would lose the venv)
    (folder / "python").chmod(0o755)
    env = dict(os.environ, STEPS="many", PY=str(folder / "python"))
    done = subprocess.run(["bash", "demo.sh", str(tmp_path / "data"), str(tmp_path / "runs")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and done.stdout.strip() == "error: STEPS must be a positive whole number (digits, at " \
                                                          "most 9), not 'many'", done.stdout + done.stderr


def test_each_setting_is_written_in_its_recipe_only():
    """demo.sh and slurm/ take their training numbers from recipes/ (no number of a recipe written there too)."""
    common = (ROOT / "slurm" / "common.sh").read_text()
    for number in ("300000", "200000", "--batch-size 64", "labert", "STEPS:=1000", "SAVE_EVERY:=500"):
        assert number not in common, number
    demo = (ROOT / "demo.sh").read_text()
    for setting in ("STEPS:-1000", "ETA:-18", "LR:-2e-3", "BATCH:-64", "PER_IMAGE:-5", ":-2000", ":-400", ":-200",
                    "decode-steps 10", "3 * STEPS"):
        assert setting not in demo, setting


# ---------------------------------------------------------------------------------------------
# The README and the gallery


def test_the_readme_stays_short():
    """About 2,000 words, at most 2,300: history and analyses belong in docs/."""
    assert len(README.read_text().split()) <= 2300


def test_the_gallery_names_the_levels_it_shows():
    from clid.base.text import get_levels
    from clid.caption.gallery import gallery_title

    levels = get_levels("caption")
    assert gallery_title(levels, [1, 3, 6]) == "Captions at length levels 1, 3 and 6"
    assert gallery_title(levels, [2]) == "Captions at length level 2"
    assert gallery_title(levels, list(range(1, 8))) == "Captions at every length level"
