import pytest

from clid.base import text
from clid.base.files import DataError


def test_karpathy_preprocessing():
    assert text.karpathy_tokens("A Man's  dog, jumping!") == ["a", "mans", "dog", "jumping"]
    assert text.preprocess("Two dogs play in 2 parks.") == "two dogs play in 2 parks"
    assert text.preprocess("A dog. A cat!", keep_sentences=True) == "a dog . a cat"


def test_length_counts_wordpieces_plus_final_period():
    tok = text.load_tokenizer()
    assert len(tok.vocab) == 30522
    # "skateboarder" is split into word pieces by bert-base-uncased
    pieces = tok.tokenize("a skateboarder doing tricks")
    assert len(pieces) > 4
    assert text.caption_length("A skateboarder doing tricks.") == len(pieces) + 1
    assert text.caption_length("Dog") == 2
    assert text.caption_length("") == 1  # only the final "."
    ids = text.encode(["a dog"])[0]
    assert ids[-1] == text.eos_id(tok) == tok.convert_tokens_to_ids(".")
    assert ids[:-1] == tok("a dog", add_special_tokens=False)["input_ids"]


def test_encode_matches_the_tokenizer_on_real_captions(fixtures):
    from clid.data.captions import load_karpathy

    tok = text.load_tokenizer()
    captions = [c for r in load_karpathy(fixtures / "dataset_coco_sample.json") for c in r.captions]
    for caption, ids in zip(captions, text.encode(captions, tok)):
        assert ids == tok(caption, add_special_tokens=False)["input_ids"] + [text.eos_id(tok)]


def test_decode_cuts_at_first_period():
    tok = text.load_tokenizer()
    ids = text.encode(["a man riding a horse"])[0] + text.encode(["extra words"])[0]
    assert text.decode(ids, tok) == "a man riding a horse"


SENTENCES = ["a man riding a horse", "the horse is brown", "a tree stands behind them",
             "the sky is blue", "two dogs run on the grass"]


@pytest.mark.parametrize("n_sentences", [1, 2, 5])
@pytest.mark.parametrize("padding", [0, 3])
def test_paragraph_decode_keeps_every_sentence_and_drops_only_the_padding(n_sentences, padding):
    tok = text.load_tokenizer()
    eos = text.eos_id(tok)
    paragraph = ". ".join(SENTENCES[:n_sentences]) + "."
    ids = text.encode([paragraph], tok, keep_sentences=True)[0]   # sentences, "." between them, final "."
    assert ids.count(eos) == n_sentences
    generated = ids + [eos] * padding                             # LaBERT pads to the level with "."
    end = text.content_end(generated, eos, keep_sentences=True)
    assert end == len(ids) - 1                                     # the text ends before the final "."
    decoded = text.decode(generated, tok, keep_sentences=True)
    assert decoded == ". ".join(SENTENCES[:n_sentences])
    # the decoded paragraph re-encodes to the same ids: its length is the counted length
    assert text.encode([decoded], tok, keep_sentences=True)[0] == ids
    # a caption (not a paragraph) is still cut at its first "."
    assert text.decode(generated, tok) == SENTENCES[0]
    assert text.content_end(generated, eos) == ids.index(eos)


def test_paragraph_that_fills_its_length_without_a_final_period():
    tok = text.load_tokenizer()
    eos = text.eos_id(tok)
    ids = text.encode(["a dog runs. a cat sleeps"], tok, keep_sentences=True)[0][:-1]  # no final "."
    assert text.content_end(ids, eos, keep_sentences=True) == len(ids)
    assert text.decode(ids, tok, keep_sentences=True) == "a dog runs. a cat sleeps"
    assert text.content_end([eos, eos], eos, keep_sentences=True) == 0    # nothing but padding
    assert text.keeps_sentences("paragraph") and not text.keeps_sentences("caption")


def test_level_sets():
    assert text.get_levels("caption") == ((1, 9), (10, 19), (20, 29), (30, 39), (40, 49), (50, 59), (60, 69))
    paragraph = text.get_levels("paragraph")
    assert len(paragraph) == 13 and paragraph[0] == (1, 9) and paragraph[-1] == (120, 129)
    assert text.get_levels("labert") == ((7, 9), (10, 14), (15, 19), (20, 25))
    with pytest.raises(ValueError):
        text.get_levels("nope")
    with pytest.raises(ValueError):
        text.get_levels([(1, 10), (10, 20)])  # overlapping


@pytest.mark.parametrize("length,level", [(1, 1), (9, 1), (10, 2), (19, 2), (20, 3), (69, 7), (70, None), (0, None)])
def test_length_to_level_and_back(length, level):
    assert text.length_to_level(length) == level
    if level is not None:
        low, high = text.level_range(level)
        assert low <= length <= high


def test_labert_levels_leave_gaps():
    assert text.length_to_level(6, "labert") is None
    assert text.length_to_level(7, "labert") == 1
    assert text.length_to_level(25, "labert") == 4
    assert text.level_range(2, "labert") == (10, 14)
    with pytest.raises(ValueError):
        text.level_range(5, "labert")


def test_other_tokenizer_folder(tmp_path):
    # a locally saved tokenizer folder is selectable by path
    tok = text.load_tokenizer()
    tok.save_pretrained(tmp_path)
    other = text.load_tokenizer(str(tmp_path))
    assert text.encode(["a dog"], other) == text.encode(["a dog"], tok)
    with pytest.raises(DataError, match="cannot load the tokenizer"):
        text.load_tokenizer(str(tmp_path / "missing"))


def test_accents_fold_as_bert_uncased_and_wordless_text_is_empty():
    from clid.base.text import karpathy_tokens, load_tokenizer, preprocess

    assert preprocess("Café crème in Zürich, São Paulo") == "cafe creme in zurich sao paulo"
    # the same folding as the uncased BERT tokenizer, so the length counts the word, not [UNK]
    tokenizer = load_tokenizer()
    for word in ("café", "naïve", "élan"):
        assert tokenizer.tokenize(word) == tokenizer.tokenize(preprocess(word))
    assert karpathy_tokens("一只狗 \U0001F436 !!") == []
    assert preprocess("\U0001F600") == ""


def test_many_captions_show_tokenizing_progress_and_the_same_ids(fixtures, monkeypatch, capsys):
    """From clid.base.progress.LARGE captions on, encoding prints plain progress lines (no terminal here);
    the ids are those of the captions encoded one by one."""
    import json

    from clid.base.progress import LARGE

    monkeypatch.setenv("CLID_PROGRESS_SECONDS", "0")
    images = json.loads((fixtures / "dataset_coco_sample.json").read_text())["images"]
    captions = [s["raw"] for image in images for s in image["sentences"]]
    many = (captions * (LARGE // len(captions) + 1))[:LARGE + 5]
    ids = text.encode(many)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(f"tokenizing captions: caption {LARGE + 5}/{LARGE + 5} (100%)")
    assert len(lines) >= 2 and all(line.startswith("tokenizing captions: caption ") for line in lines)
    assert ids[:len(captions)] == [text.encode([c])[0] for c in captions] and len(ids) == LARGE + 5
    text.encode(captions)
    assert capsys.readouterr().out == ""  # (fewer: silent)
