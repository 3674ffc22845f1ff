"""Sphinx extension: each inline script once per page.

Sphinx 7.4 adds an inline script registered after the HTML builder started (sphinx-thebe's and
sphinx-togglebutton's configuration) twice: once under the file name ``None`` and again, from the
registry, under ``''``, which it then takes for a different script. The second copy of sphinx-thebe's
``const THEBE_JS_URL`` is a SyntaxError in every page's console (tests/test_browser.py finds it).
This keeps the first of identical inline scripts. Not run by hand: `make book` loads it (`_config.yml`,
``local_extensions``).
"""


def _drop_repeated_inline_scripts(app, pagename, templatename, context, doctree):
    """Remove, in place, every inline script whose body and attributes an earlier one has."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        if not script.filename:
            key = tuple(sorted(script.attributes.items()))
            if key in seen:
                continue
            seen.add(key)
        kept.append(script)
    scripts[:] = kept


def setup(app):
    app.connect("html-page-context", _drop_repeated_inline_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
