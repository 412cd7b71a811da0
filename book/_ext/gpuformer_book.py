"""A Sphinx fix the course's book needs on the Sphinx 7 series that Jupyter Book 1 requires.

Inline scripts that an extension registers after the HTML builder has started (sphinx-thebe's
``const THEBE_JS_URL = ...`` configuration, sphinx-togglebutton's selector) were written twice
into every page, and the second ``const`` declaration threw "Identifier 'THEBE_JS_URL' has
already been declared" in the browser. Sphinx 7.4 keeps such a script once with the file name
``None`` (``Sphinx.add_js_file``) and again with ``''`` (``StandaloneHTMLBuilder.prepare_writing``),
and the two do not compare equal. Upstream fixed it in sphinx-doc/sphinx#13402, after the Sphinx 7
series. Here each page's script list keeps the first of any scripts that differ only in that.

It leaves every other script, and the order of the scripts, as they are.
"""

from typing import Any

from sphinx.application import Sphinx


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


def setup(app: Sphinx) -> dict:
    # Late (priority 900), after the extensions that add a page's scripts on this event.
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
