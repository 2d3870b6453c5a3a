// The chat page's script. The page works without it (its forms post and the server renders every
// message); with it the same forms go over the WebSocket (/ws/chat/, protocol in webui/consumers.py)
// and the answer streams. Only the message being written re-renders, at most once per animation frame:
// marked (with chat-math.js's rules for TeX), then DOMPurify with the server's own allow-list, then
// KaTeX (math already typeset in the frame before is moved, not typeset again) and highlight.js. Every
// code block gets a label (its language or file name) and a Copy button. The model's thinking
// (deltas of channel "reasoning") fills a collapsed "Thinking…" block above the answer, whose summary
// says how long it thought once the answer (or a tool call) begins; tool calls are built into the
// server's own markup (#tool-call-template) with text nodes only. When the answer ends the server's
// rendering of it replaces the streamed one. Data comes from #chat-config (json_script).
// Keys: Esc stops the answer, Ctrl+Shift+O opens a new chat, `/` goes to the search, `?` lists them
// (#shortcuts). The context gauge counts the message being written too, as an estimate
// (`BYTES_PER_TOKEN`), so an attached file (chat-attach.js) shows what it costs before it is sent.
(function () {
  "use strict";
  const config = JSON.parse(document.getElementById("chat-config").textContent);
  const $ = (sel, root) => (root || document).querySelector(sel);
  const list = $("#messages");
  const statusEl = $("#status");
  const stopBtn = $("#stop");
  // SmolLM2's tokenizer: 2.2 (a log) to 3.5 (Python, prose) bytes a token; rather more tokens than fewer
  const BYTES_PER_TOKEN = 2.5;
  const purify = {
    ALLOWED_TAGS: Object.keys(config.allowed),
    ALLOWED_ATTR: Array.from(new Set(Object.values(config.allowed).flat())),
  };
  const stats = (window.chatStats = { renders: 0, renderMs: [], lengths: [] }); // read by the browser tests
  let ws = null;
  let live = null; // the answer being written: {li, body, text, dirty, thinking, calls, scheduled}
  let busy = false;
  let signedOut = false; // the socket closed with 4401: the session ended (webui/socket_auth.py)

  // --- the socket ---------------------------------------------------------------------------------
  function connect() {
    ws = new WebSocket(location.protocol.replace("http", "ws") + "//" + location.host + "/ws/chat/");
    ws.addEventListener("message", (e) => onEvent(JSON.parse(e.data)));
    ws.addEventListener("close", (e) => {
      ws = null;
      if (e.code === 4401) {
        showSignedOut();
      } else if (busy) {
        setStatus("The connection to the board was lost; reload the page to see what was stored.", true);
        setBusy(false);
      }
    });
  }

  function send(msg) {
    if (signedOut) return showSignedOut();
    if (ws && ws.readyState === WebSocket.OPEN) {
      ws.send(JSON.stringify(msg));
      return;
    }
    if (!ws) connect();
    ws.addEventListener("open", () => ws.send(JSON.stringify(msg)), { once: true });
  }

  // --- what the page shows ------------------------------------------------------------------------
  function setStatus(text, error) {
    statusEl.textContent = text;
    statusEl.classList.toggle("error", !!error);
  }

  function showSignedOut() {
    signedOut = true;
    onError({ message: "" }); // what was streaming stays as far as it came
    const link = document.createElement("a");
    link.href = "/login/?next=" + encodeURIComponent(location.pathname);
    link.textContent = "sign in again";
    statusEl.replaceChildren("Signed out — ", link, ".");
  }

  function setBusy(on) {
    busy = on;
    stopBtn.hidden = !on;
    document.querySelectorAll("form[data-ws] button[type=submit]").forEach((b) => { b.disabled = on; });
  }

  function showControls(finish) {
    $("#regenerate").hidden = false;
    $("#continue").hidden = !(finish === "length" || finish === "cancelled");
  }

  function fromServer(html) {
    // a message the server rendered (and sanitized); its forms get this page's CSRF token
    const t = document.createElement("template");
    t.innerHTML = html;
    const el = t.content.firstElementChild;
    const token = $("input[name=csrfmiddlewaretoken]");
    el.querySelectorAll("form").forEach((f) => {
      if (token && !f.querySelector("input[name=csrfmiddlewaretoken]")) f.prepend(token.cloneNode());
    });
    decorate(el);
    return el;
  }

  function decorate(root) {
    // every code block (not a value in a tool call's table) in a div.code, as the server makes a fenced
    // one: its language or file name as a label, and a Copy button; then the math typeset
    root.querySelectorAll("pre").forEach((pre) => {
      if (pre.closest("td")) return;
      let wrap = pre.parentElement;
      if (!wrap.classList.contains("code")) {
        wrap = document.createElement("div");
        wrap.className = "code";
        const lang = language(pre.querySelector("code"));
        if (lang) {
          const label = wrap.appendChild(document.createElement("span"));
          label.className = "lang";
          label.textContent = lang;
        }
        pre.replaceWith(wrap);
        wrap.append(pre);
      }
      if (wrap.querySelector(":scope > button.copy")) return;
      const btn = document.createElement("button");
      btn.type = "button";
      btn.className = "copy";
      btn.textContent = "Copy";
      wrap.insertBefore(btn, pre);
    });
    chatMath.typeset(root);
  }

  function language(code) {
    // what a block's fence named: a language (python) or a file name (app.py); marked gives it as a class
    const m = code && /(?:^|\s)language-(\S+)/.exec(code.className);
    return m ? m[1] : "";
  }

  function highlight(code) {
    // highlight.js by the fence's language, or by a file name's extension, else as plain text
    const lang = language(code);
    if (lang && !hljs.getLanguage(lang)) {
      const ext = lang.includes(".") ? lang.split(".").pop() : "";
      code.classList.replace("language-" + lang, hljs.getLanguage(ext) ? "language-" + ext : "nohighlight");
    }
    hljs.highlightElement(code);
  }

  function copy(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    const ta = document.createElement("textarea"); // plain http on the LAN is no secure context
    ta.value = text;
    ta.setAttribute("readonly", "");
    ta.style.position = "fixed";
    ta.style.opacity = "0";
    document.body.append(ta);
    ta.select();
    document.execCommand("copy");
    ta.remove();
    return Promise.resolve();
  }

  function nearBottom() {
    const el = document.scrollingElement;
    return el.scrollHeight - el.scrollTop - el.clientHeight < 120;
  }

  function scrollDown() {
    const el = document.scrollingElement;
    el.scrollTop = el.scrollHeight;
  }

  // --- the answer being written -------------------------------------------------------------------
  function startAnswer(index, prefix, model, prefixReasoning) {
    const li = $("#answer-template").content.firstElementChild.cloneNode(true);
    li.dataset.index = index;
    li.id = "m" + index;
    $(".who", li).textContent = model;
    list.append(li);
    live = { li, body: $(".body", li), text: prefix || "", dirty: true, thinking: null, calls: [], scheduled: false };
    if (prefixReasoning) { // a continued answer's earlier thinking, shown as the server shows it
      const th = thinking();
      th.text = prefixReasoning;
      th.timed = false;
      endThinking();
    }
    schedule();
  }

  function thinking() {
    // the answer's thinking block, opened (but collapsed) at its first delta
    if (!live.thinking) {
      const details = $("details.thinking", live.li);
      details.hidden = false;
      details.classList.add("streaming");
      live.thinking = {
        details, summary: $("summary", details), body: $(".md", details),
        text: "", dirty: false, done: false, timed: true, t0: performance.now(),
      };
    }
    return live.thinking;
  }

  function endThinking() {
    const th = live && live.thinking;
    if (!th || th.done) return;
    th.done = true;
    th.details.classList.remove("streaming");
    if (th.timed) th.summary.textContent = "Thought for " + Math.max(1, Math.round((performance.now() - th.t0) / 1000)) + " s";
  }

  function toolCall(ev) {
    // a piece of a tool call: its name first, then its arguments' JSON text in pieces
    let call = live.calls[ev.index];
    if (!call) {
      const el = $("#tool-call-template").content.firstElementChild.cloneNode(true);
      $(".calls", live.li).append(el);
      call = live.calls[ev.index] = { el, args: "", dirty: true };
    }
    if (ev.name) $(".tool-name", call.el).textContent = ev.name;
    call.args += ev.arguments || "";
    call.dirty = true;
  }

  function fields(obj) {
    // an object as the server's key/value table (`_fields.html`): scalars as text, objects as JSON
    const table = document.createElement("table");
    table.className = "fields";
    const tbody = table.appendChild(document.createElement("tbody"));
    const entries = Object.entries(obj);
    for (const [key, value] of entries) {
      const tr = tbody.appendChild(document.createElement("tr"));
      tr.appendChild(document.createElement("th")).textContent = key;
      const td = tr.appendChild(document.createElement("td"));
      if (value !== null && typeof value === "object" && Object.keys(value).length) {
        const code = td.appendChild(document.createElement("pre")).appendChild(document.createElement("code"));
        code.className = "language-json";
        code.textContent = JSON.stringify(value, null, 2);
        hljs.highlightElement(code);
      } else {
        td.textContent = typeof value === "string" && value ? value : JSON.stringify(value);
      }
    }
    if (!entries.length) {
      const td = tbody.appendChild(document.createElement("tr")).appendChild(document.createElement("td"));
      const none = td.appendChild(document.createElement("span"));
      none.className = "muted";
      none.textContent = "no arguments";
    }
    return table;
  }

  function renderCall(call) {
    call.dirty = false;
    const args = $(".tool-args", call.el);
    let value;
    try {
      value = JSON.parse(call.args);
    } catch (e) {
      value = undefined; // not whole yet: its text so far
    }
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      args.replaceChildren(fields(value));
    } else {
      const pre = document.createElement("pre");
      pre.appendChild(document.createElement("code")).textContent = call.args;
      args.replaceChildren(pre);
    }
  }

  function schedule() {
    if (live && !live.scheduled) {
      live.scheduled = true;
      requestAnimationFrame(renderLive);
    }
  }

  function renderLive() {
    if (!live) return;
    live.scheduled = false;
    const t0 = performance.now();
    const follow = nearBottom();
    const th = live.thinking;
    if (th && th.dirty) {
      th.dirty = false;
      const math = chatMath.rendered(th.body);
      th.body.innerHTML = DOMPurify.sanitize(marked.parse(th.text), purify);
      chatMath.typeset(th.body, math);
    }
    if (live.dirty) {
      live.dirty = false;
      const math = chatMath.rendered(live.body);
      live.body.innerHTML = DOMPurify.sanitize(marked.parse(live.text), purify);
      chatMath.typeset(live.body, math);
      decorate(live.body); // labels from the fences' classes, before highlight.js changes them
      live.body.querySelectorAll("pre code").forEach(highlight);
    }
    live.calls.forEach((c) => { if (c.dirty) renderCall(c); });
    if (follow) scrollDown(); // reads the layout: the time below includes it
    stats.renderMs.push(performance.now() - t0);
    stats.lengths.push(live.text.length + (th ? th.text.length : 0));
    stats.renders += 1;
  }

  // --- events from the socket ---------------------------------------------------------------------
  function plural(n, word) {
    return n + " " + word + (n === 1 ? "" : "s");
  }

  function onEvent(ev) {
    switch (ev.t) {
      case "turn": return onTurn(ev);
      case "queued":
        return setStatus(ev.position === 0 ? "Next in line…" : plural(ev.position, "request") + " ahead…");
      case "loading": return setStatus("Loading " + ev.model + "…");
      case "start":
        markEdge(ev.edge || 0);
        return setStatus("Reading the prompt (" + plural(ev.prompt_tokens, "token") + ")…");
      case "prefill": return setStatus("prompt " + ev.done + " / " + ev.total);
      case "delta":
        if (live) {
          if (!live.started) setStatus("");
          live.started = true;
          if (ev.channel === "reasoning") {
            const th = thinking();
            th.text += ev.text;
            th.dirty = true;
          } else {
            endThinking();
            live.text += ev.text;
            live.dirty = true;
          }
          schedule();
        }
        return;
      case "tool_call":
        if (live) {
          if (!live.started) setStatus("");
          live.started = true;
          endThinking();
          toolCall(ev);
          schedule();
        }
        return;
      case "final": return onFinal(ev);
      case "error": return onError(ev);
    }
  }

  // where the model's view begins: before message `edge` (the worker left the ones ahead of it out of
  // the prompt to fit the context), with its "Summarize and continue" form: the server's marker
  // (_edge.html, in the page's #edge-template), which a reload renders in place
  function markEdge(edge) {
    const old = $("#context-edge");
    if (old) old.remove();
    const first = edge && list.querySelector('li.msg[data-index="' + edge + '"]');
    const template = $("#edge-template");
    if (!first || !template) return;
    first.before(template.content.firstElementChild.cloneNode(true));
  }

  function onTurn(ev) {
    if (config.session !== ev.session) { // the first answer of a new conversation
      config.session = ev.session;
      history.replaceState(null, "", "/chat/" + ev.session + "/");
      const settings = $("#new-chat");
      if (settings && ev.head) settings.replaceWith(fromServer(ev.head));
      const chats = $("#chat-list");
      if (chats && ev.item) {
        chats.querySelectorAll("li.muted, li[aria-current]").forEach((li) => {
          if (li.classList.contains("muted")) li.remove();
          else li.removeAttribute("aria-current");
        });
        chats.prepend(fromServer(ev.item));
      }
    }
    const from = ev.user ? ev.user.index : ev.index;
    list.querySelectorAll("li.msg").forEach((li) => {
      if (Number(li.dataset.index) >= from) li.remove();
    });
    if (ev.user) list.append(fromServer(ev.user.html));
    setStatus("Waiting for the worker…");
    startAnswer(ev.index, ev.prefix, ev.model, ev.prefix_reasoning);
    scrollDown();
  }

  function onFinal(ev) {
    if (live) {
      endThinking();
      const li = fromServer(ev.message.html);
      const was = live.thinking;
      const now = $("details.thinking", li);
      if (was && now) { // keep what the reader saw: the block as opened or closed, how long it thought
        now.open = was.details.open;
        $("summary", now).textContent = was.summary.textContent;
      }
      live.li.replaceWith(li);
      live = null;
    }
    if (ev.context && ev.context.context) {
      tokens.used = ev.context.used;
      tokens.context = ev.context.context;
      showTokens();
    }
    setStatus("");
    setBusy(false);
    showControls(ev.finish_reason);
  }

  function onError(ev) {
    if (live) {
      endThinking();
      if (!live.text && !live.thinking && !live.calls.length) live.li.remove();
      else live.li.classList.remove("streaming");
      live = null;
    }
    setStatus(ev.message, true);
    setBusy(false);
  }

  // --- the page's forms, keys and buttons ---------------------------------------------------------
  document.addEventListener("submit", (e) => {
    const form = e.target;
    if (form.matches("form.summarize")) { // a plain post that ends with the page reloaded: say it works
      if (busy) return e.preventDefault();
      setBusy(true);
      form.querySelector("button").textContent = "Summarizing…";
      return setStatus("The model is writing a summary of the earlier messages…");
    }
    if (!form.matches("form[data-ws]")) return;
    e.preventDefault();
    if (signedOut) return showSignedOut(); // the text typed stays in its box
    if (busy) return;
    const data = new FormData(form, e.submitter);
    const msg = { action: data.get("action") || "send", session: config.session };
    if (data.has("text")) msg.text = data.get("text");
    if (data.has("index")) msg.index = Number(data.get("index"));
    if ((msg.action === "send" || msg.action === "edit") && !(msg.text || "").trim()) return;
    if (!config.session) {
      msg.new = {};
      for (const [k, v] of data) {
        if (!["action", "text", "csrfmiddlewaretoken"].includes(k)) msg.new[k] = v;
      }
    }
    setBusy(true);
    setStatus("Sending…");
    send(msg);
    if (msg.action === "send") {
      const text = form.querySelector("textarea[name=text]");
      text.value = "";
      text.style.height = ""; // as tall as an attachment made it: back to its rows
      showTokens();
    }
  });

  document.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || e.shiftKey || e.isComposing) return;
    if (!e.target.matches("form[data-ws] textarea[name=text]")) return;
    e.preventDefault();
    e.target.form.requestSubmit();
  });

  document.addEventListener("click", (e) => {
    const btn = e.target.closest("button.copy");
    if (!btn) return;
    copy($("pre", btn.parentElement).innerText).then(() => {
      btn.textContent = "Copied";
      setTimeout(() => { btn.textContent = "Copy"; }, 1500);
    });
  });

  stopBtn.addEventListener("click", () => {
    send({ action: "stop" });
    setStatus("Stopping…");
  });

  const shortcuts = $("#shortcuts");
  function typing(el) {
    return el instanceof Element && !!el.closest("input, textarea, select, [contenteditable]");
  }
  document.addEventListener("keydown", (e) => {
    if (e.defaultPrevented || e.isComposing) return;
    if (e.key === "Escape") {
      if (busy && !stopBtn.hidden && !$("dialog[open]")) { // an open dialog takes its own Esc
        e.preventDefault();
        stopBtn.click();
      }
    } else if ((e.ctrlKey || e.metaKey) && e.shiftKey && !e.altKey && e.key.toLowerCase() === "o") {
      e.preventDefault();
      location.assign("/chat/");
    } else if (!(e.ctrlKey || e.metaKey || e.altKey) && !typing(e.target) && !$("dialog[open]")) {
      if (e.key === "/") {
        e.preventDefault();
        const search = $(".chats input[name=q]");
        $("#show-chats").checked = true; // on a phone the list (and its search) is folded away
        search.focus();
        search.select();
      } else if (e.key === "?") {
        e.preventDefault();
        shortcuts.showModal();
      }
    }
  });
  $("#shortcuts-open").hidden = false;
  $("#shortcuts-open").addEventListener("click", () => shortcuts.showModal());
  shortcuts.addEventListener("click", (e) => { if (e.target === shortcuts) shortcuts.close(); }); // the backdrop

  // --- tokens: the conversation's so far (the last answer's prompt and completion), and an estimate of
  // the message being written; in the gauge, or beside the new chat's model (until its first answer)
  const box = $("#composer textarea[name=text]");
  const tokens = { used: 0, context: 0, scheduled: false };
  if ($("#gauge")) {
    tokens.used = Number($("#gauge").getAttribute("value")) || 0;
    tokens.context = $("#gauge").max > 1 ? $("#gauge").max : 0; // max 1: the context is not known
  }
  function showTokens() {
    tokens.scheduled = false;
    const draft = box.value ? Math.ceil(new TextEncoder().encode(box.value).length / BYTES_PER_TOKEN) : 0;
    const total = tokens.used + draft;
    const over = tokens.context > 0 && total > tokens.context;
    const text = (draft ? " + ≈" + draft : "") + " / " + (tokens.context || "?") + " tokens" + (over ? ": too long" : "");
    const gauge = $("#gauge");
    if (gauge) {
      gauge.max = tokens.context || 1;
      gauge.value = total;
      $("#gauge-text").textContent = tokens.used + text;
      gauge.parentElement.classList.toggle("over", over);
    } else if ($("#model-info")) {
      $("#model-info").textContent = tokens.context ? "context " + tokens.context + " tokens" + (draft ? " · this message ≈" + draft + (over ? ": too long" : "") : "") : "";
      $("#model-info").classList.toggle("over", over);
    }
  }
  box.addEventListener("input", () => {
    if (!tokens.scheduled) {
      tokens.scheduled = true;
      requestAnimationFrame(showTokens);
    }
  });

  // the new chat's model picker: its context and its own sampling defaults beside the fields
  const picker = $("#id_model");
  function showDefaults() {
    const m = config.models[picker.value] || { defaults: {} };
    tokens.context = m.context || 0;
    showTokens();
    document.querySelectorAll("[data-default-for]").forEach((span) => {
      const v = m.defaults[span.dataset.defaultFor];
      span.textContent = v === undefined || v === null ? "" : "model default: " + v;
      const input = $("[name=" + span.dataset.defaultFor + "]");
      if (input) input.placeholder = v === undefined || v === null ? "default" : String(v);
    });
  }
  if (picker) {
    picker.addEventListener("change", showDefaults);
    showDefaults();
  }

  decorate(document);
  document.addEventListener("htmx:load", function (e) { decorate(e.detail.elt); }); // "load earlier" messages
  if (config.session) scrollDown();
  connect();
})();
