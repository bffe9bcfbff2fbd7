"""Scene graphs ready for the walk of stage 02: each graph checked, and its objects' saliency.

Object saliency (CLID step 1): the saliency map summed inside each object's box, normalised over
the image's objects; without maps, the same sum over a centre-bias prior. A graph that cannot be
captioned is reported as (image id, action, kind, detail) and skipped; self-loops are removed and
cycles noted (the walk never loops).
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from clid.base.files import (
    DataError,
    check_image_groups,
    check_unchanged,
    h5_number,
    name_problem,
    open_h5,
    read_state,
)
from clid.base.text import preprocess
from clid.data.records import SceneGraph
from clid.data.scenegraphs import check_box

# centre-bias prior: an isotropic Gaussian at the image centre, sigma = PRIOR_SIGMA * image side
PRIOR_SIGMA = 0.25


# ---------------------------------------------------------------------------------------------
# Object saliency

def box_saliency(smap: np.ndarray, boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Sum of ``smap`` inside each box (x1, y1, x2, y2 in image pixels of a width x height image).

    The map is taken as constant over each of its cells, so the integral over a box is exact for
    fractional boxes too: the summed-area table, interpolated bilinearly at the box corners.
    """
    h, w = smap.shape
    table = np.zeros((h + 1, w + 1))
    table[1:, 1:] = np.asarray(smap, dtype=np.float64).cumsum(0).cumsum(1)
    scale = np.array([w / width, h / height, w / width, h / height])
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4) * scale
    x1, x2 = np.clip(b[:, 0], 0, w), np.clip(b[:, 2], 0, w)
    y1, y2 = np.clip(b[:, 1], 0, h), np.clip(b[:, 3], 0, h)

    def integral(x, y):  # integral of the map over [0, x] x [0, y], in map cells
        x0 = np.minimum(np.floor(x).astype(int), w - 1)
        y0 = np.minimum(np.floor(y).astype(int), h - 1)
        fx, fy = x - x0, y - y0
        return (table[y0, x0] * (1 - fx) * (1 - fy) + table[y0, x0 + 1] * fx * (1 - fy)
                + table[y0 + 1, x0] * (1 - fx) * fy + table[y0 + 1, x0 + 1] * fx * fy)

    return integral(x2, y2) - integral(x1, y2) - integral(x2, y1) + integral(x1, y1)


def prior_saliency(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """``--saliency none``: each box's integral of a centre-bias map, exp(-d^2 / (2 sigma^2)) with
    sigma = PRIOR_SIGMA times the image side in each axis. For a small box this is about its area
    times the Gaussian of its centre's distance to the image centre: large and central objects
    are salient, small and peripheral ones are not."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)

    def axis(lo, hi, size):
        sigma = PRIOR_SIGMA * size
        c = size / 2.0
        erf = np.vectorize(math.erf)
        return sigma * math.sqrt(math.pi / 2) * (erf((hi - c) / (math.sqrt(2) * sigma))
                                                 - erf((lo - c) / (math.sqrt(2) * sigma)))

    return axis(b[:, 0], b[:, 2], width) * axis(b[:, 1], b[:, 3], height)


def normalised(values: np.ndarray) -> np.ndarray:
    total = float(values.sum())
    return values / total if total > 0 else np.full(len(values), 1.0 / max(len(values), 1))


@dataclass
class Prepared:
    """A graph ready to caption: output image id, objects, children and object saliency."""

    image_id: str  # the output image id (the COCO id when --image-data maps it)
    graph_id: str  # the id in the scene-graph file
    nouns: list[str]
    attributes: list[list[str]]
    object_ids: list[int]
    children: list[list[tuple[int, list[str]]]]  # per object: (child index, its predicates)
    saliency: np.ndarray  # normalised, sums to 1


# ---------------------------------------------------------------------------------------------
# Checking graphs

def find_cycle(n: int, edges: list[tuple[int, int]]) -> list[int] | None:
    """A directed cycle (as a list of node indices) if the graph has one, else None."""
    out = defaultdict(list)
    for a, b in edges:
        out[a].append(b)
    state = [0] * n  # 0 new, 1 on the stack, 2 done
    for root in range(n):
        if state[root]:
            continue
        stack, path = [(root, iter(out[root]))], [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state[nxt] == 1:
                return path[path.index(nxt):] + [nxt]
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(out[nxt])))
                path.append(nxt)
    return None


class SaliencySource:
    """Saliency maps of stage 01, looked up by the output (COCO) id, else by the VG id."""

    def __init__(self, path):
        self.path = str(path)
        if not Path(self.path).exists():
            raise DataError(self.path, None, "saliency file not found (run 01_saliency.py, or give --saliency none)")
        self.state = read_state(self.path)
        self.file = open_h5(self.path, "saliency file")
        check_image_groups(self.file, self.path, "saliency")

    def check_unchanged(self) -> None:
        """Refuse the file (a DataError) when it was replaced or rewritten since it was opened."""
        check_unchanged(self.path, self.state)

    def get(self, image_id: str, graph_id: str):
        """``(map, width, height)`` or None. Maps are keyed by the output (COCO) id, or by the VG id
        when 01 read a VG image list; such groups carry the VG id (attr ``vg_image_id``), so a COCO
        id that happens to equal another image's VG id never picks up the wrong map."""
        mapped = image_id != graph_id
        for key in ([image_id, graph_id] if mapped else [image_id]):
            if name_problem(key) or key not in self.file:  # ("a/b", "..": a path in HDF5, no image's group)
                continue
            group = self.file[key]
            if not isinstance(group, h5py.Group):
                raise DataError(self.path, f"image {key}", "is a dataset, not a group (map, width, height)")
            vg = group.attrs.get("vg_image_id")
            vg = None if vg is None else str(vg)
            if mapped and ((key == image_id and vg not in (None, graph_id)) or (key == graph_id and vg != graph_id)):
                continue
            if "map" not in group:
                hint = " (it holds 'features': a region-feature file?)" if "features" in group else ""
                raise DataError(self.path, f"image {key}", f"missing dataset 'map'{hint}")
            smap = group["map"][()]
            if smap.ndim != 2 or min(smap.shape) < 1 or smap.dtype.kind not in "fiu":
                raise DataError(self.path, f"image {key}",
                                f"'map' must be a 2-d array of numbers, got {smap.dtype} {smap.shape}")
            width, height = (h5_number(self.path, f"image {key}", group, name, positive=True)
                             for name in ("width", "height"))
            return smap.astype(np.float32), width, height
        return None


def prepare(graph: SceneGraph, image_id: str, saliency: SaliencySource | None,
            problems: list[tuple]) -> Prepared | None:
    """Check one graph and compute its object saliency; problems go to ``problems`` as
    (image id, action, kind, detail)."""
    def report(action, kind, detail=""):
        problems.append((image_id, action, kind, detail))

    if not graph.objects:
        report("skipped", "empty graph")
        return None
    index = {o.object_id: i for i, o in enumerate(graph.objects)}
    relations = []
    loops = sorted({r.subject_id for r in graph.relations if r.subject_id == r.object_id})
    if loops:
        report("repaired", "self-loop removed", f"object(s) {loops}")
    wordless = sorted({r.predicate for r in graph.relations if not preprocess(r.predicate)})
    if wordless:  # ("" or an emoji would read "with": predicate_phrase's word for a bare auxiliary)
        report("repaired", "relation without a word removed", f"predicate(s) {', '.join(map(repr, wordless))}")
    relations = [r for r in graph.relations if r.subject_id != r.object_id and preprocess(r.predicate)]
    cycle = find_cycle(len(index), [(index[r.subject_id], index[r.object_id]) for r in relations])
    if cycle:
        ids = " -> ".join(str(graph.objects[i].object_id) for i in cycle)
        report("noted", "cycle (the walk does not loop)", ids)

    boxes = np.array([o.box for o in graph.objects], dtype=np.float64)
    width, height = graph.width, graph.height
    if saliency is None:
        if width is None or height is None:  # no image size: the frame is the objects' extent
            width, height = float(boxes[:, 2].max()), float(boxes[:, 3].max())
        values = prior_saliency(boxes, width, height)
    else:
        found = saliency.get(image_id, graph.image_id)
        if found is None:
            report("skipped", "no saliency map", f"image {image_id} is not in {saliency.path}")
            return None
        smap, map_width, map_height = found
        if (smap < 0).any():
            report("skipped", "negative saliency", f"the map of image {image_id} holds values down to "
                                                   f"{float(np.nanmin(smap)):g} (saliency is >= 0)")
            return None
        if width is None or height is None:
            # boxes are in the image's pixels: check them against the size stage 01 saw
            width, height = map_width, map_height
            for obj in graph.objects:
                problem = check_box(obj, width, height)
                if problem:
                    report("skipped", "box outside the image", problem)
                    return None
        # boxes are scaled by the graph's own image size (a VG image may be a resized COCO image)
        values = box_saliency(smap, boxes, width, height)
        if not np.all(np.isfinite(values)):
            bad = [graph.objects[i].object_id for i in np.flatnonzero(~np.isfinite(values))]
            report("skipped", "NaN saliency", f"object(s) {bad[:5]}")
            return None
        if values.sum() <= 0:
            report("repaired", "zero saliency in every box: centre prior used")
            values = prior_saliency(boxes, width, height)

    children: list[dict[int, list[str]]] = [dict() for _ in graph.objects]
    for r in relations:
        children[index[r.subject_id]].setdefault(index[r.object_id], []).append(r.predicate)
    return Prepared(image_id=image_id, graph_id=graph.image_id,
                    nouns=[o.name for o in graph.objects],
                    attributes=[[a for a in dict.fromkeys(o.attributes) if len(a.split()) <= 2] for o in graph.objects],
                    object_ids=[o.object_id for o in graph.objects],
                    children=[sorted(c.items()) for c in children],
                    saliency=normalised(values))


def output_ids(graphs: list[SceneGraph], image_data, several_files: bool) -> list[tuple]:
    """Per graph: (output image id, "", "") or (None, problem kind, detail). The output id is the COCO
    id when image_data.json maps the graph, else the graph's id; each output image is captioned from
    its first graph (VG files come first), a later one in another file is left out without a problem."""
    out, seen, per_source = [], {}, Counter()
    for item, g in enumerate(graphs):
        target = g.coco_id or g.image_id
        if image_data is not None and not g.generated and g.image_id not in image_data:
            out.append((None, "not in image_data.json", f"image {g.image_id}"))
        elif image_data is not None and not g.generated and g.coco_id is None:
            out.append((None, "no COCO id", f"VG image {g.image_id}"))
        elif target in seen and graphs[seen[target]].source == g.source:
            out.append((None, "duplicate image id",
                        f"{target} is already captioned from graph {graphs[seen[target]].image_id}"))
        elif target in seen:  # another file has it: counted per source
            out.append((None, "", ""))
            per_source[(g.source, "left to an earlier file")] += 1
        else:
            seen[target] = item
            out.append((target, "", ""))
            per_source[(g.source, "taken")] += 1
    if several_files:
        for path in dict.fromkeys(g.source for g in graphs):
            also = per_source[(path, "left to an earlier file")]
            print(f"images from {path}: {per_source[(path, 'taken')]}"
                  + (f" ({also} more are taken from an earlier file)" if also else ""))
    return out


def load_problem_kind(reason: str) -> str:
    """The kind of a graph the loader rejected (clid.data.scenegraphs.load_scene_graphs reasons)."""
    if "not UTF-8" in reason:
        return "not UTF-8 text"
    if "does not exist" in reason:
        return "relationship names a missing object"
    if "outside" in reason:
        return "box outside the image"
    if "box" in reason:
        return "invalid box"
    return "malformed graph"
