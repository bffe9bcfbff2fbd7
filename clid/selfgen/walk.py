"""The saliency-guided scene-graph walk of stage 02 (CLID step 2), and the caption text it makes.

One caption is one walk over a prepared graph (:class:`clid.selfgen.graphs.Prepared`: its objects'
saliency, nouns, attributes and children):
  1. the first object is drawn with probability proportional to saliency;
  2. at each newly visited object, up to ``k`` of its children (objects it has a relationship to)
     are drawn without replacement by re-normalised saliency and visited depth first; a child
     seen before is mentioned again as "the <noun>" and not expanded further (no loops);
  3. when the walk ends with less than ``t_sal`` of the total saliency covered, it jumps to an
     unexplored object drawn by saliency, joined with "and" (``paragraph``: a new sentence);
  4. each first mention gets a random number (0..``n_attr``) of the object's attributes, each
     relationship its predicate as a verb phrase.
:func:`render` joins the mentions into the caption's text.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clid.base import english as en
from clid.selfgen.graphs import Prepared


@dataclass
class Mention:
    index: int  # object index in the graph
    connector: list[str]  # words before the noun phrase: predicate, "and", "."
    phrase: str
    attributes: tuple[str, ...] = ()  # the attributes the phrase gives the object
    relation: tuple[int, str] | None = None  # (index of the object it hangs from, predicate)


def draw(rng: np.random.Generator, weights: np.ndarray, count: int) -> list[int]:
    """Draw ``count`` indices without replacement, proportional to ``weights`` (uniform among the
    rest once the remaining weights are all zero)."""
    weights = np.asarray(weights, dtype=np.float64).copy()
    picked = []
    for _ in range(min(count, len(weights))):
        available = np.ones(len(weights), bool)
        available[picked] = False
        w = np.where(available, weights, 0.0)
        p = w / w.sum() if w.sum() > 0 else available / available.sum()
        picked.append(int(rng.choice(len(weights), p=p)))
    return picked


def walk(g: Prepared, rng: np.random.Generator, k: int, t_sal: float, n_attr: int,
         paragraph: bool) -> list[Mention]:
    """All mentions of one caption, in order, before the final cut (see the module docstring)."""
    visited: set[int] = set()
    mentions: list[Mention] = []

    def first_mention(i: int, connector: list[str], relation) -> Mention:
        attrs = [a for a in g.attributes[i] if a != g.nouns[i]]
        n = int(rng.integers(0, min(n_attr, len(attrs)) + 1))
        chosen = [attrs[j] for j in sorted(rng.choice(len(attrs), size=n, replace=False))] if n else []
        return Mention(i, connector, en.mention(g.nouns[i], chosen), tuple(chosen), relation)

    def enter(i: int, connector: list[str], relation=None) -> list | None:
        """Mention object i; a first visit draws its children and returns them to be walked."""
        if i in visited:  # a re-visit: "the <noun>", no propagation
            mentions.append(Mention(i, connector, en.mention(g.nouns[i], definite=True), (), relation))
            return None
        visited.add(i)
        mentions.append(first_mention(i, connector, relation))
        kids = g.children[i]
        return [i, kids, draw(rng, g.saliency[[c for c, _ in kids]], k), 0]

    def visit(i: int, connector: list[str]) -> None:
        """Depth first from object i, with a stack of its own (a chain of thousands of objects is fine):
        each child's predicate is drawn just before the child is walked."""
        stack = [frame] if (frame := enter(i, connector)) else []
        while stack:
            parent, kids, picks, n = top = stack[-1]
            if n == len(picks):
                stack.pop()
                continue
            top[3] += 1
            child, predicates = kids[picks[n]]
            predicate = predicates[int(rng.integers(len(predicates)))]
            relation = (parent, predicate)
            if frame := enter(child, (["and"] if n else []) + en.predicate_phrase(predicate).split(), relation):
                stack.append(frame)

    visit(draw(rng, g.saliency, 1)[0], [])
    while True:
        covered = float(g.saliency[sorted(visited)].sum())
        unvisited = [i for i in range(len(g.nouns)) if i not in visited]
        if covered >= t_sal - 1e-9 or not unvisited:
            break
        jump = unvisited[draw(rng, g.saliency[unvisited], 1)[0]]
        visit(jump, ["."] if paragraph else ["and"])
    return mentions


def render(mentions: list[Mention]) -> str:
    """Caption text: connectors and noun phrases joined, doubled words removed, each sentence
    capitalised and ended with a period."""
    sentences, words = [], []
    for m in mentions:
        for word in m.connector:
            if word == ".":
                sentences.append(" ".join(words))
                words = []
            else:
                words.append(word)
        words.append(m.phrase)
    sentences.append(" ".join(words))
    return " ".join(en.finish_sentence(en.remove_doubled_words(s)) for s in sentences if s.strip())
