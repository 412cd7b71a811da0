"""The built book as a reader sees it, in Debian's Chromium driven by Playwright, with no network.

Every page in the table of contents loads with content and no console error; math is typeset by the
MathJax shipped with the book; figures have a size; the ☰ button opens the chapter list on a phone;
chapter 3's explorer changes its picture when a slider moves; chapter 9's calculator recomputes in
the page; code blocks fit the column; search finds chapter 3. Screenshots go to ``_build/screenshots``.

Skips, saying why, where Playwright or Chromium is missing (``.ci/run`` installs both). Never runs
``playwright install``, which would download a browser.
"""

from __future__ import annotations

import functools
import http.server
import threading
import time

import pytest
import yaml

from book_build import build_book
from browser import launch, playwright_or_skip
from gpuformer_lib.tools.notebooks import REPO_ROOT

pytestmark = pytest.mark.book

SCREENSHOTS = REPO_ROOT / "_build" / "screenshots"
OVERFLOW_SHARE = 0.10
"""Largest share of a page's text outputs that may scroll sideways at 1280 px (they wrap, as in JupyterLab);
code cells never may (they are wrapped at 79 characters), tables printed in columns may (wrapping would tear
their rows apart; book/_ext/gpuformer_book.py marks them)."""

sync_api = playwright_or_skip(allow_module_level=True)


def toc_pages() -> list[str]:
    """The HTML path of every page in ``_toc.yml``, root first."""
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]
    for part in toc.get("parts", []):
        pages += [chapter["file"] for chapter in part.get("chapters", [])]
    return [f"{page}.html" for page in pages]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built book served on 127.0.0.1 (search and MathJax's fonts need http, not file://)."""
    root = build_book(tmp_path_factory)
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        chromium = launch(p)
        yield chromium
        chromium.close()


class Page:
    """A page opened offline: requests leaving 127.0.0.1 (or file://) are refused and recorded, console errors
    and uncaught exceptions recorded."""

    def __init__(self, browser, width: int = 1280, height: int = 900):
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.external: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url}")
                     if r.url not in self.external else None)
        self.page.on("response", lambda r: self.errors.append(f"{r.status}: {r.url}") if r.status >= 400 else None)
        self.context.route("**/*", self._offline)

    def _offline(self, route):
        url = route.request.url
        if url.startswith(("http://127.0.0.1", "file://", "data:", "blob:")):
            route.continue_()
        else:
            self.external.append(url)
            route.abort()

    def open(self, url: str):
        self.page.goto(url, wait_until="load")
        self.page.wait_for_load_state("networkidle")
        # MathJax typesets after load: wait for it where the page has math
        self.page.wait_for_function("() => !window.MathJax || !MathJax.startup || !MathJax.startup.promise "
                                    "|| MathJax.startup.promise.then(() => true)")
        return self.page

    def close(self):
        self.context.close()

    def __enter__(self) -> "Page":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name))


ARTICLE_TEXT = "() => (document.querySelector('article.bd-article') || document.body).innerText"
PROSE_TEXT = ("() => { const a = (document.querySelector('article.bd-article') || document.body).cloneNode(true); "
              "a.querySelectorAll('pre, code, .cell_output, mjx-container').forEach(e => e.remove()); "
              "return a.textContent; }")
"""The prose alone: code may hold a backslash-parenthesis, typeset math holds its TeX for assistive tools."""


def test_every_page_loads_offline_with_content_math_figures_and_code_that_fits(site, browser):
    root, base = site
    problems, formulas = [], 0
    with Page(browser) as view:
        for path in toc_pages():
            assert (root / path).exists(), f"{path} was not built"
            page = view.open(f"{base}/{path}")
            text = page.evaluate(ARTICLE_TEXT)
            if len(text) < 500:
                problems.append(f"{path}: only {len(text)} characters of content")
            prose = page.evaluate(PROSE_TEXT)
            raw = [marker for marker in ("\\(", "\\[", "$$") if marker in prose]
            if raw:
                problems.append(f"{path}: raw TeX left untypeset ({', '.join(raw)})")
            formulas += page.locator("mjx-container").count()
            for img in page.evaluate("() => [...document.querySelectorAll('article img')].map(i => "
                                     "[i.currentSrc, i.naturalWidth, i.getBoundingClientRect().width])"):
                src, natural, shown = img
                if not natural or not shown:
                    problems.append(f"{path}: figure {src[-60:]} has no size ({natural} px, shown {shown} px)")
            inputs, outputs = page.evaluate(
                "() => ['.cell_input pre', '.cell_output div.output:not(.gpuformer-columns) pre:not(.highlight > pre)']"
                ".map(s => [...document.querySelectorAll(s)].map(p => p.scrollWidth > p.clientWidth + 1))")
            if any(inputs):
                problems.append(f"{path}: {sum(inputs)} of {len(inputs)} code cells scroll sideways")
            if outputs and sum(outputs) / len(outputs) > OVERFLOW_SHARE:
                problems.append(f"{path}: {sum(outputs)} of {len(outputs)} text outputs scroll sideways "
                                f"(more than {OVERFLOW_SHARE:.0%}); only tables printed in columns and source code "
                                "shown by show_source may")
            if view.errors:
                problems.append(f"{path}: console errors {view.errors[:3]}")
                view.errors.clear()
            if view.external:
                problems.append(f"{path}: asked the network for {sorted(set(view.external))[:3]}")
                view.external.clear()
    assert not problems, "\n".join(problems)
    assert formulas > 100, f"only {formulas} formulas were typeset in the whole book"


def test_math_is_typeset_from_a_file_url_too(site, browser):
    root, _ = site
    with Page(browser) as view:
        page = view.open((root / "notebooks" / "03_attention.html").as_uri())
        assert page.locator("mjx-container").count() > 10
        assert "\\(" not in page.evaluate(PROSE_TEXT)
        heading = page.locator("h2:has(mjx-container)").first
        heading.scroll_into_view_if_needed()
        shot(page, "03_formula_in_a_heading_offline.png")
        assert not view.external, f"asked the network for {view.external[:3]}"


def test_the_sidebar_opens_from_the_menu_button_on_a_phone(site, browser):
    _, base = site
    with Page(browser, width=400, height=800) as view:
        page = view.open(f"{base}/notebooks/03_attention.html")
        # the chapter list: a link to chapter 0, in the sidebar or (once opened on a phone) in its dialog
        chapter_link = page.locator("#pst-primary-sidebar a[href*='00_setup'], "
                                    "#pst-primary-sidebar-modal a[href*='00_setup']")
        assert not any(_in_viewport(page, link) for link in chapter_link.all()), \
            "the chapter list is already open on a phone"
        button = page.locator("button.primary-toggle:visible").first
        assert button.count(), "no visible ☰ button at 400 px"
        button.click()
        assert _soon(page, lambda: any(_in_viewport(page, link) for link in chapter_link.all())), \
            "the ☰ button did not open the chapter list"
        shot(page, "03_phone_sidebar_open.png")
        page.keyboard.press("Escape")
        secondary = page.locator("button.secondary-toggle:visible, button.pst-navbar-icon.secondary-toggle:visible")
        if secondary.count():
            secondary.first.click()
            toc = page.locator("#pst-secondary-sidebar a, #pst-secondary-sidebar-modal a")
            assert _soon(page, lambda: any(_in_viewport(page, link) for link in toc.all())), \
                "the page-contents button did not open them"
        assert not view.errors, view.errors[:3]


def _soon(page, condition, seconds: float = 15.0) -> bool:
    """Whether ``condition()`` holds within ``seconds``, asked again every 50 ms: what a click or a key starts (a
    sidebar sliding in, a picture or a result redrawn) is waited for, not given a fixed time that a busy machine
    can overrun."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        page.wait_for_timeout(50)
    return True


def _in_viewport(page, locator) -> bool:
    """Shown, and wholly inside the window."""
    if not locator.is_visible():
        return False
    box, size = locator.bounding_box(), page.viewport_size
    return bool(box) and box["width"] > 0 and box["x"] >= 0 and box["x"] + box["width"] <= size["width"] + 1 \
        and box["y"] >= 0 and box["y"] + box["height"] <= size["height"] + 1


def test_one_search_field_shows_at_desktop_width(site, browser):
    _, base = site
    with Page(browser) as view:
        page = view.open(f"{base}/notebooks/03_attention.html")
        shown = page.evaluate("() => [...document.querySelectorAll('form.bd-search, .search-button-field, "
                              "button.search-button')].filter(e => e.offsetParent !== null && "
                              "e.getBoundingClientRect().height > 0).length")
        assert shown == 1, f"{shown} search fields or buttons show at 1280 px"


def test_search_finds_chapters_over_http(site, browser):
    _, base = site
    with Page(browser) as view:
        page = view.open(f"{base}/search.html?q=attention")
        page.wait_for_selector("#search-results ul.search li", timeout=15000)
        links = page.locator("#search-results ul.search li a").evaluate_all("as => as.map(a => a.href)")
        assert any("03_attention" in link for link in links), f"searching 'attention' did not find chapter 3: {links}"
        assert not view.errors, view.errors[:3]


def test_chapter_3_sliders_change_the_picture(site, browser):
    _, base = site
    with Page(browser) as view:
        page = view.open(f"{base}/notebooks/03_attention.html")
        explorer = page.locator(".widget-hbox").filter(has=page.locator(".widget-slider")).first
        explorer.wait_for(timeout=15000)
        explorer.scroll_into_view_if_needed()
        visible = ("(root) => [...root.querySelectorAll('img')].filter(i => i.offsetParent !== null)"
                   ".map(i => i.src.slice(-40)).join('|')")
        before = explorer.evaluate(visible)
        handle = explorer.locator(".noUi-handle, .slider-container input, input[type=range]").first
        handle.focus()
        page.keyboard.press("ArrowRight")
        assert before and _soon(page, lambda: explorer.evaluate(visible) != before), \
            "moving the head slider did not change the picture"
        shot(page, "03_explorer_after_slider.png")
        assert not view.errors, view.errors[:3]


def test_chapter_9_calculator_recomputes_in_the_page(site, browser):
    _, base = site
    with Page(browser) as view:
        page = view.open(f"{base}/notebooks/09_memory_and_accumulation.html")
        calculator = page.locator(".gpuformer-memcalc").first
        calculator.scroll_into_view_if_needed()
        result = calculator.locator(".gpuformer-memcalc-result")
        before = result.inner_text()
        shot(page, "09_calculator_before.png")
        model = calculator.locator("select").first
        options = model.locator("option").all_inner_texts()
        model.select_option(label=options[-1])
        assert _soon(page, lambda: result.inner_text() != before), \
            "the calculator's result did not change with the model"
        after = result.inner_text()
        assert options[-1].split(" (")[0] in after, f"the result does not name {options[-1]}"
        shot(page, "09_calculator_after.png")
        assert not view.errors, view.errors[:3]


def test_widgets_fit_a_phone_screen(site, browser):
    _, base = site
    with Page(browser, width=400, height=800) as view:
        for path, selector in (("notebooks/03_attention.html", ".jupyter-widgets.widget-hbox"),
                               ("notebooks/09_memory_and_accumulation.html", ".gpuformer-memcalc")):
            page = view.open(f"{base}/{path}")
            right = page.evaluate(f"() => Math.max(...[...document.querySelectorAll('{selector}')]"
                                  ".map(e => e.getBoundingClientRect().right))")
            assert right <= 400 + 1, f"{path}: a widget reaches {right:.0f} px, past the phone's 400 px"
            wide = page.evaluate("() => document.documentElement.scrollWidth")
            assert wide <= 400 + 1, f"{path}: the page scrolls sideways on a phone ({wide} px wide)"


BROKEN_WORDS = """(root) => {
  root.querySelectorAll('details').forEach(d => { d.open = true; });
  const broken = [], range = document.createRange();
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (node.parentElement.closest('style, script')) continue;
    // a word, or the part of one up to a hyphen, an en dash or an identifier's underscore (a line may end after any), or
    // one CJK character (Japanese and Chinese break between any two)
    const words = /[^\\s\\-\\u2013_\\u3000-\\u9fff\\uff00-\\uffef]+[-\\u2013_]?|[\\u3000-\\u9fff\\uff00-\\uffef]/g;
    let m;
    while ((m = words.exec(node.textContent))) {
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.bottom)));
      if (lines.size > 1) broken.push(m[0]);
    }
  }
  return broken;
}"""
"""The words of an element that a line break cuts in two (a word whose pieces sit on different lines), with its
folded notes opened first. A break after a hyphen or an identifier's underscore, or between two CJK characters,
is where a line may end."""


CROSSED_LABELS = """(block) => {
  const crossed = [];
  for (const strip of block.querySelectorAll('.gv-strip')) {
    const box = strip.getBoundingClientRect();
    const labels = [...strip.querySelectorAll('.gv-mark-label')].map(l => [l.textContent, l.getBoundingClientRect()]);
    labels.forEach(([t, r], i) => {
      if (r.bottom > box.bottom + 1 || r.left < box.left - 1 || r.right > box.right + 1) crossed.push(t + ' (outside its chart)');
      for (const [u, s] of labels.slice(i + 1))
        if (r.left < s.right && s.left < r.right && r.top < s.bottom && s.top < r.bottom) crossed.push(t + ' / ' + u);
    });
  }
  return crossed;
}"""
"""The labels of a view's dot charts that overlap another label or leave their chart's strip."""


@pytest.mark.parametrize("width", [390, 1280])
def test_gpu_views_break_no_word_and_fit_their_column(site, browser, width):
    """Every GPU view, and the appendix of GPU measurements, at a phone's and a desktop's width: no word broken
    inside, no chart label on another, nothing wider than the text column (on a phone each quantity becomes a
    card), and the GPUs whose results are committed shown on the pages."""
    from gpuformer_lib import gpu_results

    _, base = site
    devices = [run["device"]["name"] for run in (gpu_results.load_results() or {}).values()]
    problems, views = [], 0
    with Page(browser, width=width, height=900) as view:
        for path in [p for p in toc_pages() if p.startswith("notebooks/")] + ["book/gpu_measurements.html"]:
            page = view.open(f"{base}/{path}")
            column = page.evaluate("() => document.querySelector('article.bd-article').getBoundingClientRect()"
                                   ".right")
            blocks = page.locator(".gpuview-block, .gv-appendix-block")
            views += blocks.count()
            for i in range(blocks.count()):
                block = blocks.nth(i)
                broken = block.evaluate(BROKEN_WORDS)
                if broken:
                    problems.append(f"{path} view {i}: words broken inside at {width} px: {broken[:5]}")
                box = block.bounding_box()
                if box["x"] + box["width"] > column + 1:
                    problems.append(f"{path} view {i}: reaches {box['x'] + box['width']:.0f} px, past the column's "
                                    f"{column:.0f} px at {width} px")
                narrow = block.evaluate("(b) => [...b.querySelectorAll('caption')].filter(c => "
                                        "c.getBoundingClientRect().width < 0.8 * b.getBoundingClientRect().width)"
                                        ".length")
                if narrow:
                    problems.append(f"{path} view {i}: its caption is squeezed into a narrow column at {width} px")
                crossed = block.evaluate(CROSSED_LABELS)
                if crossed:
                    problems.append(f"{path} view {i}: chart labels on top of each other at {width} px: {crossed[:3]}")
                wide = block.evaluate("(b) => [...b.querySelectorAll('.gpuview-scroll')].filter(s => "
                                      "s.scrollWidth > s.clientWidth + 1).length")
                if wide:
                    problems.append(f"{path} view {i}: its table scrolls sideways at {width} px")
            if path.endswith(("02_gpu_programming.html", "05_encoder_decoder.html")):
                text = page.locator(".gpuview-block").first.inner_text()
                for device in devices if "05_" in path else []:
                    if device not in text:
                        problems.append(f"{path}: the committed {device} is not in chapter 5's view")
                page.locator(".gpuview-block").first.scroll_into_view_if_needed()
                shot(page, f"{path.split('/')[-1][:2]}_gpu_view_{width}px.png")
    assert views >= 18, f"only {views} GPU views found"
    assert not problems, "\n".join(problems)


DRAWN = """async () => {
  const found = [];
  for (const img of document.querySelectorAll('article img')) {
    if (!/\\.svg(\\?|$)/.test(img.currentSrc)) continue;
    const text = await (await fetch(img.currentSrc)).text();
    const sizes = [...text.matchAll(/<text [^>]*font-size="([\\d.]+)"/g)].map(m => parseFloat(m[1]));
    const box = img.getBoundingClientRect();
    found.push([img.currentSrc.split('/').pop(), img.naturalWidth, box.width, box.right, Math.min(...sizes)]);
  }
  return found;
}"""
"""Each drawn SVG figure of a page: its file, its own width, its shown width and right edge, its smallest font."""


@pytest.mark.parametrize("width", [390, 1280])
def test_drawings_are_on_their_pages_and_readable_at_both_widths(site, browser, width):
    """The drawn diagrams (gpuformer_lib.drawings) as shown: at least eight across the book, each inside the text
    column, its smallest text at least 9 CSS px at a phone's width as at a desktop's (shown width over the SVG's
    own width, times its smallest font size)."""
    _, base = site
    problems, seen = [], []
    with Page(browser, width=width, height=900) as view:
        for path in toc_pages():
            page = view.open(f"{base}/{path}")
            column = page.evaluate("() => document.querySelector('article.bd-article').getBoundingClientRect()"
                                   ".right")
            for name, natural, shown, right, smallest in page.evaluate(DRAWN):
                seen.append(name)
                px = smallest * shown / natural if natural else 0
                if px < 9:
                    problems.append(f"{path}: {name}'s smallest text is {px:.1f} px at {width} px (at least 9)")
                if right > column + 1:
                    problems.append(f"{path}: {name} reaches {right:.0f} px, past the column's {column:.0f} px")
    assert len(seen) >= 8, f"only {len(seen)} drawn SVG figures in the book: {seen}"
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ what a phone reader meets (issue: the book)

PHONE = 390

WIDE = """(column) => {
  const found = [];
  const scroller = (el) => {
    for (let box = el.parentElement; box && box.tagName !== 'ARTICLE'; box = box.parentElement) {
      const x = getComputedStyle(box).overflowX;
      if (x === 'auto' || x === 'scroll') return box;
    }
    return null;
  };
  for (const el of document.querySelectorAll('article table, article .cell_output pre, article .cell_output img, '
                                             + 'article mjx-container[display="true"]')) {
    if (el.closest('.gpuview-block, .gv-appendix-block')) continue;  // the GPU views have their own test
    const r = el.getBoundingClientRect();
    const scrolls = el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'visible';
    if (!r.width || (r.right <= column + 1 && !scrolls)) continue;  // inside the column, or scrolling in itself
    const box = scrolls ? el : scroller(el);
    const name = el.tagName.toLowerCase() + ' "' + el.innerText.trim().slice(0, 40) + '"';
    if (!box || box.getBoundingClientRect().right > column + 1) found.push(name + ' runs past the column');
    else if (!box.classList.contains('gpuformer-scrolls')) found.push(name + ' scrolls with no cue that it does');
  }
  for (const el of document.querySelectorAll('article .cell_output *')) {  // hidden, yet taking room
    const height = el.getBoundingClientRect().height;
    if (height > 1 && getComputedStyle(el).visibility === 'hidden'
        && getComputedStyle(el.parentElement).visibility !== 'hidden')
      found.push(el.className.split(' ').pop() + ' is hidden yet keeps ' + Math.round(height) + ' px of the page');
  }
  return found;
}"""
"""Each table, text output, figure and display equation that reaches past the text column: past it for good, or
scrolling inside a box that does not say so (the box's class ``gpuformer-scrolls``, set by gpuformer-book.js,
shows the cue); and each output hidden (a closed progress bar) that still takes room on the page."""


def _figure_reports() -> dict[str, dict]:
    """The report gpuformer_lib.figures stored with each PNG output of the notebooks, by the PNG's SHA-256: the
    book writes each PNG output to a file of its own."""
    import base64
    import hashlib

    from gpuformer_lib import figures
    from gpuformer_lib.tools.notebooks import notebook_paths, read_notebook

    reports = {}
    for path in notebook_paths():
        for cell in read_notebook(path).cells:
            for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
                if "image/png" in output.get("data", {}):
                    digest = hashlib.sha256(base64.b64decode(output["data"]["image/png"])).hexdigest()
                    reports[digest] = output.get("metadata", {}).get("image/png", {}).get(figures.METADATA_KEY)
    return reports


@pytest.mark.parametrize("width", [PHONE, 1280])
def test_tables_outputs_and_figures_fit_the_column_and_read(site, browser, width):
    """At a phone's width and a desktop's, on every page: the page never scrolls sideways; a table, text output or
    figure wider than the column scrolls inside a box that shows it does; no word in a table is broken inside;
    every figure's smallest text shows at 9 CSS px or more (its report from gpuformer_lib.figures, scaled by the
    width the page shows it at)."""
    import hashlib

    from gpuformer_lib import figures

    root, base = site
    reports = _figure_reports()
    problems, figures_seen = [], 0
    with Page(browser, width=width, height=900) as view:
        for path in toc_pages():
            page = view.open(f"{base}/{path}")
            column = page.evaluate("() => document.querySelector('article.bd-article').getBoundingClientRect()"
                                   ".right")
            wide = page.evaluate("() => document.documentElement.scrollWidth")
            if wide > width + 1:
                problems.append(f"{path}: the page scrolls sideways ({wide} px wide at {width} px)")
            problems += [f"{path}: {p} at {width} px" for p in page.evaluate(WIDE, column)]
            if width == PHONE:
                for i, table in enumerate(page.locator("article table").all()):
                    if table.evaluate("(t) => !!t.closest('.gpuview-block, .gv-appendix-block')"):
                        continue
                    broken = table.evaluate(BROKEN_WORDS)
                    if broken:
                        problems.append(f"{path}: table {i} breaks words inside at {width} px: {broken[:4]}")
            for src, natural, shown in page.evaluate(
                    "() => [...document.querySelectorAll('article .cell_output img')].filter(i => "
                    "/\\.png$/.test(i.getAttribute('src') || '')).map(i => [i.getAttribute('src'), i.naturalWidth, "
                    "i.getBoundingClientRect().width])"):
                figures_seen += 1
                file = (root / path).parent / src
                report = reports.get(hashlib.sha256(file.read_bytes()).hexdigest()) if file.exists() else None
                if report is None:
                    problems.append(f"{path}: figure {src} was not drawn through gpuformer_lib.figures")
                    continue
                px = report["min_text_px"] * shown / natural
                if px < figures.MIN_TEXT_PX:
                    problems.append(f"{path}: figure {src}'s smallest text shows at {px:.1f} px at {width} px")
    assert figures_seen >= 30, f"only {figures_seen} figures checked"
    assert not problems, "\n".join(problems)


PAGE_BYTES = 3_000_000
"""The most a page may load, in bytes, when it has no widget: a phone on a slow line still opens it."""
MATHJAX = "mathjax/tex-svg-full.js"


def test_pages_are_light(site, browser):
    """Every page loads at most 3 MB (everything it fetches, as decoded), pages with a widget aside; a page whose
    MathJax takes it over says so at its foot (gpuformer_book.py). The theme's icon script is cut to the icons
    the book uses."""
    root, base = site
    problems, weights = [], {}
    with Page(browser) as view:
        for path in toc_pages():
            page = view.open(f"{base}/{path}")
            entries = page.evaluate("() => [performance.getEntriesByType('navigation')[0], "
                                    "...performance.getEntriesByType('resource')].map(e => [e.name, "
                                    "e.decodedBodySize || 0])")
            total = sum(size for _, size in entries)
            weights[path] = total
            has_widget = page.locator(".jupyter-widgets, .widget-subarea").count() > 0
            math = [name for name, _ in entries if MATHJAX in name]
            if has_widget or total <= PAGE_BYTES:
                continue
            if math and total - sum(s for n, s in entries if MATHJAX in n) <= PAGE_BYTES and \
                    page.locator(".gpuformer-weight-note").count():
                continue
            problems.append(f"{path}: {total / 1e6:.1f} MB, over {PAGE_BYTES / 1e6:.0f} MB, and no widget or "
                            "note says why")
    icons = (root / "_static" / "scripts" / "fontawesome.js").stat().st_size
    assert icons < 300_000, f"the icon script is {icons / 1e6:.1f} MB: not cut to the icons the book uses"
    assert not problems, "\n".join(problems) + f"\nall: { {p: round(w / 1e6, 2) for p, w in weights.items()} }"


TEXTS_ON_THEIR_BACKGROUND = """(root) => {
  // every element of root with text of its own (an enabled control's too): its colour as drawn (brightened by
  // any CSS brightness() filter on it or above it, as the GPU views' kind names are in dark mode), and the
  // background it is drawn on (its own, or the nearest ancestor's that is not transparent)
  const found = [], backgrounds = new Map(), gains = new Map();
  const paint = (n) => {  // memoised: each element's answer is its parent's unless it paints its own
    if (!n) return 'rgb(255, 255, 255)';
    if (!backgrounds.has(n)) {
      const b = getComputedStyle(n).backgroundColor, v = b.match(/[\\d.]+/g);
      backgrounds.set(n, v && (v.length < 4 || parseFloat(v[3]) > 0.5) ? b : paint(n.parentElement));
    }
    return backgrounds.get(n);
  };
  const gain = (n) => {
    if (!n) return 1;
    if (!gains.has(n)) {
      const m = getComputedStyle(n).filter.match(/brightness\\(([\\d.]+)\\)/);
      gains.set(n, (m ? parseFloat(m[1]) : 1) * gain(n.parentElement));
    }
    return gains.get(n);
  };
  const drawn = (e) => {
    const colour = getComputedStyle(e).color, g = gain(e);
    if (g === 1 || !colour.startsWith('rgb')) return colour;
    const v = colour.match(/[\\d.]+/g).slice(0, 3).map(c => Math.min(255, parseFloat(c) * g));
    return `rgb(${v.join(', ')})`;
  };
  for (const e of [root, ...root.querySelectorAll('*')]) {
    const own = [...e.childNodes].some(c => c.nodeType === 3 && c.textContent.trim());
    const control = e.matches('select, output');
    if (!(own || control) || e.closest('option, script, style, :disabled, a.headerlink, mjx-container')
        || !e.getClientRects().length) continue;
    found.push([e.tagName + ' "' + e.textContent.trim().slice(0, 24) + '"', drawn(e), paint(e)]);
  }
  return found;
}"""
"""What a page's text is drawn in and on, for :func:`_contrast`. Left out: the text of disabled controls (WCAG
exempts inactive controls, and the calculator's unused rank count is shown inactive on purpose), the theme's
heading anchors (shown only on hover) and MathJax's output."""


def _luminance(css_colour: str) -> float:
    """Relative luminance (WCAG 2) of an ``rgb(...)``, ``rgba(...)`` or ``color(srgb ...)`` colour (what
    ``getComputedStyle`` gives for a ``color-mix``: channels from 0 to 1)."""
    import re as _re

    values = [float(v) for v in _re.findall(r"\d*\.?\d+(?:e-?\d+)?", css_colour.removeprefix("color(srgb"))[:3]]
    channels = values if css_colour.startswith("color(srgb") else [v / 255 for v in values]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _contrast(colour: str, background: str) -> float:
    """WCAG 2's contrast ratio of two colours: 1 (the same) to 21 (black on white); body text needs 4.5."""
    high, low = sorted((_luminance(colour), _luminance(background)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_contrast_ratio_reads_as_wcag_says():
    assert _contrast("rgb(0, 0, 0)", "rgb(255, 255, 255)") == pytest.approx(21)
    assert _contrast("rgb(206, 214, 221)", "rgb(206, 214, 221)") == pytest.approx(1)
    # the bug this guards: the page's light text on the theme's light output card in dark mode
    assert _contrast("rgb(206, 214, 221)", "rgba(206, 214, 221, 1)") < 4.5
    assert _contrast("rgb(206, 214, 221)", "rgb(18, 18, 18)") > 4.5
    assert _contrast("rgb(34, 40, 50)", "color(srgb 0.983529 0.984902 0.986274)") > 14


WIDGETS = {"notebooks/09_memory_and_accumulation.html": ".gpuformer-memcalc",
           "notebooks/03_attention.html": ".jupyter-widgets.widget-hbox"}
"""The pages with a widget, and the widget: their texts must be among those read."""


def test_every_text_reads_in_either_theme(site, browser):
    """Every text of every page, in each theme, against the background it is drawn on: a contrast of at least 4.5
    (WCAG's for body text). The theme puts HTML outputs on a light card in dark mode; the GPU views' muted text
    (contrast 1.7), the memory calculator's and the explorer's labels (1.0) sat on it unread while a check of the
    calculator's select alone passed."""
    _, base = site
    problems = []
    with Page(browser) as view:
        for path in toc_pages():
            page = view.open(f"{base}/{path}")
            # the theme changes colours with a transition: off, so each colour read is the theme's final one,
            # however slowly a busy machine draws
            page.add_style_tag(content="*, *::before, *::after { transition: none !important; }")
            for theme in ("dark", "light"):
                page.evaluate(f"() => {{ document.documentElement.dataset.theme = '{theme}'; }}")
                if path in WIDGETS:  # waits for the widget to be drawn, so the page's texts below include its own
                    widget = page.locator(WIDGETS[path]).first
                    found = widget.evaluate(TEXTS_ON_THEIR_BACKGROUND)
                    if len(found) < 3:
                        problems.append(f"{path}: only {len(found)} texts read in {WIDGETS[path]}")
                    widget.scroll_into_view_if_needed()
                    shot(page, f"{path.split('/')[-1][:2]}_{theme}.png")
                texts = page.locator("article.bd-article").first.evaluate(TEXTS_ON_THEIR_BACKGROUND)
                problems += [f"{path} ({theme}): {what} is {colour} on {background}: contrast "
                             f"{_contrast(colour, background):.1f}"
                             for what, colour, background in texts if _contrast(colour, background) < 4.5]
    assert not problems, f"{len(problems)} texts under a contrast of 4.5:\n" + "\n".join(problems[:30])


def test_search_over_a_file_url_says_to_serve_the_folder_and_logs_no_error(site, browser):
    root, _ = site
    with Page(browser) as view:
        page = view.open((root / "search.html").as_uri() + "?q=attention")
        page.wait_for_selector("#search-results ul.search li", timeout=15000)
        page.wait_for_timeout(500)
        assert page.locator(".gpuformer-file-search").count() == 1, "no note on why there are no excerpts"
        assert not view.errors, f"console errors over file://: {view.errors[:3]}"
