"""Small additions to the book's HTML: a Sphinx fix for the Sphinx 7 series that Jupyter Book 1
requires, a class on text outputs laid out in columns, and the GPU views drawn from the committed GPU results.

Inline scripts that an extension registers after the HTML builder has started (sphinx-thebe's
``const THEBE_JS_URL = ...`` configuration, sphinx-togglebutton's selector) were written twice
into every page, and the second ``const`` declaration threw "Identifier 'THEBE_JS_URL' has
already been declared" in the browser. Sphinx 7.4 keeps such a script once with the file name
``None`` (``Sphinx.add_js_file``) and again with ``''`` (``StandaloneHTMLBuilder.prepare_writing``),
and the two do not compare equal. Upstream fixed it in sphinx-doc/sphinx#13402, after the Sphinx 7
series. Here each page's script list keeps the first of any scripts that differ only in that.

It leaves every other script, and the order of the scripts, as they are.

Text outputs wrap at the column's edge, as JupyterLab shows them (``gpuformer-book.css``): most long
output lines are sentences. A table printed in columns would be torn apart by wrapping, so an output
whose lines are aligned in columns gets the class ``gpuformer-columns`` and keeps its lines (it
scrolls sideways where it is wider than the column).

An exercise cell is stored as shipped, before a learner's answer, so its check printed "❌ Not yet. ..." (the
stub's placeholder, or the given code's mistake to find). In a static page that reads as an error; such an
output gets the class ``gpuformer-unanswered``, which the stylesheet shows as a muted note under a caption
saying what it is (a solution's output never gets it).

Every chapter's GPU view stores its specification in the page; the build draws each view again from it and
from the result files committed under ``bench_results/gpu/`` (``gpuformer_lib.gpu_results``, which needs no
torch), so committing a GPU run's files shows that device on every page without re-running a chapter. The
appendix page ``book/gpu_measurements.md`` gets every committed item on every device in place of its marker.

Light pages: the theme's fontawesome.js (1.5 MB, every Font Awesome icon, on every page) is cut after the build
to the icons the pages and their scripts name (:func:`trim_icon_script`), and a page with math says at its foot
that MathJax (2.2 MB, shipped for offline reading) is most of its weight (:func:`note_mathjax_weight`).
"""

import re
import sys
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

_GAP = re.compile(r"\S {2,}\S")
"""Two or more spaces between two words: the gap between two columns (sentences have one space)."""


def is_columns(text: str) -> bool:
    """Whether printed text is laid out in columns: three lines or more, at least two of them with a
    gap of two spaces or more between words, or a table drawn with ``|``."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 3:
        return False
    return sum(bool(_GAP.search(line.strip())) or line.count("|") >= 2 for line in lines) >= 2


UNANSWERED = "❌ Not yet."
"""How a check's output starts when the answer is not right yet: in a stored exercise cell, the shipped stub's."""


def mark_column_outputs(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Add ``gpuformer-columns`` to the text outputs of notebook cells that :func:`is_columns`, and
    ``gpuformer-unanswered`` to what an exercise cell's check printed before any answer (an exercise cell as
    shipped, not its solution): in a static page it is a note on the exercise, not an error of the page."""
    for block in doctree.findall(nodes.literal_block):
        parent, in_output, cell_classes = block.parent, False, []
        while parent is not None:
            classes = parent.get("classes", [])
            in_output = in_output or "cell_output" in classes
            if "cell" in classes:
                cell_classes = classes
                break
            parent = parent.parent
        if not in_output:
            continue
        if is_columns(block.astext()):
            block["classes"].append("gpuformer-columns")
        said = block.astext().splitlines()
        if any(line.startswith(UNANSWERED) for line in said) and "tag_solution" not in cell_classes:
            block["classes"].append("gpuformer-unanswered")


def _script_key(script: Any) -> tuple:
    """What makes two scripts the same script: the file (None and '' alike), priority and attributes."""
    attributes = getattr(script, "attributes", {})
    return (getattr(script, "filename", script) or "", getattr(script, "priority", None),
            tuple(sorted((name, str(value)) for name, value in attributes.items())))


def drop_duplicate_scripts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Remove a page's repeated scripts, keeping the first of each (see the module docstring)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            kept.append(script)
    # A new list: the builder's own list is restored after each page and must stay untouched.
    context["script_files"] = kept


APPENDIX_MARK = "<!-- gpu-measurements -->"
VALIDATION_MARK = "<!-- predictor-validation -->"


def _gpu_results(app: Sphinx):
    """``gpuformer_lib.gpu_results`` from the checkout being built (the book's build installs no library)."""
    root = str(Path(app.srcdir).resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    from gpuformer_lib import gpu_results

    return gpu_results


def load_gpu_results(app: Sphinx) -> None:
    gpu_results = _gpu_results(app)
    app.env.gpuformer_gpu_results = gpu_results.load_results(Path(app.srcdir) / "bench_results" / "gpu")


def redraw_gpu_views(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Draw the page's GPU views again with the committed results (see the module docstring)."""
    body = context.get("body")
    if body and "gpuview-block" in body:
        context["body"] = _gpu_results(app).redraw_views(body, getattr(app.env, "gpuformer_gpu_results", None))


def fill_gpu_appendix(app: Sphinx, docname: str, source: list[str]) -> None:
    """The appendix of GPU measurements: the marker becomes every committed item on every device."""
    if APPENDIX_MARK not in source[0]:
        return
    gpu_results = _gpu_results(app)
    validation = gpu_results.validation_html(
        gpu_results.load_validation(Path(app.srcdir) / "bench_results" / "predictor-validation.json"))
    source[0] = source[0].replace(VALIDATION_MARK, "```{raw} html\n" + validation + "\n```")
    notebooks = sorted((Path(app.srcdir) / "notebooks").glob("*.ipynb"))
    table = gpu_results.appendix_html(getattr(app.env, "gpuformer_gpu_results", None),
                                      gpu_results.notebook_specs(notebooks))
    source[0] = source[0].replace(APPENDIX_MARK, "```{raw} html\n" + table + "\n```")


_ICON_CLASS = re.compile(r"\bfa-([a-z0-9]+(?:-[a-z0-9]+)*)")
_ICON_ENTRY_START = re.compile(r'var p=\{(?="?[a-z0-9-]+"?:\[\d+,\d+,\[)')


def _structure(text: str, start: int = 0):
    """Each character of JavaScript ``text`` from ``start`` that lies outside a string, with the depth of
    brackets and braces after it."""
    depth, in_string = 0, False
    for i in range(start, len(text)):
        ch = text[i]
        if ch == '"' and text[i - 1] != "\\":
            in_string = not in_string
        elif not in_string:
            depth += (ch in "{[") - (ch in "}]")
            yield i, ch, depth


def _icon_entries(body: str) -> list[tuple[str, set[str]]]:
    """The ``name:[width,height,[aliases],"unicode",path]`` entries of one of fontawesome.js's icon objects (the
    text between its braces), each with the names and aliases it answers to."""
    commas = [i for i, ch, depth in _structure(body) if ch == "," and depth == 0]
    named = []
    for lo, hi in zip([-1] + commas, commas + [len(body)]):
        head = re.match(r'"?([a-z0-9-]+)"?:\[\d+,\d+,\[([^\]]*)\]', body[lo + 1:hi])
        if head:
            named.append((body[lo + 1:hi], {head[1], *re.findall(r'"([a-z0-9-]+)"', head[2])}))
    return named


def subset_icons(script: str, used: set[str]) -> str:
    """fontawesome.js with only the icons in ``used`` (names or aliases) left in its three icon objects (solid,
    regular, brands): its runtime, which draws each ``<i class="fa-...">`` as an inline SVG, is kept whole."""
    out, pos = [], 0
    for match in _ICON_ENTRY_START.finditer(script):
        open_brace = match.end() - 1
        end = next(i for i, ch, depth in _structure(script, open_brace) if depth == 0)
        kept = [text for text, names in _icon_entries(script[open_brace + 1:end]) if names & used]
        out.append(script[pos:open_brace + 1] + ",".join(kept))
        pos = end
    return "".join(out) + script[pos:]


def trim_icon_script(app: Sphinx, exception: Exception | None) -> None:
    """The theme's fontawesome.js (1.5 MB, every icon Font Awesome has, on every page) cut to the icons that the
    built pages and their scripts name: about 0.1 MB."""
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    script = out / "_static" / "scripts" / "fontawesome.js"
    if not script.exists():
        return
    used: set[str] = set()
    # the pages and the theme's scripts; not the widget bundle, whose own Font Awesome 5 style sheet names them all
    scripts = [p for p in (out / "_static").rglob("*.js") if p != script and not {"widgets", "mathjax"} & set(p.parts)]
    for path in list(out.rglob("*.html")) + scripts:
        used |= set(_ICON_CLASS.findall(path.read_text(encoding="utf-8", errors="replace")))
    script.write_text(subset_icons(script.read_text(encoding="utf-8"), used), encoding="utf-8")


WEIGHT_NOTE = ('<p class="gpuformer-weight-note">This page loads MathJax (about 2.2 MB), shipped with the book so '
               "that its formulas are typeset offline, from a file as from a server; it is most of the page's "
               "weight.</p>")


def note_mathjax_weight(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """A page with math says at its foot why it weighs more than the others (tests/test_book_browser.py holds a
    page to 3 MB, MathJax aside when the page says so)."""
    body = context.get("body")
    if body and doctree is not None and app.env.get_domain("math").has_equations(pagename):
        context["body"] = body + WEIGHT_NOTE


def setup(app: Sphinx) -> dict:
    # Late (priority 900), after the extensions that add a page's scripts on this event.
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    app.connect("doctree-resolved", mark_column_outputs)
    app.connect("builder-inited", load_gpu_results)
    app.connect("html-page-context", redraw_gpu_views)
    app.connect("source-read", fill_gpu_appendix)
    app.connect("build-finished", trim_icon_script)
    app.connect("html-page-context", note_mathjax_weight)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
