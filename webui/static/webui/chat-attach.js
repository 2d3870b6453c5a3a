// Attachments on the chat page: a text file (a log, a config, source code), chosen with "Attach" or
// dropped on the message box, is read here and put into the message being written as a fenced block
// named after the file (```app.log … ```), where it can be read and edited before it is sent, and where
// the context gauge counts it (chat.js). Nothing is uploaded on its own: it goes as part of the message.
// Refused, with the reason on the status line: an image (no vision model is supported), a file over the
// limit (#attach-file's data-max-bytes), a file that is not UTF-8 text (a NUL byte, or invalid UTF-8).
(function () {
  "use strict";
  const input = document.getElementById("attach-file");
  const button = document.getElementById("attach");
  const box = document.querySelector("#composer textarea[name=text]");
  const statusEl = document.getElementById("status");
  const MAX = Number(input.dataset.maxBytes);
  const IMAGE = /\.(png|jpe?g|gif|webp|avif|bmp|ico|tiff?|heic|heif)$/i; // an SVG is text: it may come

  function status(text, error) {
    statusEl.textContent = text;
    statusEl.classList.toggle("error", !!error);
  }

  function size(n) {
    // rounded up: a file a byte over 256 KB says 257
    return n < 1024 ? n + " bytes" : n < 10 * 1024 ? (n / 1024).toFixed(1) + " KB" : Math.ceil(n / 1024) + " KB";
  }

  function fenced(name, text) {
    // a fence longer than any run of backticks in the text; the name without spaces or backticks, so
    // that it is the fence's whole first word (its label, and its language by the extension)
    let longest = 0;
    for (const run of text.match(/`+/g) || []) longest = Math.max(longest, run.length);
    const ticks = "`".repeat(Math.max(3, longest + 1));
    const info = name.replace(/`/g, "").replace(/\s+/g, "_");
    return ticks + info + "\n" + text + (text.endsWith("\n") || !text ? "" : "\n") + ticks + "\n";
  }

  function insert(block) {
    // at the caret (a selection is replaced), on lines of its own
    const start = box.selectionStart;
    const before = box.value.slice(0, start);
    const lead = before && !before.endsWith("\n\n") ? (before.endsWith("\n") ? "\n" : "\n\n") : "";
    box.focus();
    box.setRangeText(lead + block + "\n", start, box.selectionEnd, "end");
    box.style.height = Math.min(box.scrollHeight + 2, innerHeight * 0.4) + "px"; // shows more of it (the CSSOM)
    box.dispatchEvent(new Event("input", { bubbles: true })); // the gauge counts it
  }

  async function attach(file) {
    if ((file.type.startsWith("image/") && file.type !== "image/svg+xml") || IMAGE.test(file.name)) {
      return status(file.name + ": images are not supported while no vision model is; attach a text file", true);
    }
    if (file.size > MAX) {
      return status(file.name + " is too large (" + size(file.size) + "): an attachment may be at most " + size(MAX), true);
    }
    const bytes = new Uint8Array(await file.arrayBuffer());
    let text = null;
    if (!bytes.includes(0)) {
      try {
        text = new TextDecoder("utf-8", { fatal: true }).decode(bytes); // a leading BOM is dropped
      } catch (e) {
        text = null;
      }
    }
    if (text === null) {
      const why = bytes.includes(0) ? "it holds NUL bytes" : "it is not valid UTF-8";
      return status(file.name + " is not a text file (" + why + "): only text can be attached, a log, a config, source code", true);
    }
    insert(fenced(file.name, text));
    status("Attached " + file.name + " (" + size(file.size) + ") to the message below");
  }

  button.hidden = false; // without this script there is nothing to attach with
  button.addEventListener("click", () => input.click());
  input.addEventListener("change", () => {
    if (input.files.length) attach(input.files[0]);
    input.value = ""; // the same file again is a change too
  });
  box.addEventListener("dragover", (e) => {
    if (e.dataTransfer.types.includes("Files")) e.preventDefault();
  });
  box.addEventListener("drop", (e) => {
    if (!e.dataTransfer.files.length) return;
    e.preventDefault();
    attach(e.dataTransfer.files[0]);
  });
})();
