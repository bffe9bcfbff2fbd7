"""Every dataset loader, returning the same record types.

- ``records``: the record types (captions of an image, scene graphs) and the field checks;
- ``captions``: Karpathy JSON (COCO, Flickr30k), the official COCO captions JSON, Stanford paragraphs
  and our own JSONL;
- ``splits``: the Karpathy test ids, the COCO converter, and the guard that never trains on a test image;
- ``scenegraphs``: Visual Genome scene graphs and a scene-graph generator's TSV;
- ``python -m clid.captions convert-coco``: official COCO captions files -> a Karpathy-style JSON.

Image ids are strings in memory (the dataset's own id: COCO id, VG id, or a file-name stem).
Malformed input raises :class:`clid.base.files.DataError` naming the file, the record and the problem.
"""
