"""bench/report.py rewrites only its block of docs/results.md: inserted before the first
hand-written section the first time, replaced between the markers afterwards, the rest kept."""
import argparse
import importlib.util
import pathlib

import pytest

pytest.importorskip("matplotlib")
ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("report", ROOT / "bench" / "report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def make(tmp_path, results):
    args = argparse.Namespace(results=str(results), figures=str(tmp_path / "fig"), work=str(tmp_path))
    return report.Report(args)


def test_first_write_goes_before_the_first_section_and_keeps_everything(tmp_path):
    res = tmp_path / "results.md"
    original = "# Measured results\n\nintro\n\n## Issue 5\nhand table\n\n## Issue 6\nmore\n"
    res.write_text(original)
    r = make(tmp_path, res)
    r.md = ["### generated one"]
    r.write(["io"])
    text = res.read_text()
    assert text.index(report.BEGIN) < text.index("## Issue 5")
    assert text.index("intro") < text.index(report.BEGIN)
    assert "### generated one" in text
    assert text.replace(text[text.index(report.BEGIN):text.index(report.END) + len(report.END) + 2], "") == original


def test_second_write_replaces_only_the_block(tmp_path):
    res = tmp_path / "results.md"
    res.write_text("# R\n\n## Hand\nkeep me\n")
    r = make(tmp_path, res)
    r.md = ["### old figures"]
    r.write(["io"])
    with_block = res.read_text()
    res.write_text(with_block + "\n## Added later by hand\nalso keep\n")
    r.md = ["### new figures"]
    r.write(["decode"])
    text = res.read_text()
    assert "### old figures" not in text and "### new figures" in text
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1
    assert "keep me" in text and "also keep" in text
    assert text.index("## Hand") > text.index(report.END)
