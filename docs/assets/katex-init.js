// Render the maths markup of pymdownx.arithmatex (generic mode: \( \) inline in a span,
// \[ \] display in a div; mkdocs.yml) with the KaTeX the site serves itself
// (docs/assets/katex/, no CDN). Runs on every page load, Material's instant loading included.
function renderArithmatex() {
  document.querySelectorAll(".arithmatex").forEach(function (element) {
    if (element.dataset.katex === "done") return;
    var tex = element.textContent.trim();
    var display = tex.startsWith("\\[");
    katex.render(tex.slice(2, -2), element, { displayMode: display, throwOnError: false });
    element.dataset.katex = "done";
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(renderArithmatex);
} else {
  document.addEventListener("DOMContentLoaded", renderArithmatex);
}
