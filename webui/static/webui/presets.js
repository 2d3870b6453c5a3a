// A new chat's preset picker: choosing a preset fills the system prompt and sampling fields at once (the
// page's #preset-data: {key: {system, temperature, …, stop}}); without this script its Apply button loads
// /chat/?preset=KEY, which the server fills the same way. Fields a preset leaves out are emptied: the
// model's default, as on the server.
(function () {
  "use strict";
  const pick = document.getElementById("preset-pick");
  const data = document.getElementById("preset-data");
  if (!pick || !data) return;
  const presets = JSON.parse(data.textContent);
  const fields = Array.from(document.querySelectorAll("#new-chat [form=composer]"))
    .filter((el) => el.name && el.name !== "model");
  document.getElementById("preset-pick-apply").hidden = true;
  pick.addEventListener("change", () => {
    const p = presets[pick.value] || {};
    fields.forEach((el) => {
      const v = p[el.name];
      el.value = v === undefined || v === null ? "" : String(v);
    });
  });
})();
