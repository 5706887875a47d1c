// The message browser (paged from any offset, or a live tail) and the "produce a test message" form.

import { api, follow } from '../api.js';
import {
  alertBox,
  clearFieldErrors,
  duration,
  errorText,
  field,
  h,
  headersList,
  isJsonType,
  num,
  payloadView,
  setFieldError,
  when,
} from '../dom.js';

const PAGE = 50;
// The live tail keeps its latest LIVE_KEEP messages and, of those, no more than LIVE_KEEP_CHARS
// characters of payload: each item holds its whole payload (for "Show all"), and 500 messages
// of 1 MB took 500 MB of the tab (8 MiB ones would crash it). The newest one always stays.
const LIVE_KEEP = 500;
const LIVE_KEEP_CHARS = 8 * 1024 * 1024;
const OFFSET = /^\d{16}_\d{16}$/;

/** "-1", an offset, or a message number (turned into the offset just before that message). */
function offsetFrom(text) {
  const t = text.trim();
  if (t === '' || t === '-1') return '-1';
  if (OFFSET.test(t)) return t;
  if (/^\d{1,16}$/.test(t)) return `${t.padStart(16, '0')}_${'0'.repeat(16)}`;
  return null;
}

/**
 * Where the page of PAGE messages before `offset` starts ("-1" from the start), or null when
 * `offset` is the start itself. Offsets are message positions (the offset of message n is
 * n - 1), so the older page is known without asking.
 */
function pageBefore(offset) {
  const m = /^(\d{16})_\d{16}$/.exec(offset || '');
  if (!m || Number(m[1]) === 0) return null;
  const start = Math.max(0, Number(m[1]) - PAGE);
  return start === 0 ? '-1' : offsetFrom(String(start));
}

/** The offset of the last page before the tail offset `tail`. */
const latestOffset = (tail) => pageBefore(tail) ?? '-1';

/** The payload as UTF-8 bytes in base64, the form the API takes raw bytes in. */
function base64Utf8(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = '';
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

/**
 * A fresh message id for a message sent with the id field left empty. From getRandomValues, not
 * randomUUID: the console may be served over plain HTTP, where randomUUID does not exist.
 */
function newMessageId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return 'console-' + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

/** A message as a list item, and the length of its payload text (`length`). */
export function messageView(m, json) {
  const shown = payloadView(m, json);
  const li = h(
    'li',
    { class: 'msg' },
    h(
      'div',
      { class: 'meta' },
      h('span', {}, 'Offset ', h('code', {}, m.offset)),
      m.id !== null && m.id !== undefined ? h('span', {}, 'Id ', h('code', {}, m.id)) : null,
      m.time ? h('time', { datetime: m.time }, when(m.time)) : null,
    ),
    headersList(m.headers),
    shown.element,
  );
  return { li, length: shown.length };
}

export const messageItem = (m, json) => messageView(m, json).li;

const plural = (n, one, many) => `${num(n)} ${n === 1 ? one : many}`;

export async function renderMessages(panel, ctx, station) {
  const name = station.name;
  const json = isJsonType(station.contentType);
  // Each item's payload length, for the live tail's bound (LIVE_KEEP_CHARS).
  const lengths = new WeakMap();
  const item = (m) => {
    const { li, length } = messageView(m, json);
    lengths.set(li, length);
    return li;
  };

  // Produce a test message.
  const msgId = h('input', { type: 'text', autocomplete: 'off', spellcheck: 'false', maxlength: '256' });
  const data = h('textarea', { rows: '4', spellcheck: 'false' });
  data.value = json ? '{"hello": "world"}' : 'hello';
  const headers = h('textarea', { rows: '2', spellcheck: 'false', placeholder: '{"source": "console"}' });
  const result = h('p', { class: 'result', role: 'status', 'aria-live': 'polite' });
  const produceButton = h('button', { type: 'submit', class: 'primary' }, 'Produce');
  const produceForm = h(
    'form',
    { class: 'card produce', novalidate: true },
    h('h2', {}, 'Produce a test message'),
    field({
      id: 'msgId',
      label: 'Message id',
      control: msgId,
      hint:
        'Optional. The same id again within the idempotency window is a duplicate and is not stored. ' +
        'Left empty, the console gives the message an id, kept while the same message is sent again ' +
        'after a failure, so it is stored at most once.',
    }),
    field({
      id: 'payload',
      label: json ? 'Payload (JSON)' : 'Payload (text)',
      control: data,
      wide: true,
    }),
    field({ id: 'headers', label: 'Headers (JSON object, optional)', control: headers, wide: true }),
    h('div', { class: 'actions' }, produceButton),
    result,
  );
  // The id given to a message sent with the id field empty: one per distinct form content, kept
  // while that content is sent again after a failure. A failed send (above all "not answering")
  // may have been stored all the same, and without an id the resend stored it a second time;
  // with the same id, it is answered as a duplicate. A stored message or a changed form gets a
  // fresh id: sending the same content again on purpose stores it again.
  let given = null; // { content, id, failed }
  produceForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearFieldErrors(produceForm);
    result.textContent = '';
    const message = {};
    let mine = null;
    if (msgId.value !== '') message.id = msgId.value;
    else {
      const content = JSON.stringify([data.value, headers.value]);
      if (given?.content !== content) given = { content, id: newMessageId(), failed: false };
      mine = given;
      message.id = mine.id;
    }
    if (json) {
      try {
        JSON.parse(data.value);
      } catch (err) {
        setFieldError(produceForm, 'payload', `The payload is not JSON: ${err.message}`);
        data.focus();
        return;
      }
      // Sent as typed, not as the parsed value: JSON.parse rounds integers beyond 2^53.
      message.dataBase64 = base64Utf8(data.value);
    } else {
      message.data = data.value;
    }
    if (headers.value.trim()) {
      let parsed = null;
      try {
        parsed = JSON.parse(headers.value);
      } catch {
        parsed = null;
      }
      if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
        setFieldError(produceForm, 'headers', 'Headers must be a JSON object of strings.');
        headers.focus();
        return;
      }
      message.headers = parsed;
    }
    produceButton.disabled = true;
    try {
      const answer = await api.produce(name, message);
      const r = answer.results[0];
      if (mine && given === mine) given = null;
      result.className = r.duplicate ? 'result duplicate' : 'result stored';
      let text;
      if (!r.duplicate) text = ['Offset ', h('code', {}, r.offset)];
      else if (mine?.failed) {
        text = ['An earlier attempt whose answer was lost had stored it, at offset ', h('code', {}, r.offset)];
      } else text = ['The first message with this id is at offset ', h('code', {}, r.offset)];
      result.replaceChildren(
        h('strong', {}, r.duplicate ? 'Duplicate: not stored. ' : 'Stored. '),
        ...text,
        ...(mine ? [', message id ', h('code', {}, mine.id)] : []),
        '.',
      );
      if (!live.checked && upToDate) await load(current);
    } catch (err) {
      if (mine) mine.failed = true;
      // Said with the error: the resend is safe (a duplicate, not a second copy) as long as it
      // comes within the station's idempotency window.
      const resend = mine
        ? ` Sending it again unchanged reuses message id ${mine.id}: stored at most once within the ` +
          `idempotency window (${duration(station.idempotencyWindowMs)}).`
        : '';
      if (err?.status === 401) {
        // The token was revoked: the sign-in comes over the page, and the form keeps its input.
        result.className = 'result error';
        result.textContent = `Not stored: ${errorText(err)}${resend}`;
        return;
      }
      const where = {
        'messages.0.id': 'msgId',
        'messages.0.data': 'payload',
        'messages.0.dataBase64': 'payload',
        'messages.0.headers': 'headers',
      }[err?.field];
      if (where) setFieldError(produceForm, where, err.message);
      else {
        result.className = 'result error';
        result.textContent = errorText(err) + resend;
      }
    } finally {
      produceButton.disabled = false;
    }
  });

  // Browse.
  const offsetInput = h('input', { type: 'text', id: 'from-offset', spellcheck: 'false', placeholder: '-1' });
  const go = h('button', { type: 'submit' }, 'Go');
  const first = h('button', { type: 'button' }, 'First');
  const previous = h('button', { type: 'button' }, 'Previous page');
  const next = h('button', { type: 'button' }, 'Next page');
  const latest = h('button', { type: 'button' }, 'Latest');
  const live = h('input', { type: 'checkbox', role: 'switch', id: 'live-tail' });
  const list = h('ol', { class: 'messages', 'aria-label': 'Messages' });
  const status = h('p', { class: 'hint', 'aria-live': 'polite' });
  // Said once the live tail has let older messages go (LIVE_KEEP, LIVE_KEEP_CHARS).
  const dropped = h('p', { class: 'hint', hidden: true });
  const problem = h('div');
  let current = '-1';
  let nextOffset = null;
  let upToDate = false;
  let stopFollow = null;
  // Bumped by every start and stop of the live tail: a start that awaited the station while
  // the switch went off (and on again) sees a newer generation and leaves following to it.
  let generation = 0;

  function setPaging() {
    const liveOn = live.checked;
    for (const b of [go, first, latest]) b.disabled = liveOn;
    // Previous is the older page before the one shown (not Back through the pages visited: after
    // Latest it went to the first page), so it is off at the start of the station only.
    previous.disabled = liveOn || pageBefore(current) === null;
    next.disabled = liveOn || upToDate;
  }

  async function load(offset, fallback = null) {
    problem.replaceChildren();
    let page;
    try {
      page = await api.messages(name, offset, PAGE, { signal: ctx.signal });
    } catch (err) {
      if (err?.status === 401 || ctx.signal.aborted || live.checked) return;
      // 410: retention dropped the offset asked for (Latest asks for tail - PAGE).
      if (err?.status === 410 && fallback) return load(fallback);
      problem.replaceChildren(alertBox(err));
      return;
    }
    // The live tail started meanwhile: the list is its now.
    if (live.checked) return;
    current = offset;
    nextOffset = page.nextOffset;
    upToDate = page.upToDate;
    offsetInput.value = offset;
    dropped.hidden = true;
    list.replaceChildren(...page.messages.map(item));
    status.textContent = page.messages.length
      ? `${page.messages.length === 1 ? '1 message' : `${page.messages.length} messages`} from offset ${offset}${upToDate ? ', up to the tail' : ''}.`
      : 'No messages from this offset yet.';
    setPaging();
  }

  async function startLive() {
    stopFollow?.();
    stopFollow = null;
    const mine = ++generation;
    let from = nextOffset || '-1';
    if (!upToDate) {
      // Far from the tail: start at the tail rather than replaying everything in between.
      const s = await api.station(name, { signal: ctx.signal }).catch(() => station);
      from = s.stats?.tailOffset || from;
    }
    if (mine !== generation || !live.checked || ctx.signal.aborted) return;
    if (!upToDate) list.replaceChildren();
    problem.replaceChildren();
    dropped.hidden = true;
    status.textContent = 'Live: new messages appear below as they arrive.';
    // What the list holds (the page it started from, when that reached the tail), and what the
    // tail let go of: older messages past its bound, and messages retention removed unread.
    let count = 0;
    let chars = 0;
    for (const li of list.children) {
      count += 1;
      chars += lengths.get(li) || 0;
    }
    let letGo = 0;
    let removed = 0;
    // Following stopped by itself (closed, deleted): the switch goes off, paging comes back.
    const stopped = (text) => {
      if (mine !== generation) return;
      generation += 1;
      stopFollow = null;
      live.checked = false;
      status.textContent = text;
      setPaging();
    };
    const shown = () => {
      const lost = removed ? `; ${num(removed)} removed by retention before they were shown` : '';
      status.textContent = `Live: ${plural(count, 'message', 'messages')} shown, newest last${lost}.`;
    };
    const bound = () => {
      while (count > LIVE_KEEP || (chars > LIVE_KEEP_CHARS && count > 1)) {
        const first = list.firstElementChild;
        first.remove();
        // A gap marker at the top goes with the messages around it.
        if (!lengths.has(first)) continue;
        count -= 1;
        chars -= lengths.get(first);
        letGo += 1;
      }
      if (!letGo) return;
      dropped.hidden = false;
      dropped.textContent =
        `${plural(letGo, 'older message', 'older messages')} left this view: the live tail keeps the latest ` +
        `${num(LIVE_KEEP)} messages and at most 8 MiB of payload. Turn it off to page through them.`;
    };
    stopFollow = follow(
      name,
      from,
      (messages) => {
        for (const m of messages) {
          const li = item(m);
          list.append(li);
          count += 1;
          chars += lengths.get(li);
        }
        bound();
        shown();
      },
      {
        onResumed: () => mine === generation && shown(),
        onGap: ({ count: n, from: after, to }) => {
          if (mine !== generation) return;
          removed += n;
          list.append(
            h(
              'li',
              { class: 'gap' },
              `${plural(n, 'message was', 'messages were')} removed by retention before they were shown `,
              '(after offset ',
              h('code', {}, after),
              ', up to ',
              h('code', {}, to),
              ').',
            ),
          );
          shown();
        },
        onError: (err, final) => {
          if (err?.status === 401 || mine !== generation) return;
          if (!final) {
            status.textContent = `Live tail interrupted (${errorText(err)}); retrying…`;
            return;
          }
          if (err?.status === 403) {
            // Asking again gets the same refusal: said once, and the switch goes off.
            stopped('Stopped following: this token may not read the messages of this station.');
            problem.replaceChildren(alertBox(err));
            return;
          }
          stopped('Stopped following: the station is gone.');
          problem.replaceChildren(
            alertBox(err?.status === 404 ? new Error(`Station “${name}” no longer exists: it was deleted.`) : err),
          );
        },
        onClosed: () => stopped('The station is closed: no more messages will arrive, so following stopped.'),
      },
    );
    setPaging();
  }

  function stopLive() {
    generation += 1;
    stopFollow?.();
    stopFollow = null;
    setPaging();
  }

  ctx.signal.addEventListener('abort', () => stopFollow?.());
  live.addEventListener('change', () => (live.checked ? startLive() : (stopLive(), load(current))));
  first.addEventListener('click', () => load('-1'));
  previous.addEventListener('click', () => {
    const older = pageBefore(current);
    // Retention may have removed the older page's start (410): the earliest kept, then.
    if (older !== null) load(older, '-1');
  });
  next.addEventListener('click', () => nextOffset && load(nextOffset));
  latest.addEventListener('click', async () => {
    const s = await api.station(name, { signal: ctx.signal }).catch(() => station);
    load(latestOffset(s.stats?.tailOffset), '-1');
  });
  const browseForm = h(
    'form',
    { class: 'toolbar', novalidate: true },
    h('label', { for: 'from-offset' }, 'From offset'),
    offsetInput,
    go,
  );
  browseForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const offset = offsetFrom(offsetInput.value);
    if (offset === null) {
      problem.replaceChildren(
        alertBox(new Error('An offset looks like 0000000000000042_0000000000000000, or give a message number, or -1 for the start.')),
      );
      return;
    }
    load(offset);
  });

  panel.replaceChildren(
    h(
      'div',
      { class: 'split' },
      h(
        'section',
        { class: 'browse', 'aria-labelledby': 'browse-title' },
        h('h2', { id: 'browse-title' }, 'Browse messages'),
        browseForm,
        h(
          'div',
          { class: 'toolbar' },
          first,
          previous,
          next,
          latest,
          h('span', { class: 'switch' }, live, h('label', { for: 'live-tail' }, 'Live tail')),
        ),
        status,
        problem,
        dropped,
        list,
      ),
      produceForm,
    ),
  );
  await load('-1');
}
