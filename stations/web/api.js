// The management API client: JSON in and out, the bearer token on every call, errors as ApiError.

import { liveSlot } from './slots.js';

const TOKEN_KEY = 'stations.token';

export const token = {
  // sessionStorage only: the token lives as long as this tab and no other tab reads it. The
  // browser may still write it to its profile on disk (to restore the session): Sign out
  // clears it.
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

/**
 * The server's own "not found" (its JSON error, code not_found): what was asked for is gone. A
 * 404 without it (a proxy's page while the server is replaced, say) is a passing failure.
 */
export const notFound = (err) => err?.status === 404 && err?.code === 'not_found';

/**
 * A poll's read refused with 403 (the token's role or scope does not allow it) gets the same
 * answer every time it is asked again with the same token: it asks nothing more until the tab
 * has another token (a sign-in), or `clear()` (the person asks to try again). `note(err)`:
 * whether `err` was such a refusal (then kept); `stands`: whether to hold off now.
 */
export function refusal() {
  let refused; // the token refused (null: none was sent); undefined: not refused
  return {
    note(err) {
      if (err?.status !== 403) return false;
      refused = token.get();
      return true;
    },
    get stands() {
      return refused !== undefined && refused === token.get();
    },
    clear() {
      refused = undefined;
    },
  };
}

/** A request naming a station's `createdAt` found another station under its name (409). */
export const isRecreated = (err) => err?.status === 409 && err?.field === 'createdAt';

// How long the server may take to begin its answer before the console says it is not
// answering. Without a limit, a stopped server (or a connection dropped without a word, as
// after a network change) left every refresh waiting for ever and its last figures on screen
// as if current. A write gets longer (a lock may hold it: PostgreSQL gives up after 10 s), as
// its answer is the only way to know whether it was made.
export const ANSWER_MS = 10_000;
const WRITE_ANSWER_MS = 30_000;
// Once the answer has begun, its body (a page of messages is up to 8 MiB) may take longer on a
// slow link.
const BODY_MS = 60_000;

/** No answer in time: status 0, code not_answering. */
function notAnswering(method, ms) {
  const within = `no answer within ${ms / 1000} s`;
  return new ApiError(0, {
    code: 'not_answering',
    message:
      method === 'GET'
        ? `The server is not answering (${within}).`
        : `The server is not answering (${within}): this may or may not have been done.`,
  });
}

let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

// While the server refuses this tab's token (401) and the person is asked for another one,
// polls and live tails wait rather than asking again and again with the refused token.
let refused = null;
export const signInPending = () => refused !== null;
export function holdForSignIn() {
  if (refused) return;
  let release;
  const promise = new Promise((resolve) => {
    release = resolve;
  });
  refused = { promise, release };
}
export function releaseAfterSignIn() {
  refused?.release();
  refused = null;
}
/** Resolves when requests may go out again (at once unless a sign-in is awaited), or on abort. */
export function signedIn(signal) {
  if (!refused || signal?.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    refused.promise.then(resolve);
    signal?.addEventListener('abort', resolve, { once: true });
  });
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

// Where the server's root is: the console is served at <root>/ui/, and behind a proxy that
// mounts the server under a path prefix (https://example.com/stations/) "/api" would miss it.
const ROOT = new URL('..', document.baseURI).pathname.replace(/\/$/, '');

/**
 * `answerMs`: how long the server may take to begin answering (see ANSWER_MS). `withStatus`:
 * answers { status, data } rather than the data alone (a create answers 200, not 201, for a
 * station that already existed with the same settings).
 */
export async function request(method, path, body, { signal, bearer, exact, answerMs, withStatus } = {}) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const limit = answerMs ?? (method === 'GET' ? ANSWER_MS : WRITE_ANSWER_MS);
  const late = new AbortController();
  let clock = setTimeout(() => late.abort(), limit);
  const both = signal ? AbortSignal.any([signal, late.signal]) : late.signal;
  let res;
  let data = null;
  try {
    res = await fetch(ROOT + path, {
      method,
      headers: bearer ? { ...headers, Authorization: `Bearer ${bearer}` } : authHeaders(headers),
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      signal: both,
    });
    clearTimeout(clock);
    clock = setTimeout(() => late.abort(), BODY_MS);
    if (res.status !== 204) {
      try {
        data = exact ? JSON.parse(await res.text(), exactNumbers) : await res.json();
      } catch (err) {
        if (both.aborted) throw err;
        data = null; // not JSON (a proxy's error page): the status says enough
      }
    }
  } catch (err) {
    if (late.signal.aborted && !signal?.aborted) throw notAnswering(method, res ? BODY_MS : limit);
    throw err;
  } finally {
    clearTimeout(clock);
  }
  if (!res.ok) {
    const err = new ApiError(res.status, data?.error);
    if (res.status === 401 && !bearer) onUnauthorized(err);
    throw err;
  }
  return withStatus ? { status: res.status, data } : data;
}

// `/api/stations/{name}` takes the name as one URL-encoded segment (%2F for /).
const one = (name) => `/api/stations/${encodeURIComponent(name)}`;
// `/v1/stream/{name}` takes the name as a path.
const streamPath = (name) => ROOT + '/v1/stream/' + name.split('/').map(encodeURIComponent).join('/');
const query = (params) => {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? '?' + s : '';
};

export const api = {
  // One page of stations by name ({ limit, after, contains }: answers `next`), or without
  // them every station.
  stations: (page = {}, opts) => request('GET', '/api/stations' + query(page), undefined, opts),
  station: (name, opts) => request('GET', one(name), undefined, opts),
  // { view, created }: created is false when the station already existed with the same
  // settings (the create is idempotent: 200, not 201), and nothing was made.
  create: (config) =>
    request('POST', '/api/stations', config, { withStatus: true }).then(({ status, data }) => ({
      view: data,
      created: status === 201,
    })),
  // With `createdAt` (the view's), as remove: only that station is changed (isRecreated).
  patch: (name, changes, createdAt) => request('PATCH', one(name) + query({ createdAt }), changes),
  // With `createdAt` (the view's): only that station; one created again since answers 409
  // naming createdAt, and nothing is deleted (see isRecreated).
  remove: (name, createdAt) => request('DELETE', one(name) + query({ createdAt })),
  messages: (name, offset = '-1', limit = 50, opts) =>
    request('GET', one(name) + '/messages' + query({ offset, limit }), undefined, { ...opts, exact: true }),
  produce: (name, message) => request('POST', one(name) + '/messages', { messages: [message] }),
  // One page of a station's groups by name ({ limit, after, prefix, contains }) with `next`;
  // { order: 'lag', limit }: the `limit` furthest behind.
  groupPage: (name, page, opts) => request('GET', one(name) + '/groups' + query({ ...page, limit: page.limit ?? 100 }), undefined, opts),
  deleteGroup: (name, group) =>
    request('DELETE', one(name) + '/groups/' + encodeURIComponent(group)),
  // One page of a station's reader cursors by name ({ limit, after, prefix, contains }).
  cursorPage: (name, page, opts) => request('GET', one(name) + '/cursors' + query({ ...page, limit: page.limit ?? 100 }), undefined, opts),
  dls: (name, { group, after, limit = 100 } = {}, opts) =>
    request('GET', one(name) + '/dls' + query({ group, after, limit }), undefined, { ...opts, exact: true }),
  replay: (name, selection) => request('POST', one(name) + '/dls/replay', selection),
  drop: (name, selection) => request('POST', one(name) + '/dls/drop', selection),
  seek: (name, group, target) =>
    request('POST', one(name) + '/groups/' + encodeURIComponent(group) + '/seek', target),
};

// A long-poll waits up to the server's --long-poll-timeout-ms (30 s unless set) before its empty
// answer (204), so it gets that wait and a margin, not ANSWER_MS. The wait is learnt from the
// empty answers; a long-poll given up is followed by the catch-up read, whose own limit tells
// whether the server still answers (if it does, the server's wait is longer: it is doubled).
const LONG_POLL_WAIT_MS = 30_000;
const LONG_POLL_MARGIN_MS = 10_000;
const LONG_POLL_MAX_MS = 3_600_000 + LONG_POLL_MARGIN_MS; // the server's --long-poll-timeout-ms at most
// An SSE response carries nothing while no message comes, so a stopped server looks just like a
// quiet station: after this long without an event, a catch-up read checks that the server still
// answers (and shows whatever the events missed, should the connection be dead).
const SSE_QUIET_MS = 15_000;
// A tail without a slot for a waiting read (see slots.js) looks this often with a short request.
const LOOK_MS = 2000;

// "0000000000000042_0000000000000000" → 42.
const seq = (offset) => Number.parseInt(String(offset).split('_')[0], 10);

/**
 * Follow a station from `offset`, calling `onMessages(messages)` with full message views as they
 * arrive. The wake-up comes from the Durable Streams read: Server-Sent Events through EventSource
 * when no token is in use, else long-poll fetches (EventSource cannot send an Authorization
 * header). The messages themselves are read through the management API, so they carry ids,
 * headers and times. `onError(err, final)` reports a failed read (a server not answering too):
 * final (the station is gone, 404; the token may not read it, 403) means following stopped,
 * else it retries, and `onResumed()` follows the next good read. `onGap({ count, from, to })`:
 * retention removed `count` messages (after offset `from`, up to `to`) before they were read;
 * called before the messages after the gap. `onClosed()`: the station was closed, what it held
 * is read, and following stopped. Returns a function that stops following. A 401 (the token
 * revoked) waits for the person to sign in again (see holdForSignIn), then goes on.
 *
 * While the tab is hidden, its waiting read is let go and taken up again (after a catch-up read)
 * when the tab is shown: a browser opens at most six HTTP/1.1 connections to a server, shared by
 * all its tabs, and six tails each holding one for up to a minute left none for any other
 * request of any tab (their own catch-up reads included: nothing moved for a minute). Shown
 * tabs share out the waiting reads too (see slots.js): a tail without one looks every LOOK_MS
 * with a short request (HEAD of the stream: where its tail is, and whether it is closed).
 */
export function follow(
  name,
  offset,
  onMessages,
  { onError = () => {}, onResumed = () => {}, onGap = () => {}, onClosed = () => {} } = {},
) {
  const ctrl = new AbortController();
  let cursor = offset;
  let pulling = null;
  let again = false;
  let source = null;
  let failing = false;
  let longPollMs = LONG_POLL_WAIT_MS + LONG_POLL_MARGIN_MS;
  let quiet = null;
  // The waiting read's own controller: aborted when the tab is hidden (see above), which
  // frees its slot.
  let waiting = null;

  const rest = () => {
    waiting?.abort();
    waiting = null;
    clearTimeout(quiet);
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
    // A deleted station does not come back under this tail, and a token refused (403: its role
    // or stations do not allow reading it) gets the same answer every time: reading on would
    // fail for ever, every 2 s. (A 401 waits for a sign-in instead: see breather.)
    const final = notFound(err) || err?.status === 403;
    if (final) stop();
    failing = true;
    onError(err, final);
  }

  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  /** After a failed read: wait for a new token (401), else a moment, before reading again. */
  function breather(err, signal) {
    if (err?.status === 401 && signInPending()) return signedIn(signal);
    return pause(2000);
  }

  async function pull() {
    if (pulling) {
      again = true;
      return pulling;
    }
    pulling = (async () => {
      do {
        again = false;
        let gapFrom = null;
        for (;;) {
          let page;
          try {
            page = await api.messages(name, cursor, 200, { signal: ctrl.signal });
          } catch (err) {
            // Retention dropped what the tail had not read yet: go on from the earliest kept,
            // and say what was missed.
            if (err?.status !== 410 || cursor === '-1') throw err;
            gapFrom = cursor;
            cursor = '-1';
            continue;
          }
          if (gapFrom !== null) {
            // A message's offset is the position just before it; an empty page's next offset
            // is the earliest position kept.
            const to = page.messages.length ? page.messages[0].offset : page.nextOffset;
            const count = seq(to) - seq(gapFrom);
            if (count > 0) onGap({ count, from: gapFrom, to });
            gapFrom = null;
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

  async function longPoll(mine) {
    while (!mine.signal.aborted) {
      const late = new AbortController();
      let clock = null;
      try {
        await pull();
        if (mine.signal.aborted) return;
        const started = performance.now();
        clock = setTimeout(() => late.abort(), longPollMs);
        const res = await fetch(`${streamPath(name)}?offset=${encodeURIComponent(cursor)}&live=long-poll`, {
          headers: authHeaders(),
          cache: 'no-store',
          signal: AbortSignal.any([mine.signal, late.signal]),
        });
        if (res.status === 401) onUnauthorized(new ApiError(401, null));
        if (!res.ok) throw new ApiError(res.status, (await res.json().catch(() => null))?.error);
        await res.arrayBuffer();
        if (res.headers.get('Stream-Closed') === 'true') return closed();
        // Empty: the server waited its whole long-poll timeout (at least a second).
        if (res.status === 204) longPollMs = Math.max(performance.now() - started, 1000) + LONG_POLL_MARGIN_MS;
      } catch (err) {
        if (mine.signal.aborted) return;
        // Given up: the catch-up read at the top of the loop says whether the server answers.
        if (late.signal.aborted) {
          longPollMs = Math.min(longPollMs * 2, LONG_POLL_MAX_MS);
          continue;
        }
        if (err?.status !== 401) fail(err);
        await breather(err, mine.signal);
      } finally {
        clearTimeout(clock);
      }
    }
  }

  function sse(mine) {
    if (mine.signal.aborted) return;
    const here = new EventSource(`${streamPath(name)}?offset=${encodeURIComponent(cursor)}&live=sse`);
    source = here;
    // Quiet for a while: a catch-up read checks that the server still answers (see SSE_QUIET_MS).
    const check = () => {
      if (source !== here || mine.signal.aborted) return;
      pull().then(
        () => {
          if (source === here) quiet = setTimeout(check, SSE_QUIET_MS);
        },
        (err) => {
          if (source !== here || mine.signal.aborted) return;
          here.close();
          source = null;
          fail(err);
          breather(err, mine.signal).then(() => connect(mine));
        },
      );
    };
    const heard = () => {
      clearTimeout(quiet);
      quiet = setTimeout(check, SSE_QUIET_MS);
    };
    heard();
    here.addEventListener('data', () => {
      heard();
      pull().catch(fail);
    });
    here.addEventListener('control', (event) => {
      heard();
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
      if (source !== here) return;
      clearTimeout(quiet);
      if (!mine.signal.aborted) pause(1000).then(() => connect(mine));
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
        if (err?.status !== 401) fail(err);
        await breather(err, mine.signal);
      }
    }
  }

  /**
   * One short request in place of a waiting read: HEAD of the stream says where its tail is
   * and whether it is closed; what came is read as a waiting read's answer would have it.
   */
  async function look(signal) {
    const late = new AbortController();
    const clock = setTimeout(() => late.abort(), ANSWER_MS);
    let res;
    try {
      res = await fetch(streamPath(name), {
        method: 'HEAD',
        headers: authHeaders(),
        cache: 'no-store',
        signal: AbortSignal.any([signal, late.signal]),
      });
    } catch (err) {
      if (late.signal.aborted && !signal.aborted) throw notAnswering('GET', ANSWER_MS);
      throw err;
    } finally {
      clearTimeout(clock);
    }
    if (!res.ok) {
      // A HEAD answer has no body to say why: the read does (a 401 asks for a sign-in too).
      await pull();
      throw new ApiError(res.status, null);
    }
    // After a failure too, so that the tail says it is following again.
    if (failing || res.headers.get('Stream-Next-Offset') !== cursor) await pull();
    return res.headers.get('Stream-Closed') === 'true';
  }

  /** Without a slot: look every LOOK_MS, until a slot is free (then wait for messages). */
  async function glance(mine, slot) {
    while (!mine.signal.aborted) {
      if (await slot.take()) {
        if (!mine.signal.aborted) wait(mine);
        return;
      }
      if (mine.signal.aborted) return;
      try {
        if (await look(mine.signal)) return closed();
        await pause(LOOK_MS);
      } catch (err) {
        if (mine.signal.aborted) return;
        if (err?.status !== 401) fail(err);
        await breather(err, mine.signal);
      }
    }
  }

  function wait(mine) {
    if (token.get()) longPoll(mine);
    else connect(mine);
  }

  // Reads what came meanwhile, then waits for more (unless the tab is hidden): with a slot for
  // a waiting read, else looking now and then.
  function live() {
    if (document.hidden) return;
    const mine = new AbortController();
    waiting = mine;
    // Another tab took this slot: look now and then until one is free again.
    const slot = liveSlot(() => {
      if (waiting !== mine) return;
      rest();
      live();
    });
    mine.signal.addEventListener('abort', () => slot.release(), { once: true });
    glance(mine, slot);
  }

  document.addEventListener('visibilitychange', visibility);
  live();
  return stop;
}
