"""The demo world: a small, fully known stand-in for COCO + Visual Genome + region features.

``00_demo_data.py`` is the recipe; the modules are the simulator, one concern each:
``world`` (the vocabulary and the scene records), ``drawing`` (rendering objects and backgrounds),
``scenes`` (placing objects, occlusion, salience), ``relations`` (read off the drawn geometry),
``graphs`` (Visual Genome graphs and a scene-graph generator's noise), ``captions`` (trusted captions),
``references`` (long references), ``worker`` (one image start to finish, in worker processes) and
``preview`` (the contact sheet). Region features come from :mod:`clid.data.encoder`.
"""
from clid.demo.captions import NOUNS, YOUNG
from clid.demo.drawing import paint_thing
from clid.demo.graphs import HALLUCINATIONS, VG_ID_OFFSET, noise_report
from clid.demo.preview import read_preview_records, write_preview
from clid.demo.worker import make_images
from clid.demo.world import ALL_COLOURS, BACKGROUND_NAMES, CATEGORIES, COLOURS, Thing

__all__ = ["ALL_COLOURS", "BACKGROUND_NAMES", "CATEGORIES", "COLOURS", "HALLUCINATIONS", "NOUNS", "VG_ID_OFFSET", "YOUNG",
           "Thing",
           "make_images", "noise_report", "paint_thing", "read_preview_records", "write_preview"]
