// Consumer groups of a station with their live counts.

import { api } from '../api.js';
import { confirmAction } from '../dialog.js';
import { alertBox, announce, duration, errorText, h, num } from '../dom.js';
import { stationHref } from './station.js';

const COLUMNS = [
  ['pending', 'Pending'],
  ['inFlight', 'In flight'],
  ['deadLettered', 'Dead-lettered'],
  ['lag', 'Lag'],
];

export async function renderGroups(panel, ctx, station) {
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

  async function remove(group) {
    const yes = await confirmAction({
      title: `Delete group ${group}?`,
      message: 'Its cursor, leases and dead letters are deleted. Consumers of this group start over.',
      confirmLabel: 'Delete',
      danger: true,
    });
    if (!yes) return;
    try {
      await api.deleteGroup(name, group);
      announce(`Group ${group} deleted.`);
      await refresh();
    } catch (err) {
      announce(errorText(err));
    }
  }

  async function refresh() {
    const { groups } = await api.groups(name, { signal: ctx.signal });
    // Rows are rebuilt; keep keyboard focus on the same control.
    const focused = body.contains(document.activeElement) ? document.activeElement.getAttribute('aria-label') : null;
    body.replaceChildren(
      ...groups.map((g) =>
        h(
          'tr',
          {},
          h('th', { scope: 'row', 'data-label': 'Group' }, g.name),
          COLUMNS.map(([key, label]) =>
            h('td', { class: key === 'deadLettered' && g[key] ? 'n warn' : 'n', 'data-label': label }, num(g[key])),
          ),
          h('td', { 'data-label': 'Max deliveries' }, num(g.maxMsgDeliveries)),
          h('td', { 'data-label': 'Max ack time' }, duration(g.maxAckTimeMs)),
          h(
            'td',
            { class: 'row-actions' },
            g.deadLettered
              ? h('a', { href: stationHref(name, 'dls') + '?group=' + encodeURIComponent(g.name) }, 'Dead letters')
              : null,
            h(
              'button',
              { type: 'button', class: 'quiet', 'aria-label': `Delete group ${g.name}`, onclick: () => remove(g.name) },
              'Delete',
            ),
          ),
        ),
      ),
    );
    if (focused) body.querySelector(`[aria-label="${CSS.escape(focused)}"]`)?.focus();
    table.hidden = groups.length === 0;
    empty.hidden = groups.length > 0;
    problem.replaceChildren();
  }

  panel.replaceChildren(h('h2', {}, 'Consumer groups'), problem, table, empty);
  try {
    await refresh();
  } catch (err) {
    if (err?.status === 401 || ctx.signal.aborted) return;
    problem.replaceChildren(alertBox(err));
    table.hidden = true;
  }
  ctx.every(2000, refresh);
}
