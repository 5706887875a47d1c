// Create a station, or change the settings of one. Checks what the API checks before sending,
// and puts the API's own errors at the field it names (`error.field`, a dotted path).

import { api, isRecreated } from '../api.js';
import {
  alertBox,
  announce,
  clearFieldErrors,
  duration,
  errorText,
  field,
  h,
  num,
  parseDuration,
  setFieldError,
} from '../dom.js';
import { stationHref } from '../routes.js';

const NAME = /^[A-Za-z0-9._~-]+(\/[A-Za-z0-9._~-]+)*$/;
const CONTENT_TYPE = /^[A-Za-z0-9!#$&^_.+-]+\/[A-Za-z0-9!#$&^_.+-]+(\s*;[\x20-\x7e]*)?$/;
const WINDOW_UNITS = [
  ['ms', 1],
  ['s', 1000],
  ['min', 60_000],
  ['h', 3_600_000],
];
const MIN_WINDOW = 100;
const MAX_WINDOW = 86_400_000;
const MAX_REDRIVE_DELAY = 604_800_000;
const MIN_ACK = 100;
const MAX_ACK = 43_200_000;

// API field (dotted path) → form control id.
const FIELDS = {
  name: 'name',
  contentType: 'contentType',
  idempotencyWindowMs: 'window',
  'retention.maxAgeMs': 'maxAge',
  'retention.maxMessages': 'maxMessages',
  'retention.maxBytes': 'maxBytes',
  'dls.poison': 'poison',
  'dls.forwardTo': 'forwardTo',
  'dls.retentionMs': 'dlsRetention',
  'dls.redrive': 'maxRedrives',
  'dls.redrive.maxRedrives': 'maxRedrives',
  'dls.redrive.delayMs': 'redriveDelay',
  'dls.redrive.maxDelayMs': 'redriveDelay',
  'dls.redrive.backoff': 'redriveBackoff',
  'consumerDefaults.maxMsgDeliveries': 'maxMsgDeliveries',
  'consumerDefaults.maxAckTimeMs': 'maxAckTime',
};

export function nameProblem(name, label = 'Name') {
  if (!name) return `${label} is required.`;
  if (name.length > 512) return `${label} is longer than 512 characters.`;
  if (!NAME.test(name)) {
    return `${label} may hold letters, digits, “.”, “_”, “~”, “-” and single “/” between segments.`;
  }
  if (name.split('/')[0] === '__ds') return `${label}: names starting with “__ds” are reserved.`;
  return null;
}

/** The largest unit that shows `ms` as a whole number. */
function windowParts(ms) {
  for (const [unit, size] of [...WINDOW_UNITS].reverse()) {
    if (ms % size === 0) return [String(ms / size), unit];
  }
  return [String(ms), 'ms'];
}

/**
 * A number field's text: what the browser could not read as a number ("2e", "1 000") has the
 * value "" and `validity.badInput`, and "" means "no limit" or "redrive off" in several fields:
 * a typo deleted a station's limits and the console said "Settings saved".
 */
const typed = (control) => (control.validity?.badInput ? 'not a number' : control.value);

// The API's bound on counts and sizes: 2^53 - 1, the largest integer every JSON client reads
// exactly (a larger one was said to be "not a whole number of at least 1").
const MAX_COUNT_TEXT = num(Number.MAX_SAFE_INTEGER);

const positiveInt = (text) => {
  const t = text.trim();
  if (!t) return null;
  return /^\d+$/.test(t) && Number(t) >= 1 && Number.isSafeInteger(Number(t)) ? Number(t) : NaN;
};

const REDRIVE_MAX_DELAY = 604_800_000; // the API's default dls.redrive.maxDelayMs

/**
 * The PATCH body for a save: only the settings the form changed, and in retention, dls and
 * consumerDefaults only the changed keys (the API merges those key by key). Sending the whole
 * config would overwrite what someone else changed meanwhile, and would name dls.forwardTo,
 * which a token scoped to this station alone may not name. dls.redrive goes whole: the API
 * replaces it. Nothing changed: {} (the server still answers, e.g. 403 to a consumer).
 */
function changedSettings(config, out) {
  const changes = {};
  if (out.idempotencyWindowMs !== config.idempotencyWindowMs) changes.idempotencyWindowMs = out.idempotencyWindowMs;
  for (const section of ['retention', 'dls', 'consumerDefaults']) {
    const before = config[section] || {};
    const diff = {};
    for (const [key, value] of Object.entries(out[section])) {
      if (key === 'redrive') continue;
      if (value !== (before[key] ?? null)) diff[key] = value;
    }
    if (Object.keys(diff).length) changes[section] = diff;
  }
  const was = config.dls?.redrive || null;
  const now = out.dls.redrive;
  const same =
    was === null || now === null
      ? was === now
      : now.maxRedrives === was.maxRedrives &&
        now.delayMs === was.delayMs &&
        now.backoff === was.backoff &&
        (now.maxDelayMs ?? REDRIVE_MAX_DELAY) === was.maxDelayMs;
  if (!same) changes.dls = { ...changes.dls, redrive: now };
  return changes;
}

export async function renderForm(container, ctx, station) {
  const editing = Boolean(station);
  const config = station || {
    name: '',
    contentType: 'application/json',
    idempotencyWindowMs: 120_000,
    retention: { maxAgeMs: null, maxMessages: null, maxBytes: null },
    dls: { poison: true, forwardTo: null, retentionMs: null },
    consumerDefaults: { maxAckTimeMs: 30_000, maxMsgDeliveries: 2 },
  };
  const [windowValue, windowUnit] = windowParts(config.idempotencyWindowMs);
  const c = {
    name: h('input', {
      type: 'text',
      value: config.name,
      autocomplete: 'off',
      spellcheck: 'false',
      required: !editing,
      readonly: editing,
      maxlength: '512',
    }),
    contentType: h('input', {
      type: 'text',
      value: config.contentType,
      list: 'content-types',
      readonly: editing,
      spellcheck: 'false',
    }),
    window: h('input', {
      type: 'number',
      value: windowValue,
      min: '0',
      step: 'any',
      inputmode: 'decimal',
    }),
    windowUnit: h(
      'select',
      { id: 'windowUnit' },
      WINDOW_UNITS.map(([unit]) => h('option', { value: unit, selected: unit === windowUnit }, unit)),
    ),
    maxAge: h('input', { type: 'text', value: config.retention.maxAgeMs ? duration(config.retention.maxAgeMs).replace(' ', '') : '', spellcheck: 'false' }),
    maxMessages: h('input', { type: 'number', min: '1', step: '1', value: config.retention.maxMessages ?? '' }),
    maxBytes: h('input', { type: 'number', min: '1', step: '1', value: config.retention.maxBytes ?? '' }),
    poison: h('input', {
      type: 'checkbox',
      role: 'switch',
      id: 'poison',
      checked: config.dls.poison,
      'aria-describedby': 'poison-hint poison-error',
    }),
    forwardTo: h('input', { type: 'text', value: config.dls.forwardTo || '', list: 'station-names', spellcheck: 'false' }),
    dlsRetention: h('input', { type: 'text', value: config.dls.retentionMs ? duration(config.dls.retentionMs).replace(' ', '') : '', spellcheck: 'false' }),
    maxRedrives: h('input', { type: 'number', min: '1', max: '1000', step: '1', value: config.dls.redrive?.maxRedrives ?? '' }),
    redriveDelay: h('input', {
      type: 'text',
      value: duration(config.dls.redrive?.delayMs ?? 60_000).replace(' ', ''),
      spellcheck: 'false',
    }),
    redriveBackoff: h('input', { type: 'number', min: '1', max: '10', step: 'any', value: config.dls.redrive?.backoff ?? 1 }),
    maxMsgDeliveries: h('input', { type: 'number', min: '1', max: '1000', step: '1', value: config.consumerDefaults.maxMsgDeliveries }),
    maxAckTime: h('input', { type: 'text', value: duration(config.consumerDefaults.maxAckTimeMs).replace(' ', ''), spellcheck: 'false' }),
  };
  const summary = h('div', { class: 'form-errors' });
  const submit = h('button', { type: 'submit', class: 'primary' }, editing ? 'Save changes' : 'Create station');
  const cancelHref = editing ? stationHref(config.name) : '#/';
  const stationNames = h('datalist', { id: 'station-names' });

  const form = h(
    'form',
    { class: 'card station-form', novalidate: true },
    summary,
    h(
      'fieldset',
      {},
      h('legend', {}, 'Station'),
      field({
        id: 'name',
        label: 'Name',
        control: c.name,
        hint: editing
          ? 'A station cannot be renamed.'
          : 'Letters, digits, “.”, “_”, “~”, “-”; “/” between segments, e.g. shop/orders.',
      }),
      field({
        id: 'contentType',
        label: 'Content type',
        control: c.contentType,
        hint: editing ? 'Fixed when the station is created.' : 'application/json stores JSON messages; anything else stores bytes.',
      }),
      h(
        'datalist',
        { id: 'content-types' },
        ['application/json', 'text/plain', 'application/octet-stream'].map((t) => h('option', { value: t })),
      ),
      field({
        id: 'window',
        label: 'Idempotency window',
        control: c.window,
        hint: 'How long a message id is remembered: 100 ms to 24 h.',
        extra: [h('label', { for: 'windowUnit', class: 'unit-label' }, 'Unit'), c.windowUnit],
      }),
    ),
    h(
      'fieldset',
      {},
      h('legend', {}, 'Retention'),
      h('p', { class: 'hint' }, 'Leave empty for no limit. Durations: e.g. 90s, 30min, 12h, 7d.'),
      h(
        'div',
        { class: 'grid3' },
        field({ id: 'maxAge', label: 'Max age', control: c.maxAge }),
        field({ id: 'maxMessages', label: 'Max messages', control: c.maxMessages }),
        field({ id: 'maxBytes', label: 'Max bytes', control: c.maxBytes }),
      ),
    ),
    h(
      'fieldset',
      {},
      h('legend', {}, 'Dead-letter store (DLS)'),
      h(
        'div',
        { class: 'field switch', 'data-field': 'poison' },
        c.poison,
        h('label', { for: 'poison' }, 'Dead-letter poison messages'),
        h('p', { class: 'hint', id: 'poison-hint' }, 'A message that used up its deliveries goes to the DLS instead of being dropped.'),
        h('p', { class: 'field-error', id: 'poison-error', hidden: true }),
      ),
      field({
        id: 'forwardTo',
        label: 'Forward dead letters to',
        control: c.forwardTo,
        hint: 'Optional: another station that also receives each dead letter.',
      }),
      field({
        id: 'dlsRetention',
        label: 'Keep dead letters for',
        control: c.dlsRetention,
        hint: 'Empty: until replayed or dropped.',
      }),
      h(
        'div',
        { class: 'grid3' },
        field({
          id: 'maxRedrives',
          label: 'Redrive at most',
          control: c.maxRedrives,
          hint: 'Times each dead letter goes back to its group by itself, 1 to 1000. Empty: off.',
        }),
        field({
          id: 'redriveDelay',
          label: 'Redrive after',
          control: c.redriveDelay,
          hint: 'Delay after dead-lettering, e.g. 30s, 5min (up to 7d).',
        }),
        field({
          id: 'redriveBackoff',
          label: 'Backoff',
          control: c.redriveBackoff,
          hint: 'Each later redrive waits this many times longer (1 to 10; 1: fixed).',
        }),
      ),
      stationNames,
    ),
    h(
      'fieldset',
      {},
      h('legend', {}, 'Consumer defaults'),
      h(
        'div',
        { class: 'grid2' },
        field({
          id: 'maxMsgDeliveries',
          label: 'Max message deliveries',
          control: c.maxMsgDeliveries,
          hint: '1 to 1000 deliveries before a message is dead-lettered.',
        }),
        field({
          id: 'maxAckTime',
          label: 'Max ack time',
          control: c.maxAckTime,
          hint: 'Lease per delivery, 100 ms to 12 h: e.g. 30s, 2min (a bare number is ms).',
        }),
      ),
    ),
    h('div', { class: 'actions' }, submit, h('a', { class: 'button', href: cancelHref }, 'Cancel')),
  );
  function read() {
    const errors = {};
    const out = {};
    const name = c.name.value.trim();
    if (!editing) {
      const problem = nameProblem(name);
      if (problem) errors.name = problem;
      out.name = name;
      const ct = c.contentType.value.trim();
      if (!CONTENT_TYPE.test(ct) || ct.length > 255) {
        errors.contentType = 'Content type must be a MIME type such as application/json.';
      }
      out.contentType = ct;
    }
    const size = Object.fromEntries(WINDOW_UNITS)[c.windowUnit.value];
    const amount = typed(c.window).trim() === '' ? NaN : Number(typed(c.window));
    const exact = amount * size;
    const windowMs = Math.round(exact);
    if (!Number.isFinite(amount) || windowMs < MIN_WINDOW || windowMs > MAX_WINDOW) {
      errors.window = 'Idempotency window must be between 100 ms and 24 h.';
    } else if (Math.abs(exact - windowMs) > 1e-6) {
      // 100.4 ms was sent as 100 without a word. (The tolerance is for binary fractions:
      // 1.1 s is 1100.0000000000002 ms.)
      errors.window = 'Idempotency window must be a whole number of milliseconds.';
    }
    out.idempotencyWindowMs = windowMs;
    const maxAge = parseDuration(c.maxAge.value);
    if (Number.isNaN(maxAge) || maxAge === 0) errors.maxAge = 'Max age must be a duration such as 7d or 12h, or empty.';
    const maxMessages = positiveInt(typed(c.maxMessages));
    if (Number.isNaN(maxMessages)) errors.maxMessages = `Max messages must be a whole number from 1 to ${MAX_COUNT_TEXT}, or empty.`;
    const maxBytes = positiveInt(typed(c.maxBytes));
    if (Number.isNaN(maxBytes)) errors.maxBytes = `Max bytes must be a whole number from 1 to ${MAX_COUNT_TEXT}, or empty.`;
    out.retention = { maxAgeMs: maxAge, maxMessages, maxBytes };
    const forwardTo = c.forwardTo.value.trim() || null;
    if (forwardTo) {
      const problem = nameProblem(forwardTo, 'Forward dead letters to');
      if (problem) errors.forwardTo = problem;
    }
    const dlsRetention = parseDuration(c.dlsRetention.value);
    if (Number.isNaN(dlsRetention) || dlsRetention === 0) {
      errors.dlsRetention = 'Keep dead letters for must be a duration such as 7d, or empty.';
    }
    out.dls = { poison: c.poison.checked, forwardTo, retentionMs: dlsRetention, redrive: null };
    const redrives = typed(c.maxRedrives).trim();
    if (redrives) {
      const maxRedrives = /^\d+$/.test(redrives) ? Number(redrives) : NaN;
      if (!(maxRedrives >= 1 && maxRedrives <= 1000)) {
        errors.maxRedrives = 'Redrive at most must be a whole number from 1 to 1000, or empty.';
      }
      const delayMs = parseDuration(c.redriveDelay.value) ?? 60_000;
      if (Number.isNaN(delayMs) || delayMs > MAX_REDRIVE_DELAY) {
        errors.redriveDelay = 'Redrive after must be a duration such as 30s or 5min, at most 7d.';
      }
      const backoff = typed(c.redriveBackoff).trim() === '' ? 1 : Number(typed(c.redriveBackoff));
      if (!(backoff >= 1 && backoff <= 10)) errors.redriveBackoff = 'Backoff must be a number from 1 to 10.';
      out.dls.redrive = { maxRedrives, delayMs, backoff };
      const keep = config.dls.redrive?.maxDelayMs;
      if (keep !== undefined && keep >= delayMs) out.dls.redrive.maxDelayMs = keep;
    }
    const deliveries = typed(c.maxMsgDeliveries).trim();
    const maxMsgDeliveries = /^\d+$/.test(deliveries) ? Number(deliveries) : NaN;
    if (!(maxMsgDeliveries >= 1 && maxMsgDeliveries <= 1000)) {
      errors.maxMsgDeliveries = 'Max message deliveries must be a whole number from 1 to 1000.';
    }
    const maxAckTimeMs = parseDuration(c.maxAckTime.value);
    if (!(maxAckTimeMs >= MIN_ACK && maxAckTimeMs <= MAX_ACK)) {
      errors.maxAckTime = 'Max ack time must be between 100 ms and 12 h.';
    }
    out.consumerDefaults = { maxMsgDeliveries, maxAckTimeMs };
    return { errors, out };
  }

  function showErrors(errors) {
    const ids = Object.keys(errors);
    for (const [id, message] of Object.entries(errors)) setFieldError(form, id, message);
    summary.replaceChildren(
      ids.length
        ? h(
            'div',
            { class: 'alert', role: 'alert' },
            h(
              'p',
              {},
              ids.length === 1 ? 'Fix this field: ' : `Fix these ${ids.length} fields: `,
              ids.map((id) => form.querySelector(`label[for="${id}"]`)?.textContent || id).join(', '),
              '.',
            ),
          )
        : '',
    );
    const first = ids.length ? form.querySelector(`#${ids[0]}`) : null;
    if (first) {
      // Keep the field's label in view, not just the control.
      first.closest('.field')?.scrollIntoView({ block: 'center' });
      first.focus({ preventScroll: true });
    }
  }

  let gone = false; // the station this form was loaded from was deleted and created again
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearFieldErrors(form);
    summary.replaceChildren();
    const { errors, out } = read();
    if (Object.keys(errors).length) {
      showErrors(errors);
      return;
    }
    submit.disabled = true;
    try {
      if (editing) {
        // The createdAt the form was filled from: a station deleted and created again since
        // (elsewhere) keeps its own settings rather than taking these.
        await api.patch(config.name, changedSettings(config, out), config.createdAt);
        announce('Settings saved.');
        location.hash = stationHref(config.name);
      } else {
        const { view, created } = await api.create(out);
        if (!created) {
          // The server takes a create of a station that exists with these same settings as
          // done (200): nothing was made, and it may hold messages and groups already.
          showErrors({ name: `Station “${view.name}” already exists (with these settings): nothing was created.` });
          summary.append(h('p', {}, h('a', { href: stationHref(view.name) }, `Open station ${view.name}`)));
          return;
        }
        announce(`Station ${view.name} is ready.`);
        location.hash = stationHref(view.name);
      }
    } catch (err) {
      if (err?.status === 401) {
        // The token was revoked: the sign-in comes over the page, and this form keeps its input.
        const what = editing ? 'Not saved' : 'Not created';
        summary.replaceChildren(alertBox(new Error(`${what}: ${errorText(err)}`)));
        return;
      }
      if (isRecreated(err)) {
        gone = true; // the same save would meet the same 409: nothing more to send from here
        summary.replaceChildren(
          alertBox(
            new Error(
              `Not saved: station “${config.name}” was deleted and created again since this form was ` +
                'loaded, and nothing was changed. Open its Settings again to edit the new station.',
            ),
          ),
        );
        return;
      }
      const id = err?.field && (FIELDS[err.field] || FIELDS[err.field.split('.')[0]]);
      if (id) {
        showErrors({ [id]: err.message });
      } else if (err?.status === 409) {
        showErrors({ name: err.message || 'A station with this name already exists with other settings.' });
      } else {
        summary.replaceChildren(alertBox(new Error(errorText(err))));
      }
    } finally {
      submit.disabled = gone;
    }
  });

  const heading = editing ? h('h2', {}, 'Settings') : h('h1', { tabindex: '-1' }, 'New station');
  const parts = editing
    ? [heading, form]
    : [h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'All stations')), heading, form];
  container.replaceChildren(...parts);
  if (!editing) document.title = 'New station · Stations';
  // Offer the other stations as forward targets (best effort; the first thousand by name:
  // a datalist of every station at 10,000 weighed megabytes).
  api
    .stations({ limit: 1000 }, { signal: ctx.signal })
    .then(({ stations }) => {
      for (const s of stations) if (s.name !== config.name) stationNames.append(h('option', { value: s.name }));
    })
    .catch(() => {});
}
