"""The site's own Sphinx extension: what the theme and the extensions do not get right alone.

1. **Maths offline.** MathJax 3.2.2 (es5 build, from the locked ``django-static-mathjax``
   package, pure static files) is copied into the build's ``_static/mathjax`` and
   ``mathjax_path`` points at it, so a saved copy, the PDF and a machine with no network all
   render formulas. Only what the book needs is copied: the ``tex-chtml`` component, the TeX
   extensions it loads on demand, the CommonHTML fonts, the menu and the accessibility parts.
2. **One of everything in each page's head.** Some extensions register their scripts twice
   (``const THEBE_JS_URL`` declared twice is a JavaScript error on every page); the theme and
   Sphinx each write a viewport meta tag. Duplicates are dropped.
3. **The book's stylesheet and favicon** (``tools/site_static``): no duplicate search header
   on desktop, wide tables and display equations scroll inside themselves, not the page.
4. **Figures** drawn by a notebook's code become numbered figures with a caption and real
   alt text. A figure cell gives its caption as a sentence in myst-nb's metadata
   (``mystnb: {figure: {caption: ..., name: fig-...}}``; myst-nb makes the figure) and the
   caption is its alt text too, unless ``mystnb: {image: {alt: ...}}`` gives one. A figure
   with no caption gets the description ``scalebook.setup()`` stores in its PNG (title,
   axes titles and labels) as caption and alt. Figures are numbered by chapter (Fig. 5.1,
   5.2, ...) as sections and exercises are, and a click on one opens the full-size image
   (Sphinx links an image shown at a set width to its file).
5. **Offline badge.** The notebooks' "Open in Colab" badge is Colab's online image (Colab and
   GitHub show the notebook's own Markdown, where only an absolute URL works); on the site
   and in the PDF it is the book's own copy, ``_static/colab-badge.svg``.
6. **For search engines and link previews**: each page gets a meta description (its first
   paragraph) and Open Graph tags, and the site a ``sitemap.xml`` and ``robots.txt``. The
   site's address is ``html.baseurl`` in _config.yml, or else the GitHub Pages address of
   the repository URL there (``https://OWNER.github.io/REPO/``).
7. **Search** (``search-fixes.js``): headings rank above API entries, and a result's snippet
   leaves out the set-up cell and the badge.
8. **Phones** (``book.js``): an inline formula wider than its paragraph scrolls inside
   itself instead of widening the page.
9. **The set-up cell folds away whole.** In the notebooks it is tagged ``hide-input``
   (``tools/notebooks.py sync``), so Jupyter shows what it printed; on the site each chapter
   would open with that line ("JAX ... with 8 simulated CPU devices"), which says what the
   machine that built the site ran, not the reader's. As a notebook is read, the set-up
   cell's ``hide-input`` becomes ``hide-cell``: one "Show code cell content" toggle holds its
   code and its output. The stored notebooks are not changed.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from docutils import nodes
from sphinx.transforms import SphinxTransform

HERE = Path(__file__).resolve().parent
STATIC = HERE / "site_static"
MATHJAX_PATH = "mathjax/tex-chtml.js"
# What tex-chtml.js loads at run time, relative to MathJax's es5 folder.
MATHJAX_PARTS = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2",
                 "ui", "a11y", "adaptors")


def mathjax_source() -> Path:
    """The es5 folder of the installed MathJax package."""
    import mathjax  # the django-static-mathjax distribution; no Django needed

    return Path(next(iter(mathjax.__path__))) / "static" / "mathjax" / "es5"


def copy_mathjax(static_dir: Path) -> Path:
    src, dst = mathjax_source(), Path(static_dir) / "mathjax"
    for part in MATHJAX_PARTS:
        s, d = src / part, dst / part
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, d, dirs_exist_ok=True)
        else:
            shutil.copy2(s, d)
    return dst


def _config_inited(app, config):
    config.mathjax_path = MATHJAX_PATH
    config.html_static_path = list(config.html_static_path) + [str(STATIC)]
    # pydata-sphinx-theme logs a console error on every page when no default mode is set.
    # (its templates read default_mode from the page context)
    context = dict(config.html_context or {})
    context.setdefault("default_mode", "auto")
    config.html_context = context
    if not config.html_favicon:
        config.html_favicon = str(STATIC / "favicon.svg")


VIEWPORT = re.compile(r'\s*<meta name="viewport"[^>]*/?>')
SCRIPT = re.compile(r'\n?[ \t]*<script\b[^>]*>.*?</script>', re.S)
STYLESHEET = re.compile(r'\n?[ \t]*<link rel="stylesheet"[^>]*/?>')


def dedupe_head(html: str) -> str:
    """Keep the first viewport meta tag of a page's head, and one copy of each script and
    stylesheet tag (an extension registered twice writes its tags twice)."""
    head_end = html.find("</head>")
    if head_end < 0:
        return html
    head, rest = html[:head_end], html[head_end:]
    seen_viewport = []

    def first_viewport(m):
        seen_viewport.append(m)
        return m.group(0) if len(seen_viewport) == 1 else ""

    def once(pattern, text):
        seen = set()

        def keep(m):
            key = m.group(0).strip()
            if key in seen:
                return ""
            seen.add(key)
            return m.group(0)

        return pattern.sub(keep, text)

    head = VIEWPORT.sub(first_viewport, head)
    head = once(STYLESHEET, once(SCRIPT, head))
    return head + rest


COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
LOCAL_BADGE = "_static/colab-badge.svg"


def local_badge(html: str, depth: int) -> str:
    """The page's Colab badge images pointed at the site's own copy; DEPTH: how many folders
    below the site's root the page is."""
    return html.replace(f'src="{COLAB_BADGE}"', f'src="{"../" * depth}{LOCAL_BADGE}"')


def site_url(config) -> str:
    """Where the site is published, ending in '/': html_baseurl, or else the GitHub Pages
    address of the repository URL in _config.yml."""
    base = (getattr(config, "html_baseurl", "") or "").strip()
    if base:
        return base.rstrip("/") + "/"
    repo = ((getattr(config, "html_theme_options", None) or {}).get("repository_url") or "")
    m = re.match(r"https://github\.com/([^/]+)/([^/]+?)/?$", repo)
    return f"https://{m.group(1).lower()}.github.io/{m.group(2)}/" if m else ""


SITEMAP_SKIP = {"genindex.html", "search.html", "py-modindex.html"}


def sitemap(outdir: Path, base: str) -> str:
    """sitemap.xml for every page of the site under OUTDIR (not Sphinx's generated lists,
    not the root's redirect)."""
    from xml.sax.saxutils import escape

    urls = []
    for page in sorted(Path(outdir).rglob("*.html")):
        rel = page.relative_to(outdir).as_posix()
        if page.name in SITEMAP_SKIP or rel.startswith(("_static/", "_sources/", "_images/")):
            continue
        if 'http-equiv="refresh"' in page.read_text(encoding="utf-8", errors="replace")[:3000].lower():
            continue
        urls.append(f"  <url><loc>{escape(base + rel)}</loc></url>")
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
            + "\n".join(urls) + "\n</urlset>\n")


def _build_finished(app, exc):
    if exc is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    copy_mathjax(out / "_static")
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        depth = len(page.relative_to(out).parts) - 1
        fixed = local_badge(dedupe_head(text), depth)
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")
    base = site_url(app.config)
    if app.builder.name == "html" and base:
        (out / "sitemap.xml").write_text(sitemap(out, base), encoding="utf-8")
        (out / "robots.txt").write_text(f"User-agent: *\nAllow: /\nSitemap: {base}sitemap.xml\n",
                                        encoding="utf-8")


# ---- meta description and link previews -------------------------------------------------

def description(doctree, limit: int = 200) -> str:
    """The page's first real paragraph (not in a code cell or an output, not the badge),
    cut at a word before LIMIT characters."""
    if doctree is None:
        return ""
    for para in doctree.findall(nodes.paragraph):
        if any("cell" in (p.get("classes", []) if isinstance(p, nodes.Element) else [])
               or p.__class__.__name__ in ("CellNode", "CellOutputNode")
               for p in _ancestors(para)):
            continue
        text = " ".join(para.astext().split())
        if len(text) < 40:
            continue
        if len(text) > limit:
            text = text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + "…"
        return text
    return ""


def _ancestors(node):
    p = node.parent
    while p is not None:
        yield p
        p = p.parent


def _attr(text: str) -> str:
    from html import escape

    return escape(text, quote=True)


def meta_tags(title: str, desc: str, site_title: str, url: str) -> str:
    tags = [f'<meta name="description" content="{_attr(desc)}" />' if desc else "",
            f'<meta property="og:title" content="{_attr(title)}" />',
            f'<meta property="og:site_name" content="{_attr(site_title)}" />',
            '<meta property="og:type" content="website" />',
            f'<meta property="og:description" content="{_attr(desc)}" />' if desc else "",
            f'<meta property="og:url" content="{_attr(url)}" />' if url else "",
            '<meta name="twitter:card" content="summary" />']
    return "\n".join(t for t in tags if t) + "\n"


def _page_context(app, pagename, templatename, context, doctree):
    from html import unescape

    desc = description(doctree) or getattr(app.env, "scalebook_description", "")
    title = re.sub(r"<[^>]+>", "", unescape(context.get("title") or "")) or app.config.html_title
    site_title = app.config.html_title or app.config.project
    base = site_url(app.config)
    url = base + app.builder.get_target_uri(pagename) if base and app.builder.name == "html" else ""
    context["metatags"] = context.get("metatags", "") + meta_tags(title, desc, site_title, url)


def _env_updated(app, env):
    """The book's own description (its root page's first paragraph), for pages that have
    none of their own (the search page, the index)."""
    try:
        env.scalebook_description = description(env.get_doctree(app.config.root_doc))
    except Exception:
        env.scalebook_description = ""


# ---- figures ---------------------------------------------------------------------------

def png_description(path: Path) -> str | None:
    """The figure description scalebook.setup() stores in a PNG (a tEXt or iTXt chunk
    'Description'), read with the standard library (the venv has no PIL)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    return png_text(data, "Description")


def png_text(data: bytes, key: str) -> str | None:
    """The text a PNG (its bytes, DATA) stores under KEY in a tEXt or iTXt chunk, or None."""
    import struct
    import zlib

    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    pos, tag = 8, key.encode("latin-1") + b"\0"
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"tEXt" and body.startswith(tag):
            desc = body.split(b"\0", 1)[1].decode("latin-1")
        elif kind == b"iTXt" and body.startswith(tag):
            rest = body.split(b"\0", 1)[1]
            compressed, rest = rest[0], rest[2:]
            text = rest.split(b"\0", 2)[2]           # after language tag and keyword
            desc = (zlib.decompress(text) if compressed else text).decode("utf-8")
        elif kind == b"IEND":
            return None
        else:
            continue
        return desc.strip() or None
    return None


class NotebookFigures(SphinxTransform):
    """An image that a notebook cell drew becomes a numbered figure with caption and alt."""

    default_priority = 400

    def _find(self, uri: str) -> Path:
        """The PNG file behind an image node: myst-nb writes a notebook's outputs to
        jupyter_execute/ beside the html folder (wherever --path-output puts it)."""
        candidates = [Path(uri)] if Path(uri).is_absolute() else [
            Path(self.env.srcdir, uri), Path(self.env.srcdir, self.env.docname).parent / uri]
        candidates.append(Path(self.app.outdir).parent / "jupyter_execute" / Path(uri).name)
        return next((c for c in candidates if c.exists()), candidates[-1])

    def apply(self):
        for image in list(self.document.findall(nodes.image)):
            uri = image.get("uri", "")
            if not uri or not _in_cell_output(image):
                continue
            figure = next((a for a in _ancestors(image) if isinstance(a, nodes.figure)), None)
            if figure is not None:
                # myst-nb made the figure from the cell's caption: the caption is the alt
                # text too, unless the cell gave its own.
                figure["classes"] = list(dict.fromkeys(figure["classes"] + ["nb-figure"]))
                caption = next(iter(figure.findall(nodes.caption)), None)
                alt = image.get("alt", "")
                if caption is not None and (not alt or alt == uri or alt.endswith(
                        (".png", ".svg", ".jpg"))):
                    image["alt"] = " ".join(caption.astext().split())
                continue
            alt = image.get("alt")
            desc = png_description(self._find(uri))
            if alt and alt != uri and not alt.endswith((".png", ".svg", ".jpg")):
                desc = desc or alt
            if not desc:
                continue
            image["alt"] = desc
            figure = nodes.figure(classes=["nb-figure"])
            image.replace_self(figure)
            self.document.set_id(figure)  # an id makes numfig number it
            figure += image
            figure += nodes.caption(desc, desc)


CHAPTER_DOC = re.compile(r"^(?:notebooks|solutions)/(\d+)_")


def chapter_numbers(fignumbers: dict) -> dict:
    """Figure (and table, code-block) numbers by chapter: Sphinx numbers them through the
    whole book when the toctree is not numbered (ours is not: chapter titles carry their
    numbers, "# 5. ..."), so chapter 5's figures would be Fig. 15, 16, ... . FIGNUMBERS is
    Sphinx's env.toc_fignumbers (docname -> figtype -> id -> number tuple); in each chapter
    document (notebooks/05_x, solutions/05_x) the numbers become (5, 1), (5, 2), ... in
    their order in the document. Returns the new mapping; other documents are unchanged."""
    out = {}
    for doc, by_type in fignumbers.items():
        m = CHAPTER_DOC.match(doc)
        if not m:
            out[doc] = by_type
            continue
        chapter = int(m.group(1))
        out[doc] = {figtype: {fid: (chapter, k) for k, (fid, _) in enumerate(
            sorted(ids.items(), key=lambda item: item[1]), start=1)}
            for figtype, ids in by_type.items()}
    return out


def _number_by_chapter(app, env):
    """After Sphinx's own figure numbering (env-get-updated, the TocTreeCollector):
    renumber by chapter. Returns the documents whose numbers changed, to be written again."""
    new = chapter_numbers(env.toc_fignumbers)
    changed = [doc for doc in new if new[doc] != env.toc_fignumbers.get(doc)]
    env.toc_fignumbers = new
    return changed


def fold_setup_cell(text: str) -> str:
    """A notebook's JSON with its set-up cell (tag ``setup``) tagged ``hide-cell`` instead of
    ``hide-input``; other notebooks come back unchanged, character for character."""
    nb = json.loads(text)
    changed = False
    for cell in nb.get("cells", []):
        tags = cell.get("metadata", {}).get("tags", [])
        if "setup" in tags and "hide-cell" not in tags:
            cell["metadata"]["tags"] = [t for t in tags if t != "hide-input"] + ["hide-cell"]
            changed = True
    return json.dumps(nb, ensure_ascii=False) if changed else text


def _source_read(app, docname, source):
    if str(app.env.doc2path(docname)).endswith(".ipynb"):
        source[0] = fold_setup_cell(source[0])


def _in_cell_output(node) -> bool:
    p = node.parent
    while p is not None:
        classes = p.get("classes", []) if isinstance(p, nodes.Element) else []
        if "cell_output" in classes or p.__class__.__name__ == "CellOutputNode":
            return True
        p = p.parent
    return False


def _builder_inited(app):
    # Sphinx gives a builder the node handlers registered under its own name and, only if there
    # are none, those of its format. Some extension registers handlers for "singlehtml" (the
    # single-page build the PDF is printed from), so the "html" handlers of the others (myst-nb's
    # hidden code cells, sphinx-exercise's boxes) are missing there and Sphinx stops on their
    # nodes. Give the single-page builder every html handler it lacks.
    if app.builder.name == "singlehtml":
        handlers = app.registry.translation_handlers
        own = handlers.setdefault("singlehtml", {})
        for name, pair in handlers.get("html", {}).items():
            own.setdefault(name, pair)
        # Sphinx adds MathJax to a page whose own document has maths; the single page is the
        # root document with the chapters inlined, so it would get none.
        app.set_html_assets_policy("always")


def _one_document(app, doctree) -> None:
    """Point every node of a page at the page's own document. The nodes that MyST's
    ``eval-rst`` blocks make (the API pages' autodoc) belong to a nested document whose
    settings hold the build environment, so each API page's pickled doctree carried a copy of
    the whole environment (6 MB a page, unpickled again at every figure numbering and write:
    about a minute of each build). Measured and tested in tests/test_site_fixes.py."""
    for node in doctree.findall():
        if getattr(node, "_document", None) is not None and node._document is not doctree:
            node._document = doctree


def setup(app):
    app.connect("config-inited", _config_inited)
    app.connect("doctree-read", _one_document)
    app.connect("builder-inited", _builder_inited)
    app.connect("build-finished", _build_finished)
    app.connect("html-page-context", _page_context)
    app.connect("env-updated", _env_updated)
    app.connect("source-read", _source_read)
    app.add_css_file("book.css")
    app.add_js_file("search-fixes.js", priority=200)
    app.add_js_file("book.js")
    app.add_transform(NotebookFigures)
    # after the TocTreeCollector's numbering (priority 500)
    app.connect("env-get-updated", _number_by_chapter, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
