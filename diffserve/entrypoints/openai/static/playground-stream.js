// diffserve playground: reading a streamed image request. Server-sent events over fetch (EventSource cannot POST or
// send the key), in either shape the server streams: diffserve's ("progress" per step, "result", then [DONE]) or,
// when partial images were asked for, OpenAI's (partial_image events, then one completed event per image and no
// [DONE]), whose completed events are put together into the same result object the page shows.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);

  // JSON.parse keeping integers beyond 2^53 exact, as digit strings (source text access, where supported).
  const parseExact = (text) => JSON.parse(text, (key, value, context) =>
    (typeof value === "number" && !Number.isSafeInteger(value) && Number.isInteger(value)
      && context && /^[0-9]+$/.test(context.source) ? context.source : value));

  function b64ToBlob(b64, type) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i += 1) bytes[i] = bin.charCodeAt(i);
    return new Blob([bytes], { type });
  }

  // The completed events of an OpenAI-shaped stream, as one response object.
  const completedResult = (completions) => ({
    type: "result",
    output_format: completions[0].output_format,
    data: completions.map((e) => ({ b64_json: e.b64_json, revised_prompt: e.revised_prompt })),
    diffserve: completions[completions.length - 1].diffserve,
  });

  // Hands every event to handle(event) (true once the request ended: a result or an error); resolves to whether
  // it ended.
  async function read(resp, handle) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    const completions = [];
    let buffer = "";
    let ended = false;
    $("preview-box").hidden = true;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
        if (data === "[DONE]") return ended;
        if (!data) continue;
        const event = parseExact(data);
        if (/^image_(generation|edit)\.completed$/.test(event.type)) completions.push(event);
        else ended = handle(event) || ended;
      }
    }
    if (!ended && completions.length) ended = handle(completedResult(completions));
    return ended;
  }

  // A partial image in the preview box, replacing the last one.
  function showPreview(event, total) {
    const img = $("preview");
    if (img.src) URL.revokeObjectURL(img.src);
    img.src = URL.createObjectURL(b64ToBlob(event.b64_json, `image/${event.output_format}`));
    img.dataset.index = String(event.partial_image_index);
    $("preview-box").hidden = false;
    $("preview-caption").textContent =
      `partial image ${event.partial_image_index + 1} of ${total} (image ${event.image_index + 1})`;
  }

  window.diffserveStream = { read, showPreview, b64ToBlob };
})();
