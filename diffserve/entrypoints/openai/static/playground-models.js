// diffserve playground, model picker: a server may serve several models (GET /v1/models lists them). The picked
// model's card decides the tab (its diffserve.makes: images or videos) and the form's defaults, and every request
// names it. One model: no picker, the same page as before.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  let cards = [];

  function pick(id) {
    const card = cards.find((c) => c.id === id) || cards[0];
    if (!card) return;
    window.diffservePlayground.model = card.id;
    document.body.dataset.model = card.id;
    document.dispatchEvent(new CustomEvent("diffserve:model", { detail: card }));
  }

  function render(found) {
    cards = found;
    const picker = $("model-picker");
    const previous = picker.value;
    picker.replaceChildren(...cards.map((card) => {
      const option = document.createElement("option");
      option.value = card.id;
      const makes = card.diffserve && card.diffserve.makes === "videos" ? "video" : "image";
      option.textContent = `${card.id} (${makes})`;
      return option;
    }));
    if (cards.some((c) => c.id === previous)) picker.value = previous;
    $("model-field").hidden = cards.length < 2;
    pick(picker.value);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("model-picker").addEventListener("change", (event) => pick(event.target.value));
  });
  document.addEventListener("diffserve:connected", (event) => render(event.detail || []));
})();
