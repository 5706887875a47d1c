// Reader cursors of a station (committed positions of readers such as Spark streaming
// queries), with their lag; shown under the consumer groups. The server pages them by name
// (see serverPages): a refresh reads the page on screen only.

import { api, signInPending } from '../api.js';
import { alertBox, h, num, refusablePoll, serverPages, staleBox } from '../dom.js';

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
  const NONE = 'No reader cursors. A Spark streaming read with option("cursor", NAME) commits its progress here.';
  const empty = h('p', { class: 'empty', hidden: true }, NONE);
  const search = h('input', { type: 'search', id: 'cursor-search', autocomplete: 'off', placeholder: 'Filter by name' });
  const searchBar = h('div', { class: 'toolbar', hidden: true }, h('label', { for: 'cursor-search' }, 'Search cursors'), search);
  const problem = h('div');
  let updated = null; // when the rows were last refreshed

  const pages = serverPages({
    label: 'Pages of reader cursors',
    read: (query, signal) => api.cursorPage(name, query, { signal: AbortSignal.any([ctx.signal, signal]) }),
    rows: (answer) => answer.cursors,
    // While a new token is awaited the refused one is not sent again: the refresh after the
    // sign-in reads the page asked for.
    turned: () => (signInPending() ? pages.stale() : reads.poll()),
    search,
    signal: ctx.signal,
  });

  function render(cursors, contains) {
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
    searchBar.hidden = cursors.length === 0 && !contains;
    const none = contains ? `No cursor matches “${contains}”.` : NONE;
    if (empty.textContent !== none) empty.textContent = none;
  }

  async function refresh() {
    const page = await pages.load();
    if (!page) return; // overtaken by a newer request (a page turn, a search)
    render(page.rows, page.contains);
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
      searchBar.hidden = true;
      pages.element.hidden = true;
    },
    onFailed: (err) => {
      problem.replaceChildren(updated === null ? alertBox(err) : staleBox(err, updated));
      lost(err);
    },
  });

  panel.append(h('h2', {}, 'Reader cursors'), searchBar, problem, table, pages.element, empty);
  await reads.poll();
  // A page or a search read less than a tick ago is fresh enough: one request per 2 s.
  ctx.every(2000, () => (pages.fresh(1000) ? undefined : reads.poll()));
}
