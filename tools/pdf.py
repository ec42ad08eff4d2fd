"""The whole book as one PDF, printed by headless Chromium from the single-page site.

    python3 tasks.py pdf [--out _build/pdf/scalebook.pdf] [--root BOOK]

1. Sphinx's ``singlehtml`` builder writes the book (the same table of contents, the same
   extensions) as one page, ``_build/singlehtml/index.html``.
2. Debian's Chromium, driven by Playwright, opens it from a server on 127.0.0.1, waits for
   the bundled MathJax to typeset every formula (no network is used), and prints it to A4
   with page numbers; the screen-only parts (sidebars, header, buttons) are left out by the
   book's print stylesheet (tools/site_static/book.css).
3. The PDF is written to ``--out`` and, when the website has been built, copied next to it
   as ``_build/html/scalebook.pdf``, where the introduction's link points.

The same check the browser test makes is made here: a formula that MathJax could not typeset
or an image that did not load stops the command with the list.

``--root BOOK`` prints another copy of the book's sources instead of this checkout:
the student edition (``python3 tasks.py student --pdf`` passes its folder, so the
student PDF is printed from sources that hold no solution; the defaults of ``--out``
and ``--build-dir`` then lie under BOOK/_build).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PDF_NAME = "scalebook.pdf"
ROOT_PAGE = "book/intro.html"   # the single page (index.html only redirects to it)
PRINTED_PAGE = "scalebook.html" # ... whose links assume it sits at the top: a copy there


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def build_single_page(out: Path, root: Path = ROOT) -> Path:
    jb = Path(sys.executable).with_name("jupyter-book")
    r = subprocess.run([str(jb), "build", str(root), "--builder", "singlehtml",
                        "--path-output", str(out), "-W", "-n", "--keep-going"],
                       cwd=root)
    if r.returncode:
        raise SystemExit("error: the single-page build failed (see above)")
    return out / "_build" / "singlehtml"


@functools.lru_cache(maxsize=None)
def _quiet_handler(folder: str):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=folder, **k)

        def log_message(self, *args):
            pass

    return Handler


def print_pdf(site: Path, pdf: Path, browser: str) -> dict:
    """Print SITE/index.html to PDF; returns what the page reported (formulas, images)."""
    from playwright.sync_api import sync_playwright

    shutil.copy2(site / ROOT_PAGE, site / PRINTED_PAGE)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _quiet_handler(str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{PRINTED_PAGE}"
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=browser, args=["--no-sandbox"])
            page = b.new_page(viewport={"width": 900, "height": 1200})
            page.route("**/*", lambda route: route.continue_()
                       if route.request.url.startswith("http://127.0.0.1") else route.abort())
            page.goto(url, wait_until="load", timeout=120_000)
            page.wait_for_function("() => window.MathJax && MathJax.startup"
                                   " && MathJax.startup.promise", timeout=120_000)
            page.evaluate("() => MathJax.startup.promise.then(() => true)")
            report = page.evaluate("""() => ({
                formulas: document.querySelectorAll('mjx-container').length,
                failed: document.querySelectorAll('mjx-merror').length,
                // the Colab badges are online images, left out of the print (book.css)
                broken_images: [...document.images].filter(i => !i.complete || !i.naturalWidth)
                                 .filter(i => !i.src.includes('colab-badge'))
                                 .map(i => i.getAttribute('src')),
            })""")
            page.emulate_media(media="print")
            pdf.parent.mkdir(parents=True, exist_ok=True)
            page.pdf(path=str(pdf), format="A4", print_background=True,
                     margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"},
                     display_header_footer=True, header_template="<span></span>",
                     footer_template='<div style="font-size:8px;width:100%;text-align:center">'
                                     '<span class="pageNumber"></span> / '
                                     '<span class="totalPages"></span></div>')
            b.close()
    finally:
        server.shutdown()
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 tasks.py pdf",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(ROOT),
                        help="the book's sources to print (this checkout)")
    parser.add_argument("--out", help="the PDF (ROOT/_build/pdf/scalebook.pdf)")
    parser.add_argument("--build-dir",
                        help="where the single-page site is built (ROOT/_build/pdf)")
    parser.add_argument("--no-copy", action="store_true",
                        help="do not copy the PDF into _build/html")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    build_dir = Path(args.build_dir or root / "_build" / "pdf")
    browser = chromium()
    if browser is None:
        print("error: the PDF is printed by Chromium, which is not installed "
              "(Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    site = build_single_page(build_dir, root)
    pdf = Path(args.out or root / "_build" / "pdf" / PDF_NAME)
    report = print_pdf(site, pdf, browser)
    problems = []
    if report["failed"]:
        problems.append(f"{report['failed']} formulas MathJax could not typeset")
    if report["broken_images"]:
        problems.append("images that did not load: " + ", ".join(report["broken_images"][:5]))
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 1
    html = root / "_build" / "html"
    copy = html.is_dir() and not args.no_copy
    if copy:
        shutil.copy2(pdf, html / PDF_NAME)
    print(f"PDF: {pdf} ({pdf.stat().st_size / 2**20:.1f} MiB, {report['formulas']} formulas)"
          + (f"; copied to {html / PDF_NAME}" if copy else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
