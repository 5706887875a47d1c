// Reader cursors of a station (committed positions of readers such as Spark streaming
// queries), with their lag; shown under the consumer groups.

import { api, refusal } from '../api.js';
import { alertBox, h, num, refusedBox, staleBox } from '../dom.js';

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
    refused.clear();
    problem.replaceChildren();
  }

  // A 403 (a token whose stations no longer cover this one): said, and not asked again every
  // 2 s (until another token, or Try again).
  const refused = refusal();
  const tryAgain = () => {
    refused.clear();
    poll();
  };
  function failed(err, first) {
    if (err?.status === 401 || ctx.signal.aborted) return;
    if (refused.note(err)) {
      problem.replaceChildren(refusedBox(err, 'reader cursors', tryAgain));
      table.hidden = true;
      empty.hidden = true;
      return;
    }
    problem.replaceChildren(first ? alertBox(err) : staleBox(err, updated));
    lost(err);
  }
  const poll = () => (refused.stands ? undefined : refresh().catch((err) => failed(err, false)));

  panel.append(h('h2', {}, 'Reader cursors'), problem, table, empty);
  try {
    await refresh();
  } catch (err) {
    failed(err, true);
  }
  ctx.every(2000, poll);
}
