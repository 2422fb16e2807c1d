"""The HTML page `dvc plots show` writes, made self-contained: Vega, Vega-Lite and Vega-Embed inlined.

DVC's default page loads the three libraries from a CDN, so offline (our machines, CI, an air-gapped
cluster) it draws nothing. DVC accepts a page template (``plots.html_template`` in .dvc/config, relative to
.dvc/) with a ``{plot_divs}`` placeholder; leaving out its ``{scripts}`` placeholder drops the CDN tags. The
libraries come from vl-convert-python (a pinned dependency that bundles them for offline HTML), so nothing is
fetched at run time and no third-party JavaScript is committed here: the page is generated on first use
(``ensure_offline_template``, called by every stage run, ``npr plots`` and ``make install``) into
``.dvc/tmp/``, and regenerated when the bundled versions change.

The plots are drawn as SVG (not canvas), so the page's text, axis labels included, is in the DOM: a
headless browser's ``--dump-dom`` shows what a reader sees (tests/integration/ops/test_dvc_metrics_plots.py).
"""

from __future__ import annotations

import os
from pathlib import Path

# Relative to .dvc/ (DVC resolves plots.html_template there); .dvc/tmp is git-ignored.
TEMPLATE_REL = "tmp/offline-plots.html"
# DVC's templates declare the Vega-Lite v5 schema: bundle a v5 compiler so they compile as written.
VEGA_LITE_VERSION = "5.21"
VERSION_MARK = "npr-offline-plots"

# Runs after the bundle (which defines vegaEmbed, vegaLite and vega): every plot DVC embeds calls the
# global vegaEmbed(el, spec), so wrap it to render SVG and keep the action menu (export to PNG/SVG).
_SNIPPET = """
window.vega = vega;
window.vegaLite = vegaLite;
window.vegaEmbed = function (el, spec, opts) {
  return vegaEmbed(el, spec, Object.assign({renderer: "svg"}, opts || {}));
};
"""

_PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<!-- {mark} {versions} -->
<title>npr-pipeline plots</title>
<script type="text/javascript">
{bundle}
</script>
<style>
  body {{ font-family: sans-serif; margin: 1.5em; }}
  body > div {{ display: inline-block; vertical-align: top; margin: 0 1.5em 1.5em 0; }}
  table {{ border-spacing: 15px; }}
</style>
</head>
<body>
{{plot_divs}}
</body>
</html>
"""


def bundle_versions() -> str:
    import vl_convert  # lazy: vl_convert

    return (
        f"vl-convert {getattr(vl_convert, '__version__', '?')}; vega {vl_convert.get_vega_version()}; "
        f"vega-lite {VEGA_LITE_VERSION}; vega-embed {vl_convert.get_vega_embed_version()}"
    )


def render_template() -> str:
    """The page: the bundled libraries inline, then DVC's ``{plot_divs}``; no external resource."""
    import vl_convert  # lazy: vl_convert

    bundle = vl_convert.javascript_bundle(_SNIPPET, vl_version=VEGA_LITE_VERSION)
    # A literal "</script" inside the inline code would end the tag early; DVC fills "{name}" placeholders.
    bundle = bundle.replace("</script", "<\\/script")
    for placeholder in ("{plot_divs}", "{scripts}", "{refresh_tag}"):
        if placeholder in bundle:
            raise RuntimeError(f"the Vega bundle contains DVC's placeholder {placeholder}")
    return _PAGE.format(mark=VERSION_MARK, versions=bundle_versions(), bundle=bundle)


def template_path(root: Path | str = ".") -> Path:
    return Path(root) / ".dvc" / TEMPLATE_REL


def ensure_offline_template(root: Path | str = ".") -> Path | None:
    """Write the page into ``.dvc/tmp/`` unless an up-to-date one is there; returns its path (None outside a
    DVC repository). Cheap when present: one small read."""
    path = template_path(root)
    if not path.parent.parent.is_dir():  # no .dvc/ here
        return None
    if path.exists():
        with path.open(encoding="utf-8") as f:
            head = "".join(f.readline() for _ in range(4))
        if VERSION_MARK in head and bundle_versions() in head:
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(render_template(), encoding="utf-8")
    os.replace(tmp, path)
    return path
