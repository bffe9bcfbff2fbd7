"""CLID's peers in 06 (``--strategy``): loss-based curation and a Baby Step curriculum, each a strategy object
whose ``rounds(step, state)`` yields the rounds to train (:mod:`clid.selection.strategies` says what each does)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from clid.base.files import DataError
from clid.selection.schedule import Pool, Round, digest, scores_for

# ---------------------------------------------------------------------------------------------
# loss-remove, loss-replacecap


def flag_high_loss(loss: np.ndarray, ratio: float | None = None, n_std: float | None = None) -> np.ndarray:
    """Positions of the flagged samples, highest loss first: the top ``round(N * ratio)`` by loss (ties:
    the earlier position first), or, with ``n_std``, every loss above mean + n_std * std (ddof 1)."""
    loss = np.asarray(loss, dtype=np.float64)
    order = np.argsort(-loss, kind="stable")
    if n_std is not None:
        if len(loss) < 2:
            return np.zeros(0, dtype=np.int64)
        cut = loss.mean() + n_std * loss.std(ddof=1)
        return order[loss[order] > cut]
    return order[:round(len(loss) * ratio)]


class LossCuration:
    """``loss-remove`` and ``loss-replacecap`` (see the module docstring).

    ``logp(indices)`` returns the current model's Eq. 2 for those examples. The state is the list of
    curations; the current set is rebuilt from it (:meth:`members`).
    """

    def __init__(self, pool: Pool, args, logp: Callable[[np.ndarray], np.ndarray], check=None):
        self.pool, self.args, self.logp, self.check = pool, args, logp, check
        self.replace = args.strategy == "loss-replacecap"
        self.history: list[dict] = []
        by_image: dict[str, list[int]] = {}
        for index, image_id in enumerate(pool.image_ids):
            by_image.setdefault(image_id, []).append(index)
        self.captions_of_image = by_image
        if not self.replace and args.curate_std is None:
            self.check_not_emptied()

    def check_not_emptied(self) -> None:
        """Refuse (a DataError) a ``--curate-ratio`` that removes every caption before ``--max-steps``: the sizes
        of the set after each curation are known in advance (``round(N * ratio)`` go each time)."""
        size, every, ratio = self.pool.size, self.args.curate_every, self.args.curate_ratio
        for step in range(every, self.args.max_steps, every):
            flagged = round(size * ratio)
            if not flagged:
                return
            size -= flagged
            if not size:
                raise DataError(None, None, f"--strategy loss-remove with --curate-ratio {ratio:g} every {every} "
                                            f"steps removes every one of the {self.pool.size} captions by step {step} "
                                            f"(of --max-steps {self.args.max_steps}): give a smaller --curate-ratio "
                                            "or a larger --curate-every")

    def summary(self) -> list[str]:
        rule = (f"the samples above mean + {self.args.curate_std:g} std" if self.args.curate_std is not None
                else f"the top {100 * self.args.curate_ratio:g}%")
        action = "replaced by another caption of their image" if self.replace else "removed"
        return [f"plan: start from the whole extended set ({self.pool.size} captions); every "
                f"{self.args.curate_every} steps, {rule} by loss ({self.args.loss_mode} Eq. 2) are {action}"]

    def members(self, history: list[dict] | None = None) -> np.ndarray:
        """The current training set after the curations of ``history``: example indices, one per sample."""
        members = np.arange(self.pool.size)
        if self.replace:
            for entry in history if history is not None else self.history:
                for position, _, new in entry["replaced"]:
                    members[position] = new
            return members
        keep = np.ones(self.pool.size, dtype=bool)
        for entry in history if history is not None else self.history:
            keep[entry["removed"]] = False
        return members[keep]

    def curate(self, step: int) -> dict:
        """Score the current set with the current model and flag its highest-loss samples."""
        started = time.time()
        members = self.members()
        unique, inverse = np.unique(members, return_inverse=True)
        loss = -np.asarray(self.logp(unique), dtype=np.float64)[inverse]
        flagged = flag_high_loss(loss, self.args.curate_ratio, self.args.curate_std)
        entry = {"step": step, "size": int(len(members)), "loss_mean": round(float(loss.mean()), 5),
                 "loss_std": round(float(loss.std(ddof=1)) if len(loss) > 1 else 0.0, 5), "flagged": int(len(flagged))}
        if self.replace:
            entry["replaced"] = self.replacements(members, flagged, step)
        else:
            entry["removed"] = sorted(int(members[p]) for p in flagged)
        entry["seconds"] = round(time.time() - started, 2)
        return entry

    def replacements(self, members: np.ndarray, flagged: np.ndarray, step: int) -> list[list[int]]:
        """[position, old example, new example] per flagged sample, highest loss first. A flagged caption is
        never drawn again; its replacement is a random never-flagged caption of its image (or itself)."""
        from clid.base.rng import item_rng

        spent = {int(old) for entry in self.history for _, old, _ in entry["replaced"]}
        out = []
        for position in flagged:
            old = int(members[position])
            spent.add(old)
            candidates = [c for c in self.captions_of_image[self.pool.image_ids[old]] if c not in spent]
            new = candidates[int(item_rng(self.args.seed, "replacecap", step, int(position)).integers(len(candidates)))] \
                if candidates else old
            out.append([int(position), old, int(new)])
        return out

    def log_rows(self) -> list[dict]:
        """One line per round: sizes and what changed, by caption id."""
        rows, n_trusted = [], self.pool.n_trusted
        for r, entry in enumerate([{"step": 0}] + self.history):
            members = self.members(self.history[:r])
            row = {"round": r, "start": entry["step"], "size": int(len(members)),
                   "trusted": int((members < n_trusted).sum()), "pool": int((members >= n_trusted).sum()),
                   "digest": digest(members)}
            if r:
                row.update({k: entry[k] for k in ("loss_mean", "loss_std", "flagged", "seconds")})
                ids = self.pool.caption_ids
                if self.replace:
                    row["replaced"] = [[ids[old], ids[new]] for _, old, new in entry["replaced"]]
                else:
                    row["removed"] = [ids[i] for i in entry["removed"]]
            rows.append(row)
        return rows

    def rounds(self, step: int, state: dict) -> Iterator[Round]:
        every, max_steps = self.args.curate_every, self.args.max_steps
        self.history = [e for e in state.get("curations", []) if e["step"] <= step]
        r = step // every
        while r * every < max_steps:
            start = r * every
            if start > 0 and (not self.history or self.history[-1]["step"] < start):
                entry = self.curate(start)
                self.history.append(entry)
                if self.check is not None:
                    self.check(digest(self.members()))
                yield_note = (f"curation at step {start}: loss {entry['loss_mean']:.3f} ± {entry['loss_std']:.3f}, "
                              f"{entry['flagged']} of {entry['size']} flagged ({entry['seconds']:.1f} s)")
            else:
                yield_note = None
            members = self.members()
            end = min(start + every, max_steps)
            n_pool = int((members >= self.pool.n_trusted).sum())
            text = (f"round {r}: {len(members)} captions ({n_pool} self-generated), steps {start}-{end}"
                    + (f"; {yield_note}" if yield_note else ""))
            yield Round(("round", r), start, end, members, text, {"curations": self.history})
            r += 1

    def seconds(self) -> float:
        return float(sum(e["seconds"] for e in self.history))


# ---------------------------------------------------------------------------------------------
# curriculum (Baby Step)


def difficulty_buckets(difficulty: np.ndarray, n_buckets: int) -> list[np.ndarray]:
    """Example indices sorted easiest first (ties by index), cut into ``n_buckets`` near-equal buckets."""
    difficulty = np.asarray(difficulty, dtype=np.float64)
    order = np.lexsort((np.arange(len(difficulty)), difficulty))
    return [np.sort(b) for b in np.array_split(order, n_buckets)]


def baby_step(scores: list[float], patience: int, n_buckets: int, min_improvement: float = 0.0) -> list[int]:
    """The number of buckets in use after each evaluation of ``scores`` (higher is better).

    Training starts on one bucket. An evaluation that does not beat the best score since the last
    bucket was added by more than ``min_improvement`` is flat; after ``patience`` flat evaluations in
    a row the next bucket is added (and the best and the count start over).
    """
    active, best, flat, out = 1, None, 0, []
    for score in scores:
        if best is None or score > best + min_improvement:
            best, flat = score, 0
        else:
            flat += 1
        if flat >= patience and active < n_buckets:
            active, best, flat = active + 1, None, 0
        out.append(active)
    return out


class BabyStep:
    """``curriculum``: Baby Step over difficulty buckets (see the module docstring).

    ``val_score()`` returns the current model's validation score (higher is better); the state is the
    list of evaluations, from which the buckets in use are recomputed (:func:`baby_step`).
    """

    def __init__(self, pool: Pool, difficulty: np.ndarray, args, val_score: Callable[[], float],
                 difficulty_seconds: float = 0.0):
        self.pool, self.args, self.val_score = pool, args, val_score
        self.buckets = difficulty_buckets(difficulty, args.buckets)
        self.difficulty = difficulty
        self.difficulty_seconds = difficulty_seconds
        self.history: list[dict] = []
        self.sets: dict[int, tuple] = {}  # buckets in use -> (their examples, self-generated count, digest)

    def summary(self) -> list[str]:
        sizes = [len(b) for b in self.buckets]
        means = [round(float(self.difficulty[b].mean()), 3) if len(b) else None for b in self.buckets]
        pools = [int((b >= self.pool.n_trusted).sum()) for b in self.buckets]
        return [f"plan: Baby Step over {len(self.buckets)} buckets by difficulty {self.args.difficulty} "
                f"(sizes {sizes}, self-generated {pools}, mean difficulty {means}); a validation evaluation every "
                f"{self.args.curate_every} steps, the next bucket after {self.args.patience} without an improvement "
                f"of more than {self.args.min_improvement:g}"]

    def active(self, history: list[dict] | None = None) -> int:
        history = self.history if history is None else history
        if not history:
            return 1
        return baby_step([e["score"] for e in history], self.args.patience, len(self.buckets),
                         self.args.min_improvement)[-1]

    def members(self, history: list[dict] | None = None) -> np.ndarray:
        return self.training_set(self.active(history))[0]

    def training_set(self, active: int) -> tuple[np.ndarray, int, str]:
        """(the examples of the first ``active`` buckets, how many are self-generated, their digest), computed
        once per bucket count, not at every round."""
        if active not in self.sets:
            members = np.sort(np.concatenate(self.buckets[:active]))
            self.sets[active] = (members, int((members >= self.pool.n_trusted).sum()), digest(members))
        return self.sets[active]

    def log_rows(self) -> list[dict]:
        rows = []
        for r, entry in enumerate([{"step": 0}] + self.history):
            active = self.active(self.history[:r])
            members, n_pool, members_digest = self.training_set(active)
            row = {"round": r, "start": entry["step"], "buckets": active, "size": int(len(members)), "pool": n_pool,
                   "digest": members_digest}
            if r:
                row.update(score=entry["score"], seconds=entry["seconds"])
            else:
                row["difficulty_seconds"] = round(self.difficulty_seconds, 2)
            rows.append(row)
        return rows

    def rounds(self, step: int, state: dict) -> Iterator[Round]:
        every, max_steps = self.args.curate_every, self.args.max_steps
        self.history = [e for e in state.get("evaluations", []) if e["step"] <= step]
        r = step // every
        while r * every < max_steps:
            start = r * every
            note = None
            if start > 0 and (not self.history or self.history[-1]["step"] < start):
                started = time.time()
                score = float(self.val_score())
                self.history.append({"step": start, "score": round(score, 6), "seconds": round(time.time() - started, 2)})
                note = f"validation log p {score:.4f}"
            members = self.members()
            end = min(start + every, max_steps)
            text = (f"round {r}: buckets 1-{self.active()} of {len(self.buckets)}, {len(members)} captions, "
                    f"steps {start}-{end}" + (f"; {note}" if note else ""))
            yield Round(("round", r), start, end, members, text, {"evaluations": self.history})
            r += 1

    def seconds(self) -> float:
        return self.difficulty_seconds + float(sum(e["seconds"] for e in self.history))


# ---------------------------------------------------------------------------------------------
# Difficulty of every example (curriculum)


def clip_similarity(folder, images, texts: list[str], image_ids: list[str], filenames: dict[str, str],
                    batch_size: int = 64, device="cpu") -> np.ndarray:
    """Cosine similarity of each (image, text) pair under a transformers CLIPModel saved in ``folder``."""
    from PIL import Image, UnidentifiedImageError
    from transformers import CLIPModel, CLIPProcessor

    from clid.data.images import convert_image

    try:
        model = CLIPModel.from_pretrained(str(folder)).to(device).eval()
        processor = CLIPProcessor.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError) as err:
        from clid.base.hub import load_problem

        raise DataError(folder, None, f"not a transformers CLIP model folder ({load_problem(str(folder), err)})") from None
    image_embeds = {}
    unique = list(dict.fromkeys(image_ids))
    with torch.no_grad():
        for start in range(0, len(unique), batch_size):
            chunk = unique[start:start + batch_size]
            pixels = []
            for image_id in chunk:
                if image_id not in filenames:
                    raise DataError(images, f"image {image_id}", "the captions file names no image file for it")
                path = Path(images) / filenames[image_id]
                try:
                    with Image.open(path) as im:
                        pixels.append(convert_image(im, "RGB"))
                except (OSError, UnidentifiedImageError) as err:
                    raise DataError(path, f"image {image_id}", f"cannot read the image ({type(err).__name__})") from None
            inputs = processor(images=pixels, return_tensors="pt")
            embeds = model.get_image_features(pixel_values=inputs["pixel_values"].to(device))
            embeds = getattr(embeds, "pooler_output", embeds)
            for image_id, e in zip(chunk, torch.nn.functional.normalize(embeds.float(), dim=-1)):
                image_embeds[image_id] = e
        out = np.empty(len(texts))
        for start in range(0, len(texts), batch_size):
            inputs = processor(text=texts[start:start + batch_size], return_tensors="pt", padding=True, truncation=True)
            embeds = model.get_text_features(input_ids=inputs["input_ids"].to(device),
                                             attention_mask=inputs["attention_mask"].to(device))
            embeds = torch.nn.functional.normalize(getattr(embeds, "pooler_output", embeds).float(), dim=-1)
            pictures = torch.stack([image_embeds[i] for i in image_ids[start:start + batch_size]])
            out[start:start + batch_size] = (embeds * pictures).sum(-1).cpu().numpy()
    return out


def example_difficulty(args, pool: Pool, examples, texts: list[str], filenames: dict[str, str], regions, device,
                       out: Path, levels, write: bool = True) -> tuple[np.ndarray, float]:
    """(difficulty of every example, seconds spent), cached in OUT/difficulty.h5 for a resumed run."""
    from clid.base.files import read_arrays, write_arrays

    cache = Path(out) / "difficulty.h5"
    if cache.is_file():
        saved = read_arrays(cache)
        if list(saved.get("id", [])) == pool.caption_ids and "difficulty" in saved:
            return np.asarray(saved["difficulty"], dtype=np.float64), float(saved.get("seconds", [0.0])[0])
    started = time.time()
    kind, _, where = args.difficulty.partition(":")
    if kind == "u":  # minus CLID's score: the trusted captions' from 05 --include-trusted
        ids = [f"trusted:{c}" if k < pool.n_trusted else c for k, c in enumerate(pool.caption_ids)]
        difficulty = -scores_for(ids, args.quality, examples.digests, args.selfgen, args.captions).numpy().astype(np.float64)
    elif kind == "bootstrap":  # the loss under a model trained on the trusted captions
        difficulty = -bootstrap_logprobs(where, examples, regions, args.loss_mode, device, levels)
    else:  # minus the CLIP similarity of image and text
        difficulty = -clip_similarity(where, args.images, texts, pool.image_ids, filenames, device=device)
    seconds = time.time() - started
    if write:
        write_arrays(cache, {"id": np.asarray(pool.caption_ids, dtype=object), "difficulty": difficulty,
                             "seconds": np.full(len(difficulty), seconds)})
    return difficulty, seconds


def bootstrap_logprobs(folder, examples, regions, mode: str, device, levels) -> np.ndarray:
    """Eq. 2 of every example under the checkpoint in ``folder`` (trained on the same ``levels``)."""
    from clid.model.checkpoints import check_same_levels, load_checkpoint
    from clid.model.scoring import caption_logprobs

    model = load_checkpoint(folder, device)
    check_same_levels("--difficulty bootstrap:", folder, model.config.levels, levels)
    tokens = torch.tensor(sorted({t for row in examples.tokens for t in row}))
    missing = tokens[model.to_output(tokens) < 0]
    if len(missing):
        raise DataError(None, None, f"--difficulty bootstrap:{folder}: token "
                                    f"{model.tokenizer.convert_ids_to_tokens(int(missing[0]))!r} of the captions is "
                                    "not in its output vocabulary (train it with the same --output-vocab)")
    return caption_logprobs(model, examples, regions, mode, 64, device)
