"""``python -m clid.features``: region features of images, or a release converted (the code: ``clid.data.store``,
``clid.data.encoder``, ``clid.data.convert``)."""
