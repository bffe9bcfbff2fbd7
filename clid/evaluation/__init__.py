"""Step 7, the evaluation: length control and the COCO caption metrics per level (``metrics``), repeated and
broken phrases (``repetition``), and 07's report with its plots (``report``). It imports data and below."""
