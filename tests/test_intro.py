"""The front of the book is current: the introduction (``book/intro.md``) lists every chapter of the table of
contents (``_toc.yml``), in its order, under the title the notebook gives itself and with the part it sits in, and
nothing there is still 'planned' (it once listed chapters 13-15 as planned and left out 16). What it says about the
GPU views holds for the stored pages: they were run on a CPU, so no measured row names a GPU, and the GPU
measurements it points at are in the repository."""

import json
import re

import pytest

from gpuformer_lib.tools.notebooks import REPO_ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML comes with jupyter-book (make test installs it)")

INTRO = REPO_ROOT / "book" / "intro.md"
ROW = re.compile(r"^\| *(\d+) *\| *\{doc\}`(.+?) <\.\./(notebooks/[^>]+)>` *\| *(.+?) *\|$")
"""A row of the chapter table: | number | {doc}`title <../notebooks/name>` | part |."""


def toc_chapters() -> list[tuple[str, str]]:
    """(part caption, notebook path without .ipynb) for each notebook of _toc.yml, in its order."""
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    return [(part["caption"], chapter["file"]) for part in toc["parts"] for chapter in part["chapters"]
            if chapter["file"].startswith("notebooks/")]


def notebook_title(path: str) -> tuple[str, str]:
    """(number, title) from the notebook's first markdown heading, "# N. Title"."""
    notebook = json.loads((REPO_ROOT / f"{path}.ipynb").read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            heading = re.search(r"^# +(.+?) *$", "".join(cell["source"]), re.M)
            if heading:
                numbered = re.fullmatch(r"(\d+)\. +(.+)", heading.group(1))
                assert numbered, f"{path}: its title {heading.group(1)!r} is not 'N. Title'"
                return numbered.group(1), numbered.group(2)
    raise AssertionError(f"{path}: no markdown heading")


def intro_rows(text: str) -> list[tuple[str, str, str, str]]:
    """(number, title, notebook path, part) for each row of the introduction's chapter table."""
    return [match.groups() for line in text.splitlines() if (match := ROW.match(line.strip()))]


def expected_rows() -> list[tuple[str, str, str, str]]:
    return [(*notebook_title(path), path, caption) for caption, path in toc_chapters()]


def chapter_list_problems(text: str) -> list[str]:
    """What is wrong with an introduction's chapter list, in words; [] when it is current."""
    found = []
    rows, expected = intro_rows(text), expected_rows()
    listed = [row[2] for row in rows]
    for row in expected:
        if row[2] not in listed:
            found.append(f"chapter {row[0]} ({row[2]}) is not listed")
    for row in rows:
        if row[2] not in [e[2] for e in expected]:
            found.append(f"{row[2]} is listed but is not a chapter of _toc.yml")
    if not found and rows != expected:
        for got, want in zip(rows, expected):
            if got != want:
                found.append(f"row {got} should read {want} (the order, title and part of _toc.yml and the notebook)")
                break
    if re.search(r"\bplanned\b", text, re.I):
        found.append("it still calls something 'planned'")
    return found


def test_the_intro_lists_every_chapter_of_the_toc_in_order():
    assert chapter_list_problems(INTRO.read_text()) == []


@pytest.mark.parametrize("edit, hint", [
    # the list as it was before issue 32: 13-15 planned in one row, 16 missing
    (lambda t: re.sub(r"^\| 13 .*?(?=^\| 16 )", "| 13–15 | Case studies | planned |\n", t, flags=re.M | re.S),
     "chapter 13"),
    (lambda t: "\n".join(l for l in t.splitlines() if not l.startswith("| 16 ")), "chapter 16"),
    (lambda t: re.sub(r"^(\| 3 .*)\n(\| 4 .*)$", r"\2\n\1", t, flags=re.M), "should read"),
    (lambda t: t.replace("`Attention <", "`Attention, the old title <"), "should read"),
    (lambda t: t.replace("| 8 | {doc}`Mixed precision <../notebooks/08_mixed_precision>` | Part III",
                         "| 8 | {doc}`Mixed precision <../notebooks/08_mixed_precision>` | Part II"), "should read"),
    (lambda t: t + "\n| 17 | {doc}`Next <../notebooks/17_next>` | Part VII |\n", "not a chapter of _toc.yml"),
    (lambda t: t + "\nChapter 17 is planned.\n", "planned"),
])
def test_an_intro_that_is_not_current_is_refused(edit, hint):
    found = chapter_list_problems(edit(INTRO.read_text()))
    assert any(hint in problem for problem in found), found


def test_what_the_intro_says_of_the_gpu_views_holds():
    """The intro says every page of this edition was run on a CPU and that the GPU views read the committed suite
    results. When a page is re-executed on a GPU, this fails: update the intro's "Three kinds of GPU number"."""
    from gpuformer_lib import gpu_results

    text = INTRO.read_text()
    assert "every chapter ends its measurements with a **GPU view**" in text
    assert "every page of this edition was run on a CPU" in text
    assert "committed under `bench_results/gpu/`" in text and gpu_results.load_results()
    for _, path in toc_chapters():
        notebook = json.loads((REPO_ROOT / f"{path}.ipynb").read_text())
        hardware = notebook["metadata"].get("gpuformer", {}).get("hardware", {})
        assert hardware.get("gpu_name") is None, f"{path} was run on {hardware['gpu_name']}: not a CPU"
        for _, spec in gpu_results.notebook_specs([REPO_ROOT / f"{path}.ipynb"]):
            for row in spec["rows"]:
                if row["kind"] == "measured":
                    assert "CPU" in row["device"], f"{path}: a measured row from {row['device']}"