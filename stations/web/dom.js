// Building DOM from data without ever parsing it as HTML: every string becomes a text node.

import { refusal } from './api.js';

/**
 * h('a', {href: '#/', class: 'x', onclick: fn}, 'text', child, [more]) → element.
 * Strings become text nodes (never markup); `value` and `checked` are set as properties.
 */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (key === 'class') {
      el.className = value;
    } else if (key === 'value' || key === 'checked') {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

const numberFormat = new Intl.NumberFormat('en');
export const num = (n) => (n === null || n === undefined ? '—' : numberFormat.format(n));

export function bytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

// Durations: the units the console offers, largest first.
export const UNITS = [
  ['d', 86_400_000],
  ['h', 3_600_000],
  ['min', 60_000],
  ['s', 1000],
  ['ms', 1],
];

export function duration(ms) {
  if (ms === null || ms === undefined) return '—';
  for (const [unit, size] of UNITS) if (ms >= size && ms % size === 0) return `${ms / size} ${unit}`;
  return `${ms} ms`;
}

/** "90s", "2 h", "1500" (ms) → milliseconds; "" → null; anything else → NaN. */
export function parseDuration(text) {
  const t = text.trim();
  if (!t) return null;
  const m = /^(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h|d)?$/i.exec(t);
  if (!m) return NaN;
  const unit = (m[2] || 'ms').toLowerCase();
  const size = { ms: 1, s: 1000, sec: 1000, m: 60_000, min: 60_000, h: 3_600_000, d: 86_400_000 }[unit];
  const ms = Number(m[1]) * size;
  // 1.1 * 1000 is 1100.0000000000002 in binary floating point: a whole number of ms all the same.
  const whole = Math.round(ms);
  return Math.abs(ms - whole) < 1e-6 ? whole : NaN;
}

export function when(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

/** As the server decides: a station stores JSON only when its media type is exactly application/json. */
export const isJsonType = (contentType) => (contentType || '').split(';')[0].trim().toLowerCase() === 'application/json';

/**
 * A message payload as readable text: on a JSON station always JSON text (so the string "123"
 * shows quoted, apart from the number 123), pretty-printed; else text as is, binary as base64.
 */
export function payloadText(item, json) {
  if (item.dataBase64 !== undefined && item.dataBase64 !== null) return item.dataBase64;
  if (!json && typeof item.data === 'string') return item.data;
  return JSON.stringify(item.data, null, 2);
}

// Characters of a payload shown at first: laying out a 20 MB payload whole held the tab for
// seconds, and a page of fifty large ones for much longer.
export const PAYLOAD_SHOWN = 64 * 1024;

// Bidirectional controls (Unicode's Bidi_Control: U+061C, U+200E, U+200F, U+202A-U+202E,
// U+2066-U+2069) reorder the text around them: a payload holding U+202E showed the rest of its
// line reversed, as it was not ("\u202E0001\u202C USD" read "1000 USD"). Wherever the console
// shows text someone else wrote (payloads, headers, dead-letter errors), they are shown as marks.
const BIDI = /[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g;
const bidiMark = (c) => `\u27E8U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}\u27E9`;

/** `text` with its bidirectional controls shown as marks (⟨U+202E⟩): see BIDI. */
export const marked = (text) => String(text).replace(BIDI, bidiMark);

/** `<pre>` holding a payload as text (never markup); `json`: the station stores JSON. A long
 * payload shows its first PAYLOAD_SHOWN characters and a button that shows the rest. */
export function payload(item, json) {
  return payloadView(item, json).element;
}

/** payload(), and the length of its text (what the element keeps alive, for "Show all"). */
export function payloadView(item, json) {
  const pre = h('pre', { class: 'payload' });
  const text = marked(payloadText(item, json));
  let more = null;
  if (text.length > PAYLOAD_SHOWN) {
    pre.textContent = text.slice(0, PAYLOAD_SHOWN);
    more = h(
      'button',
      {
        type: 'button',
        onclick: () => {
          pre.textContent = text;
          more.remove();
        },
      },
      `Show all ${num(text.length)} characters`,
    );
  } else {
    pre.textContent = text;
  }
  let element = more ? h('div', {}, pre, more) : pre;
  if (item.dataBase64 !== undefined && item.dataBase64 !== null) {
    element = h('div', {}, h('p', { class: 'hint' }, 'Binary payload, shown as base64:'), pre, more);
  }
  return { element, length: text.length };
}

export function headersList(headers) {
  const entries = Object.entries(headers || {});
  if (!entries.length) return null;
  return h(
    'dl',
    { class: 'headers' },
    entries.map(([k, v]) => [h('dt', {}, marked(k)), h('dd', {}, marked(v))]),
  );
}

/** A message shown for someone to read: error text, with a 403 explained. */
export function errorText(err) {
  if (err?.status === 401) return 'The server no longer accepts this tab’s token: sign in again, then try again.';
  if (err?.status === 403) return `Not allowed with this token: ${err.message}`;
  if (err?.status === 404) return err.message || 'Not found.';
  if (err instanceof TypeError) return 'The server cannot be reached.';
  return err?.message || String(err);
}

export function alertBox(err) {
  return h('p', { class: 'alert', role: 'alert' }, errorText(err));
}

/**
 * A read this token may not make (403): said once, with what is not shown; the polls stop
 * (see `refusal`) until another token is given, or `retry` (a Try again button) is pressed.
 */
export function refusedBox(err, what, retry) {
  return h(
    'div',
    { class: 'alert refused', role: 'alert' },
    h(
      'p',
      {},
      `This token may not read ${what}`,
      err?.message ? ` (${err.message})` : '',
      '. Nothing more is asked for them until you sign in with another token. ',
      retry ? h('button', { type: 'button', class: 'quiet', onclick: retry }, 'Try again') : null,
    ),
  );
}

/**
 * The poll of a read this token may be refused (403: its role or stations do not allow it). A
 * refused poll asks nothing more (see `refusal`) until the tab has another token or Try again
 * is pressed, and `box` (if any) says "This token may not read `what`" with that button.
 * `read()` reads and shows, and throws what failed; `onRefused(err)` hides what the refusal
 * stands for; `onFailed(err)` hears of any other failure but a 401 (the sign-in comes over
 * the page). Try again reads at once, unless `retry` says otherwise. `poll()` answers what
 * `read()` did, or undefined (refused, failed). A read that succeeds empties `box` and ends
 * the refusal.
 */
export function refusablePoll({ read, signal, box, what, onRefused = () => {}, onFailed = () => {}, retry }) {
  const refused = refusal();
  const tryAgain = () => {
    refused.clear();
    return retry ? retry() : poll();
  };
  function failed(err) {
    if (err?.status === 401 || signal?.aborted) return;
    if (refused.note(err)) {
      box?.replaceChildren(refusedBox(err, what, tryAgain));
      onRefused(err);
      return;
    }
    onFailed(err);
  }
  const shown = (value) => {
    refused.clear();
    box?.replaceChildren();
    return value;
  };
  function poll() {
    if (refused.stands) return undefined;
    return read().then(shown, failed);
  }
  // `now()`: read at once, refused or not (after an action), throwing what failed.
  return { poll, now: () => read().then(shown) };
}

// Typing a search asks once it pauses, not at every key.
const SEARCH_MS = 300;

/**
 * Previous and Next over a list the server pages by name (the stations, a station's groups,
 * its reader cursors: `limit`, `after`, `contains`, and the answer's `next`, the `after` of the
 * page that follows, null on the last). Only the page on screen is read, and a refresh reads it
 * again, so it costs the same at 10 rows or 10,000 (the whole list of 5,000 groups was 855 KB
 * every 2 s); a search is the server's too, so it finds rows on any page.
 *
 * `read(query, signal)` asks for a page (`query`: { limit, after, contains }), `rows(answer)`
 * is its list. `load()` reads the page asked for and answers { rows, index, contains, next }
 * (`index`: the position of its first row), or null when a newer request overtook it; an
 * emptied page (its rows deleted) goes back to the first. A click on Previous or Next, or a
 * new search, asks for another page through `turned()`, which should `load()` it; meanwhile
 * the buttons are set for it. `label` names the navigation; `search`, an input, filters.
 */
export function serverPages({ label, read, rows, turned, search = null, signal = null, size = 100 }) {
  // The page asked for: the name it starts after (null: the first page), the starts of the
  // pages before it (Previous goes back through them: the server knows no page numbers) and
  // the search. `nextStart` is the start of the page after it (null: none, or not known yet).
  let start = null;
  let starts = [];
  let contains = '';
  let nextStart = null;
  // Numbers the requests: only the latest one's answer is shown (a page turn or a search
  // overtakes a refresh under way).
  let asked = 0;
  let inflight = null;
  let askedAt = -Infinity;
  let searchTimer = null;
  const previous = h('button', { type: 'button' }, 'Previous page');
  const next = h('button', { type: 'button' }, 'Next page');
  const range = h('p', { class: 'hint' });
  const element = h('nav', { class: 'toolbar pager', 'aria-label': label, hidden: true }, previous, next, range);

  /** The buttons, for the page asked for (they change at a click, before its answer). */
  function buttons() {
    const focused = document.activeElement;
    element.hidden = starts.length === 0 && nextStart === null;
    previous.disabled = starts.length === 0;
    next.disabled = nextStart === null && !inflight;
    // A button that just went disabled would drop the keyboard's focus: the other one takes it.
    if (focused === previous && previous.disabled && !next.disabled) next.focus();
    if (focused === next && next.disabled && !previous.disabled) previous.focus();
  }
  function turn() {
    clearTimeout(searchTimer);
    turned();
    buttons();
  }
  previous.addEventListener('click', () => {
    if (!starts.length) return;
    // The page left is the next one of the page gone back to.
    nextStart = start;
    start = starts.pop();
    turn();
  });
  next.addEventListener('click', () => {
    if (nextStart === null) return; // its start not known yet: the page before is still loading
    starts.push(start);
    start = nextStart;
    nextStart = null;
    turn();
  });
  search?.addEventListener('input', () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      const text = search.value.trim();
      if (text === contains) return;
      contains = text;
      start = null;
      starts = [];
      nextStart = null;
      turn();
    }, SEARCH_MS);
  });
  signal?.addEventListener('abort', () => clearTimeout(searchTimer));

  async function load() {
    const mine = ++asked;
    inflight?.abort();
    const ctrl = new AbortController();
    inflight = ctrl;
    askedAt = performance.now();
    const index = starts.length * size;
    const asking = contains;
    let answer;
    try {
      answer = await read({ limit: size, after: start, contains: asking }, ctrl.signal);
    } catch (err) {
      if (inflight === ctrl) inflight = null;
      if (mine !== asked) return null; // overtaken (and aborted): the newer request says how it went
      buttons(); // a Next left waiting for the failed page's answer
      throw err;
    }
    if (inflight === ctrl) inflight = null;
    if (mine !== asked) return null;
    const list = rows(answer);
    if (!list.length && start !== null) {
      // The page emptied (its rows deleted): back to the first one.
      start = null;
      starts = [];
      nextStart = null;
      return load();
    }
    nextStart = answer.next ?? null;
    // The server counts nothing: the pages before this one were full, so the count is known
    // on the last page only (give or take rows created or deleted meanwhile).
    const last = index + list.length;
    const from = last === index + 1 ? num(last) : `${num(index + 1)}–${num(last)}`;
    const text = list.length ? `${from}${nextStart === null ? ` of ${num(last)}` : ''}` : '';
    if (range.textContent !== text) range.textContent = text;
    buttons();
    return { rows: list, index, contains: asking, next: nextStart };
  }

  return {
    element,
    load,
    /** Whether a page was asked for less than `ms` ago (a refresh then is not needed). */
    fresh: (ms) => performance.now() - askedAt < ms,
    /** The next refresh asks at once (the page asked for was not read: a sign-in awaited). */
    stale() {
      askedAt = -Infinity;
    },
  };
}

/** A refresh failed: why, and how old the figures still on screen are (`since`: a Date). */
export function staleBox(err, since) {
  const age = since ? ` What is shown is from ${since.toLocaleTimeString()}.` : '';
  return h('p', { class: 'alert', role: 'alert' }, errorText(err), age);
}

let toastTimer = null;
/** Tell everyone what just happened: a live region for screen readers, a toast for the eyes. */
export function announce(text) {
  // The live region stays in the accessibility tree; only its text changes.
  document.getElementById('announce').textContent = text;
  const toast = document.getElementById('toast');
  toast.textContent = text;
  toast.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => {
    toast.hidden = true;
  }, 5000);
}

/** Labelled form field: the label names the control plainly; hint and error are described. */
export function field({ id, label, control, hint, extra, wide }) {
  control.id = id;
  const described = [];
  const hintEl = hint ? h('p', { class: 'hint', id: `${id}-hint` }, hint) : null;
  if (hintEl) described.push(hintEl.id);
  const errorEl = h('p', { class: 'field-error', id: `${id}-error`, hidden: true });
  described.push(errorEl.id);
  control.setAttribute('aria-describedby', described.join(' '));
  return h(
    'div',
    { class: wide ? 'field wide' : 'field', 'data-field': id },
    h('label', { for: id }, label),
    extra ? h('div', { class: 'inline' }, control, extra) : control,
    hintEl,
    errorEl,
  );
}

export function setFieldError(form, id, message) {
  const control = form.querySelector(`#${CSS.escape(id)}`);
  const errorEl = form.querySelector(`#${CSS.escape(id)}-error`);
  if (!control || !errorEl) return false;
  if (message) {
    control.setAttribute('aria-invalid', 'true');
    errorEl.textContent = message;
    errorEl.hidden = false;
  } else {
    control.removeAttribute('aria-invalid');
    errorEl.textContent = '';
    errorEl.hidden = true;
  }
  return true;
}

export function clearFieldErrors(form) {
  for (const el of form.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
  for (const el of form.querySelectorAll('.field-error')) {
    el.textContent = '';
    el.hidden = true;
  }
}
