"""Stage 02: self-generated captions of widely varying length from scene graphs (CLID step 2).

In:  scene graphs: Visual Genome ``scene_graphs.json`` (+ ``image_data.json`` for sizes and the
     VG-to-COCO id map) and/or a scene-graph generator's predictions (the Scene Graph Benchmark's
     TSV, see clid/data/scenegraphs.py; ``--labelmap`` for label indices, sizes from ``--sizes``, else the
     ``--images``, else the boxes' extent), and the saliency HDF5 of stage 01 (or ``--saliency none``).
Out: JSONL, one caption a line: ``id`` ("<image_id>_<n>"), ``image_id``, ``caption``, ``objects``
     (object ids in mention order), ``n_tokens``, ``level``, ``seed``; plus ``OUT.problems.tsv``
     (of all shards) listing every graph that was skipped, repaired or noted, by image id (the
     COCO id when mapped, else the graph's id), with the reason.

    python 02_scenegraph_captions.py --scene-graphs scene_graphs.json --image-data image_data.json \
        --saliency saliency.h5 --out selfgen.jsonl
    python 02_scenegraph_captions.py --scene-graphs scene_graphs.json predictions.tsv \
        --image-data image_data.json --labelmap VG-SGG-dicts.json --sizes hw.tsv --saliency saliency.h5 --out selfgen.jsonl

Several graph files: each image is captioned from one graph. Visual Genome graphs win (a COCO image
that is in VG takes its VG graph); among files of the same kind, the first file given wins. The
count of images per file is printed.

The walk (one caption; randomness keyed by (seed, graph id, caption number); clid/selfgen/walk.py):
  1. object saliency = the saliency map summed inside the object's box, normalised over the
     image's objects (``--saliency none``: the same sum over a centre-bias prior map, see
     ``prior_saliency`` in clid/selfgen/graphs.py);
  2. the first object is drawn with probability proportional to saliency;
  3. at each newly visited object, up to ``--k`` of its children (objects it has a relationship to)
     are drawn without replacement by re-normalised saliency and visited depth first; a child
     seen before is mentioned again as "the <noun>" and not expanded further (no loops);
  4. when the walk ends with less than ``--t-sal`` of the total saliency covered, it jumps to an
     unexplored object drawn by saliency, joined with "and" (``--paragraph``: a new sentence);
  5. each first mention gets a random number (0..``--n-attr``) of the object's attributes
     (attributes of more than two words are not used), each relationship its predicate as a verb
     phrase; finally a random number of the last mentioned objects (0 .. all but one) is cut off.

Bad graphs never stop the run and are never dropped silently: graphs that cannot be captioned
(malformed, relationships naming missing objects, boxes outside the image, empty, NaN or negative saliency,
no COCO id, no saliency map) are skipped; self-loops are removed and cycles noted (the walk never
loops). All are counted by reason, printed, and listed by image id in the problems file.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from clid.base import files
from clid.base.files import DataError
from clid.base.rng import item_rng
from clid.base.text import caption_lengths, length_to_level, load_tokenizer
from clid.data.scenegraphs import load_graph_files, load_image_data
from clid.data.stats import format_table, length_stats
from clid.demo.truth import TrueGraphs, judge
from clid.run import runs, shard
from clid.run.cli import (
    HelpFormatter,
    add_levels_arg,
    add_tokenizer_arg,
    non_negative_int,
    positive_int,
    run_main,
    unit_interval,
)
from clid.selfgen.graphs import Prepared, SaliencySource, load_problem_kind, output_ids, prepare
from clid.selfgen.walk import render, walk

# ---------------------------------------------------------------------------------------------
# One image's captions

def caption_image(g: Prepared, seed: int, args, true_graphs=None) -> list[dict]:
    """``--per-image`` captions of one graph (without lengths); with ``true_graphs``
    (:class:`clid.demo.truth.TrueGraphs`) each caption's errors against the true graph (``truth``)."""
    out = []
    for n in range(args.per_image):
        rng = item_rng(seed, g.graph_id, n)
        mentions = walk(g, rng, args.k, args.t_sal, args.n_attr, args.paragraph)
        keep = len(mentions) - int(rng.integers(0, len(mentions)))  # cut 0 .. all but one
        mentions = mentions[:keep]
        record = {"id": f"{g.image_id}_{n}", "image_id": g.image_id, "caption": render(mentions),
                  "objects": [g.object_ids[m.index] for m in mentions]}
        if true_graphs is not None and (true := true_graphs.get(g.graph_id)) is not None:
            record["truth"] = judge(g.object_ids, g.nouns, [(m.index, m.attributes, m.relation) for m in mentions], true)
        out.append(record)
    return out


# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    graphs = parser.add_argument_group("scene graphs", "the graphs the walks run on, and their images")
    walks = parser.add_argument_group("walks", "the saliency-guided graph walks and the captions they make")
    run = parser.add_argument_group("run", "the output, shards and resuming")
    graphs.add_argument("--scene-graphs", required=True, nargs="+", metavar="FILE",
                        help="Visual Genome scene_graphs.json and/or Scene Graph Benchmark predictions TSVs")
    graphs.add_argument("--graph-format", choices=["auto", "vg", "sgg"], default="auto",
                        help="format of every --scene-graphs file (auto: detected per file)")
    graphs.add_argument("--image-data", default=None,
                        help="VG image_data.json: image sizes, and COCO ids as the output image ids")
    graphs.add_argument("--labelmap", default=None, help="generated graphs: the benchmark's labelmap JSON, when "
                        "classes are label indices")
    graphs.add_argument("--sizes", default=None, help="generated graphs: image sizes, the benchmark's hw TSV or "
                        "VG image_data.json")
    graphs.add_argument("--images", default=None, help="generated graphs: image folder, for sizes not in --sizes")
    graphs.add_argument("--min-object-conf", type=unit_interval, default=0.2,
                        help="generated graphs: objects below this confidence are left out (the paper is silent; "
                             "0.2 is the benchmark's usual detection score threshold)")
    graphs.add_argument("--min-relation-conf", type=unit_interval, default=0.1,
                        help="generated graphs: relations below this confidence are left out (the paper is silent)")
    walks.add_argument("--saliency", required=True,
                       help="saliency HDF5 of 01_saliency.py, or 'none' for the centre prior")
    run.add_argument("--out", required=True, help="output JSONL")
    walks.add_argument("--k", type=positive_int, default=2, help="children visited per object")
    walks.add_argument("--t-sal", type=unit_interval, default=0.8, help="saliency share to cover before the walk may stop")
    walks.add_argument("--n-attr", type=non_negative_int, default=4, help="most attributes per object")
    walks.add_argument("--per-image", type=positive_int, default=5, help="captions per image")
    walks.add_argument("--paragraph", action="store_true",
                       help="a jump starts a new sentence instead of 'and' (implied by --levels paragraph)")
    add_levels_arg(walks, "length levels for 'level'; paragraph also makes jumps start new sentences "
                          "(default: paragraph with --paragraph, else caption)", default=None)
    shard.add_chunk_size_arg(run, 2000, "graphs")
    add_tokenizer_arg(walks)
    graphs.add_argument("--clean-graphs", default=None, metavar="FILE",
                        help="the demo world's true graphs (00's scene_graphs_clean.json; diagnostics only): each "
                             "caption gets 'truth', its counts of hallucinated and mislabelled objects, wrong "
                             "attributes and wrong relations (clid/demo/truth.py)")
    shard.add_shard_args(run)
    args = parser.parse_args(argv)
    args.levels = args.levels or ("paragraph" if args.paragraph else "caption")
    args.paragraph = args.paragraph or args.levels == "paragraph"  # one switch: the paragraph task
    return args


PROBLEMS = ("image_id", "action", "kind", "detail")  # the columns of OUT.problems.tsv


def main(argv=None) -> int:
    args = parse_args(argv)
    record = runs.run_record(
        args, inputs=("scene_graphs", "image_data", "labelmap", "sizes", "saliency", "tokenizer", "clean_graphs",
                      "images"),
        settings=("graph_format", "images", "min_object_conf", "min_relation_conf", "saliency", "k", "t_sal",
                  "n_attr", "per_image", "paragraph", "levels", "tokenizer", "seed"))
    job = shard.Job(args.out, shard.Shard.from_args(args), args.chunk_size, record, args.restart, (".jsonl",))
    if job.done:
        print(f"{job.written()} already exists; nothing to do")
        return 0
    started = time.time()

    # 1. graphs (an item is a graph's place in the list), and the output image id of each
    graphs, load_problems, image_data = load_graphs(args)
    targets = output_ids(graphs, image_data, len(args.scene_graphs) > 1)
    saliency = None if args.saliency.lower() == "none" else SaliencySource(args.saliency)
    tokenizer = load_tokenizer(args.tokenizer)
    true_graphs = load_true_graphs(args.clean_graphs) if args.clean_graphs else None

    # 2. per chunk of graphs: check each graph and compute its object saliency, then walk it
    def process(chunk):
        problems = []  # (image id, action, kind, detail)
        if job.spec.shard_id == 0 and chunk.index == 0:  # graphs that do not parse belong to no shard
            problems += [(image_id, "skipped", load_problem_kind(why), why) for image_id, why in load_problems]
        records = []
        for item in chunk.items:
            target, kind, detail = targets[item]
            prepared = prepare(graphs[item], target, saliency, problems) if target else None
            if target is None and kind:  # (not an image taken from an earlier file)
                problems.append((graphs[item].image_id, "skipped", kind, detail))
            elif prepared is not None:
                records += caption_image(prepared, args.seed, args, true_graphs)
        lengths = caption_lengths([r["caption"] for r in records], tokenizer, args.levels == "paragraph")
        for r, n in zip(records, lengths):
            r.update(n_tokens=n, level=length_to_level(n, args.levels), seed=args.seed)
        if saliency is not None:  # (no chunk walks maps from two versions of the file)
            saliency.check_unchanged()
        shard.write_table(chunk.table("problems.tsv"), PROBLEMS, problems)
        files.write_jsonl(chunk.path, records)

    final = job.run(list(range(len(graphs))), process, "captions", "graph")

    # 3. report: problems by reason, the problems file, the length table
    written = job.written()
    n_graphs = len(graphs) if final else len(job.spec.select(graphs))
    report_problems(shard.side_path(written, "problems.tsv"), saliency, n_graphs)
    captions = list(files.read_jsonl(written))
    print(f"graphs: {len(graphs) + len(load_problems)} in {' '.join(args.scene_graphs)}, "
          f"{len(job.spec.select(graphs))} in this shard; {len({r['image_id'] for r in captions})} captioned "
          f"({args.per_image} captions each) in {written}")
    stats = length_stats([r["n_tokens"] for r in captions], args.levels)
    print(format_table(stats, f"{written} ({args.levels} levels)"))
    if stats["above"]:
        print(f"{stats['above']} captions are longer than the last level (level null); they are kept")
    if final is None:
        print(f"shard {job.spec.shard_id} done; the output appears when all {job.spec.num_shards} shards are done")
    print(f"done in {time.time() - started:.1f}s")
    return 0


def load_graphs(args):
    """(graphs, graphs that do not parse as (image id, reason), image_data or None)."""
    image_data = load_image_data(args.image_data) if args.image_data else None
    graphs, load_problems, notes = load_graph_files(
        args.scene_graphs, args.graph_format, image_data, args.sizes, args.images, args.labelmap,
        args.min_object_conf, args.min_relation_conf)
    print("\n".join(notes))
    return graphs, load_problems, image_data


def load_true_graphs(path):
    """The true graphs of --clean-graphs (a malformed file is one error line)."""
    try:
        return TrueGraphs(path)
    except (DataError, FileNotFoundError) as err:
        sys.exit(f"error: --clean-graphs: {err}")


def report_problems(path: Path, saliency, n_graphs: int) -> None:
    """Print the skipped, repaired and noted graphs of the problems file (of ``n_graphs``) by reason."""
    problems = shard.read_table(path)
    counts = Counter((action, kind) for _, action, kind, _ in problems)
    for (action, kind), n in sorted(counts.items()):
        examples = [i for i, a, k, _ in problems if a == action and k == kind][:5]
        print(f"  {action:>8}: {n:6d}  {kind}  (e.g. image {', '.join(examples)})")
    if problems:
        print(f"  every skipped or repaired graph is listed in {path}")
    if saliency is not None and counts[("skipped", "no saliency map")] == n_graphs > 0:
        print(f"note: no graph found its map in {saliency.path}; maps are looked up by the output image id "
              f"(the COCO id with --image-data): run 01_saliency.py with --list captions.json or image_data.json")


if __name__ == "__main__":
    sys.exit(run_main(main))
