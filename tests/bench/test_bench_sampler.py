"""The smoke test of bench/bench_sampler.py: one tiny size, its dated table written by --out (the
benchmark at full size is run by hand: docs/running.md#benchmarks)."""
import json

from conftest import import_script

bench = import_script("bench/bench_sampler.py", "bench_sampler")


def test_bench_sampler_writes_its_dated_table(tmp_path, capsys):
    bench.main(["--sizes", "20000", "--rounds", "2", "--no-slow-peers", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    isa = bench.kernel_copy()
    table = (tmp_path / f"bench_sampler_{isa}.md").read_text()
    for needed in ("- date: ", "- commit: ", "ISA flags: ", f"cpu kernels {isa}", "load average (1, 5, 15 min) before",
                   "load average (1, 5, 15 min) after", "## Wall-clock time", "## CPU time"):
        assert needed in table, needed
    rows = json.loads((tmp_path / f"bench_sampler_{isa}.json").read_text())["rows"]
    for op, target in (("smoothstep_sample", 1.5), ("kth_value", 1.2)):
        for clock in ("wall", "cpu"):
            mine = [r for r in rows if r["op"] == op and r["clock"] == clock and not r.get("other_peer")]
            assert sorted(r["threads"] for r in mine) == sorted({1, bench.torch.get_num_threads()})
            for r in mine:
                assert r["rounds"] == 2 and r["ratio"] > 0 and r["target"].startswith(f">= {target}x")
                assert r["ratio_low"] <= r["ratio_high"]
                assert ("over_floor" in r) == (op == "smoothstep_sample")  # the floor: the sampler's keys alone
    assert "| wall | 20,000 | `smoothstep_sample` |" in printed
