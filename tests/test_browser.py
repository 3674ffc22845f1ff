"""The built book as a reader sees it: every page of ``_build/html`` loaded in headless
Chromium with JavaScript on and every remote host blocked, as on a machine with no network.

For each page: every equation is typeset by the bundled MathJax (each math element holds MathJax's
output, no TeX error, no raw ``\\(``, ``\\[`` or ``$$`` left in the rendered text outside code), every
image loaded, the console logged no error, every internal link reaches an existing file and, where it
names one, an existing anchor. A full-page screenshot of each page is kept under
``_build/screenshots/`` for people to look at. A static check needs no browser: no page loads a
script, style sheet or image from a remote host.

Readability at a 1280 px window, with every hidden solution, dropdown and hidden input
opened: no code block (a cell's source, its printed output, a code block of the text) is wider than
the article column or scrolls sideways inside it, a table wider than the column scrolls inside its own
box instead of running past it, and glued values (myst-nb's ``span.pasted-text``) are set in
the weight of the sentence around them, not in bold.

What a student hits first, read at 1280 px and at a 400 px phone: no Markdown table left as
raw ``| a | b |`` text, no display equation clipped behind a scroll bar, no table header broken inside a
word ("STREA M"), and, on the phone, nothing widening the page past the screen.

Skipped where no book is built (``make book``) or where Chromium, chromedriver or selenium is
missing (Debian: ``apt-get install chromium chromium-driver``; ``.ci/run`` installs them).
"""

import base64
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"

if not (BOOK / "index.html").is_file():
    pytest.skip(f"no built book in {BOOK}: run make book first", allow_module_level=True)

pytestmark = pytest.mark.integration

PAGES = sorted(
    path.relative_to(BOOK).as_posix()
    for path in BOOK.rglob("*.html")
    if path.relative_to(BOOK).parts[0] not in ("_static", "_sources", "_images")
)
REDIRECT = re.compile(r'<meta http-equiv="refresh" content="0; url=([^"]+)"', re.IGNORECASE)
REDIRECTS = {page: m.group(1) for page in PAGES if (m := REDIRECT.search((BOOK / page).read_text()))}
"""Pages that only forward to another (the root index.html): their target must exist."""
CONTENT_PAGES = [page for page in PAGES if page not in REDIRECTS]

RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\\begin\{|\$[^$\n]*\\[A-Za-z]+[^$\n]*\$")
"""TeX that MathJax did not typeset: its delimiters, or a $...$ span holding a TeX command."""
MAX_SHOT_HEIGHT = 16384
"""Pixels: Chromium's largest capture; a longer page is cut at this height."""

BROWSER_FLAGS = (
    "--headless=new",
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
    "--force-device-scale-factor=1",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # no remote host resolves: the book must need none
    "--disable-background-networking",
    "--disable-extensions",
    "--no-first-run",
)

SETTLE = """
const done = arguments[arguments.length - 1];
(async () => {
  // The driver can hand over a page whose body is not parsed yet (seen as "reading 'cloneNode'" of null).
  for (let i = 0; (!document.body || document.readyState !== "complete") && i < 300; i++) {
    await new Promise(r => setTimeout(r, 100));
  }
  const hasMathJax = [...document.scripts].some(s => /mathjax/i.test(s.src));
  const ready = () => window.MathJax && MathJax.startup && MathJax.startup.promise;
  for (let i = 0; hasMathJax && !ready() && i < 300; i++) await new Promise(r => setTimeout(r, 100));
  if (ready()) await MathJax.startup.promise;
  const images = [...document.images];
  images.forEach(img => { img.loading = "eager"; });
  await Promise.all(images.map(img => img.decode().catch(() => null)));
  const text = document.body.cloneNode(true);
  text.querySelectorAll("pre, code, script, style, mjx-container, .highlight").forEach(e => e.remove());
  done({
    math: [...document.querySelectorAll("span.math, div.math")].map(
      e => ({tex: e.textContent.trim().slice(0, 80), typeset: e.querySelector("mjx-container") !== null})),
    texErrors: [...document.querySelectorAll("mjx-merror")].map(e => e.getAttribute("data-mjx-error")),
    text: text.textContent,
    images: images.length,
    broken: images.filter(img => !img.complete || img.naturalWidth === 0).map(img => img.getAttribute("src")),
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    ids: [...document.querySelectorAll("[id], a[name]")].map(e => e.id || e.getAttribute("name")),
  });
})().catch(error => done({failure: String(error)}));
"""
"""Wait for MathJax's first typesetting and for every image, then read what the reader sees."""

LAYOUT = """
const article = document.querySelector("article.bd-article") || document.querySelector("main") || document.body;
// Open what a reader can open: exercise solutions and dropdowns (sphinx-togglebutton hides them with a
// class), <details> blocks (hidden cell inputs, sphinx-design dropdowns).
document.querySelectorAll(".toggle-hidden").forEach(e => e.classList.remove("toggle-hidden"));
document.querySelectorAll("details").forEach(e => { e.open = true; });
const style = getComputedStyle(article);
const box = article.getBoundingClientRect();
const left = box.left + parseFloat(style.paddingLeft), right = box.right - parseFloat(style.paddingRight);
const where = element => {
  let heading = null;
  for (const h of article.querySelectorAll("h1, h2, h3, h4")) {
    if (h.compareDocumentPosition(element) & Node.DOCUMENT_POSITION_FOLLOWING) heading = h;
  }
  const title = heading ? heading.textContent.replace(/[#¶]/g, "").trim() : "top";
  return `under "${title.slice(0, 60)}": ${element.textContent.trim().replace(/\\s+/g, " ").slice(0, 60)}`;
};
const shown = element => element.getClientRects().length > 0;
const weight = element => parseInt(getComputedStyle(element).fontWeight, 10);
const scrollBox = element => {
  for (let a = element.parentElement; a && a !== article; a = a.parentElement) {
    if (["auto", "scroll"].includes(getComputedStyle(a).overflowX)) return a;
  }
  return null;
};
const outside = rect => rect.left < left - 1 || rect.right > right + 1;
const wide = [];
for (const element of article.querySelectorAll("pre")) {
  if (!shown(element)) continue;
  const rect = element.getBoundingClientRect();
  if (outside(rect) || element.scrollWidth > element.clientWidth + 1) {
    wide.push(`pre ${Math.round(Math.max(rect.width, element.scrollWidth))} px ` +
              `in a column of ${Math.round(right - left)} px, ${where(element)}`);
  }
}
for (const element of article.querySelectorAll("table")) {  // a wide table must scroll in its own box
  if (!shown(element)) continue;
  const holder = scrollBox(element);
  const rect = (holder || element).getBoundingClientRect();
  if (outside(rect)) {
    wide.push(`table ${Math.round(element.getBoundingClientRect().width)} px ` +
              `${holder ? "in a scroll box running" : "running"} past a column of ${Math.round(right - left)} px, ` +
              where(element));
  }
}
const bold = [...article.querySelectorAll("span.pasted-text")]
  .filter(e => shown(e) && weight(e) > weight(e.parentElement))
  .map(e => `${e.textContent.trim().slice(0, 40)} (weight ${weight(e)} in text of ${weight(e.parentElement)}), ` +
            where(e));
// Markdown tables the parser left as text: a paragraph or list item of "| a | b |" cells.
const rawPipes = [...article.querySelectorAll("p, li")]
  .filter(e => shown(e) && !e.closest("pre, code, table"))
  .filter(e => { const text = e.textContent.trim(); return text.startsWith("|") && (text.match(/\\|/g) || []).length >= 4; })
  .map(e => where(e));
// Display equations wider than their box (clipped behind a scroll bar) or than the column.
const clippedMath = [];
for (const element of article.querySelectorAll("div.math")) {
  if (!shown(element)) continue;
  const typeset = element.querySelector("mjx-container > mjx-math, mjx-container svg") || element;
  const width = Math.max(typeset.getBoundingClientRect().width, element.scrollWidth);
  if (width > element.clientWidth + 1 || outside(element.getBoundingClientRect())) {
    clippedMath.push(`${Math.round(width)} px in a box of ${element.clientWidth} px, ${where(element)}`);
  }
}
// Table headers broken inside a word ("STREA M"): a word whose text spans two lines. A hyphen or a slash
// may end a line, so words holding one are left out.
const brokenHeaders = [];
for (const header of article.querySelectorAll("th")) {
  if (!shown(header)) continue;
  const walker = document.createTreeWalker(header, NodeFilter.SHOW_TEXT);
  let node, broken = null;
  while (!broken && (node = walker.nextNode())) {
    for (const match of node.data.matchAll(/\\S+/g)) {
      if (/[-\\/]/.test(match[0])) continue;
      const range = document.createRange();
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
      if (tops.size > 1) { broken = match[0]; break; }
    }
  }
  if (broken) brokenHeaders.push(`"${broken}" ${where(header)}`);
}
// What makes the page wider than the window (outside any box that scrolls on its own).
const page = document.documentElement;
const widening = page.scrollWidth > window.innerWidth + 1 ? [...article.querySelectorAll("*")]
  .filter(e => shown(e) && e.getBoundingClientRect().right > window.innerWidth + 1 && !scrollBox(e)
               && ![...e.children].some(c => c.getBoundingClientRect().right > window.innerWidth + 1))
  .map(e => `${e.tagName.toLowerCase()} reaching ${Math.round(e.getBoundingClientRect().right)} px, ${where(e)}`) : [];
return {width: window.innerWidth, column: Math.round(right - left), wide: wide, bold: bold,
        glued: article.querySelectorAll("span.pasted-text").length, rawPipes: rawPipes, clippedMath: clippedMath,
        brokenHeaders: brokenHeaders, pageWidth: page.scrollWidth, widening: widening};
"""
"""Open every hidden block, then list what a reader at the window's width meets: code blocks wider than the
article column (or scrolling inside it), tables running past it, glued values set bolder than their sentence,
raw Markdown tables, clipped display equations, headers broken inside a word, and what widens the page."""
READING_WIDTH = 1280
"""Pixels: the window width the layout checks read the pages at (that of ``BROWSER_FLAGS``)."""
PHONE_WIDTH = 400
"""Pixels: a phone's screen, the second width the layout checks read the pages at."""


class _Assets(HTMLParser):
    """The URLs a page loads by itself: scripts, style sheets, icons, images, frames."""

    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img", "iframe", "source", "video", "audio") and attrs.get("src"):
            self.urls.append(attrs["src"])
        rel = attrs.get("rel") or ""
        if tag == "link" and attrs.get("href") and any(k in rel for k in ("stylesheet", "preload", "icon")):
            self.urls.append(attrs["href"])


@pytest.mark.parametrize("page", PAGES)
def test_no_remote_assets(page):
    assets = _Assets()
    assets.feed((BOOK / page).read_text())
    remote = [url for url in assets.urls if url.startswith("//") or urlsplit(url).scheme in ("http", "https")]
    assert not remote, f"{page} loads from remote hosts (fails with no network): {remote}"


@pytest.mark.parametrize("page", sorted(REDIRECTS))
def test_redirect_target_exists(page):
    target = (BOOK / page).parent / urldefrag(REDIRECTS[page]).url
    assert target.is_file(), f"{page} forwards to {REDIRECTS[page]}, which was not built"


def _which(*names: str) -> str | None:
    return next((path for path in map(shutil.which, names) if path), None)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium driven by selenium through Debian's chromedriver (no driver download)."""
    chromium, chromedriver = _which("chromium", "chromium-browser"), _which("chromedriver")
    if not (chromium and chromedriver):
        pytest.skip("no Chromium or chromedriver on PATH: apt-get install chromium chromium-driver (.ci/run does)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (requirements.txt)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in BROWSER_FLAGS + (f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=chromedriver))
    driver.set_page_load_timeout(120)
    driver.set_script_timeout(120)
    yield driver
    driver.quit()


def _screenshot(driver, path: Path) -> None:
    """Save a PNG of the whole page (up to ``MAX_SHOT_HEIGHT`` pixels tall) at ``path``: the window is
    made as tall as the page for the capture, so the layout is the one a reader scrolls through."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    height = min(int(size["height"]), MAX_SHOT_HEIGHT)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": int(size["width"]), "height": height, "deviceScaleFactor": 1, "mobile": False})
    try:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def _layout(driver, width: int = READING_WIDTH) -> dict:
    """The layout checks of ``LAYOUT`` read in a viewport exactly ``width`` pixels wide."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
    try:
        return driver.execute_script(LAYOUT)
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


@pytest.fixture(scope="module")
def visit(browser):
    """``visit(page)``: the page's state once loaded and settled (each page is loaded once)."""
    seen = {}

    def load(page: str) -> dict:
        if page not in seen:
            browser.get((BOOK / page).as_uri())
            state = browser.execute_async_script(SETTLE)
            assert "failure" not in state, f"{page}: {state.get('failure')}"
            state["console"] = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
            _screenshot(browser, SCREENSHOTS / Path(page).with_suffix(".png"))
            state["layout"] = _layout(browser)  # after the screenshot: it opens the hidden blocks
            state["phone"] = _layout(browser, PHONE_WIDTH)
            seen[page] = state
        return seen[page]

    return load


@pytest.mark.parametrize("page", CONTENT_PAGES)
def test_equations_typeset(visit, page):
    state = visit(page)
    untypeset = [math["tex"] for math in state["math"] if not math["typeset"]]
    assert not untypeset, f"{page}: {len(untypeset)} of {len(state['math'])} equations not typeset: {untypeset[:3]}"
    assert not state["texErrors"], f"{page}: MathJax could not typeset: {state['texErrors'][:5]}"
    raw = RAW_TEX.findall(state["text"])
    assert not raw, f"{page}: raw TeX in the rendered text: {raw[:5]}"


FIGURE_OUTPUTS = ("<Figure size", "<IPython.core.display.Image object>")
"""How a figure's output reads as text in a committed chapter (its PNG is stripped, see tools/strip_images.py)."""


def figures_in_chapter(page: str) -> int:
    """Figures the chapter behind ``page`` drew, counted in its committed outputs (0 for a page without one)."""
    source = ROOT / Path(page).with_suffix(".ipynb")
    if not source.is_file():
        return 0
    cells = json.loads(source.read_text())["cells"]
    return sum("".join(output.get("data", {}).get("text/plain", "")).startswith(FIGURE_OUTPUTS)
               for cell in cells for output in cell.get("outputs", []))


@pytest.mark.parametrize("page", CONTENT_PAGES)
def test_images_load(visit, page):
    state = visit(page)
    assert not state["broken"], f"{page}: {len(state['broken'])} of {state['images']} images did not load: {state['broken']}"
    expected = figures_in_chapter(page)  # every figure the chapter drew is on its page
    assert state["images"] >= expected, f"{page}: {state['images']} images on the page, the chapter drew {expected}"


@pytest.mark.parametrize("page", CONTENT_PAGES)
def test_no_console_errors(visit, page):
    assert not visit(page)["console"], f"{page}: console errors: {visit(page)['console']}"


@pytest.mark.parametrize("page", CONTENT_PAGES)
def test_internal_links_resolve(visit, page):
    broken = []
    for href in sorted(set(visit(page)["links"])):
        url, fragment = urldefrag(href)
        if urlsplit(url).scheme != "file":
            continue  # a remote link: the reader's browser follows it, this test has no network
        target = Path(unquote(urlsplit(url).path))
        if not target.is_relative_to(BOOK) or not target.is_file():
            broken.append(f"{href} (no such file in the book)")
        elif fragment and target.suffix == ".html":
            target_page = target.relative_to(BOOK).as_posix()
            if target_page in CONTENT_PAGES and unquote(fragment) not in visit(target_page)["ids"]:
                broken.append(f"{href} (no such anchor)")
    assert not broken, f"{page}: {len(broken)} broken internal links: {broken}"


@pytest.mark.parametrize("page", CONTENT_PAGES)
def test_tables_and_code_fit_the_column(visit, page):
    layout = visit(page)["layout"]
    assert layout["width"] == READING_WIDTH, f"{page}: read at {layout['width']} px, not {READING_WIDTH}"
    assert not layout["wide"], (f"{page}: {len(layout['wide'])} code blocks wider than the {layout['column']} px "
                                f"column or tables running past it at {READING_WIDTH} px: {layout['wide'][:5]}")


WIDTHS = {"layout": READING_WIDTH, "phone": PHONE_WIDTH}
"""The states ``visit`` reads a page's layout in, by the window width it was read at."""


@pytest.mark.parametrize("page", CONTENT_PAGES)
def test_no_raw_markdown_tables(visit, page):
    raw = visit(page)["layout"]["rawPipes"]
    assert not raw, f"{page}: {len(raw)} Markdown tables shown as raw | cells | text: {raw[:5]}"


@pytest.mark.parametrize("state", WIDTHS)
@pytest.mark.parametrize("page", CONTENT_PAGES)
def test_display_math_is_not_clipped(visit, page, state):
    clipped = visit(page)[state]["clippedMath"]
    assert not clipped, (f"{page}: {len(clipped)} display equations clipped at {WIDTHS[state]} px "
                         f"(break them over lines): {clipped[:5]}")


@pytest.mark.parametrize("state", WIDTHS)
@pytest.mark.parametrize("page", CONTENT_PAGES)
def test_table_headers_break_between_words(visit, page, state):
    broken = visit(page)[state]["brokenHeaders"]
    assert not broken, f"{page}: {len(broken)} table headers broken inside a word at {WIDTHS[state]} px: {broken[:5]}"


@pytest.mark.parametrize("page", CONTENT_PAGES)
def test_page_fits_a_phone(visit, page):
    phone = visit(page)["phone"]
    assert phone["width"] == PHONE_WIDTH, f"{page}: read at {phone['width']} px, not {PHONE_WIDTH}"
    assert phone["pageWidth"] <= PHONE_WIDTH + 1, (f"{page}: {phone['pageWidth']} px wide on a {PHONE_WIDTH} px "
                                                   f"screen, widened by {phone['widening'][:5]}")


@pytest.mark.parametrize("page", CONTENT_PAGES)
def test_glued_values_are_not_bold(visit, page):
    layout = visit(page)["layout"]
    assert not layout["bold"], f"{page}: glued values set bolder than their text: {layout['bold'][:5]}"
