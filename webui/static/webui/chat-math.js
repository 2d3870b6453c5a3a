// TeX math on the chat page. The rules that say which text is math are webui/chat/texmath.py's, written
// again here as a marked extension for the answer being streamed (the server renders stored messages
// with the Python ones; tests/appliance/browser/test_chat_math.py holds the two to the same cases). Both
// leave the TeX in <span class="math"> (`math display` for display math, a <div> for a block), and
// `typeset` renders those with KaTeX.
//
// KaTeX builds its output as DOM nodes (`katex.render`, HTML for the eye and MathML for screen readers):
// its inline styles are set through the CSSOM, which the page's Content-Security-Policy (style-src
// 'self') allows, where the same markup parsed from a string (`renderToString` into innerHTML) would lose
// every style="…". A few constructs set a style attribute instead (\pmb's and \fcolorbox's MathML, the
// SVG of \oiint), which the policy refuses: while KaTeX renders, such a setAttribute goes through the
// CSSOM (`cssomStyles`). Its error display is one of them; errors are shown here instead (the TeX, in
// red, the error as its title).
(function () {
  "use strict";
  // opener, closer, display; tried in this order at a `$` or a `\`
  const INLINE = [["$$", "$$", true], ["\\[", "\\]", true], ["\\(", "\\)", false], ["$", "$", false]];
  const BLOCK = [["$$", "$$"], ["\\[", "\\]"]];
  const SPACE = /\s/;
  const OPTIONS = { throwOnError: true, strict: "ignore", maxSize: 50, maxExpand: 1000 };
  const texOf = new WeakMap(); // a typeset element → its TeX

  function closing(src, start, closer) {
    // where `closer` first occurs from `start`, a backslash skipping the character after it; -1 if not,
    // or if a backtick comes first (inline math holds none, so a code span's `$` closes nothing)
    for (let i = start; i < src.length; ) {
      if (src.startsWith(closer, i)) return i;
      if (src[i] === "`") return -1;
      i += src[i] === "\\" ? 2 : 1;
    }
    return -1;
  }

  function inlineMath(src) {
    // the math that starts at src[0]: {tex, display, length}, else undefined
    for (const [opener, closer, display] of INLINE) {
      if (!src.startsWith(opener)) continue;
      const start = opener.length;
      if (opener === "$" && (start >= src.length || SPACE.test(src[start]) || src[start] === "$")) return;
      const stop = closing(src, start, closer);
      if (stop < 0) return;
      const after = stop + closer.length;
      if (opener === "$" && (SPACE.test(src[stop - 1]) || "0123456789".includes(src[after] || "x"))) return;
      const tex = src.slice(start, stop).trim();
      return tex ? { tex, display, length: after } : undefined;
    }
  }

  function blockMath(src) {
    // a block from src's first line: {tex, length}, else undefined
    const m = /^ {0,3}(\$\$|\\\[)/.exec(src);
    if (!m) return;
    const closer = BLOCK.find((b) => b[0] === m[1])[1];
    const lines = src.split("\n");
    const rest = lines[0].trimEnd().slice(m[0].length);
    const body = [];
    let n = 1;
    if (rest.endsWith(closer) && rest.length >= closer.length) {
      body.push(rest.slice(0, -closer.length)); // on one line: $$ x $$
    } else if (rest.includes(closer)) {
      return; // `$$x$$ and more`: a paragraph's
    } else {
      body.push(rest);
      for (;; n++) {
        if (n >= lines.length) return;
        const text = lines[n].trim();
        if (!text) return; // a blank line: no block
        if (text.endsWith(closer)) {
          body.push(text.slice(0, -closer.length));
          n++;
          break;
        }
        body.push(text);
      }
    }
    const tex = body.join("\n").trim();
    if (!tex) return;
    return { tex, length: lines.slice(0, n).join("\n").length + (n < lines.length ? 1 : 0) };
  }

  function escape(s) {
    return s.replace(/[&<>"']/g, (c) => "&#" + c.charCodeAt(0) + ";");
  }

  marked.use({
    extensions: [
      {
        name: "mathBlock",
        level: "block", // no `start`: like markdown-it's rule, it does not interrupt a paragraph
        tokenizer(src) {
          const b = blockMath(src);
          if (b) return { type: "mathBlock", raw: src.slice(0, b.length), tex: b.tex };
        },
        renderer: (t) => '<div class="math display">' + escape(t.tex) + "</div>\n",
      },
      {
        name: "math",
        level: "inline",
        start(src) {
          const i = src.search(/\$|\\[([]/);
          return i < 0 ? undefined : i;
        },
        tokenizer(src) {
          const m = inlineMath(src);
          if (m) return { type: "math", raw: src.slice(0, m.length), tex: m.tex, display: m.display };
        },
        renderer: (t) => '<span class="math' + (t.display ? " display" : "") + '">' + escape(t.tex) + "</span>",
      },
    ],
  });

  function key(el, tex) {
    return (el.classList.contains("display") ? "D" : "I") + tex;
  }

  function rendered(root) {
    // the typeset math under `root`, by TeX: `typeset` moves it into a new rendering of the same text
    const out = new Map();
    root.querySelectorAll(".math").forEach((el) => {
      if (!texOf.has(el)) return;
      const k = key(el, texOf.get(el));
      if (!out.has(k)) out.set(k, []);
      out.get(k).push(el);
    });
    return out;
  }

  function cssomStyles(render) {
    // run `render` with element.setAttribute("style", css) made element.style.cssText = css
    const setAttribute = Element.prototype.setAttribute;
    Element.prototype.setAttribute = function (name, value) {
      if (String(name).toLowerCase() === "style") this.style.cssText = value;
      else setAttribute.call(this, name, value);
    };
    try {
      render();
    } finally {
      Element.prototype.setAttribute = setAttribute;
    }
  }

  function typeset(root, reuse) {
    // KaTeX into every .math under `root` not typeset yet; `reuse`: `rendered`'s of the text before
    root.querySelectorAll(".math").forEach((el) => {
      if (texOf.has(el)) return;
      const tex = el.textContent;
      texOf.set(el, tex);
      const old = reuse && (reuse.get(key(el, tex)) || []).shift();
      if (old) {
        el.replaceChildren(...old.childNodes);
        return;
      }
      try {
        cssomStyles(() => katex.render(tex, el, { ...OPTIONS, displayMode: el.classList.contains("display") }));
      } catch (e) {
        el.textContent = tex;
        el.classList.add("math-error");
        el.title = e.message;
      }
    });
  }

  window.chatMath = { rendered, typeset, inlineMath, blockMath };
})();
