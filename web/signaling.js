// Signaling: the peer connection and its offer/answer exchange over HTTP (POST /offer, DELETE /whip/<id>).
// Non-trickle: the offer goes out once, carrying every ICE candidate gathered in time.

export const BUSY_MESSAGE = "All lines are busy, try again in a few seconds";
const ICE_GATHER_TIMEOUT_MS = 2000; // a slow STUN server must not hold up the call

const params = new URLSearchParams(location.search);
const TOKEN = params.get("token");
const AGENT = params.get("agent");

/** ?ctx.customer=Dana&ctx.order=1234: the call's context, which the agent's templates and tools see. */
function contextFromUrl() {
  const context = {};
  for (const [key, value] of params) {
    if (key.startsWith("ctx.") && key.length > 4) context[key.slice(4)] = value;
  }
  return context;
}

/** A failure whose message is fit to show the caller as it is. */
export class CallError extends Error {}

export function authHeaders() {
  return TOKEN ? { Authorization: `Bearer ${TOKEN}` } : {};
}

/** ?ice=stun:host:port,turn:user:pass@host:port (the same forms the server's --ice-servers takes). */
function iceServersFromUrl() {
  const urls = (params.get("ice") || "").split(",").map((s) => s.trim()).filter(Boolean);
  return urls.map((url) => {
    const m = /^(turns?):([^:@]+):([^@]+)@(.+)$/.exec(url);
    if (!m) return { urls: url };
    return { urls: `${m[1]}:${m[4]}`, username: decodeURIComponent(m[2]), credential: decodeURIComponent(m[3]) };
  });
}

/**
 * The ICE servers for a call: the server's (GET /api/ice: STUN, and TURN with credentials that expire),
 * then any the URL names. Fetched right before each call, so the TURN credentials are fresh.
 */
export async function iceServers() {
  let fromServer = [];
  try {
    const res = await fetch("/api/ice", { headers: authHeaders(), cache: "no-store" });
    if (res.ok) fromServer = (await res.json()).iceServers || [];
  } catch {
    // unreachable or an older server: the URL's servers (if any) are all there is
  }
  return [...fromServer, ...iceServersFromUrl()];
}

/**
 * A peer connection sending `stream`, with the "events" data channel.
 * @param {{stream: MediaStream, iceServers: RTCIceServer[], onMessage: Function, onTrack: Function,
 *   onStateChange: Function}} handlers
 */
export function createPeer({ stream, iceServers, onMessage, onTrack, onStateChange }) {
  const pc = new RTCPeerConnection({ iceServers });
  stream.getTracks().forEach((track) => pc.addTrack(track, stream));
  // Created before the offer so the SDP carries the data-channel section the server answers to.
  const channel = pc.createDataChannel("events");
  channel.onmessage = (msg) => onMessage(msg.data);
  pc.ontrack = (ev) => onTrack(ev.streams[0] || new MediaStream([ev.track]));
  pc.onconnectionstatechange = () => onStateChange(pc.connectionState);
  return pc;
}

/** Resolves once ICE gathering is complete, or after ICE_GATHER_TIMEOUT_MS with what was found. */
export function iceGatheringDone(pc) {
  return new Promise((resolve) => {
    const check = () => {
      if (pc.iceGatheringState === "complete") finish();
    };
    const finish = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const timer = setTimeout(finish, ICE_GATHER_TIMEOUT_MS);
    pc.addEventListener("icegatheringstatechange", check);
    check();
  });
}

function offerErrorMessage(status, error) {
  if (status === 503) return BUSY_MESSAGE;
  if (status === 401 || status === 403) return "The server refused this link's access token.";
  if (status === 404 && AGENT) return `This service has no agent named "${AGENT}".`;
  return error || `The server could not start the call (HTTP ${status}).`;
}

/** Sends the local offer; resolves to the answer {sdp, type, call_id} or throws CallError. */
export async function postOffer(pc) {
  let res;
  try {
    res = await fetch("/offer", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify({
        sdp: pc.localDescription.sdp,
        type: "offer",
        ...(AGENT ? { agent: AGENT } : {}),
        context: contextFromUrl(),
      }),
    });
  } catch {
    throw new CallError("Could not reach the Parley server. Check your connection and try again.");
  }
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new CallError(offerErrorMessage(res.status, body.error));
  if (!body.sdp) throw new CallError("The server sent an unusable answer. Please try again.");
  return body;
}

/** Asks the server to free the line. Best effort: the call may already be gone on its side. */
export function deleteCall(callId) {
  // keepalive lets the request outlive the page when the hang-up comes from closing the tab.
  fetch(`/whip/${encodeURIComponent(callId)}`, { method: "DELETE", headers: authHeaders(), keepalive: true })
    .catch(() => {});
}
