// diffserve playground: the forms start from the model's own request defaults (its /v1/models card carries them
// once the model is loaded), so the first click draws what the model was made for (toy-shapes: 64x64), not a
// size written into the page.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const defaultsOf = (card) => (card && card.diffserve ? card.diffserve.defaults : undefined);

  async function fill(cards) {
    let defaults = defaultsOf(cards[0]);
    for (let tries = 0; !defaults && tries < 600; tries += 1) { // still loading: ask again each second
      await new Promise((resolve) => { setTimeout(resolve, 1000); });
      const resp = await window.diffservePlayground.api("/v1/models");
      if (resp.ok) defaults = defaultsOf((await resp.json()).data[0]);
    }
    if (!defaults) return;
    const [width, height] = (defaults.size || "x").split("x");
    const values = { width, height, steps: defaults.num_inference_steps, guidance: defaults.guidance_scale,
      "video-width": width, "video-height": height, "video-frames": defaults.num_frames,
      "video-fps": defaults.fps, "video-steps": defaults.num_inference_steps };
    for (const [id, value] of Object.entries(values)) {
      // A field the user already typed into keeps its value.
      if (value !== undefined && value !== null && value !== "" && $(id).value === "") $(id).value = String(value);
    }
    document.body.dataset.defaults = "filled";
  }

  document.addEventListener("diffserve:connected", (event) => { fill(event.detail || []).catch(() => {}); });
})();
