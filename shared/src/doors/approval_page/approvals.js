// Airlock's approval page: passkey ceremonies (WebAuthn) against the server's JSON
// endpoints. No framework, no build step. Every state-changing request is a same-origin
// fetch with the page's anti-forgery token.
"use strict";

function b64uEncode(buf) {
  const bytes = new Uint8Array(buf);
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function b64uDecode(str) {
  const s = str.replace(/-/g, "+").replace(/_/g, "/");
  const bin = atob(s + "===".slice((s.length + 3) % 4));
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out.buffer;
}

// The server's options may hold nulls where the browser wants a field left out.
function dropNulls(v) {
  if (Array.isArray(v)) return v.map(dropNulls);
  if (v && typeof v === "object") {
    const o = {};
    for (const [k, x] of Object.entries(v)) if (x !== null) o[k] = dropNulls(x);
    return o;
  }
  return v;
}

function creationOptions(o) {
  const p = dropNulls(o.publicKey);
  p.challenge = b64uDecode(p.challenge);
  p.user.id = b64uDecode(p.user.id);
  (p.excludeCredentials || []).forEach((c) => (c.id = b64uDecode(c.id)));
  return { publicKey: p };
}

function requestOptions(o) {
  const p = dropNulls(o.publicKey);
  p.challenge = b64uDecode(p.challenge);
  (p.allowCredentials || []).forEach((c) => (c.id = b64uDecode(c.id)));
  return { publicKey: p };
}

function registrationJSON(c) {
  return {
    id: c.id,
    rawId: b64uEncode(c.rawId),
    type: c.type,
    response: {
      attestationObject: b64uEncode(c.response.attestationObject),
      clientDataJSON: b64uEncode(c.response.clientDataJSON),
    },
    extensions: {},
  };
}

function assertionJSON(c) {
  return {
    id: c.id,
    rawId: b64uEncode(c.rawId),
    type: c.type,
    response: {
      authenticatorData: b64uEncode(c.response.authenticatorData),
      clientDataJSON: b64uEncode(c.response.clientDataJSON),
      signature: b64uEncode(c.response.signature),
      userHandle: c.response.userHandle ? b64uEncode(c.response.userHandle) : null,
    },
    extensions: {},
  };
}

function csrf() {
  const m = document.querySelector('meta[name="csrf-token"]');
  return m ? m.content : "";
}

async function post(url, body) {
  const r = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json", "x-csrf-token": csrf() },
    body: JSON.stringify(body || {}),
  });
  let j = {};
  try {
    j = await r.json();
  } catch (e) {
    j = {};
  }
  if (!r.ok) {
    const err = new Error((j.error && j.error.message) || "HTTP " + r.status);
    err.code = j.error && j.error.code;
    throw err;
  }
  return j;
}

function say(text, kind) {
  const s = document.getElementById("status");
  if (s) {
    s.textContent = text;
    s.dataset.kind = kind || "info";
  }
}

// Set once the plan can no longer be decided here: its buttons stay disabled.
let decisionClosed = false;

function busy(on) {
  document.querySelectorAll("button").forEach((b) => {
    b.disabled = on || (decisionClosed && (b.id === "approve" || b.id === "decline"));
  });
  const main = document.getElementById("plan");
  if (main && !on) delete main.dataset.busy;
}

async function run(what) {
  busy(true);
  try {
    await what();
  } catch (e) {
    say((e && e.name && e.name !== "Error" ? e.name + ": " : "") + (e && e.message ? e.message : e), "error");
    busy(false);
  }
}

async function enroll() {
  const base = location.pathname.replace(/\/$/, "");
  say("Waiting for your passkey...");
  const c = await post(base + "/start");
  const cred = await navigator.credentials.create(creationOptions(c.options));
  const done = await post(base + "/finish", { challenge_id: c.challenge_id, credential: registrationJSON(cred) });
  say("Passkey registered for " + done.operator_id + ".", "ok");
  location.assign(done.next || "/approvals");
}

async function signIn() {
  const main = document.getElementById("login");
  const id = document.getElementById("operator").value.trim();
  say("Waiting for your passkey...");
  const c = await post("/approvals/login/start", { operator_id: id });
  const cred = await navigator.credentials.get(requestOptions(c.options));
  const done = await post("/approvals/login/finish", {
    challenge_id: c.challenge_id,
    credential: assertionJSON(cred),
    next: main.dataset.next,
  });
  say("Signed in as " + done.operator_id + ".", "ok");
  location.assign(done.next || "/approvals");
}

async function decide(decision) {
  const main = document.getElementById("plan");
  main.dataset.busy = "1";
  const base = "/approvals/plans/" + encodeURIComponent(main.dataset.planId);
  say("Confirm with your passkey...");
  const c = await post(base + "/start", { decision: decision });
  const cred = await navigator.credentials.get(requestOptions(c.options));
  const done = await post(base + "/finish", { challenge_id: c.challenge_id, credential: assertionJSON(cred) });
  say((done.decision === "approved" ? "Approved" : "Declined") + " by " + done.approver + ".", "ok");
  location.reload();
}

async function signOut() {
  await post("/approvals/logout");
  location.assign("/approvals/login");
}

// Seconds left on every countdown of the page (`data-left-ms`, measured when it was drawn).
function arm(el) {
  el._end = Date.now() + Number(el.dataset.leftMs || 0);
}

function secondsLeft(el) {
  return Math.max(0, Math.round((el._end - Date.now()) / 1000));
}

// A plan that can no longer be decided from this page: its buttons stay, disabled, and the
// page says why (and what the plan is now).
function closeDecision(why, state) {
  decisionClosed = true;
  document.querySelectorAll("#approve, #decline").forEach((b) => (b.disabled = true));
  const w = document.getElementById("why-not");
  if (w && w.textContent !== why) w.textContent = why;
  const s = document.getElementById("state");
  if (s && state) s.textContent = state;
  const main = document.getElementById("plan");
  if (main && state) main.dataset.state = state;
}

function planCountdown() {
  const el = document.getElementById("time-left");
  if (!el) return;
  arm(el);
  const tick = () => {
    const left = secondsLeft(el);
    el.textContent = left + " s";
    if (left === 0) {
      if (document.getElementById("plan").dataset.state === "pending") {
        closeDecision("This plan expired; ask the agent for a new plan.", "expired");
      }
      return;
    }
    setTimeout(tick, 1000);
  };
  tick();
}

async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  const j = await r.json().catch(() => ({}));
  if (!r.ok) {
    const err = new Error((j.error && j.error.message) || "HTTP " + r.status);
    err.status = r.status;
    throw err;
  }
  return j;
}

// Polls `url` every `ms` while `go(answer)` returns true; a session that ended stops it.
function poll(url, ms, go) {
  const once = async () => {
    if (document.hidden) return setTimeout(once, ms);
    try {
      if (!go(await getJSON(url))) return;
    } catch (e) {
      if (e.status === 401 || e.status === 404) {
        say(e.message, "error");
        return;
      }
    }
    setTimeout(once, ms);
  };
  setTimeout(once, ms);
}

// The plan page: the decision closes itself when the plan is decided elsewhere.
function watchPlan() {
  const main = document.getElementById("plan");
  if (!main || main.dataset.state !== "pending") return;
  const url = "/approvals/plans/" + encodeURIComponent(main.dataset.planId) + "/state.json";
  poll(url, 2000, (j) => {
    if (main.dataset.busy) return true;
    const a = document.getElementById("approve");
    const d = document.getElementById("decline");
    if ((a && !j.approve) || (d && !j.decline) || j.state !== "pending") {
      closeDecision(j.why_not || "This plan is no longer waiting for a decision.", j.state);
    }
    return j.state === "pending";
  });
}

// The pending list: it updates itself (a new plan appears, a decided or expired one
// leaves) without moving the reader's focus unless the list changed.
function watchPending() {
  const main = document.getElementById("pending-page");
  const list = document.getElementById("pending");
  if (!main || !list) return;
  const tick = () => {
    list.querySelectorAll(".left").forEach((el) => {
      if (el._end === undefined) arm(el);
      el.textContent = secondsLeft(el) + " s";
    });
  };
  tick();
  setInterval(tick, 1000);
  if (main.dataset.live !== "true") return;
  poll("/approvals/pending.json", 1000, (j) => {
    if (j.key !== list.dataset.key) {
      list.innerHTML = j.html;
      list.dataset.key = j.key;
      const c = document.getElementById("pending-count");
      if (c) c.textContent = j.text;
    }
    const left = new Map(j.plans.map((p) => [p.plan_id, p.left_ms]));
    list.querySelectorAll("li[data-plan-id]").forEach((li) => {
      const el = li.querySelector(".left");
      if (el && left.has(li.dataset.planId)) {
        el.dataset.leftMs = left.get(li.dataset.planId);
        arm(el);
      }
    });
    tick();
    return true;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const on = (id, f) => {
    const el = document.getElementById(id);
    if (el) el.addEventListener("click", () => run(f));
  };
  on("enroll", enroll);
  on("sign-in", signIn);
  on("approve", () => decide("approved"));
  on("decline", () => decide("declined"));
  on("sign-out", signOut);
  const op = document.getElementById("operator");
  if (op) op.addEventListener("keydown", (e) => e.key === "Enter" && run(signIn));
  planCountdown();
  watchPlan();
  watchPending();
});
