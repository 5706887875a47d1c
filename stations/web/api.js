// The management API client: JSON in and out, the bearer token on every call, errors as ApiError.

const TOKEN_KEY = 'stations.token';

export const token = {
  // sessionStorage only: the token lives as long as this tab, never on disk for other tabs.
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

export class ApiError extends Error {
  constructor(status, error) {
    super(error?.message || `the server answered ${status}`);
    this.status = status;
    this.code = error?.code || 'http_' + status;
    this.field = error?.field || null;
  }
}

let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

function authHeaders(extra = {}) {
  const secret = token.get();
  return secret ? { ...extra, Authorization: `Bearer ${secret}` } : extra;
}

// JSON numbers as the server wrote them: JSON.parse rounds an integer beyond 2^53 (and drops the
// ".0" of 1.0), so where the source text says more than the double, the text is kept (a raw JSON
// value, which JSON.stringify writes back as is). Only payloads need this: see `exact`.
const keepSource = typeof JSON.rawJSON === 'function';
function exactNumbers(key, value, context) {
  if (keepSource && typeof value === 'number' && context?.source !== undefined && String(value) !== context.source) {
    return JSON.rawJSON(context.source);
  }
  return value;
}

export async function request(method, path, body, { signal, bearer, exact } = {}) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(path, {
    method,
    headers: bearer ? { ...headers, Authorization: `Bearer ${bearer}` } : authHeaders(headers),
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: 'no-store',
    signal,
  });
  if (res.status === 204) return null;
  let data = null;
  try {
    data = exact ? JSON.parse(await res.text(), exactNumbers) : await res.json();
  } catch {
    data = null;
  }
  if (!res.ok) {
    const err = new ApiError(res.status, data?.error);
    if (res.status === 401 && !bearer) onUnauthorized(err);
    throw err;
  }
  return data;
}

// `/api/stations/{name}` takes the name as one URL-encoded segment (%2F for /).
const one = (name) => `/api/stations/${encodeURIComponent(name)}`;
// `/v1/stream/{name}` takes the name as a path.
const streamPath = (name) => '/v1/stream/' + name.split('/').map(encodeURIComponent).join('/');
const query = (params) => {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? '?' + s : '';
};

export const api = {
  stations: (opts) => request('GET', '/api/stations', undefined, opts),
  station: (name, opts) => request('GET', one(name), undefined, opts),
  create: (config) => request('POST', '/api/stations', config),
  patch: (name, changes) => request('PATCH', one(name), changes),
  remove: (name) => request('DELETE', one(name)),
  messages: (name, offset = '-1', limit = 50, opts) =>
    request('GET', one(name) + '/messages' + query({ offset, limit }), undefined, { ...opts, exact: true }),
  produce: (name, message) => request('POST', one(name) + '/messages', { messages: [message] }),
  groups: (name, opts) => request('GET', one(name) + '/groups', undefined, opts),
  deleteGroup: (name, group) =>
    request('DELETE', one(name) + '/groups/' + encodeURIComponent(group)),
  cursors: (name, opts) => request('GET', one(name) + '/cursors', undefined, opts),
  dls: (name, { group, after, limit = 100 } = {}, opts) =>
    request('GET', one(name) + '/dls' + query({ group, after, limit }), undefined, { ...opts, exact: true }),
  replay: (name, selection) => request('POST', one(name) + '/dls/replay', selection),
  drop: (name, selection) => request('POST', one(name) + '/dls/drop', selection),
  seek: (name, group, target) =>
    request('POST', one(name) + '/groups/' + encodeURIComponent(group) + '/seek', target),
};

/**
 * Follow a station from `offset`, calling `onMessages(messages)` with full message views as they
 * arrive. The wake-up comes from the Durable Streams read: Server-Sent Events through EventSource
 * when no token is in use, else long-poll fetches (EventSource cannot send an Authorization
 * header). The messages themselves are read through the management API, so they carry ids,
 * headers and times. `onError(err, final)` reports a failed read: final (the station is gone,
 * 404) means following stopped, else it retries, and `onResumed()` follows the next good read.
 * `onClosed()`: the station was closed, what it held is read, and following stopped. Returns a
 * function that stops following.
 *
 * While the tab is hidden, its waiting read is let go and taken up again (after a catch-up read)
 * when the tab is shown: a browser opens at most six HTTP/1.1 connections to a server, shared by
 * all its tabs, and six tails each holding one for up to a minute left none for any other
 * request of any tab (their own catch-up reads included: nothing moved for a minute).
 */
export function follow(name, offset, onMessages, { onError = () => {}, onResumed = () => {}, onClosed = () => {} } = {}) {
  const ctrl = new AbortController();
  let cursor = offset;
  let pulling = null;
  let again = false;
  let source = null;
  let failing = false;
  // The waiting read's own controller: aborted when the tab is hidden (see above).
  let waiting = null;

  const rest = () => {
    waiting?.abort();
    waiting = null;
    source?.close();
    source = null;
  };
  const visibility = () => {
    if (document.hidden) rest();
    else if (!waiting && !ctrl.signal.aborted) live();
  };
  const stop = () => {
    ctrl.abort();
    rest();
    document.removeEventListener('visibilitychange', visibility);
  };

  function fail(err) {
    if (ctrl.signal.aborted) return;
    // A deleted station does not come back under this tail: reading on would fail for ever.
    const final = err?.status === 404;
    if (final) stop();
    failing = true;
    onError(err, final);
  }

  async function pull() {
    if (pulling) {
      again = true;
      return pulling;
    }
    pulling = (async () => {
      do {
        again = false;
        for (;;) {
          let page;
          try {
            page = await api.messages(name, cursor, 200, { signal: ctrl.signal });
          } catch (err) {
            // Retention dropped what the tail had not read yet: go on from the earliest kept.
            if (err?.status !== 410 || cursor === '-1') throw err;
            cursor = '-1';
            continue;
          }
          cursor = page.nextOffset;
          if (failing) {
            failing = false;
            onResumed();
          }
          if (page.messages.length) onMessages(page.messages);
          if (page.upToDate) break;
        }
      } while (again && !ctrl.signal.aborted);
    })().finally(() => {
      pulling = null;
    });
    return pulling;
  }

  // Stream-Closed: nothing more will come, and a read at the tail of a closed stream answers at
  // once, so following on would ask again and again. Read what is left, then stop.
  async function closed() {
    source?.close();
    try {
      await pull();
    } catch (err) {
      fail(err);
    }
    if (ctrl.signal.aborted) return;
    stop();
    onClosed();
  }

  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  async function longPoll(mine) {
    while (!mine.signal.aborted) {
      try {
        await pull();
        if (mine.signal.aborted) return;
        const res = await fetch(`${streamPath(name)}?offset=${encodeURIComponent(cursor)}&live=long-poll`, {
          headers: authHeaders(),
          cache: 'no-store',
          signal: mine.signal,
        });
        if (res.status === 401) onUnauthorized(new ApiError(401, null));
        if (!res.ok) throw new ApiError(res.status, (await res.json().catch(() => null))?.error);
        await res.arrayBuffer();
        if (res.headers.get('Stream-Closed') === 'true') return closed();
      } catch (err) {
        if (mine.signal.aborted) return;
        fail(err);
        await pause(2000);
      }
    }
  }

  function sse(mine) {
    if (mine.signal.aborted) return;
    const here = new EventSource(`${streamPath(name)}?offset=${encodeURIComponent(cursor)}&live=sse`);
    source = here;
    here.addEventListener('data', () => pull().catch(fail));
    here.addEventListener('control', (event) => {
      let control = null;
      try {
        control = JSON.parse(event.data);
      } catch {
        control = null;
      }
      if (control?.streamClosed) closed();
    });
    // The server ends each SSE response after a while; reconnect from our own cursor rather
    // than letting EventSource repeat the first URL. An EventSource refused (404) or cut off
    // says only "error": the read before reconnecting finds out which, and reports it.
    here.addEventListener('error', () => {
      here.close();
      if (!mine.signal.aborted && source === here) pause(1000).then(() => connect(mine));
    });
  }

  async function connect(mine) {
    while (!mine.signal.aborted) {
      try {
        await pull();
        sse(mine);
        return;
      } catch (err) {
        if (mine.signal.aborted) return;
        fail(err);
        await pause(2000);
      }
    }
  }

  // Reads what came meanwhile, then waits for more (unless the tab is hidden).
  function live() {
    if (document.hidden) return;
    const mine = new AbortController();
    waiting = mine;
    if (token.get()) longPoll(mine);
    else connect(mine);
  }

  document.addEventListener('visibilitychange', visibility);
  live();
  return stop;
}
