// What the book check asks of one page once it has loaded, run inside the page.
// Returns {problems: [[element, problem], ...], links: [[element, href], ...],
// prev, next}: the hrefs of the footer's previous-page and next-page links, or null.
// Python resolves the links against the built files (bookcheck/pages.py).
async () => {
  const problems = [];
  const say = (el, what) => problems.push([describe(el), what]);

  // A name for an element that a reader of the failure can find on the page: its
  // tag and id, or its tag and first class and its place among those, and its first words.
  function describe(el) {
    if (!el || el === document) return "page";
    let name = el.tagName.toLowerCase();
    if (el.id) {
      name += "#" + el.id;
    } else {
      if (el.classList.length) name += "." + CSS.escape(el.classList[0]);
      const same = Array.from(document.querySelectorAll(name));
      if (same.length > 1) name += ` (${same.indexOf(el) + 1} of ${same.length})`;
    }
    const text = (el.textContent || el.getAttribute("src") || "").trim().replace(/\s+/g, " ");
    if (text) name += ` "${text.length > 60 ? text.slice(0, 57) + "..." : text}"`;
    return name;
  }

  // Collapsed content (solutions under "Show code cell content") is checked too.
  for (const d of document.querySelectorAll("details")) d.open = true;

  // Images: every one loaded, lazy ones included.
  const images = Array.from(document.images);
  for (const img of images) img.loading = "eager";
  await Promise.all(images.map((img) => img.decode().catch(() => null)));
  for (const img of images) {
    if (!(img.complete && img.naturalWidth > 0)) say(img, `image did not load (src ${img.getAttribute("src")})`);
  }

  // Formulas: MathJax typeset every one, and none is an error or left as raw TeX.
  const formulas = document.querySelectorAll(".math");
  if (formulas.length && !(window.MathJax && window.MathJax.startup)) {
    say(document, `MathJax did not load, ${formulas.length} formulas left as raw TeX`);
  } else {
    for (const el of formulas) {
      if (!el.querySelector("mjx-container")) say(el, "formula not typeset by MathJax");
    }
  }
  for (const err of document.querySelectorAll('mjx-merror, [data-mml-node="merror"]')) {
    const box = err.closest(".math") || err.closest("mjx-container") || err;
    const why = err.getAttribute("data-mjx-error") || err.textContent.trim();
    say(box, `MathJax error: ${why}`);
  }
  // MathJax's noundefined extension typesets an unknown macro as its name in red.
  for (const name of document.querySelectorAll('mjx-assistive-mml mtext[mathcolor="red"]')) {
    const text = name.textContent.trim();
    if (text.startsWith("\\")) say(name.closest(".math") || name, `MathJax does not know ${text}`);
  }
  const rawTeX = /\\[a-zA-Z]{2,}|\\\(|\\\[|\$\$|\$[^$\s][^$]*[\\^_{}][^$]*\$/;
  const notProse = "script, style, pre, code, kbd, textarea, mjx-container, .math";
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    if (!parent || parent.closest(notProse)) continue;
    const hit = node.textContent.match(rawTeX);
    if (hit) say(parent, `raw TeX in the text: ${JSON.stringify(hit[0])}`);
  }

  // Width at this window size: no box scrolls sideways or sticks out of the
  // content column, and the page itself does not scroll sideways.
  // MathJax's hidden copy of each formula for screen readers is laid out wider than
  // the visible one; it is never seen, so it is left out of the measurement.
  const unseen = document.head.appendChild(document.createElement("style"));
  unseen.textContent = "mjx-assistive-mml { display: none !important; }";
  const column = document.querySelector("article.bd-article, article, main") || document.body;
  const right = column.getBoundingClientRect().right;
  const boxes = "pre, table, figure, img, svg, video, iframe, .cell_output, div.math";
  const clips = (el) => ["auto", "scroll", "hidden"].includes(getComputedStyle(el).overflowX);
  const clipped = (el) => {
    for (let up = el.parentElement; up && up !== column; up = up.parentElement) {
      if (clips(up)) return true;
    }
    return false;
  };
  for (const el of column.querySelectorAll("*")) {
    if (el.closest("mjx-container") && el.tagName.toLowerCase() !== "mjx-container") continue;
    const style = getComputedStyle(el);
    if (style.display === "none" || style.visibility === "hidden") continue;
    if (clips(el) && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
      say(el, `scrolls sideways: content ${el.scrollWidth} px wide in a box of ${el.clientWidth} px`);
    } else if (el.matches(boxes)) {
      // A box inside one that scrolls is reported by that one, above.
      const out = el.getBoundingClientRect().right - right;
      if (out > 1 && !clipped(el)) say(el, `sticks out of the content column by ${Math.round(out)} px`);
    }
  }
  const page = document.documentElement;
  if (page.scrollWidth > page.clientWidth + 1) {
    say(document, `the page scrolls sideways: ${page.scrollWidth} px wide in a window of ${page.clientWidth} px`);
  }
  unseen.remove();

  // Links, for Python to resolve: every anchor, and the head's prev/next/index/search.
  const links = [];
  for (const a of document.querySelectorAll("a[href]")) {
    let name = describe(a);
    if (a.matches(".left-prev")) name = "previous-page link " + name;
    if (a.matches(".right-next")) name = "next-page link " + name;
    links.push([name, a.href]);
  }
  for (const l of document.querySelectorAll("link[rel=prev], link[rel=next], link[rel=index], link[rel=search]")) {
    links.push([`<link rel=${l.rel}>`, l.href]);
  }
  const nav = (selector) => {
    const a = document.querySelector(selector);
    return a ? a.href : null;
  };
  return { problems, links, prev: nav("a.left-prev"), next: nav("a.right-next") };
}
