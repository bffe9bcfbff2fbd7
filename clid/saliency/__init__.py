"""Saliency (stage 01): the EML-Net network (emlnet) and the image list and loading (images)."""
