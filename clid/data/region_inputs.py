"""The model's region position inputs: each region's box as six numbers, then its class probabilities, built
as the authors' loops build them or from the image's size (``box_input``)."""
from __future__ import annotations

BOX_INPUTS = ("authors", "image")
REGION_NORMS = ("none", "standardize")  # the model's --region-norm (clid.model.captioner)


def region_inputs(boxes, width, height, cls_prob=None, confidence=None, box_input: str = "authors"):
    """The region position input [R, 6 + C] of one image: six numbers per box, then the C class
    probabilities (none without ``cls_prob``).

    ``box_input="authors"``, as the authors' training, scoring and inference loops compute it: x1 and
    x2 divided by the box's own x2 (plus 1e-5), y1 and y2 by its own y2, the relative area of those
    (clamped at 0), the detector confidence (1 without one); the six numbers layer-normed, and the
    class probabilities layer-normed on their own (no learned scale or shift, eps 1e-5).
    ``box_input="image"``: x1, y1, x2, y2, width and height of the box divided by the image's width
    and height; class probabilities as they are.
    """
    import torch  # (here: importing this module leaves torch out, for the commands' --help)
    import torch.nn.functional as F

    boxes = torch.as_tensor(boxes, dtype=torch.float32)
    if box_input == "authors":
        x1, y1, x2, y2 = boxes.unbind(1)
        x1, x2 = x1 / (x2 + 1e-5), x2 / (x2 + 1e-5)
        y1, y2 = y1 / (y2 + 1e-5), y2 / (y2 + 1e-5)
        area = ((y2 - y1) * (x2 - x1)).clamp(min=0)
        conf = torch.ones_like(x1) if confidence is None else torch.as_tensor(confidence, dtype=torch.float32)
        box6 = F.layer_norm(torch.stack([x1, y1, x2, y2, area, conf], dim=1), [6])
        if cls_prob is not None:
            cls_prob = torch.as_tensor(cls_prob, dtype=torch.float32)
            cls_prob = F.layer_norm(cls_prob, [cls_prob.shape[1]])
    elif box_input == "image":
        scale = torch.tensor([width, height, width, height], dtype=torch.float32)
        b = boxes / scale
        box6 = torch.cat([b, b[:, 2:3] - b[:, 0:1], b[:, 3:4] - b[:, 1:2]], dim=1)
    else:
        raise ValueError(f"unknown box_input {box_input!r}; choose from {BOX_INPUTS}")
    if cls_prob is not None:
        box6 = torch.cat([box6, torch.as_tensor(cls_prob, dtype=torch.float32)], dim=1)
    return box6
