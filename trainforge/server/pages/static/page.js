// What every dashboard page's script shares: the API's address and its JSON calls, the notice box,
// the pages' event streams and their live dot. Loaded as a module by dashboard.js and experiments.js.

// Where the API is, from the server (every page's data-api): no copy of it in the scripts.
export const API = document.getElementById("page")?.dataset.api;

// The job states and event types, from the server (its JobState and JobEvent enums, in every page's
// data-states): no copy of their names in the scripts.
export const STATES = JSON.parse(document.getElementById("page")?.dataset.states || "{}");
const EVENT_NAMES = new Set(STATES.events || []);

// `names`, each one of the server's job event types: a name the server does not send is a mistake
// here, reported on the console instead of a listener that never fires.
export function jobEvents(...names) {
  for (const name of names) if (!EVENT_NAMES.has(name)) console.error(`trainforge: no job event is named ${name}`);
  return names;
}

// `method` on `API + path`; the answer's JSON, or an Error with the server's detail.
export async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body === undefined && method !== "GET" && method !== "DELETE") body = {}; // state changes are JSON only
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(API + path, init);
  if (!r.ok) {
    let detail = r.statusText;
    try { detail = (await r.json()).detail; } catch (_) { /* not JSON */ }
    throw new Error(typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return r.json();
}

// A message at the page's corner (`bad`: an error) that fades after a few seconds.
export function notice(text, bad) {
  let box = document.getElementById("notice");
  if (!box) {
    box = document.createElement("div");
    box.id = "notice";
    document.body.appendChild(box);
  }
  box.textContent = text;
  box.className = bad ? "notice bad" : "notice";
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => { box.className = "notice gone"; }, 6000);
}

// An EventSource on `API + path` that reconnects by itself (the browser resends Last-Event-ID) and
// shows the live dot; `handlers`: {event name: fn(parsed data, the event)}.
export function follow(path, handlers) {
  const source = new EventSource(API + path);
  source.onopen = () => live(true);
  source.onerror = () => live(false);
  for (const [name, fn] of Object.entries(handlers)) {
    source.addEventListener(name, (ev) => fn(JSON.parse(ev.data), ev));
  }
  return source;
}

// The live dot: on while the page's event stream is connected.
export function live(ok) {
  const dot = document.getElementById("live");
  if (dot) dot.className = ok ? "live on" : "live";
}
