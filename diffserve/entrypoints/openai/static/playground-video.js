// diffserve playground, video tab: shown when the server's model makes videos. A video is a job: POST /v1/videos
// (multipart, as OpenAI's SDK sends it), poll GET /v1/videos/{id} for status and progress, then fetch the MP4
// with the API key and play it from a blob: URL (a <video> element cannot send the key itself).
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const POLL_MS = 300;
  let busy = false;
  let shown = null; // the blob URL playing now

  const lib = () => window.diffservePlayground;
  const status = (text) => { $("video-status").textContent = text; };
  const showError = (text) => { $("video-error").textContent = text; };

  function setProgress(percent, text) {
    $("video-progress").value = percent;
    $("video-progress").setAttribute("aria-valuetext", `${percent}%`);
    $("video-progress-text").textContent = text;
  }

  // A video model (its /v1/models card says it makes videos) gets this tab instead of the image form.
  function detect(card) {
    const videos = Boolean(card && card.diffserve && card.diffserve.makes === "videos");
    $("video-panel").hidden = !videos;
    $("generate-panel").hidden = videos;
  }

  function form() {
    const body = new FormData();
    body.append("prompt", $("video-prompt").value);
    if (lib().model) body.append("model", lib().model);
    const width = $("video-width").value.trim();
    const height = $("video-height").value.trim();
    if (width || height) body.append("size", `${width}x${height}`);
    for (const [field, id] of [["num_frames", "video-frames"], ["fps", "video-fps"],
      ["num_inference_steps", "video-steps"], ["seed", "video-seed"]]) {
      const value = $(id).value.trim();
      if (value !== "") body.append(field, value);
    }
    if ($("video-image").files[0]) body.append("input_reference", $("video-image").files[0]);
    return body;
  }

  const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

  async function poll(id) {
    for (;;) {
      const resp = await lib().api(`/v1/videos/${encodeURIComponent(id)}`);
      if (!resp.ok) throw new Error(await lib().errorMessage(resp));
      const video = await resp.json();
      setProgress(video.progress, `${video.status} · ${video.progress}%`);
      if (video.status === "completed") return video;
      if (video.status === "failed") throw new Error(`${video.error.code}: ${video.error.message}`);
      await sleep(POLL_MS);
    }
  }

  async function play(video) {
    const resp = await lib().api(`/v1/videos/${encodeURIComponent(video.id)}/content`);
    if (!resp.ok) throw new Error(await lib().errorMessage(resp));
    if (shown) URL.revokeObjectURL(shown);
    shown = URL.createObjectURL(await resp.blob());
    const player = $("video-result");
    player.src = shown;
    player.hidden = false;
    player.dataset.videoId = video.id;
    player.play().catch(() => {}); // autoplay may be refused; the controls remain
    const info = video.diffserve || {};
    const revised = video.revised_prompt ? `; drawn from "${video.revised_prompt}"` : "";
    status(`Done: ${video.size}, ${info.num_frames} frames at ${info.fps} fps, seed ${info.seed} (${video.id})${revised}`);
  }

  async function generate(event) {
    event.preventDefault();
    if (busy) return;
    busy = true;
    $("video-generate").disabled = true;
    showError("");
    setProgress(0, "queued");
    status("Creating the job…");
    try {
      const resp = await lib().api("/v1/videos", { method: "POST", body: form() });
      if (!resp.ok) throw new Error(await lib().errorMessage(resp));
      const created = await resp.json();
      status(`Job ${created.id} queued`);
      await play(await poll(created.id));
    } catch (err) {
      if (!(err instanceof lib().AuthRequired)) showError(err.message);
      status("");
      setProgress(0, "idle");
    } finally {
      busy = false;
      $("video-generate").disabled = false;
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("video-form").addEventListener("submit", generate);
  });
  document.addEventListener("diffserve:model", (event) => detect(event.detail));
})();
