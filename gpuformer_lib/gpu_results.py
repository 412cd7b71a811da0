"""Committed GPU measurements on the page: reading the suite's result files and drawing a chapter's GPU view.

A chapter's GPU view (:mod:`gpuformer_lib.gpu_view`) holds the numbers its page computed (measured on the
device that ran it, predicted, published) and *links*: "this quantity is what suite item ``ch05.training_step``
stores at ``measurements.decoder_lm_step``". The numbers of a GPU come from the result files that
``python -m gpuformer_lib.gpu_suite`` writes under ``bench_results/gpu/<device>/`` and that are committed:
this module reads them whenever a view is drawn, so committing a run's files shows its device on every page
without re-running any chapter. The book's build draws every view again from the specification stored in the
page (:func:`redraw_views`, called by ``book/_ext/gpuformer_book.py``); in JupyterLab or Colab the view is drawn
when the cell runs.

The drawing is one row per quantity and one column per device: the page's own device, the T4, the H100,
each other GPU with a committed measurement, and other hardware. A cell holds that device's measured, predicted
and published numbers, with measured / predicted where both exist; how each number was obtained is one click
away, folded under the table; on a phone the rows become cards (CSS in ``book/_book_static``).

Only the standard library is imported here: the book is built without torch.

Leaves out: the rows' own construction and the predictors (``gpu_view``), running the suite (``gpu_suite``).
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from gpuformer_lib.published import figure_anchor, format_value

RESULTS_DIR = Path(__file__).resolve().parent.parent / "bench_results" / "gpu"
"""Where a checkout of the course keeps the committed result files (one folder per device)."""

APPENDIX_PAGE = "book/gpu_measurements"
PUBLISHED_PAGE = "book/published_figures"

KINDS = ("measured", "predicted", "published")
KIND_COLOUR = {"measured": "#1b7837", "predicted": "#2166ac", "published": "#762a83"}
"""One colour per kind, so a reader tells them apart at a glance (the word is always there too)."""

STYLE = """<style>
.gpuview-block{margin:1em 0;max-width:100%;overflow-wrap:normal;word-break:normal;hyphens:none}
.gpuview-scroll{max-width:100%;overflow-x:auto}
table.gpuview{font-size:.85em;border-collapse:collapse;width:100%;margin:0}
table.gpuview caption{caption-side:top;text-align:left;padding-bottom:.3em}
table.gpuview th,table.gpuview td{padding:4px 6px;vertical-align:top;text-align:left;border-bottom:1px solid rgba(128,128,128,.35)}
table.gpuview thead th{white-space:nowrap}
table.gpuview th.gv-quantity{font-weight:normal;min-width:8em}
.gv-entry{margin:0 0 3px}
.gv-kind{font-weight:600;font-size:.9em}
.gv-value{font-variant-numeric:tabular-nums}
.gv-meta{display:block;font-size:.85em;opacity:.75}
.gv-ratio{font-size:.9em;font-weight:600}
.gv-legend,.gv-status{font-size:.85em}
.gv-notes{font-size:.85em}
@media (max-width:640px){
table.gpuview thead{display:none}
table.gpuview caption{display:block;width:auto}
table.gpuview,table.gpuview tbody,table.gpuview tr,table.gpuview th,table.gpuview td{display:block;width:auto}
table.gpuview tr{border-top:2px solid rgba(128,128,128,.5);padding:4px 0}
table.gpuview th.gv-quantity{font-weight:600;border:none;min-width:0}
table.gpuview td{border:none;padding:2px 8px 2px 1em}
table.gpuview td.gv-empty{display:none}
table.gpuview td::before{content:attr(data-label);display:block;font-size:.8em;font-weight:600;opacity:.7}
table.gv-appendix thead{display:none}
table.gv-appendix,table.gv-appendix tbody,table.gv-appendix tr,table.gv-appendix th,table.gv-appendix td{display:block;width:auto}
table.gv-appendix tr{border-top:2px solid rgba(128,128,128,.5);padding:4px 0}
table.gv-appendix td{border:none;padding:1px 8px 1px 1em}
table.gv-appendix td:empty{display:none}
table.gv-appendix td::before{content:attr(data-label) ": ";font-size:.85em;font-weight:600;opacity:.7}
}
table.gv-appendix{font-size:.85em;border-collapse:collapse;width:100%}
table.gv-appendix th,table.gv-appendix td{padding:3px 8px;vertical-align:top;text-align:left;border-bottom:1px solid rgba(128,128,128,.35)}
.gv-chart{margin:.6em 0;font-size:.85em}
.gv-chart-line{margin:.3em 0 .6em}
.gv-strip{position:relative;height:2.5em;margin:0 .5em;background:linear-gradient(rgba(128,128,128,.6),rgba(128,128,128,.6)) 0 .75em/100% 1px no-repeat}
.gv-mark{position:absolute;top:.35em;width:.8em;height:.8em;margin-left:-.4em;border-radius:50%;box-sizing:border-box}
.gv-mark.gv-measured{background:#1b7837}
.gv-mark.gv-predicted{border:2px solid #2166ac;background:transparent}
.gv-mark.gv-published{background:#762a83;border-radius:0;transform:rotate(45deg)}
.gv-mark-label{position:absolute;top:1.3em;transform:translateX(-50%);white-space:nowrap;font-size:.85em;line-height:1.2}
.gv-mark-label.gv-left{transform:none}
.gv-mark-label.gv-right{transform:translateX(-100%)}
html[data-theme=dark] .gpuview-block .gv-kind,html[data-theme=dark] .gpuview-block .gv-legend b,html[data-theme=dark] .gv-mark{filter:brightness(1.9)}
</style>"""
"""The view's look, shipped with it so that JupyterLab and Colab show it as the book does: a table on a wide
screen; on a phone each quantity a card whose numbers each name their device; words never broken inside; the
kinds' colours brightened on the book's dark theme."""

RATIO_HINT = ("Predictions are the course's predictor's estimates (chapter 10, section 10.8), validated against "
              "published GPU runs in the appendix of GPU measurements: a measurement within that validated error of "
              "its prediction is agreement; a larger gap is the lesson.")

SPEC_ATTRIBUTE = "data-gpuview"
END_MARK = "<!-- /gpuview -->"
_BLOCK = re.compile(r'<div class="gpuview-block" ' + SPEC_ATTRIBUTE + r'="([^"]*)">.*?' + re.escape(END_MARK), re.S)

_FAMILY = re.compile(r"\b(T4|P100|V100|A100|A10G?|L4|L40S?|H100|GH200|H200|B200|MI300X?)\b", re.I)
MAIN_GPUS = ("T4", "H100")
"""The GPUs every chapter predicts for, first after the page's own device."""

ONE_DECIMAL_UNITS = ("(major.minor)",)
"""Units whose values always show one decimal: a compute capability 9.0 is '9.0', never '9'."""


# --------------------------------------------------------------------------- numbers as shown


def shown(value: float, unit: str) -> str:
    """The value as a view shows it: one decimal for :data:`ONE_DECIMAL_UNITS`, else three significant figures
    (a whole number stays whole: a published 15102 MBytes stays 15102, as its quote writes it)."""
    if unit.strip() in ONE_DECIMAL_UNITS:
        return f"{value:.1f}"
    if value == 0 or float(value).is_integer():
        return format_value(value)
    digits = 3 - int(math.floor(math.log10(abs(value)))) - 1
    return format_value(round(value, digits))


def family(device: str) -> str | None:
    """The GPU a device label names (``'NVIDIA H100 80GB HBM3'`` and ``'H100 SXM (course predictor)'`` are both
    ``'H100'``), or None for a CPU, 'any GPU' or an unnamed one."""
    match = _FAMILY.search(device)
    return match.group(1).upper() if match else None


# --------------------------------------------------------------------------- result files


class ResultFileError(ValueError):
    """A committed result file that cannot be read as the suite writes it."""


def load_results(root: Path | None = None) -> dict[str, dict] | None:
    """Every committed device's passing items: ``{folder: {"device": {...}, "items": {key: record}}}``, devices
    in name order; rehearsals (a CPU standing in for a GPU) and failed items are left out. None where ``root``
    does not exist (a library installed without the course's checkout)."""
    root = RESULTS_DIR if root is None else Path(root)
    if not root.is_dir():
        return None
    devices: dict[str, dict] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        items: dict[str, dict] = {}
        device: dict = {}
        for path in sorted(folder.glob("ch*.json")):
            try:
                data = json.loads(path.read_text())
                records = data["items"]
                device = data.get("device") or device
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ResultFileError(f"{path}: not a result file of the GPU suite ({exc})") from exc
            for key, record in records.items():
                if record.get("status") == "passed" and not record.get("rehearsal"):
                    items[key] = record
        if items and device.get("name") and not str(device["name"]).startswith("rehearsal-"):
            devices[folder.name] = {"device": device, "items": items, "skipped": _skipped(folder / "suite.json")}
    return devices


def _skipped(path: Path) -> list[tuple[str, str]]:
    """``(item, why)`` of the items the device's last suite run skipped (a 2-GPU item on one GPU, for one)."""
    try:
        return [(i["key"], i.get("why", "")) for i in json.loads(path.read_text()).get("items", [])
                if i.get("status") == "skipped"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def si(value: float, unit: str) -> str:
    """``value unit`` with an SI prefix for a rate, a size or a time (2.93e12 B/s is '2.93 TB/s', 6.49e-06 s is
    '6.49 µs'); other units as :func:`shown` writes them."""
    if unit == "s" and 0 < abs(value) < 1:
        scaled, unit = (value * 1e6, "µs") if abs(value) < 1e-3 else (value * 1e3, "ms")
        return f"{shown(scaled, unit)}\xa0{unit}"
    if unit in ("B", "FLOP") or unit.endswith("/s"):
        for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(value) >= factor:
                return f"{shown(value / factor, unit)}\xa0{prefix}{unit}"
    return f"{shown(value, unit)}\xa0{unit}".rstrip()


def lookup(record: Mapping[str, Any], path: str) -> float | None:
    """The number at a dotted ``path`` in an item's record (``values.NAME``, ``measurements.NAME``,
    ``comparisons.NAME.speedup``, ``comparisons.NAME.after``): a timing gives its median, a value its value."""
    node: Any = record
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    if isinstance(node, Mapping):
        node = node.get("median", node.get("value"))
    if isinstance(node, bool) or not isinstance(node, (int, float)) or not math.isfinite(node):
        return None
    return float(node)


def committed(results: Mapping[str, dict] | None, link: Mapping[str, Any]) -> list[dict]:
    """The committed measurements a view's link points at, one per device that has it, as entries of a view; and,
    where the link names the suite's own prediction (``predicted_path``), that prediction for the same device."""
    entries = []
    for folder, run in (results or {}).items():
        record = run["items"].get(link["item"])
        raw = None if record is None else lookup(record, link["path"])
        if raw is None:
            continue
        versions = record.get("versions", {})
        notes = "; ".join(str(n) for n in record.get("notes", []))
        common = {"quantity": link["quantity"], "unit": link["unit"], "committed": True, "folder": folder,
                  "date": str(record.get("date", ""))[:10], "torch": versions.get("torch", "?"),
                  "commit": str(record.get("commit", ""))[:7]}
        entries.append({
            **common, "kind": "measured", "device": run["device"]["name"],
            "value": raw * float(link.get("scale", 1.0)),
            "basis": (f"suite item {link['item']}, {link['path']}: {_how(record, link['path'])}; commit "
                      f"{common['commit']}" + (f"; the item's notes: {notes}" if notes else "")),
            "spread": _spread(record, link["path"]), "verdict": _verdict(record, link["path"])})
        predicted = link.get("predicted_path") and lookup(record, link["predicted_path"])
        if predicted:
            entries.append({
                **common, "kind": "predicted", "device": f"{run['device']['name']} (the suite's prediction)",
                "value": predicted * float(link.get("scale", 1.0)),
                "basis": (f"recorded by suite item {link['item']} beside its measurement, "
                          f"{link['predicted_path']}: {_how(record, link['predicted_path'])}")})
    return entries


def _timed_source(record: Mapping[str, Any], path: str) -> tuple[str, Mapping[str, Any]] | None:
    """The timing a number comes from: its own (``measurements.X``, ``comparisons.X...``) or, for a value derived
    from an item's one timed comparison and nothing else (a case study's speedup per real token), that one."""
    parts = path.split(".")
    if parts[0] in ("measurements", "comparisons") and len(parts) > 1:
        node = record.get(parts[0], {}).get(parts[1])
        return (parts[0], node) if isinstance(node, Mapping) else None
    comparisons = record.get("comparisons", {})
    if parts[0] == "values" and len(comparisons) == 1 and not record.get("measurements"):
        return "comparisons", next(iter(comparisons.values()))
    return None


def _verdict(record: Mapping[str, Any], path: str) -> str | None:
    """A comparison's verdict where the timing could not tell its two sides apart (said beside the number)."""
    source = _timed_source(record, path)
    if source is None or source[0] != "comparisons":
        return None
    verdict = str(source[1].get("verdict", ""))
    return verdict if verdict.startswith("no difference") else None


def _how(record: Mapping[str, Any], path: str) -> str:
    parts = path.split(".")
    node: Any = record
    for part in parts[:2]:
        node = node.get(part, {}) if isinstance(node, Mapping) else {}
    if isinstance(node, Mapping) and node.get("how"):
        return str(node["how"])
    if parts[0] == "measurements" and isinstance(node, Mapping):
        return f"median of {node.get('n', '?')} timed repeats, spread {_share(node.get('spread'))}"
    if parts[0] == "comparisons" and isinstance(node, Mapping):
        before, after = node.get("before", {}), node.get("after", {})
        spreads = (f"spreads {_share(before.get('spread'))} and {_share(after.get('spread'))}, verdict "
                   f"'{node.get('verdict', '?')}'")
        if parts[-1] == "speedup":
            return f"median of '{before.get('label', 'before')}' / median of '{after.get('label', 'after')}', {spreads}"
        side = node.get(parts[-1], {})
        return f"median of '{side.get('label', parts[-1])}' ({spreads})"
    return "as recorded"


NOISY = 0.25
"""A committed timing whose repeats spread wider than this (max over min, minus 1) says so beside its number."""


def _spread(record: Mapping[str, Any], path: str) -> float | None:
    """The widest spread of the timings a number comes from (a comparison's two sides), or None."""
    source = _timed_source(record, path)
    if source is None:
        return None
    kind, node = source
    sides = [node] if kind == "measurements" else [node.get("before", {}), node.get("after", {})]
    spreads = [s.get("spread") for s in sides if isinstance(s, Mapping) and isinstance(s.get("spread"), (int, float))]
    return max(spreads) if spreads else None


def _share(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, (int, float)) and math.isfinite(value) else "not recorded"


# --------------------------------------------------------------------------- the view


def view_id(spec: Mapping[str, Any]) -> str:
    digest = hashlib.sha1(spec["title"].encode()).hexdigest()[:8]
    return "gv-" + (re.sub(r"[^a-z0-9]+", "-", spec["title"].lower()).strip("-")[:40] or "view") + "-" + digest


def _columns(entries: Sequence[dict]) -> list[tuple[str, str]]:
    """``(key, heading)`` of the view's columns: the page's own device, the T4 and the H100, every other GPU
    with a committed measurement, then other hardware."""
    keys = []
    if any(e["kind"] == "measured" and not e.get("committed") for e in entries):
        keys.append(("here", "this page"))
    families = {family(e["device"]) for e in entries}
    for gpu in MAIN_GPUS:
        if gpu in families:
            keys.append((gpu, gpu))
    for e in entries:
        f = family(e["device"])
        name = e["device"].removesuffix(" (the suite's prediction)")
        if e.get("committed") and f not in MAIN_GPUS and (f or name) not in {k for k, _ in keys}:
            keys.append((f or name, f or name))
    taken = {k for k, _ in keys}
    if any(_column_of(e, taken) == "other" for e in entries):
        keys.append(("other", "other hardware"))
    return keys


def _column_of(entry: Mapping[str, Any], taken: set[str]) -> str:
    if entry["kind"] == "measured" and not entry.get("committed"):
        return "here"
    f = family(entry["device"])
    if f in taken:
        return f
    if entry.get("committed"):
        return entry["device"].removesuffix(" (the suite's prediction)")
    return "other"


def entries_of(spec: Mapping[str, Any], results: Mapping[str, dict] | None) -> list[dict]:
    """The view's own rows and the committed measurements its links point at; a prediction the suite recorded
    is shown only for a GPU the page makes no prediction of its own for (the two come from the same model)."""
    entries = [dict(row) for row in spec["rows"]]
    for link in spec.get("links", []):
        page_predicted = {family(r["device"]) for r in spec["rows"]
                          if r["quantity"] == link["quantity"] and r["kind"] == "predicted"}
        entries += [e for e in committed(results, link)
                    if e["kind"] == "measured" or family(e["device"]) not in page_predicted]
    return entries


def render_view(spec: Mapping[str, Any], results: Mapping[str, dict] | None, *, book: bool = False) -> str:
    """The view as HTML: the block a page shows, with its specification kept in it so that the book's build
    can draw it again from newer result files (:func:`redraw_views`)."""
    vid = view_id(spec)
    esc = html.escape
    entries = entries_of(spec, results)
    columns = _columns(entries)
    taken = {k for k, _ in columns}
    quantities: list[str] = []
    for e in entries:
        if e["quantity"] not in quantities:
            quantities.append(e["quantity"])
    notes: list[str] = []

    def note(text: str, url: str = "") -> str:
        body = esc(text)
        if url:
            body += f' (<a href="{esc(url)}">source</a>)'
        notes.append(body)
        n = len(notes)
        return f'<sup class="gv-ref"><a href="#{vid}-n{n}" title="{esc(text)}">{n}</a></sup>'

    def entry_html(e: dict, column: str) -> str:
        # the number keeps its unit's first word on its line; a unit written as a phrase ('x (at least) peak-memory
        # reduction', as its source writes it) wraps after that
        first, _, rest = e["unit"].partition(" ")
        value = f"{esc(shown(e['value'], e['unit']))}&nbsp;{esc(first)}" + (f" {esc(rest)}" if rest else "")
        if e["kind"] == "published" and e.get("key"):
            href = (f"../{PUBLISHED_PAGE}.html#{figure_anchor(e['key'])}" if book else e.get("url", ""))
            value = f'<a href="{esc(href)}">{value}</a>' if href else value
        meta = ""
        if e.get("committed"):
            noisy = f", noisy: spread {e['spread']:.0%}" if (e.get("spread") or 0) > NOISY else ""
            tie = f", {e['verdict']}" if e.get("verdict") else ""
            if e["kind"] == "predicted":
                meta = '<span class="gv-meta">the suite\'s prediction, same model</span>'
            else:
                meta = (f'<span class="gv-meta">{esc(e["device"])}, {esc(e["date"])}, torch {esc(e["torch"])}'
                        f"{esc(noisy + tie)}</span>")
        elif column == "other" or (column not in ("here",) and e["kind"] == "published"):
            meta = f'<span class="gv-meta">{esc(e["device"])}</span>'
        elif e["kind"] == "predicted" and "(" in e["device"]:
            meta = f'<span class="gv-meta">{esc(e["device"][e["device"].index("(") + 1:].rstrip(")"))}</span>'
        ref = note(f"{e['kind']}, {e['device']}: {e['basis']}", e.get("url", "") if e["kind"] == "published" else "")
        return (f'<div class="gv-entry gpuview-{e["kind"]}"><span class="gv-kind" style="color:'
                f'{KIND_COLOUR[e["kind"]]}">{e["kind"]}</span> <span class="gv-value">{value}</span>{ref}{meta}</div>')

    body = []
    for q in quantities:
        row = [e for e in entries if e["quantity"] == q]
        cells = [f'<th scope="row" class="gv-quantity">{esc(q)}</th>']
        for key, heading in columns:
            here = sorted((e for e in row if _column_of(e, taken) == key), key=lambda e: KINDS.index(e["kind"]))
            inner = "".join(entry_html(e, key) for e in here)
            measured = [e for e in here if e.get("committed") and e["kind"] == "measured"]
            predicted = [e for e in here if e["kind"] == "predicted" and e["unit"] == (measured[0]["unit"] if measured
                                                                                        else None)]
            if len(predicted) == 1:
                for m in measured:
                    if predicted[0]["value"] > 0:
                        ratio = m["value"] / predicted[0]["value"]
                        inner += (f'<div class="gv-ratio" title="{esc(RATIO_HINT)}">measured / predicted: '
                                  f'{esc(shown(ratio, "x"))}'
                                  + (f' ({esc(family(m["device"]) or m["device"])})' if len(measured) > 1 else "")
                                  + "</div>")
            label = f' data-label="{esc(heading)}"'
            cells.append(f'<td{label} class="{"gv-empty" if not here else "gv-cell"}">{inner}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")

    head = "".join(f'<th scope="col">{esc(h)}</th>' for _, h in columns)
    here_label = spec.get("here", "")
    status = _status(spec, results, entries, book=book)
    caption = (f'<caption><b>{esc(spec["title"])}</b><br><span class="gv-legend">'
               + (f"<b>this page</b>: {esc(here_label)}. " if any(k == "here" for k, _ in columns) else "")
               + '<b style="color:{m}">measured</b> on a named device; <b style="color:{p}">predicted</b> by the '
               "course's predictor (for a T4 and an H100 SXM: the NVIDIA H100 80GB HBM3 is an H100 SXM); <b style=\"color:{u}\">published</b> in a cited source. " + esc(RATIO_HINT)
               + "</span></caption>").format(
        m=KIND_COLOUR["measured"], p=KIND_COLOUR["predicted"], u=KIND_COLOUR["published"])
    chart = _chart(quantities, entries, taken)
    notes_html = ("<details class='gv-notes'><summary>How each number was obtained</summary><ol>"
                  + "".join(f'<li id="{vid}-n{i}">{n}</li>' for i, n in enumerate(notes, 1)) + "</ol></details>")
    spec_text = esc(json.dumps(spec, sort_keys=True, separators=(",", ":")), quote=True)
    return (f'<div class="gpuview-block" {SPEC_ATTRIBUTE}="{spec_text}">{STYLE}'
            f'<div class="gpuview-scroll"><table class="gpuview" id="{vid}">{caption}'
            f'<thead><tr><th scope="col">quantity</th>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
            f'<p class="gv-status">{status}</p>{chart}{notes_html}</div>{END_MARK}')


def _status(spec: Mapping[str, Any], results: Mapping[str, dict] | None, entries: Sequence[dict], *,
            book: bool) -> str:
    items = sorted({link["item"] for link in spec.get("links", [])})
    if not items:
        return "No item of the GPU suite measures these quantities yet."
    named = ", ".join(f"<code>{html.escape(i)}</code>" for i in items)
    appendix = (f'<a href="../{APPENDIX_PAGE}.html">the appendix of GPU measurements</a>' if book
                else "the book's appendix of GPU measurements")
    if results is None:
        return (f"GPU measurements of these quantities (suite items {named}) are read from the course's committed "
                f"result files, which this copy of the library does not have: the book shows them, and "
                f"{appendix} lists every device.")
    devices = sorted({e["device"] for e in entries if e.get("committed") and e["kind"] == "measured"})
    if not devices:
        return (f"No GPU measurement committed yet for this view (suite items {named}): "
                "<code>python -m gpuformer_lib.gpu_suite</code> on a GPU writes one, and committing its files "
                "shows that GPU here.")
    return (f"Measured on GPUs: {html.escape(', '.join(devices))}, from the committed results of suite items "
            f"{named}; every item on every device is in {appendix}.")


def _chart(quantities: Sequence[str], entries: Sequence[dict], taken: set[str]) -> str:
    """A dot chart, one line per quantity that has a committed GPU measurement and a number of another kind or
    from this page in the same unit: each number a mark on a log axis spanning at least a factor of 4 around that
    line's numbers (filled: measured, ring: predicted, diamond: published), its device written under it."""
    lines = []
    for q in quantities:
        row = [e for e in entries if e["quantity"] == q]
        gpu = [e for e in row if e.get("committed") and e["kind"] == "measured"]
        if not gpu:
            continue
        same = [e for e in row if e["unit"] == gpu[0]["unit"] and e["value"] > 0]
        if not any(not (e.get("committed") and e["kind"] == "measured") for e in same):
            continue  # GPU measurements alone: the table compares them better
        lo, hi = min(e["value"] for e in same), max(e["value"] for e in same)
        # the axis spans at least a factor of 4, so that 54.1 and 54.3 do not land at its two ends
        centre = math.log10(lo * hi) / 2
        span = max(math.log10(hi / lo), math.log10(4.0))
        lo_axis = centre - 0.58 * span
        width = span * 1.16
        lo, hi = 10 ** lo_axis, 10 ** (lo_axis + width)
        marks, labels = [], []
        for e in sorted(same, key=lambda e: e["value"]):
            x = 100 * (math.log10(e["value"]) - lo_axis) / width
            col = _column_of(e, taken)
            who = "this page" if col == "here" else (family(e["device"]) or e["device"])
            who += {"measured": "", "predicted": " pred.", "published": " pub."}[e["kind"]] if col != "here" else ""
            marks.append(f'<span class="gv-mark gv-{e["kind"]}" style="left:{x:.1f}%" '
                         f'title="{html.escape(e["kind"])}, {html.escape(e["device"])}: '
                         f'{html.escape(shown(e["value"], e["unit"]))} {html.escape(e["unit"])}"></span>')
            labels.append((x, who))
        rows = label_rows(labels)
        for (x, who), r in zip(labels, rows):
            marks.append(f'<span class="gv-mark-label{_edge(x)}" style="left:{x:.1f}%;top:{1.3 + 1.3 * r:.1f}em">'
                         f'{html.escape(who)}</span>')
        lines.append(f'<div class="gv-chart-line"><div class="gv-chart-title">{html.escape(q)} '
                     f'({html.escape(gpu[0]["unit"])}, log scale from {html.escape(shown(lo, gpu[0]["unit"]))} '
                     f'to {html.escape(shown(hi, gpu[0]["unit"]))})</div><div class="gv-strip" '
                     f'style="height:{2.6 + 1.3 * max(rows):.1f}em">{"".join(marks)}</div></div>')
    if not lines:
        return ""
    return ('<div class="gv-chart"><div class="gv-chart-legend">&#9679; measured &#9675; predicted &#9670; '
            "published</div>" + "".join(lines) + "</div>")


LABEL_CHAR_PERCENT = 100 * 7.0 / 340
"""A chart label's width per character, in percent of the strip: about 7 CSS px a character (the labels' 0.72 of
the body font, with room to spare) over the narrowest strip the book draws (about 340 px in a phone's 358 px
column). Wider screens only make the labels narrower in percent, so labels laid out for the phone never touch."""


def label_rows(labels: Sequence[tuple[float, str]], gap: float = 2.0) -> list[int]:
    """The line under the strip each chart label goes on (0 the first), given each label's mark position ``x``
    (percent of the strip, in increasing order) and text: a label takes the first line on which it keeps ``gap``
    percent clear of the last label placed there, where it starts, ends or is centred as :func:`_edge` aligns
    it."""
    ends: list[float] = []
    rows = []
    for x, text in labels:
        start, end = label_extent(x, text)
        row = next((i for i, last in enumerate(ends) if start >= last + gap), len(ends))
        if row == len(ends):
            ends.append(end)
        else:
            ends[row] = end
        rows.append(row)
    return rows


def label_extent(x: float, text: str) -> tuple[float, float]:
    """Where a chart label of ``text`` at mark ``x`` starts and ends on the narrowest strip, in percent: centred on
    its mark, or starting or ending there near either end (:func:`_edge`)."""
    w = LABEL_CHAR_PERCENT * len(text)
    edge = _edge(x)
    start = x if edge == " gv-left" else (x - w if edge == " gv-right" else x - w / 2)
    return start, start + w


def _edge(x: float) -> str:
    """A label near either end of the strip is aligned to that end, so it never runs past the column."""
    return " gv-left" if x < 15 else (" gv-right" if x > 85 else "")


# --------------------------------------------------------------------------- the book's build


def specs_in(text: str) -> list[dict]:
    """The view specifications stored in a page's HTML (or a notebook's JSON text, once decoded)."""
    return [json.loads(html.unescape(m.group(1))) for m in _BLOCK.finditer(text)]


def redraw_views(page: str, results: Mapping[str, dict] | None) -> str:
    """``page`` with every GPU view drawn again from its stored specification and ``results``: what the book's
    build does, so that the committed result files, not those present when the notebook ran, are shown."""
    return _BLOCK.sub(lambda m: render_view(json.loads(html.unescape(m.group(1))), results, book=True), page)


def notebook_specs(notebooks: Iterable[Path]) -> list[tuple[str, dict]]:
    """``(notebook stem, spec)`` of every GPU view stored in the notebooks' outputs."""
    found = []
    for path in notebooks:
        for cell in json.loads(Path(path).read_text()).get("cells", []):
            for output in cell.get("outputs", []):
                text = "".join(output.get("data", {}).get("text/html", ""))
                found += [(Path(path).stem, spec) for spec in specs_in(text)]
    return found


def appendix_html(results: Mapping[str, dict] | None, specs: Sequence[tuple[str, dict]]) -> str:
    """The appendix: what each committed device measured, against the prediction beside it on a page, then every
    suite item on every device with every number it recorded."""
    esc = html.escape
    if not results:
        return "<p class='gv-status'>No GPU measurement has been committed yet.</p>"
    out = ["<h2>Measured against predicted</h2>",
           "<p>Every quantity a chapter's GPU view links to a suite item, on every committed device, with the "
           "prediction for the same GPU: the page's own (the course's predictor, for a T4 and an H100 SXM; the "
           "NVIDIA H100 80GB HBM3 is an H100 SXM), else the one the suite recorded beside its measurement where it "
           "records one. " + esc(RATIO_HINT) + "</p>",
           STYLE, '<div class="gv-appendix-block"><div class="gpuview-scroll"><table class="gv-appendix"><thead><tr>'
           "<th>chapter</th><th>quantity</th><th>device</th><th>measured</th><th>predicted</th>"
           "<th>measured / predicted</th></tr></thead><tbody>"]
    for stem, spec in specs:
        for link in spec.get("links", []):
            preds = [r for r in spec["rows"] if r["quantity"] == link["quantity"] and r["kind"] == "predicted"
                     and r["unit"] == link["unit"]]
            found = committed(results, link)
            for m in (e for e in found if e["kind"] == "measured"):
                p = [r for r in preds if family(r["device"]) == family(m["device"])] or [
                    e for e in found if e["kind"] == "predicted" and e["folder"] == m["folder"]]
                pred = shown(p[0]["value"], p[0]["unit"]) + " " + p[0]["unit"] if len(p) == 1 else "none on the page"
                ratio = shown(m["value"] / p[0]["value"], "x") if len(p) == 1 and p[0]["value"] > 0 else ""
                out.append(f'<tr><td data-label="chapter"><a href="../notebooks/{esc(stem)}.html">{esc(stem[:2])}</a>'
                           f'</td><td data-label="quantity">{esc(link["quantity"])}</td><td data-label="device">'
                           f'{esc(m["device"])}</td><td data-label="measured">{esc(shown(m["value"], m["unit"]))}'
                           f'&nbsp;{esc(m["unit"])}</td><td data-label="predicted">{esc(pred)}</td>'
                           f'<td data-label="measured / predicted">{esc(ratio)}</td></tr>')
    out.append("</tbody></table></div></div>")
    out.append("<h2>Every item on every device</h2>")
    folders = list(results)
    heads = "".join(f"<th>{esc(results[f]['device']['name'])}</th>" for f in folders)
    out.append("<ul>" + "".join(
        f"<li><b>{esc(results[f]['device']['name'])}</b>: {len(results[f]['items'])} items passed; "
        f"{_versions(results[f])}; files in <code>bench_results/gpu/{esc(f)}/</code>"
        + "".join(f"; skipped: <code>{esc(k)}</code> ({esc(why)})" for k, why in results[f].get("skipped", []))
        + "</li>" for f in folders) + "</ul>")
    keys = sorted({k for f in folders for k in results[f]["items"]}, key=lambda k: (k[:4], k))
    for key in keys:
        records = {f: results[f]["items"].get(key) for f in folders}
        first = next(r for r in records.values() if r)
        runs = "; ".join(f"{esc(results[f]['device']['name'])}: {esc(str(r.get('date', ''))[:10])}, commit "
                         f"{esc(str(r.get('commit', ''))[:7])}" for f, r in records.items() if r)
        out.append(f"<h3>{esc(key)}</h3><p>{esc(first.get('title', ''))} ({runs})</p>")
        names = sorted({(section, name) for r in records.values() if r
                        for section in ("values", "measurements", "comparisons") for name in r.get(section, {})})
        rows = []
        for section, name in names:
            path = f"{section}.{name}" + (".speedup" if section == "comparisons" else "")
            unit = "x" if section == "comparisons" else ("s" if section == "measurements" else "")
            cells = []
            for f in folders:
                r = records[f]
                value = None if r is None else lookup(r, path)
                if value is not None and section == "values":
                    unit = r["values"][name].get("unit", "")
                label = esc(results[f]["device"]["name"])
                cells.append(f'<td data-label="{label}"></td>' if value is None else
                             f'<td data-label="{label}">{esc(si(value, unit))}</td>')
            label = {"values": "", "measurements": " (median)", "comparisons": " (speedup)"}[section]
            # a long recorded name may end a line after an underscore, as after a hyphen
            shown_name = esc(name).replace("_", "_<wbr>")
            rows.append(f"<tr><th scope='row'><code>{shown_name}</code>{label}</th>{''.join(cells)}</tr>")
        out.append(f'<div class="gv-appendix-block"><div class="gpuview-scroll"><table class="gv-appendix"><thead>'
                   f"<tr><th>recorded</th>{heads}</tr></thead><tbody>{''.join(rows)}</tbody></table></div></div>")
    return "\n".join(out)


VALIDATION_FILE = RESULTS_DIR.parent / "predictor-validation.json"
"""The predictor's validation table, as ``python -m gpuformer_lib.predict validate --write`` commits it."""


def load_validation(path: Path | None = None) -> dict | None:
    """The committed validation record of the course's predictor (``gpuformer_lib.predict``), or None."""
    path = VALIDATION_FILE if path is None else Path(path)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        record["rows"], record["summary"]["all"]["line"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ResultFileError(f"{path}: not the predictor's validation record ({exc})") from exc
    return record


def validation_html(record: Mapping[str, Any] | None) -> str:
    """The appendix's account of the predictor: its summary, every published case against its prediction (each
    linked to its registry entry), the course's own GPU runs, and the constants, each stated once."""
    esc = html.escape
    if not record:
        return "<p class='gv-status'>The predictor's validation has not been committed yet.</p>"
    s = record["summary"]
    held, every = s["held_out"], s["all"]

    def factor(log_ratio: float) -> str:
        return f"{math.exp(log_ratio):.2f}x"

    out = [f"<p><b>Held out ({held['count']} cases)</b>: a prediction misses its measurement by a factor of "
           f"{factor(held['median_abs_log_ratio'])} at the median and {factor(held['worst_abs_log_ratio'])} at "
           f"worst. <b>All {every['count']} published cases</b>: {factor(every['median_abs_log_ratio'])} at the "
           f"median, {factor(every['worst_abs_log_ratio'])} at worst.</p>", STYLE]

    def table(rows: Sequence[Mapping[str, Any]], linked: bool) -> str:
        body = []
        for r in rows:
            name = esc(r["key"]) + ("" if r["held_out"] else " *")
            if linked:
                name = (f'<a href="{PUBLISHED_PAGE.split("/")[-1]}.html#{figure_anchor(r["key"])}">{name}</a>')
            why = f"<details><summary>why</summary>{esc(r['explanation'])}</details>" if r["explanation"] else ""
            body.append(f'<tr><th scope="row" data-label="case">{name}{why}</th><td data-label="GPU">{esc(r["gpu"])}'
                        f'</td><td data-label="run as">{esc(r["execution"])}</td><td data-label="measured">'
                        f'{esc(si(r["measured_s"], "s"))}</td><td data-label="predicted">{esc(si(r["predicted_s"], "s"))}'
                        f'</td><td data-label="predicted / measured">{r["ratio"]:.2f}</td><td data-label="set by">'
                        f'{esc(r["bound"])}</td></tr>')
        return ('<div class="gv-appendix-block"><div class="gpuview-scroll"><table class="gv-appendix"><thead><tr>'
                "<th>case</th><th>GPU</th><th>run as</th><th>measured</th><th>predicted</th>"
                "<th>predicted / measured</th><th>set by</th></tr></thead><tbody>" + "".join(body)
                + "</tbody></table></div></div>")

    out.append(table(record["rows"], linked=True))
    out.append("<p>* looked at while the predictor's byte and kernel rules were written; the others are held out. "
               "Times are per step on one GPU (a throughput is turned into the time of the step that produced it); "
               "a ratio below 1 is a prediction too fast.</p>")
    if record.get("course_rows"):
        out.append("<h3>The course's own GPU runs</h3><p>Chapter 10's profiled step and the speed ladder's bf16 rungs "
                   "on every committed GPU (not held out: the eager launch constant is measured on these machines). "
                   + esc(s["course"]["line"].replace("all: ", "")) + "</p>")
        out.append(table(record["course_rows"], linked=False))
    out.append("<h3>The constants, each stated once</h3><ul>" + "".join(
        f"<li>{esc(name)}: <b>{esc(value)}</b> ({esc(source)})</li>" for name, value, source in record["constants"])
        + "</ul>")
    return "\n".join(out)


def _versions(run: Mapping[str, Any]) -> str:
    """The device's size and the software its items ran on (the first item's; the suite runs them together)."""
    device = run["device"]
    dates = sorted({str(r.get("date", ""))[:10] for r in run["items"].values()})
    v = next(iter(run["items"].values())).get("versions", {})
    return html.escape(f"{device.get('sms', '?')} SMs, {device.get('memory_gib', '?')} GiB; measured "
                       f"{' to '.join(dict.fromkeys([dates[0], dates[-1]]))} with torch {v.get('torch', '?')}, "
                       f"CUDA {v.get('cuda', '?')}, driver {v.get('driver', '?')}")
