"""Training batches of 04 and 06, each a function of (seed, step) alone, so that loader processes in any number
and a resumed run give the same batches.

- :func:`collate`: LaBERT's training input: pad each caption with "." to its level's highest length, mask a
  uniform count in [max(1, int(0.1 * high)), high] of its positions;
- :class:`StepBatches`: a run's batches by step, for loader processes;
- :func:`epoch_batches`, :func:`balanced_batches`: which examples make the global batch at a step.
"""
import functools
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from clid.base.files import DataError
from clid.base.rng import item_rng, item_seed
from clid.base.text import eos_id
from clid.data.examples import Examples
from clid.data.store import RegionCache
from clid.model.captioner import Captioner


def corpus_vocab(paths, tokenizer, files=None) -> list[int]:
    """Sorted token ids used by the captions of these files, plus "." and [UNK] (an output shortlist).
    ``files``: the run's :class:`CaptionFiles` (its tables are shared with the rest of the run)."""
    from clid.data.inputs import CaptionFiles

    files = files or CaptionFiles()
    ids = {eos_id(tokenizer), tokenizer.unk_token_id}
    for path in paths:
        ids.update(np.flatnonzero(np.bincount(files.table(path, tokenizer).token_ids)).tolist())
    return sorted(ids)


def collate(examples: Examples, indices, model: Captioner, seed: int, step: int, positions=None):
    """LaBERT's training batch for ``indices`` (``positions``: each example's place in the global batch).

    Returns (input_ids, targets, masked, levels): ``input_ids`` [B, T] with masks applied (PAD beyond
    each level's length), ``targets`` [B, T] the true ids, ``masked`` [B, T] bool.
    """
    tok = model.tokenizer
    end, pad, mask_id = eos_id(tok), tok.pad_token_id, tok.mask_token_id
    highs = [model.levels[examples.levels[i] - 1][1] for i in indices]
    T = max(highs)
    targets = torch.full((len(indices), T), pad, dtype=torch.long)
    masked = torch.zeros((len(indices), T), dtype=torch.bool)
    positions = range(len(indices)) if positions is None else positions
    for row, (i, high, place) in enumerate(zip(indices, highs, positions)):
        ids = examples.tokens[i]
        targets[row, :high] = torch.tensor(ids + [end] * (high - len(ids)))
        rng = item_rng(seed, "mask", step, place)  # keyed by the global position: same on any world size
        n_mask = int(rng.integers(max(1, int(0.1 * high)), high + 1))
        masked[row, torch.from_numpy(rng.choice(high, n_mask, replace=False))] = True
    input_ids = targets.masked_fill(masked, mask_id)
    levels = torch.tensor([examples.levels[i] for i in indices], dtype=torch.long)
    return input_ids, targets, masked, levels


class StepBatches(torch.utils.data.Dataset):
    """A training run's batches by step: item i is this rank's share of the global batch ``batch_for(step)``
    at ``steps[i]``, collated (:func:`collate`), with its padded regions and the flat places and head classes
    of its masked positions, all on the CPU. A batch depends only on (seed, step), so loader workers in any
    number give the same batches, and a resumed run the rest of them.

    A worker reads regions from the training process's cache when it holds every image (:meth:`RegionCache.preload`),
    else through its own HDF5 handle (:meth:`open_in_worker`), uncached. Bad input met in
    a worker (an image's features, a token outside the head's vocabulary) comes back as a :class:`BadBatch`,
    raised in the training process as the DataError it would have been there.
    """

    def __init__(self, examples: Examples, model: Captioner, regions: RegionCache, batch_for: Callable[[int], np.ndarray],
                 steps: range, seed: int, rank: int = 0, world: int = 1):
        self.examples, self.model, self.regions, self.batch_for = examples, model, regions, batch_for
        self.steps, self.seed, self.rank, self.world = steps, seed, rank, world
        index = model.output_index  # token id -> head class (-1: not predictable), read on the CPU
        self.output_index = None if index is None else index.cpu()

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i: int):
        step = self.steps[i]
        global_indices = self.batch_for(step)
        places = np.arange(len(global_indices))[self.rank::self.world]
        indices = global_indices[places]
        try:
            input_ids, targets, masked, levels = collate(self.examples, indices, self.model, self.seed, step, places)
            regions = self.regions.batch([self.examples.image_ids[i] for i in indices])
        except DataError as err:
            return BadBatch(err.path, err.record, err.problem)
        wanted = targets[masked]
        classes = wanted if self.output_index is None else self.output_index[wanted]
        if bool((classes < 0).any()):
            token = self.model.tokenizer.convert_ids_to_tokens(int(wanted[classes < 0][0]))
            return BadBatch(None, None, f"token {token!r} is not in the model's output vocabulary")
        keys = torch.tensor([item_seed(self.seed, "dropout", step, int(place)) & 0xFFFFFFFF for place in places])
        return (*regions, input_ids, levels), masked.flatten().nonzero()[:, 0], classes, keys

    def open_in_worker(self, worker_id: int) -> None:
        """A loader worker's own handle on the feature file (an HDF5 handle must not cross a fork), and the
        inherited cache when it is complete; the tokenizer's thread pool, started before the fork, is never
        waited for here, whatever TOKENIZERS_PARALLELISM says."""
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        features = self.regions.features.reopened()
        if self.regions.complete:
            self.regions.features = features
        else:
            self.regions = RegionCache(features, self.regions.num_classes, self.regions.box_input, cache=False)


@dataclass
class BadBatch:
    """Bad input met while making a batch, raised in the training process as a :class:`DataError` (``path``
    None: a problem of no one file)."""
    path: str | None
    record: str | None
    problem: str

    def raise_it(self):
        raise DataError(self.path, self.record, self.problem)


def epoch_batches(n: int, batch_size: int, step: int, seed: int, tag="data") -> np.ndarray:
    """The global batch at ``step`` of an endless sequence of shuffled epochs over ``n`` examples."""
    start = step * batch_size
    out, filled = np.empty(batch_size, dtype=np.int64), 0
    while filled < batch_size:
        epoch, offset = divmod(start + filled, n)
        take = min(batch_size - filled, n - offset)
        out[filled:filled + take] = epoch_order(n, seed, tag, epoch)[offset:offset + take]
        filled += take
    return out


@functools.lru_cache(maxsize=3)
def epoch_order(n: int, seed: int, tag, epoch: int) -> np.ndarray:
    """The shuffled order of ``n`` examples in ``epoch``, computed once: the latest three are kept (a batch
    spans at most two epochs, and 06 shuffles the next round's ahead), so a step costs a slice, not a
    permutation of the whole set."""
    order = item_rng(seed, tag, epoch).permutation(n)
    order.flags.writeable = False
    return order


def balanced_batches(levels, batch_size: int, seed: int) -> Callable[[int], np.ndarray]:
    """``batch_for(step)``: global batches drawn as the authors' ``balanced_training`` draws them.

    Each batch is drawn with replacement, caption i with probability 1 / (number of levels that have
    captions * captions at i's level): every such level fills an equal share of the batches, and a
    level's captions are equally likely. Keyed by (seed, step), so a resumed run draws the same.
    """
    levels = np.asarray(levels)
    counts = np.bincount(levels)
    cdf = np.cumsum(1.0 / (np.count_nonzero(counts) * counts[levels]))

    def batch_for(step: int) -> np.ndarray:
        u = item_rng(seed, "balanced", step).random(batch_size) * cdf[-1]
        return np.minimum(np.searchsorted(cdf, u, side="right"), len(levels) - 1)

    return batch_for
