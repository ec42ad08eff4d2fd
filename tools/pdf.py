"""The whole book as one PDF, printed by headless Chromium from the single-page site.

    python3 tasks.py pdf [--out _build/pdf/scalebook.pdf] [--root BOOK]

1. Sphinx's ``singlehtml`` builder writes the book (the same table of contents, the same
   extensions) as one page, ``_build/singlehtml/index.html``, beside the website's
   ``_build/html``: the two builds share Sphinx's parsed pages (``_build/.doctrees``), so
   after ``tasks.py build``'s website the single page only has to be written, not read.
2. Debian's Chromium, driven by Playwright, opens it from a server on 127.0.0.1, waits for
   the bundled MathJax to typeset every formula (no network is used), fits every code block,
   output, table and display equation wider than the column (shrinks it, and wraps a code
   block that would need too small a font), gives each heading its size by its depth in the
   book, and prints it to A4 with page numbers; the screen-only parts (sidebars, header,
   buttons) are left out by the book's print stylesheet (tools/site_static/book.css).
   A block taller than a page may break across pages (kept whole, it would move on and
   leave its frame empty behind it). Anything still wider than the page, a code frame with
   nothing in it, or a page with nothing on it, stops the command (tests/test_pdf.py also
   looks for code frames left empty on a page, with ``empty_frames``).
3. The contents get page numbers and the PDF an outline (bookmarks: every page of the book,
   its sections and subsections): the print leaves room after each entry of the contents;
   pypdf reads where each heading landed from the named destinations Chromium writes for
   link targets; a second print of the contents' pages alone, showing only the numbers, is
   laid over them; pypdf adds the outline. (Chromium's own outline needs a tagged PDF, which
   doubles the file: ``--tagged`` makes one.)
4. The PDF is written to ``--out`` and, when the website has been built, copied next to it
   as ``_build/html/scalebook.pdf``, where the introduction's link points.

The same check the browser test makes is made here: a formula that MathJax could not typeset
or an image that did not load stops the command with the list. ``--report FILE`` writes
what the print found (the outline, the contents' page numbers, the blocks it fitted) as JSON;
tests/test_pdf.py reads it and the PDF.

``--root BOOK`` prints another copy of the book's sources instead of this checkout:
the student edition (``python3 tasks.py student --pdf`` passes its folder, so the
student PDF is printed from sources that hold no solution; the defaults of ``--out``
and ``--build-dir`` then lie under BOOK/_build).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import logging
import re
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


# The page: A4 with these margins; the book is laid out SCALE times larger than it prints, so
# a 16 px line of prose prints at 12.8 px (9.6 pt) and a 100-character output line fits.
PAGE = {"format": "A4", "margin": {"top": "16mm", "bottom": "16mm", "left": "14mm",
                                   "right": "14mm"}}
SCALE = 0.8
# The CSS width the print lays the book out at: A4's 210 mm less 28 mm of margins, over SCALE.
LAYOUT_WIDTH = int((210 - 28) / 25.4 * 96 / SCALE)   # 859 px
FOOTER = ('<div style="font-size:8px;width:100%;text-align:center">'
          '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')
# Smallest font a wide block is shrunk to (layout px; prints at SCALE x, 6.4 pt) before its
# lines are wrapped instead.
MIN_FONT_PX = 10.7

# Run in the page (print media, LAYOUT_WIDTH wide) before printing. It
# 1. gives every heading its depth in the book (data-pdf-level: 1 for a page of the table of
#    contents, 2 for its sections, ... ; the API's module pages are one deeper than the API
#    page) for the print stylesheet's sizes (book.css), and lists the headings for the outline;
# 2. starts the introduction on a page of its own, under the heading "Introduction" (the cover
#    carries the book's title);
# 3. reserves room for a page number after each entry of the contents (filled in later);
# 4. fits every block wider than its column: a code block or output, a table or a display
#    equation is shrunk (to MIN_FONT_PX at least), and a code block still too wide wraps;
# 5. reports what is still wider than its column and any code frame with no text in it.
PREPARE = r"""([minFont, scale]) => {
  const art = document.querySelector('.bd-article');
  const levelOf = new Map();
  const isDoc = s => s.previousElementSibling && s.previousElementSibling.id
                     && s.previousElementSibling.id.startsWith('document-');
  const root = art.querySelector(':scope > section');
  // Each heading the outline or the contents points at gets an anchor of its own (a
  // section's id can repeat in the single page: every chapter has its "exercises"), and a
  // hidden link to it, so that Chromium writes a named destination for it.
  const anchors = new Map();
  const anchor = h => {
    if (!anchors.has(h)) {
      const a = document.createElement('span');
      a.id = 'pdf-dest-' + anchors.size;
      h.prepend(a);
      anchors.set(h, a.id);
      // a link painted where the heading is printed: its annotation tells the page exactly
      // (Chromium's named destinations can be a page off next to a page break)
      const mark = document.createElement('a');
      mark.className = 'pdf-mark';
      mark.href = '#' + a.id;
      a.after(mark);
    }
    return anchors.get(h);
  };
  const headingOf = el => {
    if (!el) return null;
    if (/^H[1-6]$/.test(el.tagName)) return el;
    const sec = el.tagName === 'SECTION' ? el : el.nextElementSibling;
    return sec ? sec.querySelector('h1, h2, h3, h4, h5, h6') : null;
  };
  // 1. levels and the outline
  const outline = [];
  for (const h of art.querySelectorAll('h1, h2, h3, h4, h5, h6')) {
    const sec = h.parentElement;
    if (!sec || sec.tagName !== 'SECTION' || !sec.id) continue;
    // the sections from the heading up to its page (the introduction's or an inlined one),
    // then one more for each page that page sits in (the API's module pages)
    let level = 0, inDoc = false;
    for (let s = sec; s && s !== art; s = s.parentElement) {
      if (s.tagName !== 'SECTION') continue;
      if (!inDoc) { level += 1; inDoc = isDoc(s); }
      else if (isDoc(s)) level += 1;
    }
    level = Math.min(level, 6);
    h.dataset.pdfLevel = String(level);
    const text = h.cloneNode(true);
    text.querySelectorAll('.headerlink').forEach(e => e.remove());
    text.querySelectorAll('mjx-container').forEach(m => {
      const mml = m.querySelector('mjx-assistive-mml');
      m.replaceWith(mml ? mml.textContent : '');
    });
    outline.push({id: anchor(h), level, title: text.textContent.replace(/\s+/g, ' ').trim()});
  }
  // 2. the introduction
  const introTitle = root && root.querySelector(':scope > h1');
  if (introTitle) {
    introTitle.lastChild.before(document.createTextNode('Introduction'));
    [...introTitle.childNodes].forEach(c => c.nodeType === 3 && c.textContent !== 'Introduction' && c.remove());
    introTitle.classList.add('pdf-intro-title');
    root.classList.add('pdf-intro');
    outline[0].title = 'Introduction';
  }
  // 3. the contents: room for a page number after each entry
  const toc = [];
  document.querySelectorAll('#jb-print-toc a.reference').forEach(a => {
    if (!a.getClientRects().length) return;   // a nested entry the contents do not show
    const h = headingOf(document.getElementById(decodeURIComponent(a.getAttribute('href').slice(1))));
    const span = document.createElement('span');
    span.className = 'pdf-page';
    span.textContent = '000';
    a.after(span);
    a.parentElement.classList.add('pdf-toc-entry');
    toc.push(h ? anchor(h) : null);
  });
  const holder = document.createElement('div');
  holder.style.display = 'none';
  for (const id of anchors.values()) {
    const a = document.createElement('a'); a.href = '#' + id; holder.append(a);
  }
  document.body.append(holder);
  // Nothing hangs below a page's last line: the bottom margins at the end of each page of the
  // book would otherwise run over onto a sheet of their own before the next page's break.
  for (const sec of art.querySelectorAll('section')) {
    if (!isDoc(sec) && sec !== root) continue;
    for (let e = sec; e; e = e.lastElementChild) {
      e.style.setProperty('margin-bottom', '0', 'important');
      e.style.setProperty('padding-bottom', '0', 'important');
    }
  }
  // 4. fit wide blocks
  const tooWide = el => el.scrollWidth > el.clientWidth + 1;
  let shrunk = 0, wrapped = 0;
  // (measure every block, then change them all, then measure again: one layout each time
  // rather than one per block)
  const px = (cs, k) => parseFloat(cs[k]);
  const wideBlocks = [...art.querySelectorAll('pre')].filter(pre => pre.clientWidth && tooWide(pre));
  const sizes = wideBlocks.map(pre => {
    const cs = getComputedStyle(pre);
    const pad = px(cs, 'paddingLeft') + px(cs, 'paddingRight');
    const want = Math.floor(px(cs, 'fontSize') * (pre.clientWidth - pad) / (pre.scrollWidth - pad) * 100) / 100 - 0.05;
    return Math.max(want, minFont);
  });
  wideBlocks.forEach((pre, i) => pre.style.setProperty('font-size', sizes[i] + 'px', 'important'));
  shrunk += wideBlocks.length;
  for (const pre of wideBlocks.filter(tooWide)) {
    pre.style.setProperty('white-space', 'pre-wrap', 'important');
    pre.style.setProperty('overflow-wrap', 'anywhere', 'important');
    wrapped += 1;
  }
  const fitBox = (el, box) => {
    for (let i = 0; i < 4 && box.clientWidth && el.getBoundingClientRect().width > box.clientWidth + 1; i++) {
      const size = parseFloat(getComputedStyle(el).fontSize);
      const ratio = box.clientWidth / el.getBoundingClientRect().width;
      el.style.setProperty('font-size', (size * ratio * 0.98) + 'px', 'important');
      shrunk += 1;
    }
  };
  for (const t of art.querySelectorAll('table')) fitBox(t, t.parentElement);
  for (const m of art.querySelectorAll('mjx-container[display="true"]')) fitBox(m, m.parentElement);
  // a block taller than a page may break inside (kept whole, it would start on a page it
  // cannot fit, after a gap)
  const pageHeight = (297 - 32) / 25.4 * 96 / scale;
  const tall = [...art.querySelectorAll('.cell_input, .cell_output, figure, .admonition, table, pre')]
    .filter(el => el.getBoundingClientRect().height > pageHeight - 40);
  // ... and so may the code block inside it (else the block moves on alone and leaves its
  // frame empty on the page before)
  for (const el of tall)
    for (const e of [el, ...el.querySelectorAll('div.highlight, pre')])
      e.style.setProperty('break-inside', 'auto', 'important');
  // 5. what is still too wide, and empty frames
  const label = el => (el.innerText || '').slice(0, 70).replace(/\n/g, ' ');
  const wide = [];
  for (const pre of art.querySelectorAll('pre')) {
    if (pre.clientWidth && tooWide(pre)) wide.push('pre: ' + pre.scrollWidth + ' > ' + pre.clientWidth + ' px: ' + label(pre));
  }
  for (const el of art.querySelectorAll('table, mjx-container[display="true"], img, figure')) {
    const box = el.parentElement;
    if (box.clientWidth && el.getBoundingClientRect().width > box.clientWidth + 1)
      wide.push(el.tagName.toLowerCase() + ': ' + Math.round(el.getBoundingClientRect().width) + ' > ' + box.clientWidth + ' px: ' + label(el));
  }
  const page = document.documentElement;
  if (page.scrollWidth > page.clientWidth + 1) wide.push('the page: ' + page.scrollWidth + ' > ' + page.clientWidth + ' px');
  const empty = [];
  for (const el of art.querySelectorAll('div.highlight, .cell_output, pre')) {
    const r = el.getBoundingClientRect();
    if (r.height > 0 && getComputedStyle(el).visibility !== 'hidden' && !el.closest('details:not([open])')
        && !el.innerText.trim() && !el.querySelector('img, svg, mjx-container'))
      empty.push(el.className + ': ' + label(el.closest('.cell') || el.parentElement));
  }
  // A block that scrolls is one piece to Chromium's pagination: a tall code block would move
  // whole to the next page and leave its frame empty behind it. Every block fits now, so
  // none needs to scroll: they may all break across pages.
  for (const el of art.querySelectorAll('pre, div.highlight, .cell_output, .output'))
    el.style.setProperty('overflow', 'visible', 'important');
  return {outline, toc, start: introTitle ? anchor(introTitle) : null, shrunk, wrapped, wide, empty,
          pre: art.querySelectorAll('pre').length};
}"""

# Before the second, short print: the page numbers are written into the contents and
# everything else is made invisible (its layout kept), so the pages that come out hold
# only the numbers, at the very places that the first print left for them.
NUMBERS_ONLY = r"""(pages) => {
  document.querySelectorAll('#jb-print-toc .pdf-page').forEach((span, i) => {
    span.textContent = pages[i] === null ? '' : String(pages[i]);
  });
  document.documentElement.classList.add('pdf-numbers-only');
}"""


def print_pdf(site: Path, pdf: Path, browser: str, tagged: bool = False) -> dict:
    """Print SITE's single page to PDF with an outline and page numbers in its contents;
    returns what the page reported (formulas, images, blocks fitted, outline, ...)."""
    from playwright.sync_api import sync_playwright

    shutil.copy2(site / ROOT_PAGE, site / PRINTED_PAGE)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _quiet_handler(str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{PRINTED_PAGE}"
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=browser, args=["--no-sandbox"])
            page = b.new_page(viewport={"width": LAYOUT_WIDTH, "height": 1200})
            page.route("**/*", lambda route: route.continue_()
                       if route.request.url.startswith("http://127.0.0.1") else route.abort())
            page.goto(url, wait_until="load", timeout=120_000)
            page.wait_for_function("() => window.MathJax && MathJax.startup"
                                   " && MathJax.startup.promise", timeout=120_000)
            page.evaluate("() => MathJax.startup.promise.then(() => true)")
            report = page.evaluate("""() => ({
                formulas: document.querySelectorAll('mjx-container').length,
                failed: document.querySelectorAll('mjx-merror').length,
                broken_images: [...document.images].filter(i => !i.complete || !i.naturalWidth)
                                 .map(i => i.getAttribute('src')),
            })""")
            page.emulate_media(media="print")
            report.update(page.evaluate(PREPARE, [MIN_FONT_PX, SCALE]))
            options = dict(PAGE, scale=SCALE, print_background=True)
            body = page.pdf(**options, tagged=tagged, display_header_footer=True,
                            header_template="<span></span>", footer_template=FOOTER)
            report["blank_pages"] = blank_pages(body)
            pages = destination_pages(body, report["outline"], report["toc"] + [report["start"]])
            start = pages["toc"].pop()   # the introduction's page: the contents end before it
            toc_pages = start - 1 if start else 0
            numbers = None
            if toc_pages:
                page.evaluate(NUMBERS_ONLY, [p for p in pages["toc"]])
                numbers = page.pdf(**PAGE, scale=SCALE, page_ranges=f"1-{toc_pages}")
            b.close()
    finally:
        server.shutdown()
    pdf.parent.mkdir(parents=True, exist_ok=True)
    pdf.write_bytes(finish(body, numbers, report["outline"], pages["outline"]))
    report["toc_pages"], report["toc_numbers"] = toc_pages, pages["toc"]
    return report


MARK = "pdf-dest-"


def _link_name(annot) -> str | None:
    """The named destination an internal link annotation points at."""
    dest = annot.get("/Dest")
    if dest is None and annot.get("/A") is not None:
        dest = annot["/A"].get("/D")
    return str(dest).lstrip("/") if dest is not None else None


def _marked_pages(reader) -> dict:
    """Element id -> (0-based page, top) of the mark links PREPARE put in the headings: the
    page whose annotations hold the link is the page the heading is printed on."""
    out = {}
    for i, page in enumerate(reader.pages):
        for ref in page.get("/Annots") or []:
            annot = ref.get_object()
            if annot.get("/Subtype") != "/Link":
                continue
            name = _link_name(annot)
            if name and name.startswith(MARK) and name not in out:
                out[name] = (i, float(annot["/Rect"][3]))
    return out


def _named_pages(reader) -> dict:
    """Element id -> (0-based page, top): from the mark links where there are any, else from
    the named destination (an element id) Chromium writes for every link target."""
    out = {}
    for name, dest in reader.named_destinations.items():
        try:
            page, top = reader.get_destination_page_number(dest), float(dest.top)
        except Exception:  # a destination pypdf cannot place
            continue
        out[name.lstrip("/")] = (page, top)
    out.update(_marked_pages(reader))
    return out


FOOTER_TEXTS = 3   # the footer's text pieces: the page number, " / ", the page count


def blank_pages(data: bytes) -> list[int]:
    """The 1-based pages with nothing but the footer on them: no image and no text besides
    the footer's (something that overflowed a page by its margin alone, then a page break)."""
    import io
    import re

    from pypdf import PdfReader

    out = []
    for i, page in enumerate(PdfReader(io.BytesIO(data)).pages):
        content = page.get_contents()
        data_ = content.get_data() if content is not None else b""
        texts = len(re.findall(rb"\bT[jJ]\b", data_))
        if texts <= FOOTER_TEXTS and not re.search(rb"\bDo\b", data_):
            out.append(i + 1)
    return out


_TOKEN = re.compile(rb"<[0-9A-Fa-f\s]*>|\((?:\\.|[^\\)])*\)|\[|\]|/[^\s/\[\]()<>]+|"
                    rb"[-+]?\d*\.?\d+|[A-Za-z'\"*]+")


def _frames_and_marks(content: bytes):
    """From one page's content stream (Chromium's: rectangles, text, images under nested
    transforms): the filled grey rectangles as wide as a code block (a code block's or an
    output's frame) and the points where text or an image is drawn, in page coordinates."""
    frames, marks = [], []
    ctm, fill = (1, 0, 0, 1, 0, 0), None
    stack, args, tm, path = [], [], (1, 0, 0, 1, 0, 0), []

    def mul(m, n):
        a, b, c, d, e, f = m
        A, B, C, D, E, F = n
        return (a * A + b * C, a * B + b * D, c * A + d * C, c * B + d * D,
                e * A + f * C + E, e * B + f * D + F)

    def point(x, y, m):
        return (m[0] * x + m[2] * y + m[4], m[1] * x + m[3] * y + m[5])

    for tok in _TOKEN.findall(content):
        c = tok[:1]
        if c in b"-+.0123456789":
            args.append(float(tok))
            continue
        if c in b"</([]" :
            args.append(None)
            continue
        op = tok
        if op == b"q":
            stack.append((ctm, fill))
        elif op == b"Q" and stack:
            ctm, fill = stack.pop()
        elif op == b"cm" and len(args) >= 6:
            ctm = mul(tuple(args[-6:]), ctm)
        elif op == b"rg" and len(args) >= 3:
            fill = tuple(args[-3:])
        elif op in (b"m", b"l") and len(args) >= 2:
            path.append(point(args[-2], args[-1], ctm))
        elif op == b"c" and len(args) >= 6:
            path += [point(args[i], args[i + 1], ctm) for i in (-6, -4, -2)]
        elif op == b"re" and len(args) >= 4:
            x, y, w, h = args[-4:]
            path += [point(x, y, ctm), point(x + w, y + h, ctm)]
        elif op in (b"f", b"f*", b"F", b"B", b"B*", b"b", b"b*"):
            if path:
                xs, ys = [q[0] for q in path], [q[1] for q in path]
                grey = fill and 0.88 <= fill[0] <= 0.985 and max(fill) - min(fill) < 0.03
                if grey and max(xs) - min(xs) > 300 and max(ys) - min(ys) > 6:
                    frames.append((min(xs), min(ys), max(xs), max(ys)))
            path = []
        elif op in (b"n", b"S", b"s"):
            path = []
        elif op == b"Tm" and len(args) >= 6:
            tm = tuple(args[-6:])
        elif op == b"Td" and len(args) >= 2:
            tm = (*tm[:4], tm[4] + args[-2] * tm[0], tm[5] + args[-1] * tm[3])
        elif op in (b"Tj", b"TJ", b"'", b'"'):
            marks.append(point(tm[4], tm[5], ctm))
        elif op == b"Do":
            marks.append(point(0.5, 0.5, ctm))
        args = [] if op not in (b"[", b"]") else args
    return frames, marks


def empty_frames(data: bytes) -> list[int]:
    """The 1-based pages that hold a code or output frame with nothing drawn inside it (a
    block that moved on to the next page whole and left its frame behind)."""
    import io

    from pypdf import PdfReader

    out = []
    for i, page in enumerate(PdfReader(io.BytesIO(data)).pages):
        content = page.get_contents()
        frames, marks = _frames_and_marks(content.get_data() if content is not None else b"")
        if any(not any(x0 <= x <= x1 and y0 <= y <= y1 for x, y in marks)
               for x0, y0, x1, y1 in frames):
            out.append(i + 1)
    return out


def destination_pages(data: bytes, outline: list[dict], toc: list[str]) -> dict:
    """The 1-based page of each outline entry and of each contents entry's target, read from
    the named destinations Chromium writes for every link target (None: not found)."""
    import io

    from pypdf import PdfReader

    named = _named_pages(PdfReader(io.BytesIO(data)))
    return {"outline": [named.get(o["id"]) for o in outline],
            "toc": [named[t][0] + 1 if t and t in named else None for t in toc]}


def finish(body: bytes, numbers: bytes | None, outline: list[dict], places: list) -> bytes:
    """BODY with the contents' page numbers (NUMBERS: pages holding only them) laid over its
    first pages, and an outline of OUTLINE's entries (levels 1 to 3) at PLACES."""
    import io

    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import Fit

    logging.getLogger("pypdf").setLevel(logging.ERROR)   # Chromium's trailer: a harmless warning

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(body)))
    for page in writer.pages:   # the mark links have done their work
        annots = page.get("/Annots")
        if annots:
            keep = [a for a in annots if not ((_link_name(a.get_object()) or "").startswith(MARK)
                                              and a.get_object().get("/Subtype") == "/Link")]
            if len(keep) != len(annots):
                from pypdf.generic import ArrayObject, NameObject
                page[NameObject("/Annots")] = ArrayObject(keep)
    if numbers:
        for i, overlay in enumerate(PdfReader(io.BytesIO(numbers)).pages):
            writer.pages[i].merge_page(overlay)
    parents: dict[int, object] = {}
    for entry, place in zip(outline, places):
        level = entry["level"]
        if place is None or level > 3:
            continue
        parent = parents.get(level - 1) if level > 1 else None
        if level > 1 and parent is None:
            continue
        item = writer.add_outline_item(entry["title"], place[0], parent=parent,
                                       fit=Fit.xyz(top=place[1]))
        parents[level] = item
        for deeper in range(level + 1, 7):
            parents.pop(deeper, None)
    writer.page_mode = "/UseOutlines"
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 tasks.py pdf",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(ROOT),
                        help="the book's sources to print (this checkout)")
    parser.add_argument("--out", help="the PDF (ROOT/_build/pdf/scalebook.pdf)")
    parser.add_argument("--build-dir",
                        help="the folder whose _build/ gets the single-page site (ROOT, "
                             "beside the website, whose parsed pages it reuses)")
    parser.add_argument("--no-copy", action="store_true",
                        help="do not copy the PDF into _build/html")
    parser.add_argument("--report", help="write what the print found (outline, contents' "
                        "page numbers, blocks fitted) to this JSON file")
    parser.add_argument("--tagged", action="store_true",
                        help="a tagged (accessible) PDF: about 10 s longer to print and "
                             "twice the size (Chromium writes its structure uncompressed)")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    build_dir = Path(args.build_dir or root)
    browser = chromium()
    if browser is None:
        print("error: the PDF is printed by Chromium, which is not installed "
              "(Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    site = build_single_page(build_dir, root)
    pdf = Path(args.out or root / "_build" / "pdf" / PDF_NAME)
    report = print_pdf(site, pdf, browser, **({"tagged": True} if args.tagged else {}))
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1))
    problems = []
    if report["failed"]:
        problems.append(f"{report['failed']} formulas MathJax could not typeset")
    if report["broken_images"]:
        problems.append("images that did not load: " + ", ".join(report["broken_images"][:5]))
    if report.get("wide"):
        problems.append(f"{len(report['wide'])} blocks wider than the page would be cut: "
                        + "; ".join(report["wide"][:5]))
    if report.get("blank_pages"):
        problems.append(f"blank pages: {report['blank_pages'][:10]}")
    if report.get("empty"):
        problems.append(f"{len(report['empty'])} empty code frames: " + "; ".join(report["empty"][:5]))
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 1
    html = root / "_build" / "html"
    copy = html.is_dir() and not args.no_copy
    if copy:
        shutil.copy2(pdf, html / PDF_NAME)
    if report.get("toc_pages") is not None:
        print(f"{report['shrunk']} wide blocks shrunk to fit, {report['wrapped']} of them wrapped; "
              f"outline of {len(report['outline'])} headings; contents on "
              f"{report['toc_pages']} page(s)")
    print(f"PDF: {pdf} ({pdf.stat().st_size / 2**20:.1f} MiB, {report['formulas']} formulas)"
          + (f"; copied to {html / PDF_NAME}" if copy else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
