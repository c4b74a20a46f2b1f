"""BENCHMARKS.md leads with current figures, and the docs site shows them from that one source.

The site's Benchmarks page (`docs/benchmarks.md`) includes BENCHMARKS.md's `current` section with
pymdownx.snippets when MkDocs builds it, so the figures live in one file. These tests keep that
section where the page expects it and fit for the site (no links, which would point elsewhere
there), keep every benchmark `make bench` runs in it with what reproduces its figures (run as a
module, `python -m bench.<name>`), and keep the history the current tables replaced where
BENCHMARKS.md points. `make docs` (`--strict`) is what
checks the page renders: a missing section fails the build.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"
DOCS_PAGE = ROOT / "docs" / "benchmarks.md"
HISTORY = ROOT / "bench" / "results" / "history.md"

START = "<!-- --8<-- [start:current] -->"
END = "<!-- --8<-- [end:current] -->"
INCLUDE = '--8<-- "BENCHMARKS.md:current"'


def current_part() -> str:
    """BENCHMARKS.md's `current` section: what the docs page includes."""
    text = BENCHMARKS.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, "one start and one end marker"
    start, end = text.index(START), text.index(END)
    assert start < end
    return text[start + len(START) : end]


def current_sections() -> dict[str, str]:
    """Each benchmark's part of the current figures, by its heading."""
    figures = current_part().split("\n## Current figures\n", 1)[1].split("\n## ", 1)[0]
    chunks = re.split(r"^### ", figures, flags=re.M)[1:]
    return {chunk.split("\n", 1)[0]: chunk for chunk in chunks}


def make_bench_modules() -> list[str]:
    """The benchmarks the Makefile's `bench` target runs, as `bench.<name>` (`python -m bench.<name>`)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = re.search(r"^bench:.*?\n((?:\t.*\n)+)", makefile, re.M)
    assert target is not None, "the Makefile has no bench target"
    assert "bench/" not in target.group(1), "benchmarks run as modules (-m bench.<name>), not scripts"
    return re.findall(r"-m (bench\.\w+)", target.group(1))


def test_docs_page_includes_the_current_figures() -> None:
    """The docs page takes its figures from BENCHMARKS.md rather than holding a copy."""
    lines = DOCS_PAGE.read_text(encoding="utf-8").splitlines()
    assert INCLUDE in lines
    assert not any(line.startswith("|") for line in lines), "the page holds no table of its own"


def test_current_part_reads_the_same_on_the_site() -> None:
    """The included part has no link (relative ones break on the site) and no nested include."""
    part = current_part()
    assert "## Current figures" in part and "## Methodology" in part
    assert "](" not in part
    assert "--8<--" not in part


def test_current_figures_lead_the_file() -> None:
    """Only a title and a short introduction stand above the current tables."""
    text = BENCHMARKS.read_text(encoding="utf-8")
    current = text.index("## Current figures")
    assert current < text.index("## Methodology") < text.index("## History")
    assert text[:current].count("\n") < 30


def test_every_benchmark_names_command_commit_date_and_machine() -> None:
    """Each current section says how to reproduce its figures and where they were measured."""
    sections = current_sections()
    assert len(sections) >= 10, sorted(sections)
    for heading, body in sections.items():
        for field in ("- Command:", "Commit", "Date", "Machine"):
            assert field in body, f"{heading!r} has no {field!r}"


def test_every_benchmark_of_make_bench_has_a_current_table() -> None:
    """What `make bench` runs is what the current tables report on."""
    headings = " ".join(current_sections())
    modules = make_bench_modules()
    assert modules, "the bench target runs no bench.<name> module"
    for module in modules:
        assert f"`{module}" in headings, f"no current table for {module}"


def test_every_current_command_runs_a_module() -> None:
    """The commands BENCHMARKS.md gives run benchmarks as modules, the way they import."""
    commands = re.findall(r"`\.venv/bin/python ([^`]*)`", current_part())
    assert commands
    for command in commands:
        assert " ".join(command.split()).startswith("-m bench."), command


def test_the_soak_has_its_slot() -> None:
    """The soak benchmark has its section among the current figures."""
    soak = [body for heading, body in current_sections().items() if heading.startswith("Soak")]
    assert len(soak) == 1
    assert "200 req/s" in soak[0] and "30 min" in soak[0]


def test_history_is_linked_and_holds_every_benchmark() -> None:
    """The archive BENCHMARKS.md links to exists and has a part for each benchmark of `make bench`."""
    assert "](bench/results/history.md)" in BENCHMARKS.read_text(encoding="utf-8")
    history = HISTORY.read_text(encoding="utf-8")
    assert history.startswith("# Benchmark history\n")
    for module in make_bench_modules():
        assert re.search(rf"^## .*`{re.escape(module)}`", history, re.M), module
