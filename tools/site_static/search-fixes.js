// The site's search (tools/site_fixes.py adds this file to every page, before Sphinx's
// searchtools.js, which keeps a Scorer that is already defined).
// 1. Headings weigh more than API entries: a search for "FSDP" lists the chapter's section
//    "FSDP and ZeRO" before an attribute named fsdp_something (Sphinx's defaults: title 15,
//    object 11-26).
var Scorer = {
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: {0: 12, 1: 4, 2: -5},
  objPrioDefault: 0,
  title: 30,
  partialTitle: 15,
  term: 5,
  partialTerm: 2,
};
// 2. A result's snippet is taken from the page's text without the set-up cell (its code and
//    the line it prints open every chapter) and the "Open in Colab" badge.
document.addEventListener("DOMContentLoaded", () => {
  if (typeof Search === "undefined" || !Search.htmlToText) return;
  const htmlToText = Search.htmlToText;
  Search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll(".tag_setup").forEach((el) => el.remove());
    doc.querySelectorAll('img[src*="colab-badge"]').forEach((img) => (img.closest("p") || img).remove());
    return htmlToText(doc.documentElement.outerHTML, anchor);
  };
});
