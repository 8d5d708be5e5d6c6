/* The book's own page behaviour, loaded on every page (Jupyter Book adds every .js file in _static/).
   tools/check_layout.py measures what each part is for; CONTRIBUTING.md, "Display equations" and
   "Figures", say why. Nothing here is needed to read a page: without JavaScript the page still works. */
(function () {
  "use strict";

  /* 1. The sidebar shows the current chapter (issue 39, item 6). The theme keeps the sidebar's scroll
     position from page to page, so after "Next" the current entry could sit below the fold. Scroll
     the sidebar itself (never the page) so that the current entry is in view, near the middle. */
  function showCurrentEntry() {
    const links = document.querySelectorAll(".bd-sidebar-primary a.current, .bd-sidebar-primary li.current > a");
    const current = links[links.length - 1];
    if (!current) return;
    let scroller = current.parentElement;
    while (scroller && scroller !== document.body) {
      const cs = getComputedStyle(scroller);
      if ((cs.overflowY === "auto" || cs.overflowY === "scroll") && scroller.scrollHeight > scroller.clientHeight) break;
      scroller = scroller.parentElement;
    }
    if (!scroller || scroller === document.body) return;
    const r = current.getBoundingClientRect(), s = scroller.getBoundingClientRect();
    if (r.height === 0) return;
    if (r.top < s.top || r.bottom > s.bottom) {
      scroller.scrollTop += r.top - s.top - (s.height - r.height) / 2;
    }
  }

  /* 2. Figures: every image in a cell's output opens full size on a tap, as a figure's image does
     (Sphinx links it to its file); under a figure shown at less than 3/4 of the width it was drawn
     for, one line says so (issue 39, item 1). */
  const HINT = "Tap the figure to open it full size.";
  function designedWidth(img) {
    return parseFloat(img.style.width) || parseFloat(img.getAttribute("width")) || img.naturalWidth || 0;
  }
  function linkImages() {
    document.querySelectorAll("article div.cell_output img").forEach((img) => {
      if (img.closest("a") || img.closest(".widget-subarea") || !img.src || img.src.startsWith("data:")) return;
      const a = document.createElement("a");
      a.href = img.src;
      a.className = "figure-fullsize";
      a.title = "Open the full-size image";
      img.parentNode.insertBefore(a, img);
      a.appendChild(img);
    });
  }
  function updateHints() {
    document.querySelectorAll("article figure img, article div.cell_output a.figure-fullsize > img").forEach((img) => {
      const link = img.closest("a");
      if (!link) return;
      const holder = link.parentElement;
      let hint = holder.querySelector(":scope > p.figure-hint");
      const small = img.clientWidth > 0 && img.clientWidth < 0.75 * Math.min(designedWidth(img), 717);
      if (small && !hint) {
        hint = document.createElement("p");
        hint.className = "figure-hint";
        hint.textContent = HINT;
        link.insertAdjacentElement("afterend", hint);
      } else if (!small && hint) {
        hint.remove();
      }
    });
  }

  /* 3. Display equations (issue 39, item 7): a formula wider than the room beside its number is
     scaled down to fit, to at most MIN_SCALE of its size; past that it scrolls in its own box. */
  const MIN_SCALE = 0.7;
  function fitEquations() {
    document.querySelectorAll("div.math > mjx-container[display='true']").forEach((box) => {
      if (box.dataset.baseSize === undefined) box.dataset.baseSize = box.style.fontSize || "100%";
      box.style.fontSize = box.dataset.baseSize;
      const math = box.querySelector("mjx-math");
      if (!math) return;
      const need = math.getBoundingClientRect().width, room = box.clientWidth;
      if (need > room + 1 && room > 0) {
        const scale = Math.max(MIN_SCALE, (room - 2) / need);
        box.style.fontSize = `calc(${box.dataset.baseSize} * ${scale.toFixed(3)})`;
        box.dataset.fitScale = scale.toFixed(3);
      } else {
        delete box.dataset.fitScale;
      }
    });
  }

  function layout() {
    updateHints();
    fitEquations();
  }
  let pending = null;
  window.addEventListener("resize", () => {
    clearTimeout(pending);
    pending = setTimeout(layout, 100);
  });
  function start() {
    linkImages();
    setTimeout(showCurrentEntry, 0);  // after the theme has restored the sidebar's scroll position
    layout();
    document.querySelectorAll("article img").forEach((img) => {
      if (!img.complete) img.addEventListener("load", updateHints, {once: true});
    });
    const mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(fitEquations).catch(() => null);
  }
  if (document.readyState === "complete") start();
  else window.addEventListener("load", start);
})();
