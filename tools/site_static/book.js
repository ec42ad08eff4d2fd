// The book's own script (tools/site_fixes.py adds it to every page).
// An inline formula wider than its paragraph (a long one, on a phone) scrolls inside itself
// instead of widening the page: MathJax 3 does not break inline maths over lines. Measured
// once MathJax has typeset the page, and again when the window changes width.
(function () {
  function fit() {
    document.querySelectorAll('.bd-article mjx-container:not([display="true"])').forEach((m) => {
      let box = m.parentElement;
      while (box && getComputedStyle(box).display.startsWith("inline")) box = box.parentElement;
      const math = m.firstElementChild;
      if (!box || !math) return;
      // the formula's own span (span.math, inline-flex in the theme) is what scrolls
      const holder = m.parentElement.matches("span.math") ? m.parentElement : m;
      holder.classList.toggle("mjx-wide", math.getBoundingClientRect().width > box.clientWidth);
    });
  }
  function start() {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(fit);
    }
  }
  document.addEventListener("DOMContentLoaded", start);
  window.addEventListener("resize", fit);
})();
