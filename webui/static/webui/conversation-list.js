// The chat page's conversation list: pin and unpin without leaving the page, pinned ones kept on top, and
// the bulk form's count of ticked conversations. Without this script the same forms post and the server
// redirects back; "Select" (a CSS toggle) shows the boxes and the bulk actions either way.
(function () {
  "use strict";
  const list = document.getElementById("chat-list");
  const bulk = document.getElementById("chat-bulk");
  if (!list) return;

  function lastPinned() {
    const pinned = list.querySelectorAll(":scope > li.pinned");
    return pinned.length ? pinned[pinned.length - 1] : null;
  }

  function place(li) {
    // pinned: to the top; not pinned: first after the pinned ones
    if (li.classList.contains("pinned")) list.prepend(li);
    else {
      const after = lastPinned();
      if (after) after.after(li);
      else list.prepend(li);
    }
  }

  function showPinned(li, on) {
    li.classList.toggle("pinned", on);
    const form = li.querySelector("form.pin");
    const title = li.querySelector(".item-text a").textContent;
    form.querySelector("input[name=pin]").value = on ? "0" : "1";
    const btn = form.querySelector("button");
    btn.setAttribute("aria-pressed", on ? "true" : "false");
    btn.title = on ? "Unpin" : "Pin to the top";
    btn.setAttribute("aria-label", (on ? "Unpin" : "Pin") + " “" + title + "”");
  }

  list.addEventListener("submit", (e) => {
    const form = e.target.closest("form.pin");
    if (!form) return;
    e.preventDefault();
    const li = form.closest("li");
    fetch(form.action, { method: "POST", body: new FormData(form), headers: { Accept: "application/json" } })
      .then((r) => r.json().then((body) => ({ ok: r.ok, body })))
      .then(({ ok, body }) => {
        if (!ok) throw new Error(body.error || "could not pin");
        showPinned(li, body.pinned);
        place(li);
      })
      .catch((err) => {
        const status = document.getElementById("status");
        if (status) {
          status.textContent = err.message;
          status.classList.add("error");
        } else form.submit(); // no status line on this page: the plain post says it
      });
  });

  // a conversation the chat script adds (a new chat's first answer) goes below the pinned ones, and the
  // list that was empty gets its "Select"
  new MutationObserver((changes) => {
    changes.forEach((ch) => ch.addedNodes.forEach((n) => {
      if (n.nodeType !== 1 || !n.matches("li[data-chat]")) return;
      document.querySelectorAll("#select-chats, label.select-chats").forEach((el) => { el.hidden = false; });
      if (!n.classList.contains("pinned") && n.nextElementSibling
          && n.nextElementSibling.classList.contains("pinned")) place(n);
    }));
  }).observe(list, { childList: true });

  if (!bulk) return;
  const count = document.getElementById("bulk-count");
  const buttons = bulk.querySelectorAll("button[name=action]");
  function counted() {
    const n = list.querySelectorAll("input.pick:checked").length;
    count.textContent = n ? n + " ticked:" : "Tick conversations, then:";
    buttons.forEach((b) => { b.disabled = !n; });
  }
  list.addEventListener("change", (e) => { if (e.target.matches("input.pick")) counted(); });
  document.getElementById("select-chats").addEventListener("change", (e) => {
    if (!e.target.checked) list.querySelectorAll("input.pick:checked").forEach((b) => { b.checked = false; });
    counted();
  });
  counted();
})();
