// API keys page: the Copy button beside a new key.
(function () {
  "use strict";
  var button = document.getElementById("copy-key");
  if (!button) return;
  button.addEventListener("click", function () {
    var text = document.getElementById(button.dataset.copy).textContent;
    var done = function () { button.textContent = "Copied"; };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { select(text); });
    } else {
      select(text);
    }
    function select() { // plain HTTP on the LAN has no clipboard API: select the key for Ctrl+C
      var range = document.createRange();
      range.selectNodeContents(document.getElementById(button.dataset.copy));
      var sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      button.textContent = document.execCommand && document.execCommand("copy") ? "Copied" : "Selected: press Ctrl+C";
    }
  });
})();
