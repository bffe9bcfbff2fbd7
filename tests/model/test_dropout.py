"""Keyed dropout (clid.model.dropout): an example's masks are its own, whatever batch, padding, group or rank
it runs in; torch's dropout (--dropout-draws rank) is what the model did before."""
from __future__ import annotations

import pytest
import torch

from clid.model.captioner import Captioner, preset_config
from clid.model.dropout import DropoutKeys, attention_places, hidden_places, keep_mask, mix32


def test_the_hash_is_exact_32_bit_arithmetic():
    """lowbias32 computed in int64 equals the same mix in Python's unbounded integers, for values up to 2**32 - 1."""
    def reference(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)
    values = [0, 1, 2, 12345, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1] + torch.randint(0, 2**32 - 1, (200,)).tolist()
    assert mix32(torch.tensor(values)).tolist() == [reference(v) for v in values]
    assert [mix32(v) for v in values] == [reference(v) for v in values]  # (a site's hash, made on the host)


def test_a_mask_depends_on_its_key_site_and_place_alone():
    p = 0.3
    keys = DropoutKeys.for_batch(torch.tensor([7, 8, 9]), regions=5, text=4)
    places = hidden_places(keys.positions, 16)
    mask = keep_mask(keys, 2, places, p)
    assert mask.shape == (3, 9, 16)
    alone = keep_mask(DropoutKeys.for_batch(torch.tensor([8]), regions=5, text=4), 2, places, p)
    assert torch.equal(alone[0], mask[1])  # the same example alone, or second of three
    wider = DropoutKeys.for_batch(torch.tensor([8]), regions=7, text=6)  # more padded regions, longer text
    wide = keep_mask(wider, 2, hidden_places(wider.positions, 16), p)[0]
    assert torch.equal(wide[:5], mask[1, :5]) and torch.equal(wide[7:11], mask[1, 5:])
    assert not torch.equal(mask[0], mask[1]) and not torch.equal(keep_mask(keys, 3, places, p), mask)
    many = keep_mask(DropoutKeys.for_batch(torch.arange(64), 50, 30), 0, hidden_places(torch.arange(80), 192), p)
    assert abs(1 - many.float().mean().item() - p) < 0.005  # dropped: p
    heads = attention_places(4, keys.positions, keys.positions)
    assert heads.shape == (4, 9, 9) and len(heads.unique()) == heads.numel()


def tiny_model(dropout=0.1):
    config = preset_config("tiny", 8, "caption", dropout=dropout, num_classes=3)
    return Captioner(config).train()


def batch(rows=4, regions=(5, 3, 5, 2), lengths=(6, 3, 6, 4), T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    R = max(regions)
    feats = torch.randn(rows, R, 8, generator=g)
    pos = torch.randn(rows, R, 6 + 3, generator=g)
    mask = torch.arange(R)[None] < torch.tensor(regions)[:, None]
    ids = torch.randint(1000, 2000, (rows, T), generator=g)
    ids[torch.arange(T)[None] >= torch.tensor(lengths)[:, None]] = 0  # [PAD]
    return feats * mask[..., None], pos * mask[..., None], mask, ids, torch.tensor([1, 2, 1, 3][:rows])


@pytest.mark.parametrize("grouped", [False, True])
def test_an_example_gets_the_same_states_alone_or_in_a_batch(grouped):
    """Training mode, keyed dropout: each row's text states are the same whether it runs in the batch of 4 or
    alone (its own padding), padded or grouped; torch's dropout gives other states alone."""
    torch.manual_seed(0)
    model = tiny_model()
    feats, pos, mask, ids, levels = batch()
    keys = torch.tensor([11, 22, 33, 44])
    together = model.encode(feats, pos, mask, ids, levels, grouped=grouped, dropout_keys=keys)
    for row in range(4):
        R, T = int(mask[row].sum()), int((ids[row] != 0).sum())
        alone = model.encode(feats[row:row + 1, :R], pos[row:row + 1, :R], mask[row:row + 1, :R], ids[row:row + 1, :T],
                             levels[row:row + 1], grouped=not grouped, dropout_keys=keys[row:row + 1])
        torch.testing.assert_close(alone[0], together[row, :T], rtol=1e-5, atol=1e-5)
    other = model.encode(feats, pos, mask, ids, levels, grouped=grouped, dropout_keys=keys + 1)
    assert not torch.allclose(other, together)
    torch.manual_seed(1)
    drawn = model.encode(feats, pos, mask, ids, levels, grouped=grouped)
    torch.manual_seed(1)
    assert not torch.allclose(model.encode(feats[:1], pos[:1], mask[:1], ids[:1], levels[:1], grouped=grouped), drawn[:1])


def test_evaluation_and_no_dropout_ignore_the_keys():
    feats, pos, mask, ids, levels = batch()
    keys = torch.tensor([1, 2, 3, 4])
    for model in (tiny_model().eval(), tiny_model(dropout=0.0)):
        torch.testing.assert_close(model.encode(feats, pos, mask, ids, levels, dropout_keys=keys),
                                   model.encode(feats, pos, mask, ids, levels))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_keyed_dropout_under_autocast(dtype):
    if dtype == torch.float16 and not torch.cuda.is_available():
        dtype = torch.bfloat16  # (the CPU autocasts to bfloat16)
    model = tiny_model()
    feats, pos, mask, ids, levels = batch()
    with torch.autocast("cuda" if torch.cuda.is_available() else "cpu", dtype=dtype):
        out = model.encode(feats, pos, mask, ids, levels, dropout_keys=torch.tensor([1, 2, 3, 4]))
    assert torch.isfinite(out.float()).all()


def test_keyed_dropout_refuses_a_kept_positions_pass():
    model = tiny_model()
    feats, pos, mask, ids, levels = batch()
    with pytest.raises(ValueError, match="every position"):
        model.encode(feats, pos, mask, ids, levels, text_positions=torch.zeros(4, 1, dtype=torch.long),
                     dropout_keys=torch.tensor([1, 2, 3, 4]))
