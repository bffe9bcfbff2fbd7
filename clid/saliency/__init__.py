"""``python -m clid.saliency.emlnet``: the EML-Net saliency command (the code: ``clid.method.emlnet``)."""
