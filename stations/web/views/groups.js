// Consumer groups of a station with their live counts, and a form that moves (seeks) a group
// to the earliest retained message, to now, to an offset or to a time.

import { api } from '../api.js';
import { confirmAction } from '../dialog.js';
import { alertBox, announce, duration, errorText, h, listPager, num, refusablePoll, staleBox } from '../dom.js';
import { renderCursors } from './cursors.js';
import { stationHref } from '../routes.js';

const COLUMNS = [
  ['pending', 'Pending'],
  ['inFlight', 'In flight'],
  ['deadLettered', 'Dead-lettered'],
  ['lag', 'Lag'],
];

/** `lost(err)`: a read answered 404, the station may be gone (the page says so, and stops). */
export async function renderGroups(panel, ctx, station, lost = () => {}) {
  const name = station.name;
  const body = h('tbody');
  const table = h(
    'table',
    { class: 'groups responsive' },
    h('caption', { class: 'visually-hidden' }, 'Consumer groups'),
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        h('th', { scope: 'col' }, 'Group'),
        COLUMNS.map(([, label]) => h('th', { scope: 'col', class: 'n' }, label)),
        h('th', { scope: 'col' }, 'Max deliveries'),
        h('th', { scope: 'col' }, 'Max ack time'),
        h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, 'Actions')),
      ),
    ),
    body,
  );
  const empty = h(
    'p',
    { class: 'empty', hidden: true },
    'No consumer groups yet. A group is created by its first consumer (PUT /api/stations/{name}/groups/{group}).',
  );
  const problem = h('div');
  const seek = seekForm(name, () => reads.now(), ctx.signal);

  async function remove(group) {
    const yes = await confirmAction({
      title: `Delete group ${group}?`,
      message: 'Its cursor, leases and dead letters are deleted. Consumers of this group start over.',
      confirmLabel: 'Delete',
      danger: true,
      signal: ctx.signal,
    });
    // The page ended under the dialog (the station deleted, or created again: the group of
    // that name would be the new station's): nothing is done.
    if (!yes || ctx.signal.aborted) return;
    try {
      await api.deleteGroup(name, group);
      announce(`Group ${group} deleted.`);
      await reads.now();
    } catch (err) {
      if (!ctx.signal.aborted) announce(errorText(err));
    }
  }

  // Rows keyed by group name and updated in place, as the station list does: a rebuilt row
  // would take keyboard focus (on its link or button) with it every refresh.
  const rows = new Map();
  let updated = null; // when the rows were last refreshed

  function row(g) {
    const cells = {};
    const link = h('a', { href: stationHref(name, 'dls') + '?group=' + encodeURIComponent(g.name) }, 'Dead letters');
    const actions = h(
      'td',
      { class: 'row-actions' },
      h(
        'button',
        { type: 'button', class: 'quiet', 'aria-label': `Delete group ${g.name}`, onclick: () => remove(g.name) },
        'Delete',
      ),
    );
    const tr = h(
      'tr',
      {},
      h('th', { scope: 'row', 'data-label': 'Group' }, g.name),
      COLUMNS.map(([key, label]) => (cells[key] = h('td', { class: 'n', 'data-label': label }))),
      (cells.maxMsgDeliveries = h('td', { 'data-label': 'Max deliveries' })),
      (cells.maxAckTimeMs = h('td', { 'data-label': 'Max ack time' })),
      actions,
    );
    return { tr, cells, link, actions };
  }

  function update(r, g) {
    const texts = Object.fromEntries(COLUMNS.map(([key]) => [key, num(g[key])]));
    texts.maxMsgDeliveries = num(g.maxMsgDeliveries);
    texts.maxAckTimeMs = duration(g.maxAckTimeMs);
    for (const [key, text] of Object.entries(texts)) {
      if (r.cells[key].textContent !== text) r.cells[key].textContent = text;
    }
    r.cells.deadLettered.classList.toggle('warn', g.deadLettered > 0);
    if (g.deadLettered && !r.link.isConnected) r.actions.prepend(r.link);
    else if (!g.deadLettered && r.link.isConnected) r.link.remove();
  }

  // The groups of the last answer, laid out a page at a time (a page turn shows the next at
  // once, from them).
  let groups = [];
  const pager = listPager('Pages of consumer groups', () => render());

  function render() {
    const seen = new Set();
    pager.page(groups).forEach((g, i) => {
      seen.add(g.name);
      let r = rows.get(g.name);
      if (!r) {
        r = row(g);
        rows.set(g.name, r);
      }
      update(r, g);
      if (body.children[i] !== r.tr) body.insertBefore(r.tr, body.children[i] || null);
    });
    for (const [group, r] of rows) {
      if (!seen.has(group)) {
        r.tr.remove();
        rows.delete(group);
      }
    }
    table.hidden = groups.length === 0;
    empty.hidden = groups.length > 0;
  }

  async function refresh() {
    ({ groups } = await api.groups(name, { signal: ctx.signal }));
    render();
    seek.setGroups(groups.map((g) => g.name));
    updated = new Date();
  }

  // A token that may not read groups (a producer's): said in place of the rows, and not
  // asked again every 2 s for the same 403 (until another token, or Try again).
  const reads = refusablePoll({
    read: refresh,
    signal: ctx.signal,
    box: problem,
    what: 'consumer groups',
    onRefused: () => {
      table.hidden = true;
      empty.hidden = true;
      pager.element.hidden = true;
      seek.element.hidden = true;
    },
    onFailed: (err) => {
      // A failed refresh leaves the last figures on screen: say they are not current.
      if (updated === null) {
        problem.replaceChildren(alertBox(err));
        table.hidden = true;
        pager.element.hidden = true;
      } else problem.replaceChildren(staleBox(err, updated));
      lost(err);
    },
  });

  panel.replaceChildren(h('h2', {}, 'Consumer groups'), problem, table, pager.element, empty, seek.element);
  await reads.poll();
  ctx.every(2000, reads.poll);
  await renderCursors(panel, ctx, name, lost);
}

const TARGETS = [
  ['earliest', 'Earliest retained message'],
  ['now', 'Now (skip everything stored so far)'],
  ['offset', 'An offset'],
  ['time', 'A time'],
];

/** The "Move a group" form: a seek revokes the group's leases and drops its redeliveries. */
function seekForm(station, done, signal) {
  const group = h('select', { id: 'seek-group' });
  const target = h(
    'select',
    { id: 'seek-target' },
    TARGETS.map(([value, label]) => h('option', { value }, label)),
  );
  const offset = h('input', { type: 'text', id: 'seek-offset', spellcheck: 'false', placeholder: '0000000000000000_0000000000000000' });
  const time = h('input', { type: 'datetime-local', id: 'seek-time', step: '1' });
  const offsetField = h('div', { class: 'field', hidden: true }, h('label', { for: 'seek-offset' }, 'Offset'), offset);
  const timeField = h('div', { class: 'field', hidden: true }, h('label', { for: 'seek-time' }, 'Time (local)'), time);
  const button = h('button', { type: 'submit', class: 'primary' }, 'Seek');
  const result = h('p', { class: 'hint', 'aria-live': 'polite', id: 'seek-result' });
  const showInputs = () => {
    offsetField.hidden = target.value !== 'offset';
    timeField.hidden = target.value !== 'time';
  };
  target.addEventListener('change', showInputs);
  const form = h(
    'form',
    // Hidden until the groups are known (setGroups): a Seek before that moved "group " (none).
    { class: 'card seek-form', novalidate: true, hidden: true },
    h('h3', {}, 'Move a group'),
    h(
      'p',
      { class: 'hint' },
      'A seek revokes the group\u2019s leases in flight (their acks answer unknown) and drops its waiting redeliveries; ' +
        'delivery goes on from the new position with fresh delivery counts. Dead letters stay.',
    ),
    h(
      'div',
      { class: 'toolbar' },
      h('label', { for: 'seek-group' }, 'Group'),
      group,
      h('label', { for: 'seek-target' }, 'To'),
      target,
      offsetField,
      timeField,
      button,
    ),
    result,
  );
  // The names of the last refresh: a group chosen, then deleted elsewhere, is not sought.
  let names = [];
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    if (button.disabled) return;
    // What is moved is what the dialog names: read before it opens, never after (a refresh
    // under the open dialog may rebuild the options).
    const chosen = group.value;
    if (!chosen) {
      result.textContent = 'Pick a group to move.';
      return;
    }
    let body;
    if (target.value === 'offset') body = { to: offset.value.trim() };
    else if (target.value === 'time') {
      const ms = time.value ? new Date(time.value).getTime() : NaN;
      if (Number.isNaN(ms)) {
        result.textContent = 'Pick a time to seek to.';
        time.focus();
        return;
      }
      body = { time: ms };
    } else body = { to: target.value };
    const label = TARGETS.find(([v]) => v === target.value)[1].toLowerCase();
    const gone = () => {
      result.textContent = `Group ${chosen} no longer exists (it was deleted): nothing was moved.`;
      announce(result.textContent);
    };
    if (!names.includes(chosen)) {
      gone();
      return;
    }
    const yes = await confirmAction({
      title: `Move group ${chosen} to ${label}?`,
      message: 'Its leases in flight are revoked and its waiting redeliveries dropped.',
      confirmLabel: 'Seek',
      signal,
    });
    // The page ended under the dialog (the station deleted or created again): nothing moves.
    if (!yes || signal.aborted) return;
    if (!names.includes(chosen)) {
      gone();
      return;
    }
    // One seek at a time, and the last one's result is not this one's: a second click while
    // a slow seek ran sent another (revoking the leases consumers took in between).
    button.disabled = true;
    result.textContent = `Moving group ${chosen} to ${label}…`;
    try {
      const answer = await api.seek(station, chosen, body);
      result.textContent =
        `Group ${chosen} now continues after ${answer.cursor}: ` +
        `${num(answer.revoked)} leases revoked, ${num(answer.dropped)} redeliveries dropped.`;
      announce(result.textContent);
      await done();
    } catch (err) {
      if (signal.aborted) return;
      if (err?.status === 404 && /^group /.test(err.message || '')) gone();
      else result.textContent = errorText(err);
    } finally {
      button.disabled = false;
      // Disabled, it lost the focus it had got back from the dialog.
      if (document.activeElement === document.body && button.isConnected) button.focus();
    }
  });
  // What the select holds: the groups' names, and a chosen group deleted since (disabled).
  let shown = '';
  return {
    element: form,
    setGroups(list) {
      names = list;
      const current = group.value;
      // A chosen group deleted elsewhere stays chosen, marked: the select must not slip to
      // another group (the first) by itself.
      const kept = current && !list.includes(current) ? current : null;
      form.hidden = list.length === 0 && !kept;
      const signature = JSON.stringify([list, kept]);
      if (signature === shown) return;
      shown = signature;
      const options = list.map((n) => h('option', { value: n }, n));
      if (kept) options.push(h('option', { value: kept, disabled: true }, `${kept} (deleted)`));
      group.replaceChildren(...options);
      if (current) group.value = current;
    },
  };
}
