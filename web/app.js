// Parley call page, entry module: page state, rendering, the server's events and the call lifecycle.
// The other modules each own one concern: media.js (microphone), signaling.js (peer connection and
// offer/answer), meters.js (Web Audio level meters), transcript.js (chat bubbles).

import { RAW_MIC, openMic, stopStream } from "./media.js";
import { CallError, createPeer, deleteCall, iceGatheringDone, iceServers, postOffer } from "./signaling.js";
import { attachMeter, detachAllMeters, prepareAudio, setHalo } from "./meters.js";
import { Transcript } from "./transcript.js";
import { showRecentCalls } from "./history.js";

const LOST_MESSAGE = "The connection to the agent was lost.";
const DISCONNECT_GRACE_MS = 3000; // "disconnected" often heals by itself; give up only after this

const STATE_LABELS = {
  idle: "Ready", connecting: "Connecting…", listening: "Listening", user_speaking: "You're speaking",
  thinking: "Thinking…", agent_speaking: "Agent speaking", ended: "Call ended", error: "Error",
};
const BUTTON_MODES = { // mode -> [visible label, accessible name]
  call: ["Call", "Start a call"],
  connecting: ["Connecting…", "Connecting… press to cancel"],
  hangup: ["Hang up", "Hang up"],
};

// ---- Page state, mirrored on window.parley for automated browser tests ------------------------
const parley = {
  state: "idle", callId: null, transcript: [], lastLatency: null, lastBargeIn: null, events: [],
  /** Total energy of the agent audio received so far (RTCPeerConnection stats; 0 without a call). */
  inboundAudioEnergy: async () => {
    if (!call || !call.pc) return 0;
    let energy = 0;
    (await call.pc.getStats()).forEach((r) => {
      if (r.type === "inbound-rtp" && r.kind === "audio") energy += r.totalAudioEnergy || 0;
    });
    return energy;
  },
};
window.parley = parley;

/** The call in progress (null when none). Async steps compare against it to notice a cancelled call. */
let call = null;

const $ = (id) => document.getElementById(id);
const has = (obj, key) => Object.prototype.hasOwnProperty.call(obj, key);
const ui = {
  body: document.body, button: $("call-button"), buttonLabel: $("call-button-label"), pill: $("call-state"),
  latency: $("latency"), stt: $("stat-stt"), llm: $("stat-llm"), tts: $("stat-tts"),
  barge: $("stat-barge"), bargeWrap: $("stat-barge-wrap"),
  banner: $("error-banner"), bannerText: $("error-text"), bannerClose: $("error-close"),
  callId: $("call-id"), rawNote: $("raw-note"), audio: $("remote-audio"),
  micMeter: $("mic-meter"), agentMeter: $("agent-meter"),
};
const transcript = new Transcript({
  container: $("transcript"), empty: $("transcript-empty"), entries: parley.transcript,
});

// ---- Rendering ----------------------------------------------------------------------------------
function setState(state) {
  if (!has(STATE_LABELS, state)) return; // a state from a newer server: keep showing the last known one
  parley.state = state;
  ui.body.dataset.state = state;
  ui.pill.dataset.state = state;
  ui.pill.textContent = STATE_LABELS[state];
  renderButton();
}

function renderButton() {
  const mode = !call ? "call" : parley.state === "connecting" ? "connecting" : "hangup";
  ui.button.dataset.mode = mode;
  ui.buttonLabel.textContent = BUTTON_MODES[mode][0];
  ui.button.setAttribute("aria-label", BUTTON_MODES[mode][1]);
}

/** Shows a message in the banner; an empty message hides it. */
function showError(message = "") {
  ui.bannerText.textContent = message;
  ui.banner.hidden = !message;
}

function setCallId(callId) {
  parley.callId = callId || null;
  if (call && callId) call.callId = callId;
  ui.callId.textContent = callId ? `Call ${callId}` : "";
  ui.callId.hidden = !callId;
}

const isNum = (v) => typeof v === "number" && Number.isFinite(v);
const asMs = (s) => (isNum(s) ? `${Math.round(s * 1000)} ms` : "—");

function renderLatency() {
  const lat = parley.lastLatency;
  if (lat && isNum(lat.response_s)) {
    const value = document.createElement("strong");
    value.textContent = `${lat.response_s.toFixed(2)} s`;
    ui.latency.replaceChildren("Replied in ", value);
    ui.latency.dataset.empty = "false";
  } else if (!lat) {
    ui.latency.textContent = "No replies yet";
    ui.latency.dataset.empty = "true";
  } // an event without response_s keeps the last headline but still updates the breakdown
  ui.stt.textContent = asMs(lat && lat.stt_s);
  ui.llm.textContent = asMs(lat && lat.llm_first_token_s);
  ui.tts.textContent = asMs(lat && lat.tts_first_audio_s);
  const stop = parley.lastBargeIn && parley.lastBargeIn.stop_s;
  ui.bargeWrap.hidden = !isNum(stop);
  ui.barge.textContent = asMs(stop);
}

// ---- Server events (JSON text over the "events" data channel) ---------------------------------
const handlers = {
  call: (ev) => setCallId(ev.call_id),
  state: (ev) => (ev.state === "ended" ? endCall({ serverEnded: true }) : setState(ev.state)),
  user_transcript: (ev) => transcript.userText(ev.turn_id, ev.revision, ev.text),
  agent_text: (ev) => transcript.agentSegment(ev.turn_id, ev.text),
  agent_done: (ev) => transcript.agentDone(ev.turn_id, ev.text, ev.interrupted),
  agent_cancelled: (ev) => transcript.agentCancelled(ev.turn_id),
  tool_call: (ev) => transcript.toolCall(ev.turn_id, ev.tool_call_id, ev.name, ev.arguments),
  tool_result: (ev) => transcript.toolResult(ev.turn_id, ev.tool_call_id, ev.ok),
  latency: (ev) => { parley.lastLatency = ev; renderLatency(); },
  barge_in: (ev) => { parley.lastBargeIn = ev; renderLatency(); },
  error: (ev) => showError(ev.message || "The agent ran into a problem."),
  // What the agent did to the line (a browser has none): where it transferred the caller, and why the
  // server ended the call, just before the final state. Digits it "pressed" (dtmf_out) stay in events.
  transfer: (ev) => { if (call) call.transferTo = typeof ev.to === "string" ? ev.to : ""; },
  hangup: (ev) => serverHungUp(ev.reason),
};

/** The server ended the call and said why: the agent hung up or transferred the caller. */
function serverHungUp(reason) {
  const to = call && call.transferTo;
  const notice = reason === "agent_hangup" ? "The agent ended the call."
    : reason === "transferred" ? (to ? `Transferred to ${to}.` : "The call was transferred.")
    : "";
  endCall({ serverEnded: true, message: notice });
  if (notice) setState("idle"); // nothing went wrong: the page is ready for the next call
}

function onServerMessage(data) {
  let ev = null;
  try { ev = JSON.parse(data); } catch { /* not an event of ours */ }
  if (!ev || typeof ev !== "object") return;
  parley.events.push(ev);
  if (has(handlers, ev.type)) handlers[ev.type](ev);
}

// ---- Call lifecycle -----------------------------------------------------------------------------
function resetConversation() {
  transcript.clear();
  parley.events.length = 0;
  parley.lastLatency = null;
  parley.lastBargeIn = null;
  setCallId(null);
  renderLatency();
}

function attachRemoteAudio(stream) {
  if (ui.audio.srcObject === stream) return; // ontrack fires once per track of the same stream
  ui.audio.srcObject = stream;
  ui.audio.play().catch(() => {}); // autoplay is allowed after the Call click; this is belt and braces
  attachMeter(ui.agentMeter, stream);
}

async function startCall() {
  showError("");
  resetConversation();
  prepareAudio(); // first, while the click still counts as a user gesture
  const session = { pc: null, stream: null, callId: null, disconnectTimer: 0 };
  const current = () => call === session; // false once the caller hangs up (or another call starts)
  call = session;
  setState("connecting");
  try {
    session.stream = await openMic();
    if (!current()) return stopStream(session.stream); // cancelled while the permission prompt was up
    attachMeter(ui.micMeter, session.stream);
    const servers = await iceServers();
    if (!current()) return stopStream(session.stream);
    session.pc = createPeer({
      stream: session.stream,
      iceServers: servers,
      onMessage: (data) => current() && onServerMessage(data),
      onTrack: (stream) => current() && attachRemoteAudio(stream),
      onStateChange: (state) => current() && watchConnection(session, state),
    });
    await session.pc.setLocalDescription(await session.pc.createOffer());
    await iceGatheringDone(session.pc);
    if (!current()) return;
    // Not aborted on cancel: the server may have taken a line already, and only its answer names it.
    const answer = await postOffer(session.pc);
    if (!current()) { // cancelled while the server was answering: free the line it took
      if (answer.call_id) deleteCall(answer.call_id);
      return;
    }
    setCallId(answer.call_id);
    await session.pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
  } catch (err) {
    if (!current()) return; // the caller cancelled; this failure is only the teardown's echo
    failCall(err);
  }
}

function failCall(err) {
  const session = call;
  call = null;
  teardown(session, { notifyServer: true });
  setState("error");
  showError(err instanceof CallError ? err.message : "Something went wrong starting the call. Please try again.");
}

/** Ends the current call, whoever ended it. Safe to call twice. */
function endCall({ serverEnded = false, message = "" } = {}) {
  const session = call;
  if (!session) return;
  call = null;
  teardown(session, { notifyServer: !serverEnded });
  setState("ended");
  if (message) showError(message);
  setTimeout(refreshHistory, 1000); // the record is written just after the call ends
}

function refreshHistory() {
  showRecentCalls(document.getElementById("history"), document.getElementById("history-list"));
}

function teardown(session, { notifyServer }) {
  clearTimeout(session.disconnectTimer);
  if (session.pc) session.pc.close();
  stopStream(session.stream);
  detachAllMeters();
  ui.audio.srcObject = null;
  transcript.settle();
  if (notifyServer && session.callId) deleteCall(session.callId);
}

function watchConnection(session, state) {
  clearTimeout(session.disconnectTimer);
  if (state === "connected" && parley.state === "connecting") {
    setState("listening"); // the server's own state event normally follows at once
  } else if (state === "failed") {
    const wasUp = parley.state !== "connecting";
    endCall({ message: wasUp ? LOST_MESSAGE : "Could not connect the audio. A firewall may be blocking it." });
  } else if (state === "closed") {
    endCall();
  } else if (state === "disconnected") {
    session.disconnectTimer = setTimeout(() => endCall({ message: LOST_MESSAGE }), DISCONNECT_GRACE_MS);
  }
}

// ---- Wiring -------------------------------------------------------------------------------------
ui.button.addEventListener("click", () => (call ? endCall() : startCall()));
ui.bannerClose.addEventListener("click", () => showError(""));
// Leaving or closing the tab hangs up, so the server frees the line at once instead of timing out.
window.addEventListener("pagehide", () => endCall());
setHalo(ui.button);
ui.rawNote.hidden = !RAW_MIC;
setState("idle");
renderLatency();
refreshHistory();
