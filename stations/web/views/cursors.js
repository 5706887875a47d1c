// Reader cursors of a station (committed positions of readers such as Spark streaming
// queries), with their lag; shown under the consumer groups.

import { api } from '../api.js';
import { alertBox, h, num, staleBox } from '../dom.js';

export async function renderCursors(panel, ctx, name, lost = () => {}) {
  const body = h('tbody');
  const table = h(
    'table',
    { class: 'cursors responsive', hidden: true },
    h('caption', { class: 'visually-hidden' }, 'Reader cursors'),
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        h('th', { scope: 'col' }, 'Cursor'),
        h('th', { scope: 'col' }, 'Committed offset'),
        h('th', { scope: 'col', class: 'n' }, 'Lag'),
        h('th', { scope: 'col' }, 'Updated'),
      ),
    ),
    body,
  );
  const empty = h(
    'p',
    { class: 'empty', hidden: true },
    'No reader cursors. A Spark streaming read with option("cursor", NAME) commits its progress here.',
  );
  const problem = h('div');
  let updated = null; // when the rows were last refreshed

  async function refresh() {
    const { cursors } = await api.cursors(name, { signal: ctx.signal });
    body.replaceChildren(
      ...cursors.map((c) =>
        h(
          'tr',
          {},
          h('th', { scope: 'row', 'data-label': 'Cursor' }, c.name),
          h('td', { 'data-label': 'Committed offset' }, h('code', {}, c.offset)),
          h('td', { class: 'n', 'data-label': 'Lag' }, num(c.lag)),
          h('td', { 'data-label': 'Updated' }, new Date(c.updatedAt).toLocaleString()),
        ),
      ),
    );
    table.hidden = cursors.length === 0;
    empty.hidden = cursors.length > 0;
    updated = new Date();
    problem.replaceChildren();
  }

  panel.append(h('h2', {}, 'Reader cursors'), problem, table, empty);
  try {
    await refresh();
  } catch (err) {
    if (err?.status === 401 || ctx.signal.aborted) return;
    problem.replaceChildren(alertBox(err));
    lost(err);
  }
  ctx.every(2000, () =>
    refresh().catch((err) => {
      if (err?.status !== 401 && !ctx.signal.aborted) problem.replaceChildren(staleBox(err, updated));
      lost(err);
    }),
  );
}
