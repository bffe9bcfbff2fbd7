"""Run plumbing: flags and one-line errors (cli), the device plan (runtime), run records (runs), and shards and
locks for SLURM arrays (shard). It imports only the ground floor."""
