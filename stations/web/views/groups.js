// Consumer groups of a station with their live counts, and a form that moves (seeks) a group
// to the earliest retained message, to now, to an offset or to a time.
//
// The server pages the groups (GET /api/stations/{name}/groups?limit&after&contains, by name):
// each refresh reads the page on screen and counts the figures of its groups only, so a refresh
// costs the same at 5,000 groups as at 50 (the whole list was 855 KB every 2 s at 5,000).

import { api, signInPending } from '../api.js';
import { confirmAction } from '../dialog.js';
import { alertBox, announce, duration, errorText, h, num, refusablePoll, serverPages, staleBox } from '../dom.js';
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
  const NONE = 'No consumer groups yet. A group is created by its first consumer (PUT /api/stations/{name}/groups/{group}).';
  const empty = h('p', { class: 'empty', hidden: true }, NONE);
  const search = h('input', { type: 'search', id: 'group-search', autocomplete: 'off', placeholder: 'Filter by name' });
  const searchBar = h('div', { class: 'toolbar' }, h('label', { for: 'group-search' }, 'Search groups'), search);
  const problem = h('div');
  // Why a delete was refused (a consumer's token: 403), kept on the page until the next one
  // (a toast alone went after 5 s); apart from `problem`, which each refresh empties.
  const removeProblem = h('div');
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
    removeProblem.replaceChildren();
    try {
      await api.deleteGroup(name, group);
      announce(`Group ${group} deleted.`);
      await reads.now();
    } catch (err) {
      if (!ctx.signal.aborted) {
        removeProblem.replaceChildren(alertBox(new Error(`Group ${group} was not deleted: ${errorText(err)}`)));
      }
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

  // The page of groups on screen: the last answer (see serverPages).
  let shown = { rows: [], contains: '' };
  const pages = serverPages({
    label: 'Pages of consumer groups',
    read: (query, signal) => api.groupPage(name, query, { signal: AbortSignal.any([ctx.signal, signal]) }),
    rows: (answer) => answer.groups,
    // While a new token is awaited the refused one is not sent again: the refresh after the
    // sign-in reads the page asked for.
    turned: () => (signInPending() ? pages.stale() : reads.poll()),
    search,
    signal: ctx.signal,
  });

  function render() {
    const groups = shown.rows;
    const seen = new Set();
    groups.forEach((g, i) => {
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
    searchBar.hidden = groups.length === 0 && !shown.contains;
    const none = shown.contains ? `No group matches “${shown.contains}”.` : NONE;
    if (empty.textContent !== none) empty.textContent = none;
  }

  async function refresh() {
    const page = await pages.load();
    if (!page) return; // overtaken by a newer request (a page turn, a search)
    shown = page;
    render();
    seek.setGroups(page.rows.map((g) => g.name));
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
      searchBar.hidden = true;
      pages.element.hidden = true;
      seek.element.hidden = true;
    },
    onFailed: (err) => {
      // A failed refresh leaves the last figures on screen: say they are not current.
      if (updated === null) {
        problem.replaceChildren(alertBox(err));
        table.hidden = true;
        pages.element.hidden = true;
      } else problem.replaceChildren(staleBox(err, updated));
      lost(err);
    },
  });

  searchBar.hidden = true; // shown once there are groups to search
  panel.replaceChildren(
    h('h2', {}, 'Consumer groups'),
    searchBar,
    problem,
    removeProblem,
    table,
    pages.element,
    empty,
    seek.element,
  );
  await reads.poll();
  // A page or a search read less than a tick ago is fresh enough: one request per 2 s.
  ctx.every(2000, () => (pages.fresh(1000) ? undefined : reads.poll()));
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
  // The names of the page of groups the last refresh showed (the form offers those), and the
  // groups a seek found deleted: a group chosen, then deleted elsewhere, is not sought.
  let names = [];
  const deleted = new Set();
  /** Whether the group `chosen` stands: as the last refresh said, if it is on the page shown;
   * else the server is asked (a page of one group: the first by name starting with it). */
  async function stands(chosen) {
    if (names.includes(chosen)) return true;
    const { groups } = await api.groupPage(station, { prefix: chosen, limit: 1 }, { signal });
    return groups.some((g) => g.name === chosen);
  }
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
      deleted.add(chosen);
      setOptions();
      result.textContent = `Group ${chosen} no longer exists (it was deleted): nothing was moved.`;
      announce(result.textContent);
    };
    const still = async () => {
      try {
        if (await stands(chosen)) return true;
        if (!signal.aborted) gone();
      } catch (err) {
        if (!signal.aborted) result.textContent = errorText(err);
      }
      return false;
    };
    if (!(await still())) return;
    const yes = await confirmAction({
      title: `Move group ${chosen} to ${label}?`,
      message: 'Its leases in flight are revoked and its waiting redeliveries dropped.',
      confirmLabel: 'Seek',
      signal,
    });
    // The page ended under the dialog (the station deleted or created again): nothing moves.
    if (!yes || signal.aborted) return;
    if (!(await still()) || signal.aborted) return;
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
  // What the select holds: the names of the page shown, and a group chosen that is not on it
  // (the page turned, a search, or deleted elsewhere: disabled once a seek found it gone).
  let shown = '';
  // The group chosen in the select (null: none yet, and the page's first is shown).
  let picked = null;
  group.addEventListener('change', () => {
    picked = group.value;
  });
  function setOptions() {
    const current = picked ?? group.value;
    // A chosen group off the page stays chosen: the select must not slip to another group
    // (the first) by itself.
    const kept = picked && !names.includes(picked) ? picked : null;
    form.hidden = names.length === 0 && !kept;
    const lost = kept !== null && deleted.has(kept);
    const signature = JSON.stringify([names, kept, lost]);
    if (signature === shown) return;
    shown = signature;
    const options = names.map((n) => h('option', { value: n }, n));
    if (kept) options.push(h('option', { value: kept, disabled: lost }, lost ? `${kept} (deleted)` : kept));
    group.replaceChildren(...options);
    if (current && (kept || names.includes(current))) group.value = current;
  }
  return {
    element: form,
    setGroups(list) {
      names = list;
      for (const n of list) deleted.delete(n); // created again since
      setOptions();
    },
  };
}
