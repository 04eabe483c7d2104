// diffserve playground: talks to the public HTTP API only (GET /v1/models, GET /v1/config,
// POST /v1/images/generations with "stream": true). No framework, no build step, no network but this origin.
"use strict";

(() => {
  const KEY_STORAGE = "diffserve.apiKey"; // sessionStorage only: gone when the tab closes
  const MAX_CARDS = 24;
  const $ = (id) => document.getElementById(id);
  let controller = null; // the AbortController of the generation in flight

  class AuthRequired extends Error {}

  const apiKey = () => sessionStorage.getItem(KEY_STORAGE) || "";

  function withAuth(headers) {
    const all = { ...(headers || {}) };
    if (apiKey()) all.Authorization = `Bearer ${apiKey()}`;
    return all;
  }

  // The message of an OpenAI-shaped error body; never a stack trace or an HTML page.
  async function errorMessage(resp) {
    try {
      const body = await resp.json();
      if (body && body.error && typeof body.error.message === "string") return body.error.message;
    } catch (_) { /* not JSON */ }
    return `HTTP ${resp.status} ${resp.statusText || ""}`.trim();
  }

  async function api(path, init = {}) {
    const resp = await fetch(path, { ...init, headers: withAuth(init.headers), cache: "no-store" });
    if (resp.status === 401) {
      const message = await errorMessage(resp);
      askForKey(apiKey() ? `The server refused this key: ${message}` : "");
      throw new AuthRequired(message);
    }
    return resp;
  }

  // The video tab (playground-video.js) calls the API through the same key handling.
  window.diffservePlayground = { api, errorMessage, AuthRequired };

  // --- API key -------------------------------------------------------------------------------------
  function askForKey(message) {
    $("key-panel").hidden = false;
    $("key-error").textContent = message;
    $("server-line").textContent = "This server needs an API key.";
    $("api-key").focus();
  }

  function onKeySubmit(event) {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) { $("key-error").textContent = "Enter the key."; return; }
    sessionStorage.setItem(KEY_STORAGE, key);
    $("api-key").value = "";
    $("key-error").textContent = "";
    $("key-panel").hidden = true;
    $("forget-key").hidden = false;
    connect();
  }

  function forgetKey() {
    sessionStorage.removeItem(KEY_STORAGE);
    $("forget-key").hidden = true;
    connect();
  }

  // --- server info and config ----------------------------------------------------------------------
  async function connect() {
    try {
      const models = await api("/v1/models");
      if (!models.ok) throw new Error(await errorMessage(models));
      const cards = (await models.json()).data;
      const ids = cards.map((m) => m.id);
      $("server-line").textContent = `Model: ${ids.join(", ")}`;
      $("forget-key").hidden = !apiKey();
      document.dispatchEvent(new CustomEvent("diffserve:connected", { detail: cards }));
      await loadConfig();
    } catch (err) {
      if (!(err instanceof AuthRequired)) $("server-line").textContent = `Server unreachable: ${err.message}`;
    }
  }

  async function loadConfig() {
    const resp = await api("/v1/config");
    if (resp.status === 503) { // still loading: poll, like a client of /ready would
      $("config-summary").textContent = `${await errorMessage(resp)} (retrying)`;
      setTimeout(() => loadConfig().catch(() => {}), 1000);
      return;
    }
    if (!resp.ok) { $("config-summary").textContent = await errorMessage(resp); return; }
    renderConfig(await resp.json());
  }

  function cell(row, tag, text, cls) {
    const el = document.createElement(tag);
    el.textContent = text;
    if (cls) el.className = cls;
    row.appendChild(el);
    return el;
  }

  const show = (v) => (typeof v === "string" ? v : JSON.stringify(v));

  function configTable(caption, fields) {
    const table = document.createElement("table");
    table.createCaption().textContent = caption;
    const head = table.createTHead().insertRow();
    for (const name of ["Key", "Value", "Source", "Location"]) cell(head, "th", name).scope = "col";
    const body = table.createTBody();
    for (const [key, entry] of Object.entries(fields)) {
      const row = body.insertRow();
      row.dataset.key = key;
      cell(row, "th", key).scope = "row";
      cell(row, "td", show(entry.value));
      cell(row, "td", entry.source, `source-${entry.source}`);
      cell(row, "td", entry.location == null ? "" : String(entry.location));
    }
    return table;
  }

  function renderConfig(doc) {
    const files = (doc.deploy_files || []).join(", ") || "none";
    $("config-summary").textContent =
      `Fingerprint ${doc.fingerprint} · platform ${doc.platform} · model ${doc.model || "built-in demo"} · deploy files: ${files}`;
    const box = $("config");
    box.replaceChildren(configTable("Server and pipeline", doc.pipeline || {}));
    for (const stage of doc.stages || []) box.appendChild(configTable(`Stage ${stage.stage_id}`, stage.fields));
    for (const warning of doc.warnings || []) cell(box, "p", `Warning: ${warning}`, "error");
  }

  // --- generation ----------------------------------------------------------------------------------
  const numberField = (id) => ($(id).value.trim() === "" ? undefined : Number($(id).value));

  // The request as JSON text. A seed of digits is written verbatim: seeds go up to 2^63-1, past the
  // integers a JS number holds exactly. Anything else typed there is sent as a string for the server to refuse.
  function requestJSON() {
    const body = { prompt: $("prompt").value, stream: true };
    if (window.diffservePlayground.model) body.model = window.diffservePlayground.model;
    const width = $("width").value.trim();
    const height = $("height").value.trim();
    if (width || height) body.size = `${width}x${height}`;
    for (const [field, id] of [["n", "n"], ["num_inference_steps", "steps"], ["guidance_scale", "guidance"]]) {
      const value = numberField(id);
      if (value !== undefined) body[field] = value;
    }
    const loras = lorasField();
    if (loras.length) body.loras = loras;
    if (previewCount() > 0) body.partial_images = previewCount();
    const seed = $("seed-random").checked ? "" : $("seed").value.trim();
    if (seed !== "" && !/^[0-9]+$/.test(seed)) body.seed = seed;
    const json = JSON.stringify(body);
    return seed !== "" && /^[0-9]+$/.test(seed) ? `${json.slice(0, -1)},"seed":${seed}}` : json;
  }

  // Partial images asked for: the stream then comes in OpenAI's shape (partial_image, completed events).
  const previewCount = () => numberField("previews") || 0;

  // "name:scale, name" -> [{name, scale}] (scale 1 when absent).
  const lorasField = () => $("loras").value.split(",").map((s) => s.trim()).filter(Boolean).map((item) => {
    const cut = item.lastIndexOf(":");
    const scale = cut > 0 ? Number(item.slice(cut + 1)) : NaN;
    return Number.isFinite(scale) ? { name: item.slice(0, cut), scale } : { name: item, scale: 1 };
  });

  // An edit: the same fields as multipart for /v1/images/edits (the size is the image's). Seeds go as text.
  function editForm() {
    const form = new FormData();
    form.append("image", $("edit-image").files[0]);
    if (window.diffservePlayground.model) form.append("model", window.diffservePlayground.model);
    form.append("prompt", $("prompt").value);
    form.append("stream", "true");
    for (const [field, id] of [["n", "n"], ["num_inference_steps", "steps"], ["guidance_scale", "guidance"],
      ["strength", "strength"]]) {
      const value = $(id).value.trim();
      if (value !== "") form.append(field, value);
    }
    const seed = $("seed-random").checked ? "" : $("seed").value.trim();
    if (seed !== "") form.append("seed", seed);
    const loras = lorasField();
    if (loras.length) form.append("loras", JSON.stringify(loras));
    if (previewCount() > 0) form.append("partial_images", String(previewCount()));
    return form;
  }

  function setProgress(step, total) {
    const bar = $("progress");
    bar.max = Math.max(total, 1);
    bar.value = step;
    bar.setAttribute("aria-valuetext", `step ${step} of ${total}`);
    $("progress-text").textContent = total ? `step ${step} / ${total}` : "waiting for the first step";
  }

  function setBusy(busy) {
    $("generate").disabled = busy;
    $("stop").disabled = !busy;
    if (!busy && document.activeElement === $("stop")) $("generate").focus();
  }

  const status = (text) => { $("status").textContent = text; };
  const showError = (text) => { $("error").textContent = text; };

  async function generate(event) {
    event.preventDefault();
    if (controller) return;
    showError("");
    const json = requestJSON();
    const prompt = $("prompt").value;
    controller = new AbortController();
    setBusy(true);
    setProgress(0, 0);
    status("Submitted; waiting in the queue…");
    try {
      const editing = $("edit-image").files.length > 0;
      const resp = editing
        ? await api("/v1/images/edits", { method: "POST", body: editForm(), signal: controller.signal })
        : await api("/v1/images/generations", {
          method: "POST", headers: { "Content-Type": "application/json" },
          body: json, signal: controller.signal,
        });
      if (!resp.ok) { status(""); showError(await errorMessage(resp)); return; }
      await readStream(resp, prompt);
    } catch (err) {
      if (err.name === "AbortError") {
        status("Stopped: the stream was closed, so the server aborted the request.");
        $("progress-text").textContent += " (stopped)";
      } else if (!(err instanceof AuthRequired)) {
        status("");
        showError(err.message || String(err));
      }
    } finally {
      controller = null;
      setBusy(false);
    }
  }

  function stop() {
    if (controller) controller.abort();
  }

  // The stream, in either shape (playground-stream.js); a request that ended without a result is an error.
  async function readStream(resp, prompt) {
    const ended = await window.diffserveStream.read(resp, (event) => handleEvent(event, prompt));
    if (!ended) showError("The stream ended before a result arrived.");
  }

  // True once the request has ended (a result or an error).
  function handleEvent(event, prompt) {
    if (/^image_(generation|edit)\.partial_image$/.test(event.type)) {
      window.diffserveStream.showPreview(event, previewCount());
      status(`Denoising: partial image ${event.partial_image_index + 1} of ${previewCount()}…`);
      return false;
    }
    if (event.type === "progress") {
      setProgress(event.step, event.total_steps);
      status(`Denoising ${event.request_id}…`);
      return false;
    }
    if (event.type === "result") {
      const steps = event.diffserve.num_inference_steps;
      setProgress(steps, steps);
      addResults(event, prompt);
      status(`Done: ${event.data.length} image(s), ${Number(event.diffserve.timings_ms.total).toFixed(0)} ms.`);
      return true;
    }
    if (event.type === "error") {
      status("");
      showError(event.error && event.error.message ? event.error.message : "the server reported an error");
      return true;
    }
    return false;
  }

  // --- gallery -------------------------------------------------------------------------------------
  const b64ToBlob = (b64, type) => window.diffserveStream.b64ToBlob(b64, type);

  const counts = (byBackend) => Object.entries(byBackend || {}).map(([b, c]) => `${b} × ${c}`).join(", ") || "none";

  function addField(dl, name, label, text) {
    cell(dl, "dt", label);
    cell(dl, "dd", text).dataset.field = name;
  }

  function addResults(result, prompt) {
    const info = result.diffserve;
    const att = info.attestation || {};
    const timings = Object.entries(info.timings_ms).map(([k, v]) => `${k} ${Number(v).toFixed(1)} ms`).join(", ");
    const gallery = $("gallery");
    const cards = document.createDocumentFragment(); // newest request first, its images in order
    $("gallery-empty").hidden = true;
    result.data.forEach((item, index) => {
      const seed = info.seeds[index];
      const url = URL.createObjectURL(b64ToBlob(item.b64_json, `image/${result.output_format}`));
      const card = document.createElement("li");
      card.className = "card";
      card.dataset.requestId = info.request_id;
      const img = document.createElement("img");
      img.src = url;
      img.alt = `Generated image ${index + 1} of ${result.data.length} for "${prompt}", seed ${seed}`;
      card.appendChild(img);
      const dl = document.createElement("dl");
      // An AR stage (kind: ar) rewrote the prompt: what the image was drawn from.
      if (item.revised_prompt) addField(dl, "revised-prompt", "Revised prompt", item.revised_prompt);
      addField(dl, "seed", "Seed", String(seed));
      addField(dl, "size", "Size", result.size);
      addField(dl, "steps", "Steps", String(info.num_inference_steps));
      addField(dl, "timings", "Timings", timings);
      addField(dl, "linear", "Linear", counts(att.linear));
      addField(dl, "attention", "Attention", counts(att.attention));
      if (att.lora) {
        const used = att.lora.adapters.map((a) => `${a.name} x${a.scale}`).join(", ");
        addField(dl, "lora", "LoRA", `${used} (${att.lora_linear_calls ?? 0} patched linear calls)`);
      }
      addField(dl, "executor", "Executor", String(att.executor ?? "?"));
      addField(dl, "replica", "Replica", String(att.replica ?? "?"));
      addField(dl, "worker", "Worker", `pid ${att.worker_pid ?? "?"}, rank ${att.rank ?? "?"}, ${att.device ?? "?"}`);
      addField(dl, "fingerprint", "Config fingerprint", info.config_fingerprint);
      addField(dl, "request", "Request", info.request_id);
      card.appendChild(dl);
      const links = document.createElement("div");
      links.className = "links";
      const link = document.createElement("a");
      link.href = url;
      link.download = `diffserve-${seed}.${result.output_format}`;
      link.textContent = `Download (seed ${seed})`;
      links.appendChild(link);
      const reuse = document.createElement("button");
      reuse.type = "button";
      reuse.textContent = "Use this seed";
      reuse.addEventListener("click", () => useSeed(seed));
      links.appendChild(reuse);
      card.appendChild(links);
      cards.appendChild(card);
    });
    gallery.prepend(cards);
    while (gallery.children.length > MAX_CARDS) {
      const old = gallery.lastElementChild;
      URL.revokeObjectURL(old.querySelector("img").src);
      old.remove();
    }
  }

  function useSeed(seed) {
    $("seed-random").checked = false;
    $("seed").disabled = false;
    $("seed").value = String(seed);
    $("n").value = "1";
    $("seed").focus();
  }

  function onRandomToggle() {
    $("seed").disabled = $("seed-random").checked;
    if (!$("seed").disabled) $("seed").focus();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("key-form").addEventListener("submit", onKeySubmit);
    $("forget-key").addEventListener("click", forgetKey);
    $("generate-form").addEventListener("submit", generate);
    $("stop").addEventListener("click", stop);
    $("seed-random").addEventListener("change", onRandomToggle);
    document.addEventListener("keydown", (e) => { if (e.key === "Escape" && controller) stop(); });
    connect();
  });
})();
