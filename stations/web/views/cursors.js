// Reader cursors of a station (committed positions of readers such as Spark streaming
// queries), with their lag; shown under the consumer groups.

import { api } from '../api.js';
import { alertBox, h, listPager, num, refusablePoll, staleBox } from '../dom.js';

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

  // The cursors of the last answer, laid out a page at a time (see listPager).
  let cursors = [];
  const pager = listPager('Pages of reader cursors', () => render());

  function render() {
    body.replaceChildren(
      ...pager.page(cursors).map((c) =>
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
  }

  async function refresh() {
    ({ cursors } = await api.cursors(name, { signal: ctx.signal }));
    render();
    updated = new Date();
  }

  // A 403 (a token whose stations no longer cover this one): said, and not asked again every
  // 2 s (until another token, or Try again).
  const reads = refusablePoll({
    read: refresh,
    signal: ctx.signal,
    box: problem,
    what: 'reader cursors',
    onRefused: () => {
      table.hidden = true;
      empty.hidden = true;
      pager.element.hidden = true;
    },
    onFailed: (err) => {
      problem.replaceChildren(updated === null ? alertBox(err) : staleBox(err, updated));
      lost(err);
    },
  });

  panel.append(h('h2', {}, 'Reader cursors'), problem, table, pager.element, empty);
  await reads.poll();
  ctx.every(2000, reads.poll);
}
