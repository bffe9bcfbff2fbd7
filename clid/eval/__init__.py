"""Evaluation: metrics per length level (metrics) and 07's report (report)."""
