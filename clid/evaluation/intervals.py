"""95% confidence intervals for 07 --combine: a two-level bootstrap over seeds and test images.

Each 07 folder is one seed (its own demo world and test images). Its ``per_image.jsonl`` holds, per run, level and
test image, whether the caption's length is in the level (a missing caption is a miss) and its CIDEr against the
trusted and the long references (None where it was not scored). A method's number at a seed is the mean over that
seed's images (control precision: all of them; CIDEr: the scored ones), and over several seeds the mean of the
seeds' numbers, as 07 reports it.

One resample draws the seeds with replacement, then, for every seed drawn, its test images with replacement; every
method is measured on the same draw, so a difference between two methods is paired by seed and image. The interval
is the 2.5th and 97.5th percentile of the :data:`RESAMPLES` resampled values (numpy's generator seeded with
:data:`BOOTSTRAP_SEED`, so a report is the same at every run). A per-image CIDEr keeps the document frequencies of
the subset 07 scored it in (the images are resampled, CIDEr is not recomputed). With few seeds the seed level of
the bootstrap is coarse: three seeds give at most ten distinct seed draws.

The claims (:func:`claims`) are the paper's three, each decided by its interval: held when the interval lies on the
claim's side of its bound, not held when it lies on the other side, undecided when it holds the bound.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
REFERENCE = "CLID"  # every method's difference is taken against this one
LONG_CONTROL = (4, 5, 6)  # claim (a): the levels the trusted captions hardly reach
SHORT_QUALITY = (1, 2)  # claim (b): the levels of the trusted captions
SHORT_MARGIN = 0.9  # claim (b): CLID's CIDEr at least 90% of trusted-only's (within 10% relative)
LONG_QUALITY = (3, 4, 5, 6)  # claim (c): the levels with long references
TRUSTED, EXTENDED = "trusted-only", "extended-only"  # claim roles: the method named so, or starting so (extended)


@dataclass
class SeedValues:
    """One seed's per-image values: ``series[(method, kind, level)] = (values, scored)``, arrays over the seed's
    test images (kind: "cp" 0/1 per image, all scored; "cider" and "long": CIDEr, scored where given)."""

    name: str
    n_images: int
    series: dict = field(default_factory=dict)

    def add(self, method: str, level: int, in_range, cider, long) -> None:
        hits = np.asarray(in_range, dtype=np.float64)
        self.series[(method, "cp", level)] = (hits, np.ones(len(hits), bool))
        for kind, values in (("cider", cider), ("long", long)):
            scored = np.array([v is not None for v in values], bool)
            self.series[(method, kind, level)] = (np.array([v if v is not None else 0.0 for v in values], np.float64),
                                                  scored)

    def methods(self) -> list[str]:
        return list(dict.fromkeys(method for method, _, _ in self.series))

    def statistics(self, counts) -> dict:
        """Each series' mean under image draws ``counts`` [K, n_images] (how often each image is drawn): [K] each."""
        return {key: _mean(counts, values, scored) for key, (values, scored) in self.series.items()}


def _mean(counts, values, scored):
    """Per row of ``counts`` (image draws), the mean of ``values`` over the scored images drawn (NaN: none)."""
    weights = counts * scored
    den = weights.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (weights @ values) / np.maximum(den, 1), np.nan)


def seed_tables(seeds, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED):
    """(point, resampled): ``{key: array [R, S]}``, a statistic's value per seed slot. ``seeds``: one object a seed
    with ``n_images`` (the units resampled within it) and ``statistics(counts)`` (``{key: [K]}`` under image draws
    ``counts`` [K, n_images]). Point: R = 1, the seeds in order and every image once; resampled: R = ``resamples``
    draws of the seeds (slots), and for every slot its own draw of that seed's images."""
    rng = np.random.default_rng(seed)
    S = len(seeds)
    draws = rng.integers(S, size=(resamples, S))
    point, boot = {}, {}
    for f, values in enumerate(seeds):
        n = values.n_images
        where = np.nonzero(draws == f)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=len(where[0])).astype(np.float64)
        for key, value in values.statistics(np.ones((1, n))).items():
            point.setdefault(key, np.full((1, S), np.nan))[0, f] = value[0]
        for key, value in values.statistics(counts).items():
            boot.setdefault(key, np.full((resamples, S), np.nan))[where] = value
    return point, boot


def _nanmean(a, axis):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(a, axis=axis)


# A statistic: a function of the per-slot tables ({key: [R, S]}) giving [R, S] (per slot) -------------------------

def series(method, kind, level):
    return lambda t: t.get((method, kind, level), _missing(t))


def _missing(t):
    shape = next(iter(t.values())).shape
    return np.full(shape, np.nan)


def level_mean(method, kind, levels):
    """The mean over ``levels`` of a method's per-level numbers, per slot (levels without a value left out)."""
    return lambda t: _nanmean(np.stack([series(method, kind, n)(t) for n in levels]), axis=0)


def over_seeds(stat):
    """A per-slot statistic averaged over the seed slots: [R]."""
    return lambda t: _nanmean(stat(t), axis=1)


def difference(stat_a, stat_b):
    """a - b, paired: per slot (same seed, same images), then averaged over the slots holding both."""
    return lambda t: _nanmean(stat_a(t) - stat_b(t), axis=1)


def ratio(stat_a, stat_b):
    """mean(a) / mean(b) over the slots holding both."""
    def f(t):
        a, b = stat_a(t), stat_b(t)
        both = np.isfinite(a) & np.isfinite(b)
        with np.errstate(invalid="ignore", divide="ignore"):
            return _nanmean(np.where(both, a, np.nan), 1) / _nanmean(np.where(both, b, np.nan), 1)
    return f


def interval(fn, point, boot, confidence: float = CONFIDENCE) -> dict:
    """``{"value", "low", "high", "resamples"}`` of a statistic ([R] from the tables); ``resamples``: the resampled
    values that are defined (a resample can draw no scored image)."""
    value = float(fn(point)[0])
    values = fn(boot)
    values = values[np.isfinite(values)]
    if not np.isfinite(value) or not len(values):
        return {"value": value if np.isfinite(value) else None, "low": None, "high": None, "resamples": int(len(values))}
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return {"value": value, "low": float(low), "high": float(high), "resamples": int(len(values))}


def method_intervals(seeds: list[SeedValues], levels, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """Every method's numbers with their intervals, its differences against :data:`REFERENCE` and the claims.

    Returns ``{"bootstrap": {...}, "methods": {m: {"cp": {L: iv}, "cp_average": iv, "cider": {L: iv},
    "long": {L: iv}}}, "differences": {m: same, m minus the reference}, "claims": [...]}``; ``iv``:
    :func:`interval`'s dict; values are shares and CIDEr as 07 keeps them (x1, not x100)."""
    point, boot = seed_tables(seeds, resamples, seed)
    methods = list(dict.fromkeys(m for s in seeds for m in s.methods()))
    numbers = list(range(1, len(levels) + 1))

    def numbers_of(method, against=None):
        def combine(build):  # build(method) -> a per-slot statistic
            return over_seeds(build(method)) if against is None else difference(build(method), build(against))

        rows = {"cp": {}, "cider": {}, "long": {}}
        for kind in rows:
            for n in numbers:
                if np.isfinite(point.get((method, kind, n), np.full((1, 1), np.nan))).any():
                    rows[kind][n] = interval(combine(lambda m, kind=kind, n=n: series(m, kind, n)), point, boot)
        rows["cp_average"] = interval(combine(lambda m: level_mean(m, "cp", numbers)), point, boot)
        return rows

    out = {"bootstrap": {"resamples": resamples, "seed": seed, "confidence": CONFIDENCE, "seeds": [s.name for s in seeds],
                         "images": [s.n_images for s in seeds],
                         "unit": "seeds with replacement, then each drawn seed's test images with replacement"},
           "methods": {m: numbers_of(m) for m in methods}, "differences": {}}
    if REFERENCE in methods:
        out["differences"] = {m: numbers_of(m, REFERENCE) for m in methods if m != REFERENCE}
    out["claims"] = claims(methods, point, boot)
    return out


def verdict(iv: dict, bound: float, above: bool = True) -> str:
    """held / not held / undecided: the interval beyond ``bound`` on the claim's side, on the other side, or astride."""
    if iv["low"] is None:
        return "undecided"
    if above:
        return "held" if iv["low"] > bound else "not held" if iv["high"] <= bound else "undecided"
    return "held" if iv["high"] < bound else "not held" if iv["low"] >= bound else "undecided"


def claims(methods, point, boot) -> list[dict]:
    """The paper's three claims on these runs, each with its statistic, interval and verdict (see the module
    docstring); a claim whose methods are not all there is left out."""
    out = []
    clid = REFERENCE
    extended = [m for m in methods if m.startswith(EXTENDED)]
    if clid in methods and TRUSTED in methods:
        levels = f"L{LONG_CONTROL[0]}-L{LONG_CONTROL[-1]}"
        iv = interval(difference(level_mean(clid, "cp", LONG_CONTROL), level_mean(TRUSTED, "cp", LONG_CONTROL)),
                      point, boot)
        out.append({"claim": "a", "against": TRUSTED,
                    "text": f"control at the long levels: CLID's control precision averaged over {levels} is above "
                            f"{TRUSTED}'s",
                    "statistic": f"CLID - {TRUSTED}, control precision averaged over {levels}",
                    "kind": "difference", "interval": iv, "verdict": verdict(iv, 0.0)})
        per_level, verdicts = {}, []
        for n in SHORT_QUALITY:
            iv = interval(ratio(series(clid, "cider", n), series(TRUSTED, "cider", n)), point, boot)
            per_level[n] = iv
            verdicts.append(verdict(iv, SHORT_MARGIN))
        worst = "not held" if "not held" in verdicts else "undecided" if "undecided" in verdicts else "held"
        out.append({"claim": "b", "against": TRUSTED,
                    "text": f"short-level quality kept: CLID's CIDEr at {' and at '.join(f'L{n}' for n in SHORT_QUALITY)} "
                            f"is at least {SHORT_MARGIN:.0%} of {TRUSTED}'s (within {1 - SHORT_MARGIN:.0%} relative)",
                    "statistic": f"CLID / {TRUSTED}, CIDEr against the trusted references, per level",
                    "kind": "ratio", "bound": SHORT_MARGIN, "levels": per_level, "verdict": worst})
    for other in extended if clid in methods else ():
        levels = f"L{LONG_QUALITY[0]}-L{LONG_QUALITY[-1]}"
        iv = interval(difference(level_mean(clid, "long", LONG_QUALITY), level_mean(other, "long", LONG_QUALITY)),
                      point, boot)
        out.append({"claim": "c", "against": other,
                    "text": f"long-reference quality: CLID's CIDEr against the long references, averaged over {levels}, "
                            f"is above {other}'s",
                    "statistic": f"CLID - {other}, CIDEr against the long references averaged over {levels}",
                    "kind": "difference", "interval": iv, "verdict": verdict(iv, 0.0)})
    return out
