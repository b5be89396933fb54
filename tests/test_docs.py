"""The documentation site (``mkdocs.yml``, ``docs/``, the API reference generated from the docstrings) builds in
strict mode: a broken link, a missing anchor, an unresolved API reference, a page left out of the navigation or a
docstring mkdocstrings cannot read fails the build, and so this test."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import require

ROOT = Path(__file__).resolve().parent.parent
WHY = "the documentation site; the [dev] extra installs mkdocs, mkdocs-material and mkdocstrings-python"


def test_the_docs_build_in_strict_mode(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        require(module, WHY)
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert (site / "index.html").exists() and (site / "api" / "types" / "index.html").exists()


def test_the_config_keeps_strict_mode():
    """CI's check means something only while the build stays strict."""
    text = (ROOT / "mkdocs.yml").read_text()
    assert "\nstrict: true\n" in text, "mkdocs.yml must keep `strict: true`"
