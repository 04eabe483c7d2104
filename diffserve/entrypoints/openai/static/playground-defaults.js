// diffserve playground: the forms start from the picked model's own request defaults (its /v1/models card carries
// them once the model is loaded), so the first click draws what the model was made for (toy-shapes: 64x64), not a
// size written into the page. Picking another model refills the forms from its defaults. The prompt starts from the
// model's first example prompt (its card's diffserve.example_prompts, from its marker file: the toy models know only
// their grammar), else the page's own neutral one.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const defaultsOf = (card) => (card && card.diffserve ? card.diffserve.defaults : undefined);
  let wanted = null; // the model whose defaults the forms should show
  let filledOnce = false;
  const offered = {}; // prompt box id -> the prompt this script last put there

  // The card's tab's prompt box takes its first example; a model switch replaces only a prompt the page put
  // there (or an emptied box), never one the user typed.
  function fillPrompt(card) {
    const info = card.diffserve || {};
    const box = $(info.makes === "videos" ? "video-prompt" : "prompt");
    const ours = box.id in offered ? offered[box.id] : box.defaultValue;
    if (box.value !== ours && box.value !== "") return;
    const examples = info.example_prompts || [];
    box.value = examples.length ? examples[0] : box.defaultValue;
    offered[box.id] = box.value;
  }

  async function defaultsFor(card) {
    let defaults = defaultsOf(card);
    for (let tries = 0; !defaults && tries < 600 && wanted === card.id; tries += 1) { // loading: ask each second
      await new Promise((resolve) => { setTimeout(resolve, 1000); });
      const resp = await window.diffservePlayground.api("/v1/models");
      if (resp.ok) defaults = defaultsOf((await resp.json()).data.find((c) => c.id === card.id));
    }
    return defaults;
  }

  async function fill(card) {
    wanted = card.id;
    delete document.body.dataset.defaults;
    const defaults = await defaultsFor(card);
    if (!defaults || wanted !== card.id) return; // another model was picked meanwhile
    const [width, height] = (defaults.size || "x").split("x");
    const values = { width, height, steps: defaults.num_inference_steps, guidance: defaults.guidance_scale,
      "video-width": width, "video-height": height, "video-frames": defaults.num_frames,
      "video-fps": defaults.fps, "video-steps": defaults.num_inference_steps };
    for (const [id, value] of Object.entries(values)) {
      // The first fill keeps what the user already typed; a model switch takes the new model's values.
      if (filledOnce || $(id).value === "") $(id).value = value === undefined || value === null ? "" : String(value);
    }
    filledOnce = true;
    document.body.dataset.defaults = "filled";
  }

  document.addEventListener("diffserve:model", (event) => {
    if (!event.detail) return;
    fillPrompt(event.detail);
    fill(event.detail).catch(() => {});
  });
})();
