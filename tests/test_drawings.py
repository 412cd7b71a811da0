"""The drawn diagrams (gpuformer_lib.drawings): each reads on a phone (its smallest text at least 9 CSS px where
it is shown 340 px wide, a figure's width on a 390 px phone), no label runs out of its box or over another, every
drawing is shown on a page, and the course map follows the table of contents."""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from gpuformer_lib import drawings
from gpuformer_lib.tools.notebooks import REPO_ROOT, notebook_paths
from test_intro import toc_chapters

NAMES = sorted(drawings.DRAWINGS)


def test_the_book_has_at_least_eight_drawings():
    assert len(drawings.DRAWINGS) >= 8


@pytest.mark.parametrize("name", NAMES)
def test_each_drawing_reads_on_a_phone_and_is_valid_svg(name):
    d = drawings.DRAWINGS[name]()
    assert d.problems() == []
    assert d.width <= drawings.WIDTH and d.min_text_px() >= drawings.PHONE_MIN_PX
    root = ET.fromstring(d.svg())
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg" and root.find(f"{ns}title").text.strip()
    sizes = [float(t.get("font-size")) for t in root.iter(f"{ns}text")]
    assert sizes and min(sizes) * min(1, 340 / float(root.get("width"))) >= 9  # a figure on a phone: 340 px
    assert root.find(f"{ns}rect").get("fill") == "#ffffff"  # its own light card, for a dark page too


def test_a_drawing_that_breaks_a_rule_is_refused():
    d = drawings.Drawing("bad", 540, 200, "bad")
    d.box(200, 10, 60, 30, "a label too long for its box")
    d.text(100, 100, "two labels")
    d.text(110, 104, "on top of each other")
    d.text(500, 150, "past the right edge of the card")
    d.labels.append(drawings.Label(20, 180, "tiny", 10))
    found = " | ".join(d.problems())
    for words in ("does not fit its box", "overlaps", "runs off the drawing", "under 15", "px on a phone"):
        assert words in found, (words, found)
    with pytest.raises(ValueError, match="drawing 'bad'"):
        d.svg()
    with pytest.raises(ValueError, match="at most 540"):
        drawings.Drawing("wide", 800, 100, "too wide")


def test_math_markup_sets_super_and_subscripts_smaller_and_escapes_text():
    d = drawings.Drawing("m", 540, 60, "m")
    d.text(10, 30, "e^{m − m′} < a_{k} & b")
    svg = d.svg()
    small = f"{0.75 * drawings.MIN_FONT:g}"
    assert f'<tspan baseline-shift="super" font-size="{small}">m − m′</tspan>' in svg
    assert f'<tspan baseline-shift="sub" font-size="{small}">k</tspan>' in svg and "&lt; a" in svg and "&amp; b" in svg
    assert drawings.text_width("a^{bc}", 20) == pytest.approx((1 + 2 * 0.75) * 0.6 * 20)


def test_the_course_map_follows_the_table_of_contents():
    toc = toc_chapters()
    by_part: dict[str, list[str]] = {}
    for caption, path in toc:
        by_part.setdefault(caption, []).append(re.match(r"notebooks/(\d+)_", path).group(1).lstrip("0") or "0")
    mapped = [[number for number, _ in chapters] for _, chapters in drawings.COURSE_PARTS]
    assert mapped == list(by_part.values()), "the map's parts and chapters must follow _toc.yml"
    for (title, _), caption in zip(drawings.COURSE_PARTS, by_part):
        # the map abbreviates "Part I: the Transformer from scratch" as "I · The Transformer from scratch"
        assert re.sub(r"^Part ([IVX]+): (\w)", lambda m: f"{m.group(1)} · {m.group(2).upper()}", caption) == title


def test_every_drawing_is_on_a_page():
    shown = set()
    for path in notebook_paths():
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code":
                shown |= set(re.findall(r"drawings\.(\w+)\(\)", source))
                if "drawings." in source:
                    assert "remove-input" in cell["metadata"].get("tags", []), f"{path.name}: show the drawing only"
                    assert any("image/svg+xml" in o.get("data", {}) for o in cell.get("outputs", [])), path.name
    for name, relative in drawings.BOOK_FILES.items():
        assert relative.removeprefix("book/") in (REPO_ROOT / "book" / "intro.md").read_text(encoding="utf-8")
        shown.add(name)
    assert shown == set(drawings.DRAWINGS)


def test_the_book_files_are_current():
    assert drawings.main(["--check"]) == 0, "run: python -m gpuformer_lib.drawings"
