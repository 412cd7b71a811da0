"""Prose that reads the same in the book, JupyterLab and Colab (issue 32).

A sentence whose words or numbers a measurement chose is a *prose cell*: ``prose(r\"\"\"...\"\"\")`` in a code cell
tagged ``remove-input`` and ``prose``, its ``{{name}}`` slots filled with the values ``glue`` recorded. The book
shows only its Markdown output, as part of the page; Lab and Colab render that output too. Markdown cells hold
only what no value chooses, and no role (``{glue:text}``, ``{doc}``, ``{term}``), which Lab and Colab would show
raw. Every paragraph the roles used to fill (``tests/value_sentences.json``, kept from before the change)
must still render in the built book, and each chapter shows at most half the code lines it showed before
(assembly folded: one click shows it).
"""

import ast
import html as html_lib
import json
import re

import pytest

from gpuformer_lib import viz
from gpuformer_lib.tools.notebooks import REPO_ROOT, notebook_paths, read_notebook
from notebook_pages import PROSE_TEMPLATE, is_prose

NOTEBOOKS = notebook_paths()
IDS = [p.stem[:2] for p in NOTEBOOKS]
RECORD = "application/papermill.record/text/plain"
ROLE = re.compile(r"\{[a-z][\w:-]*\}`")
FOLDED = {"hide-input", "remove-input", "remove-cell", "hide-cell"}
# code lines each chapter showed in the book on 2026-11-27, before assembly code was folded (issue 32's count)
SHOWN_BEFORE = {"00": 313, "01": 1133, "02": 1057, "03": 933, "04": 878, "05": 1034, "06": 1122, "07": 832,
                "08": 640, "09": 976, "10": 658, "11": 499, "12": 752, "13": 922, "14": 908, "15": 1080, "16": 795}
SENTENCES = json.loads((REPO_ROOT / "tests" / "value_sentences.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- viz.prose


@pytest.fixture
def glued(monkeypatch):
    monkeypatch.setattr(viz, "GLUED", {})
    return viz.GLUED


def test_glue_records_the_text_prose_shows(glued):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()  # the display machinery a kernel has
    try:
        with capture_output():
            viz.glue("speedup", "2.4x")
            viz.glue("steps", 300)
    finally:
        InteractiveShell.clear_instance()  # later tests in this process must not find a running IPython
    assert glued == {"speedup": "2.4x", "steps": "300"}


def test_prose_fills_each_slot_with_the_glued_text_and_leaves_latex_alone(glued):
    glued.update(speedup="2.4x", steps="300")
    out = viz.prose(r"""
It ran {{speedup}} faster over {{steps}} steps, $\frac{a}{b}$ and {a} kept.
""")
    assert out.data == r"It ran 2.4x faster over 300 steps, $\frac{a}{b}$ and {a} kept."
    assert out._repr_markdown_() == out.data  # what Lab, Colab and myst-nb render


@pytest.mark.parametrize("template, error, match", [
    ("{{never_glued}} is missing", KeyError, "never_glued, which no cell has glued yet: run the cells above"),
    ("plain text, no slot", ValueError, "belongs in a markdown cell"),
    (b"{{x}}", TypeError, "as a str"),
])
def test_prose_refuses_what_would_print_a_wrong_sentence(glued, template, error, match):
    glued["x"] = "1"
    with pytest.raises(error, match=match):
        viz.prose(template)


# --------------------------------------------------------------------------- the notebooks


def _shown_lines(nb) -> int:
    return sum(len(c.source.splitlines()) for c in nb.cells
               if c.cell_type == "code" and not FOLDED & set(c.metadata.get("tags", [])))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_markdown_holds_a_role_that_lab_and_colab_show_raw(path):
    nb = read_notebook(path)
    found = [m.group(0) for c in nb.cells if c.cell_type == "markdown" for m in ROLE.finditer(c.source)]
    assert not found, f"{path.name}: roles in markdown cells, shown raw in JupyterLab and Colab: {found[:5]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_each_prose_cell_renders_values_glued_above_it(path):
    """Tags, one prose(r\"\"\"...\"\"\") call, every slot glued by an earlier cell, and the stored output is the
    template filled with the values stored with those cells."""
    nb = read_notebook(path)
    glued: dict[str, str] = {}
    count = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if is_prose(cell):
            count += 1
            assert set(cell.metadata["tags"]) == {"remove-input", "prose"}, f"{path.name} cell {index}: tags"
            match = PROSE_TEMPLATE.match(cell.source)
            assert match, f"{path.name} cell {index}: a prose cell holds one prose(r\"\"\"...\"\"\") call"
            template = match.group(1)
            names = re.findall(r"\{\{(\w+)\}\}", template)
            missing = [n for n in names if n not in glued]
            assert not missing, f"{path.name} cell {index}: {missing} are glued below the prose that shows them"
            shown = [o for o in cell.outputs if "text/markdown" in o.get("data", {})]
            assert len(shown) == 1, f"{path.name} cell {index}: a prose cell stores one Markdown output"
            filled = re.sub(r"\{\{(\w+)\}\}", lambda m: glued[m.group(1)], template.strip("\n"))
            assert "".join(shown[0]["data"]["text/markdown"]) == filled, \
                f"{path.name} cell {index}: the stored sentence is not the one its stored values make"
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name and RECORD in out.get("data", {}):
                value = out["data"][RECORD]
                parsed = ast.literal_eval("".join(value) if isinstance(value, list) else value)
                glued[name] = parsed if isinstance(parsed, str) else str(parsed)
    expected = len(SENTENCES["notebooks"].get(path.name, [])) > 0
    assert (count > 0) == expected, f"{path.name}: {count} prose cells"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_at_most_half_the_code_shown_before_is_shown(path):
    before = SHOWN_BEFORE[path.name[:2]]
    shown = _shown_lines(read_notebook(path))
    assert 2 * shown <= before, (f"{path.name} shows {shown} code lines, more than half the {before} it showed on "
                                 "2026-11-27: fold the code that assembles sentences, views or tables (hide-input)")


def test_the_shown_count_sees_a_cell_unfolded():
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("a = 1\nb = 2"),
                                         nbformat.v4.new_code_cell("c = 3", metadata={"tags": ["hide-input"]})])
    assert _shown_lines(nb) == 2


# --------------------------------------------------------------------------- in the built book


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]+", text)


def _page_text(page: str) -> str:
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", page))


def static_pieces(markdown: str) -> list[str]:
    """The runs of a paragraph's own words: split at its roles and its math, markup and link targets dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)  # a link: its text
    text = re.sub(r"\{(?:term|doc)\}`([^`<]*?)\s*<[^>]*>`", r"\1", text)  # a role with its own text: the text
    text = re.sub(r"\{term\}`([^`]*)`", r"\1", text)  # a glossary term: the term (the link a page now has)
    # a value, a page's title (a {doc} role without text) and math split the paragraph into runs
    pieces = re.split(r"\{glue:text\}`[^`]+`|\{doc\}`[^`]+`|\$\$.*?\$\$|\$[^$]*\$", text, flags=re.S)
    # and into sentences: a sentence that needed a value measured further down moved below it, as its own
    # paragraph, and the rest of its paragraph stayed
    pieces = [s for p in pieces for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*`(\[])", p)]
    return [" ".join(_words(p)) for p in pieces if len(_words(p)) >= 3]


def test_static_pieces_split_at_values_and_math():
    assert static_pieces("It ran {glue:text}`x` faster than $O(T^2)$ on **both** [chips](a.md) here, really.") \
        == ["on both chips here really"]
    assert static_pieces("One two three. Four five six {glue:text}`x` seven.") == ["One two three", "Four five six"]
    assert static_pieces("See {term}`the first article <seed articles>` and {term}`seed articles` in {doc}`x`, "
                         "then go on reading.") == ["See the first article and seed articles in", "then go on reading"]


@pytest.mark.book
def test_every_value_chosen_paragraph_still_renders_in_the_book(tmp_path_factory):
    from book_build import build_book

    html = build_book(tmp_path_factory)
    missing = []
    for name, paragraphs in SENTENCES["notebooks"].items():
        page = " ".join(_words(_page_text((html / "notebooks" / name.replace(".ipynb", ".html")).read_text())))
        assert "glue:text" not in page and "{{" not in page, f"{name}: an unfilled slot or role in the page"
        for entry in paragraphs:
            for piece in static_pieces(entry.get("rewritten", entry["text"])):
                if f" {piece} " not in f" {page} ":
                    missing.append(f"{name}: {piece[:70]!r}")
    assert not missing, f"{len(missing)} pieces of value-chosen paragraphs are not on their pages:\n" + \
        "\n".join(missing[:20])
