"""Glued values render in the book as the notebook computed them (myst-nb's ``format_plain_text``)."""

import ast

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from myst_nb.core.variables import format_plain_text

from gpuformer_lib import viz
from gpuformer_lib.tools.notebooks import notebook_paths, read_notebook

GLUE_PREFIX = "application/papermill.record/"


def _glued_plain_text(name, value) -> str:
    InteractiveShell.instance()  # the display machinery a kernel has
    try:
        with capture_output() as captured:
            viz.glue(name, value)
    finally:
        InteractiveShell.clear_instance()  # later tests in this process must not find a running IPython
    (output,) = captured.outputs
    return output.data[GLUE_PREFIX + "text/plain"]


@pytest.mark.parametrize("value", ["28,976", "5,611", "T \\times T", "tab\there", "1.5 GiB (3 %)", "'quoted'",
                                   "it's \"both\"", "(1, 2)", "x" * 300])
def test_a_glued_string_renders_as_itself(value):
    plain = _glued_plain_text("v", value)
    assert format_plain_text(plain, "") == value
    assert format_plain_text(plain, "s") == value


@pytest.mark.parametrize("value", [3, 2.5, 1e-9])
def test_a_glued_number_keeps_its_format_spec(value):
    plain = _glued_plain_text("v", value)
    assert format_plain_text(plain, ".3g") == format(value, ".3g")


def test_the_old_unquoted_form_would_have_rendered_wrong():
    # the bug this guards against: text/plain stored without quotes is evaluated as Python
    assert format_plain_text("28,976", "") == "(28, 976)"


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_every_stored_glue_renders_as_a_string_or_a_number(path):
    nb = read_notebook(path)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            plain = out.get("data", {}).get(GLUE_PREFIX + "text/plain")
            if not name or plain is None:
                continue
            plain = "".join(plain) if isinstance(plain, list) else plain
            try:
                value = ast.literal_eval(plain)
            except (SyntaxError, ValueError):
                pytest.fail(f"{path.name}: glue {name!r} stored {plain[:60]!r}, which the book shows as written but "
                            "myst-nb tries to evaluate: glue a str or a number (viz.glue), then re-execute")
            assert not (isinstance(value, str) and "`" in value), \
                f"{path.name}: glue {name!r} holds markdown backticks, which the book shows as they are (glued " \
                "text is plain): leave the markup out of the glued string"
            assert isinstance(value, (str, int, float)) and not isinstance(value, bool), \
                f"{path.name}: glue {name!r} stored {plain[:60]!r}, which renders as the {type(value).__name__} " \
                f"{value!r}: glue a str or a number (viz.glue), then re-execute"
