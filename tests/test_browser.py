"""The built website in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright) opens every page from a server on 127.0.0.1 with every other address blocked.

Each page must load with no JavaScript error and no failed request to the local server,
render every formula (MathJax served by the build itself, so with no network), give every
image alt text that is not a file path, keep every code block and output within its column,
show every figure's smallest text at least 9 px tall, numbered by chapter and linked to its
full-size image, and point its Colab and repository links at the one URL in _config.yml. The intro, a chapter
and the hardware page are screenshot (desktop and phone width) into the test's temporary
folder, so a failure can be looked at.

Where Chromium or Playwright cannot be had the test is skipped with a loud reason in the
summary; under CI (CI=true) it fails instead.
"""

import functools
import http.server
import os
import re
import shutil
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import notebooks as nbtool  # noqa: E402

sys.path.pop(0)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SHOTS = ("book/intro.html", "notebooks/01_rooflines.html", "book/hardware.html")
WIDTHS = {"desktop": 1280, "phone": 390}
SKIP_PAGES = {"genindex.html", "search.html", "py-modindex.html"}   # Sphinx's generated lists


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def browser():
    why = None
    exe = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "Playwright is not installed (it is in requirements.lock)"
    if exe is None:
        why = "Chromium is not installed (Debian: apt-get install chromium; .ci/run does it)"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"BROWSER TEST CANNOT RUN IN CI: {why}")
        pytest.skip(f"BROWSER TEST NOT RUN: {why}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(built_site):
    html, result = built_site
    if result["returncode"] != 0:
        pytest.skip("the site did not build (tests/test_site.py says why)")
    handler = functools.partial(_QuietHandler, directory=str(html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", html
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def pages(html: Path) -> list[str]:
    """Every page of the book (not Sphinx's index lists, not the root's redirect)."""
    return sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html")
                  if p.name not in SKIP_PAGES and "_static" not in p.parts
                  and "_sources" not in p.parts
                  and 'http-equiv="refresh"' not in p.read_text(errors="replace").lower())


MEASURE = """() => {
  const wide = [];
  for (const el of document.querySelectorAll(
      '.bd-article div.highlight pre, .bd-article .cell_output, .bd-article .output')) {
    if (el.closest('.full-width')) continue;
    if (el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0) {
      wide.push((el.className || el.tagName) + ': ' + el.scrollWidth + ' > ' + el.clientWidth
                + ' px: ' + el.innerText.slice(0, 60).replace(/\\n/g, ' '));
    }
  }
  const wideMath = [];
  for (const el of document.querySelectorAll('.bd-article mjx-container[display="true"]')) {
    const inner = el.firstElementChild;
    const w = inner ? inner.getBoundingClientRect().width : el.scrollWidth;
    if (el.clientWidth > 0 && (w > el.clientWidth + 1 || el.scrollWidth > el.clientWidth + 1)) {
      const sec = el.closest('section');
      wideMath.push(Math.round(w) + ' > ' + el.clientWidth + ' px in section #'
                    + (sec ? sec.id : '?'));
    }
  }
  const article = document.querySelector('.bd-article');
  const page = document.documentElement;
  return {
    wide,
    wideMath,
    pageOverflow: page.scrollWidth - page.clientWidth,
    mathSource: document.querySelectorAll('.bd-article .math').length,
    mathRendered: document.querySelectorAll('.bd-article .math mjx-container').length,
    mathErrors: document.querySelectorAll('mjx-merror').length,
    rawTex: Array.from(document.querySelectorAll('.bd-article .math'))
      .filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 60)),
    noAlt: Array.from(document.querySelectorAll('img')).filter(
      i => !i.alt || !i.alt.trim() || /\\.(png|svg|jpe?g|gif)$/i.test(i.alt.trim())
    ).map(i => i.getAttribute('src') + ' alt=' + JSON.stringify(i.alt)),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    figures: Array.from(document.querySelectorAll('.bd-article figure img')).map(i => ({
      src: i.src, shown: i.getBoundingClientRect().width, natural: i.naturalWidth,
      link: i.closest('a') ? i.closest('a').href : null,
      number: (i.closest('figure').querySelector('.caption-number') || {}).textContent || '',
    })),
    article: !!article,
  };
}"""

WAIT_FOR_MATH = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  return !!window.MathJax;
}"""


def _watch(ctx, pg, local, where):
    """Route CTX's requests (only the local server answers; anything else is refused and
    noted) and collect PG's problems into WHERE["problems"] / WHERE["external"], which the
    caller points at the page being loaded."""
    def route(r):
        if r.request.url.startswith(local):
            r.continue_()
        else:   # no network: anything not on the local server is refused
            where["external"].add(r.request.url)
            r.abort()

    def note(text):
        where["problems"].append(f"{where['page']}: {text}")

    ctx.route("**/*", route)
    pg.on("pageerror", lambda e: note(f"JavaScript error: {e}"))
    pg.on("console", lambda m: m.type == "error" and not _blocked_message(m.text)
          and note(f"console error: {m.text}"))
    pg.on("requestfailed", lambda r: r.url.startswith(local) and note(
        f"request failed: {r.url} ({r.failure})"))
    pg.on("response", lambda r: r.url.startswith(local) and r.status >= 400 and note(
        f"HTTP {r.status} for {r.url}"))


def _load(pg, url):
    pg.goto(url, wait_until="load")
    pg.evaluate(WAIT_FOR_MATH)
    pg.wait_for_timeout(200)


def open_page(browser, base, page, width, problems, external):
    """PAGE in a context of its own (nothing cached from another page)."""
    ctx = browser.new_context(viewport={"width": width, "height": 900})
    pg = ctx.new_page()
    _watch(ctx, pg, base.rstrip("/"), {"page": page, "problems": problems,
                                       "external": external})
    _load(pg, base + page)
    return ctx, pg


def _blocked_message(text: str) -> bool:
    # Chromium logs each request that the test itself refused (external addresses).
    return "net::ERR_FAILED" in text or "net::ERR_BLOCKED" in text


def phone_page(page: str) -> bool:
    """The pages measured at phone width too: every chapter and solutions page, and the API
    reference (its index tables and long signatures)."""
    return page.startswith(("notebooks/", "solutions/", "book/api"))


@pytest.fixture(scope="module")
def measured(browser, server):
    """Every page at desktop width: (problems from loading it, its measurements); for the
    chapter and solutions pages also the measurements at phone width, taken in the same page
    after narrowing the window (the layout follows the width; MathJax typesets once, and its
    CHTML output does not depend on the width), which saves loading and typesetting each
    page twice. test_phone_width_and_screenshots loads pages at phone width from the start."""
    base, html = server
    out, phone = {}, {}
    # One browser tab for all the pages, as a reader clicking through the book has: the
    # theme's scripts, styles and fonts come from the cache after the first page (a fresh
    # context per page fetched and parsed them again: about half of this test's time).
    ctx = browser.new_context(viewport={"width": WIDTHS["desktop"], "height": 900})
    pg = ctx.new_page()
    where = {}
    _watch(ctx, pg, base.rstrip("/"), where)
    for page in pages(html):
        problems, external = [], set()
        where.update(page=page, problems=problems, external=external)
        pg.set_viewport_size({"width": WIDTHS["desktop"], "height": 900})
        _load(pg, base + page)
        out[page] = (problems, dict(pg.evaluate(MEASURE), external=sorted(external)))
        if phone_page(page):
            pg.set_viewport_size({"width": WIDTHS["phone"], "height": 900})
            pg.wait_for_timeout(100)
            phone[page] = pg.evaluate(MEASURE)
    ctx.close()
    return out, phone


def test_every_page_in_a_real_browser(measured):
    url, branch = nbtool.repository()
    gh = url.replace("https://github.com/", "")
    problems, formulas = [], 0
    for page, (loading, m) in measured[0].items():
        problems += loading
        formulas += m["mathRendered"]
        if m["pageOverflow"] > 1:
            problems.append(f"{page}: the page scrolls sideways by {m['pageOverflow']} px")
        if m["mathRendered"] < m["mathSource"] or m["rawTex"] or m["mathErrors"]:
            problems.append(f"{page}: {m['mathRendered']} of {m['mathSource']} formulas rendered"
                            f" ({m['mathErrors']} errors); raw TeX: {m['rawTex'][:3]}")
        for link in m["links"]:
            if "colab.research.google.com/github/" in link and \
                    not link.startswith(f"https://colab.research.google.com/github/{gh}/blob/{branch}/"):
                problems.append(f"{page}: Colab link not from _config.yml's URL: {link}")
            if link.startswith("https://github.com/") and "/scalebook" in link and \
                    not link.startswith(url):
                problems.append(f"{page}: repository link not _config.yml's URL: {link}")
    assert formulas > 100, f"only {formulas} formulas rendered in the whole book"
    assert not problems, "\n".join(problems[:60])


def test_nothing_is_fetched_from_the_network(measured):
    """The site works offline: no image (the Colab badge included), script, font or style is
    requested from anywhere but the site itself."""
    problems = [f"{page}: requested {url}" for page, (_, m) in measured[0].items()
                for url in m["external"]]
    assert not problems, "\n".join(problems[:40])


def test_no_page_scrolls_sideways_on_a_phone(measured):
    """At 390 px no chapter, solutions or API page is wider than the screen: long signatures,
    names in the API's index tables and inline code wrap (book.css)."""
    phone = measured[1]
    assert any(p.startswith("book/api/") for p in phone)
    problems = [f"{page}: scrolls sideways by {m['pageOverflow']} px"
                for page, m in phone.items() if m["pageOverflow"] > 1]
    assert not problems, "\n".join(problems[:40])


def test_every_figure_has_real_alt_text(measured):
    """tools/site_fixes.py gives a notebook's figure the description scalebook.setup() stored
    in its PNG; a figure whose alt is its file name means that chain broke."""
    problems = [f"{page}: image without real alt text: {a}"
                for page, (_, m) in measured[0].items() for a in m["noAlt"]]
    assert not problems, "\n".join(problems[:40])


# Every figure has its alt text (tools/site_fixes.py reads it from the PNG) and 88/100-character
# lines fit the desktop column (book.css); chapter 3's HLO listing and chapter 10's stored
# traceback are exempt from tests/test_width.py's limits but fit too. In the PDF nothing is
# cut either: tools/pdf.py fits each block (tests/test_pdf.py).
def test_figures_have_alt_text_and_code_fits_its_column(measured):
    problems = []
    for page, (_, m) in measured[0].items():
        problems += [f"{page}: image without real alt text: {a}" for a in m["noAlt"]]
        problems += [f"{page}: wider than its column: {w}" for w in m["wide"]]
    assert not problems, "\n".join(problems[:60])


def test_figure_text_is_at_least_9_px_as_rendered(measured, server):
    """The smallest text of each chapter figure as the page shows it at 1280 px: the font
    size of that text in the PNG's pixels (figure_report's points, which scalebook.setup()
    stores in the PNG, at the PNG's dpi) times the shown width over the PNG's own width
    (the column shrinks a figure wider than itself). Each figure is also numbered by its
    chapter (Fig. 5.1, 5.2, ...) and a click on it opens the full-size PNG."""
    import json
    from urllib.parse import unquote, urlparse

    sys.path.insert(0, str(ROOT / "tools"))
    import site_fixes
    sys.path.pop(0)
    from scalebook import plots

    base, html = server
    problems, seen = [], 0
    for page, (_, m) in measured[0].items():
        if not page.startswith("notebooks/"):
            continue
        chapter = int(page.split("/")[1][:2])
        for k, fig in enumerate(m["figures"], start=1):
            seen += 1
            name = f"{page} figure {k}"
            if fig["number"].strip() != f"Fig. {chapter}.{k}":
                problems.append(f"{name}: numbered {fig['number']!r}, not Fig. {chapter}.{k}")
            if fig["link"] != fig["src"]:
                problems.append(f"{name}: a click opens {fig['link']}, not the image")
            png = html / unquote(urlparse(fig["src"]).path).lstrip("/")
            report = site_fixes.png_text(png.read_bytes(), plots.REPORT_KEY)
            if not report or not fig["natural"]:
                problems.append(f"{name}: no figure report in {png.name} / not loaded")
                continue
            report = json.loads(report)
            png_dpi = 2 * report["dpi"]                      # stored at twice the dpi
            px = fig["shown"] / fig["natural"] * report["min_font_pt"] * png_dpi / 72
            if px < plots.MIN_TEXT_PX:
                problems.append(f"{name}: smallest text {report['smallest_text']!r} is "
                                f"{px:.1f} px ({fig['shown']:.0f} of {fig['natural']} px shown)")
    assert seen >= 30, f"only {seen} figures on the chapter pages"
    assert not problems, "\n".join(problems[:40])


def test_display_equations_fit_the_column(measured):
    """A display equation wider than the desktop column scrolls inside itself: break it
    over lines (aligned) instead."""
    problems = [f"{page}: display equation {w}"
                for page, (_, m) in measured[0].items() for w in m["wideMath"]]
    assert not problems, "\n".join(problems[:40])


def test_display_equations_fit_a_phone(measured):
    """At phone width too, on every chapter and solutions page."""
    phone = measured[1]
    assert len(phone) >= 20 and sum(m["mathRendered"] for m in phone.values()) > 100
    problems = [f"{page}: display equation {w}" for page, m in phone.items()
                for w in m["wideMath"]]
    assert not problems, "\n".join(problems[:40])


def test_phone_width_and_screenshots(browser, server, tmp_path):
    base, html = server
    problems, external = [], set()
    for page in SHOTS:
        for name, width in WIDTHS.items():
            ctx, pg = open_page(browser, base, page, width, problems, external)
            shot = tmp_path / f"{page.replace('/', '_').replace('.html', '')}_{name}.png"
            pg.screenshot(path=str(shot), full_page=True)
            m = pg.evaluate(MEASURE)
            ctx.close()
            if m["pageOverflow"] > 1:
                problems.append(f"{page} at {width} px: the page scrolls sideways by "
                                f"{m['pageOverflow']} px")
            assert shot.stat().st_size > 10_000, f"{shot} looks empty"
    print(f"\nscreenshots in {tmp_path}")
    assert not problems, "\n".join(problems) + f"\n(screenshots in {tmp_path})"


def test_maths_renders_with_the_network_off(browser, server):
    """The page's MathJax is the build's own copy: the formulas render though every address
    but the local server is refused."""
    base, html = server
    problems, external = [], set()
    ctx, pg = open_page(browser, base, "book/notation.html", 1280, problems, external)
    src = pg.evaluate("() => Array.from(document.scripts).map(s => s.src)")
    m = pg.evaluate(MEASURE)
    ctx.close()
    assert any(re.search(r"/_static/mathjax/tex-chtml\.js(\?v=\w+)?$", s) for s in src), src
    assert m["mathSource"] > 5 and m["mathRendered"] == m["mathSource"], m
    assert not problems, problems
