"""Chapter 9's memory calculator computes in the page: its JavaScript port (gpuformer_lib/js/memory_calculator.js)
against the Python (memory.training_memory, memory.predicted_peak, viz.memory_report_html) on a grid of every
control value, row by row in bytes and the result's HTML character by character; a mutated copy of the script,
which the comparison must catch; and the HTML that viz.memory_calculator sends (unique ids, the first result
computed in Python). The JavaScript runs in Node (skipped without it); one test drives the page in Debian's
Chromium through Playwright where both are installed (never a downloaded browser)."""

import dataclasses
import itertools
import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from browser import launch, playwright_or_skip
from gpuformer_lib.memory import predicted_peak, training_memory
from gpuformer_lib.model import TransformerConfig, gpt2_config
from gpuformer_lib.viz import (CALCULATOR_MAX_MICRO_BATCH, CALCULATOR_OPTIMIZERS, CALCULATOR_RANKS,
                               CALCULATOR_SEQ_LENS, CALCULATOR_SHARDING, GPU_MEMORY_GIB, PRECISION_SETTINGS,
                               CalculatorChoice, calculator_data, calculator_report_html, calculator_settings,
                               memory_calculator, memory_calculator_script)

pytest.importorskip("IPython")

SCRIPT = Path(__file__).resolve().parents[1] / "gpuformer_lib" / "js" / "memory_calculator.js"
NODE = shutil.which("node") or ("/usr/bin/node" if Path("/usr/bin/node").exists() else None)
# a model whose bytes the rank counts do not divide, so that ZeRO's floor divisions leave a remainder
ODD = TransformerConfig(vocab_size=1001, d_model=36, n_heads=3, n_encoder_layers=0, n_decoder_layers=1, d_ff=100,
                        dropout=0.0, max_len=64)
# numbers whose rounding differs between JavaScript's toFixed (ties up) and Python's format (ties to even)
TRICKY = [(0.125, 2), (0.375, 2), (2.5, 0), (124.5, 0), (0.25, 1), (0.75, 1), (-0.0, 1), (0.0, 1), (-0.04, 1),
          (1.005, 2), (79.05, 1), (15.0, 1), (1e-9, 2), (123456.785, 2), (0.5, 0), (1.5, 0)]

RUNNER = """
const calc = require(process.argv[process.argv.length - 1]);
let input = "";
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const {data, choices, numbers} = JSON.parse(input);
  const results = choices.map((choice) => {
    const r = calc.compute(data, choice);
    return {rows: r.peak.saved, moments: r.peak.moments, moment: r.peak.moment, peak: r.peak.peak, html: r.html};
  });
  const formatted = numbers.map((pair) => calc.formatFixed(pair[0], pair[1]));
  process.stdout.write(JSON.stringify({results, formatted}));
});
"""


@pytest.fixture(scope="module")
def data():
    models = {"GPT-2 small (12 x 768)": gpt2_config(), "GPT-2 medium (24 x 1024)": gpt2_config(1024, 24, 16),
              "GPT-2 XL (48 x 1600)": gpt2_config(1600, 48, 25), "odd <&> tiny": ODD}
    return calculator_data(models)


@pytest.fixture(scope="module")
def grid(data):
    """Every model x precision x optimizer x kernel x checkpointing x ZeRO stage x rank count, each with a
    micro-batch, a length and a GPU drawn from all the controls offer; then every micro-batch x length for the
    largest model at its largest (explicit attention, float32)."""
    rng = random.Random(0)
    batches = [1, 2, 3, 7, 8, 16, 31, 33, 63, CALCULATOR_MAX_MICRO_BATCH]
    gpus = list(GPU_MEMORY_GIB)
    choices = []
    for i, (model, precision, optimizer, fused, checkpointing, stage, ranks) in enumerate(itertools.product(
            data["models"], PRECISION_SETTINGS, CALCULATOR_OPTIMIZERS, (True, False), (True, False),
            CALCULATOR_SHARDING.values(), CALCULATOR_RANKS)):
        choices.append(CalculatorChoice(model, batch_size=rng.choice(batches), seq_len=rng.choice(CALCULATOR_SEQ_LENS),
                                        precision=precision, optimizer=optimizer, fused_attention=fused,
                                        checkpointing=checkpointing, sharding=stage, ranks=ranks, gpu=gpus[i % 4]))
    for batch, length in itertools.product(range(1, CALCULATOR_MAX_MICRO_BATCH + 1), CALCULATOR_SEQ_LENS):
        choices.append(CalculatorChoice("GPT-2 XL (48 x 1600)", batch_size=batch, seq_len=length,
                                        fused_attention=False, gpu=gpus[batch % 4]))
    return choices


def run_node(script: Path, data: dict, choices, numbers=TRICKY) -> dict:
    if NODE is None:
        pytest.skip("Node.js is not installed (apt-get install nodejs): the calculator's JavaScript cannot run")
    payload = json.dumps({"data": data, "choices": [dataclasses.asdict(c) for c in choices], "numbers": numbers})
    done = subprocess.run([NODE, "-e", RUNNER, "--", str(script)], input=payload, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, f"node failed: {done.stderr[-2000:]}"
    return json.loads(done.stdout)


def mismatches(data: dict, choices, out: dict, numbers=TRICKY) -> list[str]:
    """Every difference between the JavaScript's results (``out``) and the Python's, described."""
    found = []
    for choice, js in zip(choices, out["results"], strict=True):
        settings = calculator_settings(data, choice)
        n_params = data["models"][choice.model]["n_params"]
        saved, peak = training_memory(n_params, **settings), predicted_peak(n_params, **settings)
        expected = {"rows": dict(saved.rows()), "moments": [list(m) for m in peak.moments.items()],
                    "moment": peak.moment, "peak": peak.peak, "html": calculator_report_html(data, choice)}
        for key, value in expected.items():
            if js[key] != value:
                found.append(f"{choice}: {key}: JavaScript {js[key]!r}, Python {value!r}")
    for (x, digits), text in zip(numbers, out["formatted"], strict=True):
        if text != format(x, f".{digits}f"):
            found.append(f"formatFixed({x!r}, {digits}): JavaScript {text!r}, Python {format(x, f'.{digits}f')!r}")
    return found


def test_the_grid_reaches_every_control_value_and_every_outcome(data, grid):
    assert len(grid) > 3000
    for name, allowed in (("model", data["models"]), ("precision", PRECISION_SETTINGS),
                          ("optimizer", CALCULATOR_OPTIMIZERS), ("sharding", CALCULATOR_SHARDING.values()),
                          ("ranks", CALCULATOR_RANKS), ("gpu", GPU_MEMORY_GIB), ("seq_len", CALCULATOR_SEQ_LENS),
                          ("batch_size", range(1, CALCULATOR_MAX_MICRO_BATCH + 1)),
                          ("fused_attention", (True, False)), ("checkpointing", (True, False))):
        assert {getattr(c, name) for c in grid} == set(allowed), name
    pages = [calculator_report_html(data, c) for c in grid[::7]]
    assert any("Does not fit" in p for p in pages) and any("to spare" in p for p in pages)
    # the loss's forward moment (4 bytes a logit) never tops its backward (6 or 8): its value is compared
    for moment in ("loss backward", "layer backward"):
        assert any(f"predicted peak (at the {moment})" in p for p in pages), moment


def test_javascript_gives_python_results_on_every_control_value(data, grid):
    out = run_node(SCRIPT, data, grid)
    found = mismatches(data, grid, out)
    assert not found, f"{len(found)} differences, first: " + "\n".join(found[:5])
    assert any("odd &lt;&amp;&gt; tiny:" in r["html"] for r in out["results"]), "the model's name is escaped"


@pytest.mark.parametrize("old, new", [
    ("total += 4 * H * tokens;", "total += 2 * H * tokens;"),  # fused attention's log-sum-exp
    # the loss's backward in 16 bits as CPU autocast has it (8 bytes a logit), not CUDA's (2 + 4)
    ("var lossBackward = ab < 4 ? logits * (ab + 4) : logits * 8;", "var lossBackward = logits * 8;"),
    ("var lossForward = ab < 4 ? logits * 2 * ab : logits * ab;", "var lossForward = logits * (ab + 4);"),
    ("return (a - a % b) / b;", "return a / b;"),  # a floor division left out
    ("if (last % 2 === 1) {", "if (false) {"),  # toFixed's ties left as they are
])
def test_the_comparison_catches_a_changed_formula(data, grid, tmp_path, old, new):
    source = SCRIPT.read_text()
    assert source.count(old) == 1, f"{old!r} is no longer in the script: update this mutation"
    mutated = tmp_path / "memory_calculator.js"
    mutated.write_text(source.replace(old, new))
    assert mismatches(data, grid, run_node(mutated, data, grid)), f"changing {old!r} went unnoticed"


def ids(page: str) -> list[str]:
    return re.findall(r'\bid="([^"]+)"', page)


def test_each_calculator_has_its_own_ids_and_shows_python_s_first_result():
    first, second = memory_calculator().data, memory_calculator(batch_size=32, seq_len=2048).data
    for page in (first, second):
        assert len(ids(page)) == len(set(ids(page))) >= 12
        assert 'class="gpuformer-memcalc"' in page and 'class="gpuformer-memcalc-result"' in page
        assert page.count("<script>") == 1 and memory_calculator_script() in page
        assert all(" disabled" in c for c in re.findall(r"<(?:select|input)\b[^>]*>", page)), \
            "controls are sent disabled (the script enables them), so where no script runs they cannot mislead"
    assert not set(ids(first)) & set(ids(second))
    data = calculator_data()
    model = next(iter(data["models"]))
    assert calculator_report_html(data, CalculatorChoice(model)) in first
    assert calculator_report_html(data, CalculatorChoice(model, batch_size=32, seq_len=2048)) in second
    payload = re.search(r"\.mount\(document\.currentScript, \"[^\"]+\", (\{.*\})\);\n\}\(\)\);</script>", first)
    assert json.loads(payload.group(1)) == data, "the page's script computes from other data than Python"


@pytest.mark.parametrize("call, error, phrase", [
    (lambda: memory_calculator(batch_size=0), ValueError, "batch_size must be an int from 1 to 64"),
    (lambda: memory_calculator(batch_size=65), ValueError, "batch_size must be an int from 1 to 64"),
    (lambda: memory_calculator(seq_len=1000), ValueError, "seq_len must be one of the calculator's choices"),
    (lambda: memory_calculator(models={}), ValueError, "models is empty"),
    (lambda: memory_calculator(models=[gpt2_config()]), TypeError, "models must be a dict"),
    (lambda: memory_calculator(models={"a": "gpt2"}), TypeError, "to a TransformerConfig"),
    (lambda: memory_calculator(models={"huge": gpt2_config(4096, 48, 64)}), ValueError, "computes exactly"),
    (lambda: calculator_settings(calculator_data(), CalculatorChoice("GPT-3")), ValueError,
     "one of the calculator's models"),
    (lambda: CalculatorChoice("m", ranks=3), ValueError, "ranks must be one of"),
    (lambda: CalculatorChoice("m", seq_len=1024.0), ValueError, "seq_len must be one of"),
    (lambda: CalculatorChoice("m", fused_attention=1), TypeError, "fused_attention must be True or False"),
])
def test_bad_arguments_get_a_clear_error(call, error, phrase):
    with pytest.raises(error, match=re.escape(phrase)):
        call()


def test_the_page_recomputes_in_chromium(tmp_path):
    """Two calculators on one page, in Debian's Chromium: each recomputes on its own, to Python's result."""
    sync_api = playwright_or_skip()
    page_file = tmp_path / "calculator.html"
    page_file.write_text('<!doctype html><meta charset="utf-8"><body>' + memory_calculator().data
                         + memory_calculator().data + "</body>")
    data = calculator_data()
    with sync_api.sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 400, "height": 900})
            errors = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(page_file.as_uri())
            calculators = page.locator(".gpuformer-memcalc")
            assert calculators.count() == 2
            first, second = calculators.nth(0), calculators.nth(1)
            assert first.locator(".gpuformer-memcalc-static-note").count() == 0, "the script did not run"
            first.locator("[data-control='model']").select_option("GPT-2 XL (48 x 1600)")
            first.locator("[data-control='checkpointing']").check()
            expected = CalculatorChoice("GPT-2 XL (48 x 1600)", checkpointing=True)
            # the browser's own serialisation of Python's HTML (it adds <tbody>, rewrites quotes)
            as_parsed = "html => { const d = document.createElement('div'); d.innerHTML = html; return d.innerHTML; }"
            shown = first.locator(".gpuformer-memcalc-result").inner_html()
            assert shown == page.evaluate(as_parsed, calculator_report_html(data, expected))
            assert "Does not fit" in shown or "to spare" in shown
            assert second.locator(".gpuformer-memcalc-result").inner_html() == page.evaluate(
                as_parsed, calculator_report_html(data, CalculatorChoice("GPT-2 small (12 x 768)"))), \
                "changing one calculator changed the other"
            # the ranks count only when something is sharded: inactive otherwise, as the control shows
            ranks = first.locator("[data-control='ranks']")
            assert ranks.is_disabled()
            first.locator("[data-control='sharding']").select_option("3")
            assert ranks.is_enabled()
            first.locator("[data-control='sharding']").select_option("0")
            assert ranks.is_disabled()
            # the peak's bar and the GPU's on one scale; no row of zero loss temporaries
            shown = first.locator(".gpuformer-memcalc-result").inner_html()
            assert "the GPU's memory" in shown and "saved tensors (the sum above)" in shown
            assert "loss temporaries" not in shown and "#c44e52" in shown
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 400, f"the page is {width} px wide at a 400 px screen"
            assert not errors, errors
        finally:
            browser.close()
