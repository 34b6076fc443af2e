// Level meters: a Web Audio AnalyserNode per stream (the caller's mic, the agent's voice), drawn on
// one animation frame loop. A meter element shows its level through the CSS variable --level (0..1).

const FLOOR_DB = -60; // quieter than this reads as silence on a meter
const RELEASE = 0.88; // per frame: levels fall slowly so speech reads as a calm envelope, not flicker

let audioCtx = null;
let halo = null; // an element that follows the loudest meter (the call button's glow)
let frame = 0;
const meters = new Map(); // meter element -> { nodes, analyser, data, level }

/** Call from the Call click, before any await: browsers only let a user gesture start audio. */
export function prepareAudio() {
  const Ctx = window.AudioContext || window.webkitAudioContext;
  if (!audioCtx && Ctx) audioCtx = new Ctx();
  if (audioCtx && audioCtx.state === "suspended") audioCtx.resume().catch(() => {});
}

/** Sets the element whose --level follows the loudest meter. */
export function setHalo(el) {
  halo = el;
}

/** Starts metering `stream` on `el`, replacing what that element metered before. */
export function attachMeter(el, stream) {
  if (!audioCtx) return;
  detachMeter(el);
  let source;
  try {
    source = audioCtx.createMediaStreamSource(stream);
  } catch {
    return; // e.g. a stream without an audio track yet: a meter is decoration, never a reason to fail a call
  }
  const analyser = audioCtx.createAnalyser();
  analyser.fftSize = 1024;
  // Routed to the output through a muted gain: some engines only pull audio through connected graphs.
  const mute = audioCtx.createGain();
  mute.gain.value = 0;
  source.connect(analyser).connect(mute).connect(audioCtx.destination);
  meters.set(el, { nodes: [source, mute], analyser, data: new Float32Array(analyser.fftSize), level: 0 });
  if (!frame) frame = requestAnimationFrame(draw);
}

export function detachMeter(el) {
  const meter = meters.get(el);
  if (!meter) return;
  meter.nodes.forEach((node) => node.disconnect());
  meters.delete(el);
  paint(el, 0);
}

export function detachAllMeters() {
  [...meters.keys()].forEach(detachMeter);
}

/** Loudness in 0..1: RMS on a FLOOR_DB..0 dBFS scale, rising at once and falling slowly. */
function measure(meter) {
  meter.analyser.getFloatTimeDomainData(meter.data);
  let sum = 0;
  for (const x of meter.data) sum += x * x;
  const db = 20 * Math.log10(Math.sqrt(sum / meter.data.length) || 1e-8);
  const now = Math.min(1, Math.max(0, (db - FLOOR_DB) / -FLOOR_DB));
  meter.level = Math.max(now, meter.level * RELEASE);
  return meter.level;
}

function paint(el, level) {
  el.style.setProperty("--level", level.toFixed(3));
  // Coarse steps for assistive tech: a value changing 60 times a second would only be noise.
  const pct = String(Math.round(level * 10) * 10);
  if (el.getAttribute("aria-valuenow") !== pct) el.setAttribute("aria-valuenow", pct);
}

function draw() {
  let loudest = 0;
  for (const [el, meter] of meters) {
    const level = measure(meter);
    paint(el, level);
    loudest = Math.max(loudest, level);
  }
  frame = meters.size ? requestAnimationFrame(draw) : 0;
  if (halo) halo.style.setProperty("--level", frame ? loudest.toFixed(3) : "0");
}
