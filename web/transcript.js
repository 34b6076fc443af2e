// The live transcript: one chat bubble per (role, turn_id), user on the right, agent on the left.
// `entries` is the plain-data mirror ({role, turn_id, text, interrupted}) that tests read from
// window.parley.transcript; it is kept in the same order as the bubbles on screen.

const MAX_BUBBLES = 200; // long calls keep the page light; the server keeps the full transcript

/** Creates an element with a class and text. */
function h(tag, className, text = "") {
  const el = document.createElement(tag);
  el.className = className;
  el.textContent = text;
  return el;
}

/** Joins spoken segments the way they sound: one space between words, none before punctuation. */
function joinSegment(text, segment) {
  if (!text || /\s$/.test(text) || /^[\s.,;:!?)\]]/.test(segment)) return text + segment;
  return `${text} ${segment}`;
}

/** Tool arguments as JSON text, shown as `name: value, ...` (the raw text if it is not an object). */
function compactArguments(args) {
  try {
    const parsed = JSON.parse(args || "{}");
    if (parsed && typeof parsed === "object" && !Array.isArray(parsed)) {
      return Object.entries(parsed).map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`).join(", ");
    }
  } catch {
    // shown as it came
  }
  return String(args || "");
}

/** Methods starting with "_" are internal (not "#" private ones: the page sticks to ES2020). */
export class Transcript {
  /** @param {{container: HTMLElement, empty: HTMLElement, entries: object[]}} parts */
  constructor({ container, empty, entries }) {
    this.container = container;
    this.empty = empty;
    this.entries = entries;
    this.bubbles = new Map(); // "role|turn_id" -> { entry, el, textEl, revision }
  }

  /** A new revision of the user's turn replaces its text (the caller paused, then went on). */
  userText(turnId, revision, text) {
    this._update(() => {
      const bubble = this._bubble("user", turnId);
      const rev = Number.isFinite(revision) ? revision : bubble.revision + 1;
      if (rev < bubble.revision) return; // stale: a newer revision already replaced this text
      bubble.revision = rev;
      bubble.entry.text = text || "";
      this._render(bubble);
    });
  }

  /** A segment the agent is speaking now: appended to that turn's bubble, which shows as live. */
  agentSegment(turnId, text) {
    if (!text) return;
    this._update(() => {
      const bubble = this._bubble("agent", turnId);
      bubble.entry.text = joinSegment(bubble.entry.text, text);
      bubble.el.classList.add("live");
      this._render(bubble);
    });
  }

  /** The turn is over: its text becomes what the caller actually heard, marked if it was cut off. */
  agentDone(turnId, text, interrupted) {
    if (!this.bubbles.has(this._key("agent", turnId)) && !text && !interrupted) return; // nothing said
    this._update(() => {
      const bubble = this._bubble("agent", turnId);
      if (typeof text === "string") bubble.entry.text = text;
      bubble.entry.interrupted = Boolean(interrupted);
      bubble.el.classList.remove("live");
      this._render(bubble);
    });
  }

  /** The agent asked for a tool: a small line in the conversation, marked when its result is in. */
  toolCall(turnId, callId, name, args) {
    this._update(() => {
      const bubble = this._bubble("tool", `${turnId}|${callId}`);
      bubble.entry.text = `${name}(${compactArguments(args)})`;
      bubble.el.classList.add("live");
      this._render(bubble);
    });
  }

  toolResult(turnId, callId, ok) {
    const bubble = this.bubbles.get(this._key("tool", `${turnId}|${callId}`));
    if (!bubble) return;
    this._update(() => {
      bubble.el.classList.remove("live");
      bubble.el.classList.add(ok ? "done" : "failed");
      bubble.entry.ok = Boolean(ok);
    });
  }

  /** A speculative reply superseded before the caller heard it: it never happened. */
  agentCancelled(turnId) {
    const bubble = this.bubbles.get(this._key("agent", turnId));
    if (bubble) this._update(() => this._remove(bubble));
  }

  /** The call is over: no bubble is being spoken any more. */
  settle() {
    for (const bubble of this.bubbles.values()) bubble.el.classList.remove("live");
  }

  clear() {
    this.bubbles.clear();
    this.entries.length = 0;
    this.container.replaceChildren();
    this.empty.hidden = false;
  }

  _key(role, turnId) {
    return `${role}|${turnId}`;
  }

  /** Runs a change and keeps the newest message in view, unless the reader scrolled up to look back. */
  _update(change) {
    const box = this.container;
    const pinned = box.scrollHeight - box.scrollTop - box.clientHeight < 48;
    change();
    this.empty.hidden = this.entries.length > 0;
    if (pinned) box.scrollTop = box.scrollHeight;
  }

  _bubble(role, turnId) {
    const key = this._key(role, turnId);
    if (this.bubbles.has(key)) return this.bubbles.get(key);
    const entry = { role, turn_id: turnId, text: "", interrupted: false };
    const el = h("div", `bubble ${role}`);
    el.dataset.turnId = turnId;
    const textEl = h("span", "bubble-text");
    el.append(h("span", "sr-only", { user: "You: ", agent: "Agent: " }[role] || "Tool: "), textEl);
    // A user turn whose text lands after the agent began answering it still belongs above the answer.
    const answer = role === "user" ? this.bubbles.get(this._key("agent", turnId)) : null;
    if (answer) {
      this.container.insertBefore(el, answer.el);
      this.entries.splice(this.entries.indexOf(answer.entry), 0, entry);
    } else {
      this.container.append(el);
      this.entries.push(entry);
    }
    const bubble = { entry, el, textEl, revision: -1 };
    this.bubbles.set(key, bubble);
    while (this.entries.length > MAX_BUBBLES) {
      const oldest = this.entries[0];
      this._remove(this.bubbles.get(this._key(oldest.role, oldest.turn_id)));
    }
    return bubble;
  }

  _remove(bubble) {
    bubble.el.remove();
    this.bubbles.delete(this._key(bubble.entry.role, bubble.entry.turn_id));
    const i = this.entries.indexOf(bubble.entry);
    if (i >= 0) this.entries.splice(i, 1);
  }

  /** The cut-off mark: a trailing dash where the voice stopped, and a small "interrupted" tag. */
  _render({ entry, el, textEl }) {
    textEl.textContent = entry.text;
    el.classList.toggle("interrupted", entry.interrupted);
    if (entry.interrupted && !el.querySelector(".tag")) {
      el.append(h("span", "cut", "—"), h("span", "tag", "interrupted"));
    }
  }
}
