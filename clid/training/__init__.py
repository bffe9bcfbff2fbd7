"""Training: the loop of 04 and 06 and its resume. It imports the method and below."""
