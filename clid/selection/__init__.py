"""Step 5's Eq. 1 (``quality``) and step 6's data selection: CLID's schedule (``schedule``; ``reference``, its
draw in NumPy), the peers (``peers``: loss-based curation, a Baby Step curriculum) and 06's ``--strategy``
(``strategies``). It imports the model and below."""
