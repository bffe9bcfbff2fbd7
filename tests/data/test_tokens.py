"""Captions at scale: the ASCII fast path of the preprocessing, tokenised captions as flat arrays,
each caption file read once per run, the token cache beside a JSONL file, the batch order kept per epoch, and
the digests 05 records of what it scored."""
from __future__ import annotations

import json
import random
import string
import unicodedata

import numpy as np
import pytest

from clid.base import text
from clid.base.files import write_jsonl
from clid.data import token_cache
from clid.data.examples import Examples
from clid.data.inputs import CaptionFiles, make_examples, read_jsonl_table, training_items


def slow_words(caption: str) -> list[str]:
    """The preprocessing without its ASCII fast path: every character folded through unicodedata."""
    decomposed = unicodedata.normalize("NFD", caption.lower())
    folded = "".join(c for c in decomposed if unicodedata.category(c) != "Mn")
    return text._WORD.findall(folded.replace("'", "").replace("\u2019", ""))


@pytest.mark.slow
def test_ascii_fast_path_equals_the_full_preprocessing_on_the_coco_captions(coco_annotations):
    captions = [a["caption"] for a in json.loads((coco_annotations / "captions_val2014.json").read_text())["annotations"]]
    assert len(captions) == 202_654 and sum(c.isascii() for c in captions) > 200_000
    assert [text.karpathy_tokens(c) for c in captions] == [slow_words(c) for c in captions]


ODD = ["Café au lait", "NAÏVE résumé", "A man’s dog's bone", "Straße", "İstanbul", "ﬁsh ﬂag", "Ⅻ o'clock",
       "一只狗在草地上", "собака на траве", "Ωmega Σίσυφος", "\U0001F600 smiley", "x\u0301y", "tab\tand\nnewline",
       "don't', 'won’t", "", "...", "Ａ ｆｕｌｌｗｉｄｔｈ dog", "²³ squared", "ǅemal"]


def test_ascii_fast_path_equals_the_full_preprocessing_on_odd_and_random_text():
    rng = random.Random(0)
    alphabet = string.printable + "\x00\x7f'"
    randoms = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    for caption in ODD + randoms:
        assert text.karpathy_tokens(caption) == slow_words(caption), caption
        for keep in (False, True):
            sentences = [" ".join(slow_words(s)) for s in text._SENTENCE_END.split(caption)] if keep else None
            expected = " . ".join(s for s in sentences if s) if keep else " ".join(slow_words(caption))
            assert text.preprocess(caption, keep) == expected


def test_flat_token_ids_equal_the_tokenizer_and_levels_equal_length_to_level(fixtures):
    tok = text.load_tokenizer()
    captions = ODD + [s["raw"] for im in json.loads((fixtures / "dataset_coco_sample.json").read_text())["images"]
                      for s in im["sentences"]]
    ids, offsets = text.encode_flat(captions, tok)
    assert ids.dtype == np.int32 and offsets[0] == 0 and offsets[-1] == len(ids)
    for k, caption in enumerate(captions):
        expected = tok(text.preprocess(caption), add_special_tokens=False)["input_ids"] + [text.eos_id(tok)]
        assert ids[offsets[k]:offsets[k + 1]].tolist() == expected
    for name in text.LEVEL_SETS:
        lengths = np.arange(0, 140)
        assert text.length_levels(lengths, name).tolist() == [text.length_to_level(n, name) or 0 for n in lengths]


def test_examples_keep_their_interface_as_flat_arrays():
    tok = text.load_tokenizer()
    items = [("c0", "4", "a man riding a horse next to a dog"), ("c1", "5", "a dog"), ("c2", "4", "🙂"),
             ("c3", "6", " ".join(["word"] * 80))]
    examples, skipped = make_examples(items, tok, "caption", "selfgen")
    assert examples.caption_ids == ["c0", "c1"] and examples.levels.tolist() == [2, 1]
    assert skipped == {"selfgen: no word left after preprocessing": 1, "selfgen: length 81 outside the levels": 1}
    assert examples.tokens[1] == text.encode(["a dog"], tok)[0] and len(examples.tokens) == 2
    picked = examples.subset([1, 0, 1])
    assert picked.caption_ids == ["c1", "c0", "c1"] and list(picked.tokens) == [examples.tokens[i] for i in (1, 0, 1)]
    both = Examples() + picked + examples
    assert list(both.tokens) == list(picked.tokens) + list(examples.tokens) and both.levels.tolist() == [1, 2, 1, 2, 1]
    assert both.digests[0] == both.digests[2] != both.digests[1]
    with pytest.raises(IndexError):
        examples.tokens[2]


def selfgen_file(path, n=30, start=0):
    write_jsonl(path, [{"id": f"s{k}", "image_id": k % 7 + 1, "caption": f"A dog and a red ball number {k}."}
                       for k in range(start, start + n)])
    return path


def test_a_run_reads_each_caption_file_once(tmp_path, monkeypatch):
    from toyworld import make_toy_world

    from clid.data import inputs, splits
    from clid.training.batches import corpus_vocab

    captions, _ = make_toy_world(tmp_path, n_train=7, n_val=1, n_test=1)
    selfgen = selfgen_file(tmp_path / "selfgen.jsonl")
    calls = {"records": 0, "jsonl": 0}
    original_info, original_jsonl = splits.split_info, inputs.read_jsonl_table
    monkeypatch.setattr(splits, "split_info", lambda *a: calls.__setitem__("records", calls["records"] + 1) or original_info(*a))
    monkeypatch.setattr(inputs, "read_jsonl_table", lambda *a: calls.__setitem__("jsonl", calls["jsonl"] + 1) or original_jsonl(*a))
    files, tok = CaptionFiles(), text.load_tokenizer()
    vocab = corpus_vocab([captions, selfgen], tok, files)  # --output-vocab, then the training data
    items = training_items(captions, selfgen, files=files, tokenizer=tok)
    assert calls == {"records": 1, "jsonl": 1}
    assert len(items.selfgen) == 30 and set(np.unique(items.selfgen.token_ids)) <= set(vocab)
    assert vocab == corpus_vocab([captions, selfgen], tok)  # the same shortlist as a fresh read


def test_token_cache_is_used_then_rebuilt_when_stale_corrupt_or_of_another_tokenizer(tmp_path, monkeypatch, capsys):
    path = selfgen_file(tmp_path / "selfgen.jsonl")
    tok = text.load_tokenizer()
    fresh = read_jsonl_table(path, tok, False)[0]

    def cached():
        table = CaptionFiles("caption", cache=True).selfgen_table(path, tok)
        for name in ("caption_ids", "image_ids"):
            assert getattr(table, name) == getattr(fresh, name)
        for name in ("token_ids", "offsets", "digests"):
            assert np.array_equal(getattr(table, name), getattr(fresh, name))
        return capsys.readouterr().out

    target = token_cache.cache_path(path, "caption")
    assert cached() == "" and target.name == "selfgen.jsonl.tokens-caption.npz" and target.exists()
    monkeypatch.setattr("clid.data.inputs.read_jsonl_table", lambda *a: pytest.fail("the cache was not used"))
    assert cached() == ""
    monkeypatch.undo()

    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])  # truncated
    assert "the token cache is unreadable" in cached() and cached() == ""
    data = bytearray(target.read_bytes())  # a flipped byte inside the token ids: the zip's CRC, or the checks
    at = data.index(b"token_ids.npy") + 200
    data[at] ^= 0xFF
    target.write_bytes(bytes(data))
    assert "rebuilding it" in cached()

    other = text.load_tokenizer(str(text.default_tokenizer_path()))  # the same vocabulary, another object
    assert token_cache.tokenizer_digest(other) == token_cache.tokenizer_digest(tok)
    with np.load(target) as f:
        arrays = dict(f)
    header = json.loads(arrays["header"].tobytes())
    arrays["header"] = np.frombuffer(json.dumps(dict(header, tokenizer="0" * 32)).encode(), np.uint8)
    np.savez(target, **arrays)
    assert "built from another tokenizer; rebuilding it" in cached()

    selfgen_file(path, n=30, start=1)  # the file changed: stale
    fresh = read_jsonl_table(path, tok, False)[0]
    assert "built from other content of the file; rebuilding it" in cached() and cached() == ""
    labert = token_cache.cache_path(path, "labert")  # another level set: a cache of its own
    labert.write_bytes(target.read_bytes())
    CaptionFiles("labert", cache=True).selfgen_table(path, tok)
    assert "built from other levels; rebuilding it" in capsys.readouterr().out and target.exists()


def test_concurrent_runs_each_write_a_whole_cache_and_readers_never_see_a_part(tmp_path, capsys):
    """Runs that start together (SLURM array tasks) all build the cache; each writes a whole one under a name
    of its own and renames it into place, so a reader meanwhile finds no cache or a whole one."""
    from concurrent.futures import ThreadPoolExecutor

    path = selfgen_file(tmp_path / "selfgen.jsonl", n=5000)
    tok = text.load_tokenizer()
    key = token_cache.cache_key(path, tok, "caption")
    writers = [lambda: CaptionFiles("caption", cache=True).selfgen_table(path, tok) for _ in range(4)]
    seen = []
    with ThreadPoolExecutor(5) as pool:
        running = [pool.submit(w) for w in writers]
        while not all(r.done() for r in running):
            found = token_cache.load(path, key, len(tok))
            seen.append(None if found is None else len(found[0]))
    assert [r.result() is not None for r in running] == [True] * 4
    assert set(seen) <= {None, 5000} and "token cache" not in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["selfgen.jsonl", "selfgen.jsonl.tokens-caption.npz"]
    table, fault = token_cache.load(path, key, len(tok))
    assert fault is None and table.caption_ids == [f"s{k}" for k in range(5000)]


def test_epoch_batches_equal_a_fresh_permutation_at_every_step():
    from clid.base.rng import item_rng
    from clid.training.batches import epoch_batches, epoch_order

    def today(n, batch_size, step, seed, tag):  # every step computing the permutation, as before the cache
        start, out = step * batch_size, []
        while len(out) < batch_size:
            epoch, offset = divmod(start + len(out), n)
            out += item_rng(seed, tag, epoch).permutation(n)[offset:offset + batch_size - len(out)].tolist()
        return out

    for n, batch_size, tag in ((10, 4, "data"), (7, 16, ("iter", 3)), (1000, 64, ("round", 0))):
        for step in list(range(40)) + [37, 3, 0]:  # forward, then back (a resumed run starts anywhere)
            assert epoch_batches(n, batch_size, step, 5, tag).tolist() == today(n, batch_size, step, 5, tag)
    assert not epoch_order(10, 5, "data", 0).flags.writeable


def odd_jsonl(path, n: int = 400) -> None:
    """Captions as people write them: accents, apostrophes, paragraphs, blank lines, CRLF line ends and a
    BOM, integer and string ids."""
    rng = random.Random(5)
    words = ["a", "dog", "café", "man's", "naïve", "on", "the", "grass", "Ünter", "sitting", "red", "ball"]
    lines = []
    for i in range(n):
        caption = " ".join(rng.choice(words) for _ in range(rng.randint(1, 30))) + rng.choice([".", "! A cat.", ""])
        lines.append(json.dumps({"id": i if i % 3 else f"c{i}", "image_id": i % 17, "caption": caption},
                                ensure_ascii=i % 2 == 0))
        if i % 50 == 7:
            lines.append("   ")
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")


@pytest.mark.parametrize("keep_sentences", [False, True])
def test_a_long_file_read_by_several_processes_gives_the_serial_table(tmp_path, monkeypatch, keep_sentences):
    from clid.data import inputs, parallel_read

    path = tmp_path / "selfgen.jsonl"
    odd_jsonl(path)
    tok = text.load_tokenizer()
    serial, fault = read_jsonl_table(path, tok, keep_sentences)
    monkeypatch.setattr(inputs, "PARALLEL_FROM", 10)
    monkeypatch.setattr(parallel_read, "processes", lambda: 3)
    ranges = parallel_read.line_ranges(path, 24)
    assert len(ranges) == 24 and ranges[0][0] == 3 and ranges[-1][1] == path.stat().st_size  # (past the BOM)
    together, fault_together = read_jsonl_table(path, tok, keep_sentences)
    assert fault is fault_together is None and len(serial) == 400
    for name in ("image_ids", "caption_ids", "sources"):
        assert getattr(together, name) == getattr(serial, name)
    for name in ("token_ids", "offsets", "levels", "digests"):
        a, b = getattr(together, name), getattr(serial, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name


@pytest.mark.parametrize("change, fragment", [
    (lambda lines: lines[:380] + ['{"id": 5, "image_id": 1, "caption": "a dog"'] + lines[381:], "not valid JSON"),
    (lambda lines: lines[:390] + [json.dumps({"id": "c3", "image_id": 1, "caption": "a dog"})] + lines[391:],
     "appears twice"),
    (lambda lines: lines[:395] + [json.dumps({"id": 9, "image_id": 1, "caption": 7})] + lines[396:],
     "'caption' must be a string"),
])
def test_a_fault_in_a_later_part_is_named_as_the_serial_reader_names_it(tmp_path, monkeypatch, change, fragment):
    from clid.base.files import DataError
    from clid.data import inputs, parallel_read

    path = tmp_path / "selfgen.jsonl"
    odd_jsonl(path)
    path.write_text("\n".join(change(path.read_text(encoding="utf-8-sig").splitlines())) + "\n")
    tok = text.load_tokenizer()
    with pytest.raises(DataError) as serial:
        read_jsonl_table(path, tok, False)
    monkeypatch.setattr(inputs, "PARALLEL_FROM", 10)
    monkeypatch.setattr(parallel_read, "processes", lambda: 3)
    with pytest.raises(DataError) as together:
        read_jsonl_table(path, tok, False)
    assert str(together.value) == str(serial.value) and fragment in str(serial.value)


def test_a_record_without_an_id_in_a_long_file_is_found_as_before(tmp_path, monkeypatch):
    from clid.data import inputs, parallel_read

    path = tmp_path / "selfgen.jsonl"
    odd_jsonl(path)
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    lines[350] = json.dumps({"image_id": 1, "caption": "a dog"})
    path.write_text("\n".join(lines) + "\n")
    serial = read_jsonl_table(path, text.load_tokenizer(), False)
    monkeypatch.setattr(inputs, "PARALLEL_FROM", 10)
    monkeypatch.setattr(parallel_read, "processes", lambda: 3)
    together = read_jsonl_table(path, text.load_tokenizer(), False)
    assert together[1] == serial[1] and serial[1][1].startswith("missing") and together[0].caption_ids == serial[0].caption_ids


def test_threads_that_tokenise_at_once_read_a_whole_word_cache():
    """Threads encoding with one tokenizer (06 prepares its next round in a thread) share its word cache and
    each gets the ids the tokenizer gives word by word."""
    from concurrent.futures import ThreadPoolExecutor

    tok = text.load_tokenizer.__wrapped__()  # (a tokenizer of its own: its word cache starts empty)
    rng = random.Random(3)
    words = sorted(w for w in tok.vocab if w.isalpha() and w.isascii())
    batches = [[[rng.choice(words) for _ in range(rng.randint(1, 12))] for _ in range(600)] for _ in range(8)]

    def encode(captions):
        encoder = text.FlatEncoder(tok, chunk=7)
        for caption in captions:
            encoder.add(caption)
        return encoder.finish()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(encode, batches))
    end = text.eos_id(tok)
    for captions, (ids, offsets) in zip(batches, results):
        for k, caption in enumerate(captions):
            want = [p for w in caption for p in tok(w, add_special_tokens=False)["input_ids"]] + [end]
            assert ids[offsets[k]:offsets[k + 1]].tolist() == want
