"""The book builds with warnings treated as errors and shows the stored outputs."""

import re
from pathlib import Path

import pytest

from book_build import build_book
from gpuformer_lib.tools.notebooks import notebook_paths

pytestmark = pytest.mark.book


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    return build_book(tmp_path_factory)


def test_index_and_every_chapter_are_built(html):
    assert (html / "index.html").exists()
    for path in notebook_paths():
        assert (html / "notebooks" / f"{path.stem}.html").exists(), f"{path.name} has no page"


def test_chapter_pages_show_stored_outputs_figures_and_glued_numbers(html):
    page = (html / "notebooks" / "01_why_gpus.html").read_text()
    assert "size preset" in page, "the opening hardware summary is missing"
    assert len(re.findall(r"<img [^>]*src=\"[^\"]*\.png\"", page)) >= 3, "figures are missing"
    assert "glue:" not in page, "a {glue} reference was not resolved"
    assert "colab.research.google.com" in page and "mybinder.org" in page, "launch buttons are missing"


def test_solutions_are_folded_away(html):
    page = (html / "notebooks" / "00_setup.html").read_text()
    assert page.count("tag_hide-cell") >= 3


def test_widgets_render_from_files_shipped_with_the_book(html):
    page = (html / "notebooks" / "03_attention.html").read_text()
    assert "application/vnd.jupyter.widget-state+json" in page, "the widget state was not embedded"
    assert "application/vnd.jupyter.widget-view+json" in page
    for script in ("widgets/require.js", "widgets/embed-amd.js"):
        assert f"_static/{script}" in page and (html / "_static" / script).exists()
    assert "cdnjs.cloudflare.com/ajax/libs/require.js" not in page  # not the CDN default


def test_every_chapter_shows_a_gpu_view_with_the_three_kinds(html):
    for path in notebook_paths():
        page = (html / "notebooks" / f"{path.stem}.html").read_text()
        assert "gpuview" in page, f"{path.name}: no GPU view on its page"
        for kind in ("measured", "predicted", "published"):
            assert f"gpuview-{kind}" in page, f"{path.name}: its GPU view has no {kind} row"


def test_the_appendix_lists_every_published_figure_with_its_source(html):
    from gpuformer_lib import published

    page = (html / "book" / "published_figures.html").read_text()
    for figure in published.figures():
        assert figure.key in page and f'href="{figure.url}"' in page.replace("&amp;", "&"), figure.key


def test_math_comes_from_the_mathjax_shipped_with_the_book(html):
    page = (html / "notebooks" / "03_attention.html").read_text()
    assert "_static/mathjax/tex-svg-full.js" in page and (html / "_static" / "mathjax" / "tex-svg-full.js").exists()
    assert "cdn.jsdelivr.net/npm/mathjax" not in page, "MathJax would come from a CDN: raw TeX offline"


def test_each_script_is_written_once(html):
    for name in ("03_attention", "09_memory_and_accumulation"):
        page = (html / "notebooks" / f"{name}.html").read_text()
        assert page.count("const THEBE_JS_URL") <= 1, f"{name}: sphinx-thebe's configuration is written twice"
        scripts = re.findall(r'<script src="([^"]+)"', page)
        assert len(scripts) == len(set(scripts)), f"{name}: a script is loaded twice"


def test_tables_printed_in_columns_are_told_from_sentences():
    import importlib.util

    from gpuformer_lib.tools.notebooks import REPO_ROOT

    spec = importlib.util.spec_from_file_location("gpuformer_book", REPO_ROOT / "book" / "_ext" / "gpuformer_book.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    table = "row     time   speedup\nfp32    1.0 s  1.00x\nbf16    0.5 s  2.00x\n"
    sentences = "the loss fell from 4.2 to 2.1 over 300 steps.\nit trained.\nthe model fits in 3.1 GiB.\n"
    assert ext.is_columns(table) and not ext.is_columns(sentences)
    assert not ext.is_columns("a  b\nc  d\n"), "two lines are not a table"


def test_printed_tables_keep_their_lines_and_prose_outputs_wrap(html):
    page = (html / "notebooks" / "13_translation_case_study.html").read_text()
    assert page.count("gpuformer-columns") >= 3, "chapter 13's printed tables were not marked"
    css = (html / "_static" / "gpuformer-book.css").read_text()
    assert "white-space: pre-wrap" in css and ".gpuformer-columns pre" in css


def test_an_exercise_before_its_answer_reads_as_a_note_not_an_error(html):
    """Every stored "❌ Not yet." (an exercise cell as shipped) is marked as a note on the exercise; a solution's
    output never is, and the stylesheet captions the mark."""
    marked = 0
    for path in notebook_paths():
        page = (html / "notebooks" / f"{path.stem}.html").read_text()
        for cell in re.findall(r'<div class="cell (?:[^"]*)".*?(?=<div class="cell |\Z)', page, re.S):
            for output in re.findall(r'<div class="output stream[^"]*"[^>]*>.*?</pre>', cell, re.S):
                unanswered = "❌ Not yet." in output
                assert ("gpuformer-unanswered" in output) == (unanswered and "tag_solution" not in cell[:300]), \
                    (path.name, output[:200])
                marked += unanswered
    assert marked >= 30, f"only {marked} exercise outputs before an answer"
    css = (html / "_static" / "gpuformer-book.css").read_text()
    assert ".gpuformer-unanswered::before" in css and "until you answer" in css
