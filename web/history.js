// Recent calls: the ended calls the service keeps (GET /api/calls?state=ended), newest first; opening
// one fetches its record (GET /api/calls/<id>) and shows what was said, interrupted replies marked.

import { authHeaders } from "./signaling.js";

const PAGE = 8;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function when(seconds) {
  return new Date(seconds * 1000).toLocaleString([], { dateStyle: "short", timeStyle: "short" });
}

function duration(seconds) {
  if (seconds == null) return "—";
  const s = Math.round(seconds);
  return s < 60 ? `${s} s` : `${Math.floor(s / 60)} min ${s % 60} s`;
}

async function getJson(url) {
  const res = await fetch(url, { headers: authHeaders() });
  if (!res.ok) throw new Error(`${res.status}`);
  return res.json();
}

function renderTranscript(box, record) {
  box.replaceChildren();
  for (const turn of record.transcript || []) {
    if (turn.user) box.append(el("p", "history-user", turn.user));
    if (turn.agent) {
      const line = el("p", "history-agent", turn.agent);
      if (turn.interrupted) line.append(el("span", "history-cut", " (interrupted)"));
      box.append(line);
    }
  }
  if (!box.childElementCount) box.append(el("p", "history-empty", "No words kept for this call."));
}

function row(call) {
  const item = el("details", "history-call");
  const summary = el("summary");
  summary.append(
    el("span", "history-when", when(call.started)),
    el("span", "history-tag", call.transport),
    el("span", "history-meta", `${duration(call.duration_s)} · ${call.turns} turn${call.turns === 1 ? "" : "s"}`),
    el("span", "history-outcome", call.ended_reason || ""),
  );
  const body = el("div", "history-transcript");
  item.append(summary, body);
  item.addEventListener("toggle", async () => {
    if (!item.open || body.dataset.loaded) return;
    body.dataset.loaded = "1";
    try {
      renderTranscript(body, await getJson(`/api/calls/${encodeURIComponent(call.id)}`));
    } catch {
      body.replaceChildren(el("p", "history-empty", "This call's record could not be loaded."));
    }
  });
  return item;
}

/** Fill `list` with the most recent ended calls; hides `section` when records are off or unreadable. */
export async function showRecentCalls(section, list) {
  try {
    const page = await getJson(`/api/calls?state=ended&limit=${PAGE}`);
    list.replaceChildren(...page.calls.map(row));
    if (!page.calls.length) list.append(el("p", "history-empty", "No calls yet."));
    section.hidden = false;
  } catch {
    section.hidden = true;
  }
}
