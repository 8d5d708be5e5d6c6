/* Search snippets without raw TeX (issue 49). Sphinx's search page (searchtools.js) builds each
   result's snippet from the text of the page's HTML, where MathJax has not run yet, so a snippet
   showed `\(d_k\)` or `\[ ... \]`. Here every formula in a snippet's text becomes plain text: the
   delimiters dropped, \frac{a}{b} written a/b, Greek letters and common symbols as characters,
   font and spacing commands dropped, any other command by its name. tools/check_browser.py runs
   searches on the built site and reports a snippet with TeX left in it (tests/test_site_browser.py). */
(() => {
  const SYMBOLS = {
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε", eta: "η", theta: "θ",
    kappa: "κ", lambda: "λ", mu: "μ", nu: "ν", pi: "π", rho: "ρ", sigma: "σ", tau: "τ", phi: "φ", psi: "ψ",
    omega: "ω", Gamma: "Γ", Delta: "Δ", Theta: "Θ", Lambda: "Λ", Sigma: "Σ", Phi: "Φ", Omega: "Ω",
    ell: "ℓ", infty: "∞", cdot: "·", cdots: "⋯", ldots: "…", dots: "…", times: "×", odot: "⊙", oplus: "⊕",
    le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠", neq: "≠", approx: "≈", sim: "∼", propto: "∝",
    to: "→", rightarrow: "→", leftarrow: "←", mapsto: "↦", in: "∈", sum: "Σ", prod: "∏", sqrt: "√",
    top: "ᵀ", mid: "|", partial: "∂", nabla: "∇", lfloor: "⌊", rfloor: "⌋", lceil: "⌈", rceil: "⌉",
    langle: "⟨", rangle: "⟩", pm: "±", circ: "∘",
  };
  // Commands that only choose a font, a size or a space: their argument (if any) is kept.
  const SILENT = /^(math[a-z]*|text[a-z]*|operatorname|boldsymbol|displaystyle|left|right|[bB]ig+[lr]?|widetilde|tilde|hat|bar|overline|quad|qquad|label|tag|nonumber|notag)$/;

  // A group that is one token needs no brackets: \sqrt{d_k} is √d_k, \frac{1}{\tau} is 1/τ.
  const group = (arg) => /^[\w\\.]+$/.test(arg.trim()) ? arg.trim() : `(${arg})`;
  const plain = (tex) => {
    let s = tex.replace(/\\(label|tag)\s*\{[^{}]*\}/g, "").replace(/\\(begin|end)\s*\{[^{}]*\}/g, " ");
    s = s.replace(/\\([A-Za-z]+)\s+(?=[\w\\])/g, (m, name) => SILENT.test(name) ? "" : m);  // \hat v: v
    for (let i = 0; i < 6; i++)  // innermost groups first: a root inside a fraction inside a fraction
      s = s.replace(/\\([A-Za-z]+)\s*\{([^{}]*)\}/g,
                    (m, name, arg) => name === "sqrt" ? "√" + group(arg) : SILENT.test(name) ? arg : m)
        .replace(/\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, (m, a, b) => `${group(a)}/${group(b)}`);
    s = s.replace(/\\([A-Za-z]+)/g, (m, name) => SYMBOLS[name] ?? (SILENT.test(name) ? "" : name));
    s = s.replace(/\\[,;:! ]|\\\\|&/g, " ").replace(/\\([{}_%#$|])/g, "$1");
    return s.replace(/[{}\\]/g, "").replace(/\s+/g, " ").replace(/([(√]) /g, "$1").replace(/ \)/g, ")").trim();
  };

  const untex = (text) => text
    .replace(/\$\$([\s\S]*?)\$\$/g, (m, tex) => plain(tex))
    .replace(/\\\[([\s\S]*?)\\\]/g, (m, tex) => plain(tex))
    .replace(/\\\(([\s\S]*?)\\\)/g, (m, tex) => plain(tex));

  // searchtools.js declares `Search` after this file is loaded: wrap its text extraction once the
  // page's scripts have run (before Search.init, which also waits for DOMContentLoaded).
  const wrap = () => {
    if (typeof Search === "undefined" || !Search.htmlToText || Search.htmlToText.untex) return;
    const original = Search.htmlToText;
    Search.htmlToText = (html, anchor) => untex(original(html, anchor));
    Search.htmlToText.untex = true;
  };
  window.companionUntex = untex;
  wrap();
  document.addEventListener("DOMContentLoaded", wrap);
})();
