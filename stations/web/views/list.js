// All stations with live stats, a search box and the way to create one.

import { api } from '../api.js';
import { alertBox, h, num, staleBox } from '../dom.js';
import { stationHref } from '../routes.js';

const COLUMNS = [
  ['messages', 'Messages'],
  ['idsInWindow', 'Ids in window'],
  ['groups', 'Groups'],
  ['deadLettered', 'Dead-lettered'],
];

export async function renderList(main, ctx) {
  const search = h('input', {
    type: 'search',
    id: 'search',
    autocomplete: 'off',
    placeholder: 'Filter by name',
  });
  const body = h('tbody');
  const table = h(
    'table',
    { class: 'stations responsive' },
    h('caption', { class: 'visually-hidden' }, 'Stations and their live stats'),
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        h('th', { scope: 'col' }, 'Name'),
        h('th', { scope: 'col' }, 'Content type'),
        COLUMNS.map(([, label]) => h('th', { scope: 'col', class: 'n' }, label)),
      ),
    ),
    body,
  );
  const empty = h('p', { class: 'empty', hidden: true });
  const status = h('p', { class: 'hint', 'aria-live': 'polite' });
  const problem = h('div');
  const rows = new Map();
  // When the figures on screen were last refreshed (said when a refresh fails).
  let updated = null;

  function row(view) {
    const cells = {};
    const tr = h(
      'tr',
      {},
      h('th', { scope: 'row', 'data-label': 'Name' }, h('a', { href: stationHref(view.name) }, view.name)),
      h('td', { 'data-label': 'Content type' }, view.contentType),
      COLUMNS.map(([key, label]) => (cells[key] = h('td', { class: 'n', 'data-label': label }))),
    );
    return { tr, cells, name: view.name };
  }

  function applyFilter() {
    const needle = search.value.trim().toLowerCase();
    let shown = 0;
    for (const r of rows.values()) {
      r.tr.hidden = Boolean(needle) && !r.name.toLowerCase().includes(needle);
      if (!r.tr.hidden) shown += 1;
    }
    table.hidden = rows.size === 0;
    empty.hidden = shown > 0;
    if (rows.size === 0) {
      empty.replaceChildren('No stations yet. ', h('a', { href: '#/new' }, 'Create the first one'), '.');
    } else {
      empty.textContent = `No station matches “${search.value.trim()}”.`;
    }
    const stations = rows.size === 1 ? '1 station' : `${rows.size} stations`;
    status.textContent = needle ? `${shown} of ${stations} shown` : stations;
  }

  async function refresh() {
    const { stations } = await api.stations({ signal: ctx.signal });
    const seen = new Set();
    stations.forEach((view) => {
      seen.add(view.name);
      let r = rows.get(view.name);
      if (!r) {
        r = row(view);
        rows.set(view.name, r);
      }
      for (const [key] of COLUMNS) {
        const text = num(view.stats?.[key]);
        if (r.cells[key].textContent !== text) r.cells[key].textContent = text;
      }
      r.cells.deadLettered.classList.toggle('warn', (view.stats?.deadLettered || 0) > 0);
    });
    for (const [name, r] of rows) {
      if (!seen.has(name)) {
        r.tr.remove();
        rows.delete(name);
      }
    }
    // Keep the rows in name order, moving only what is out of place.
    const ordered = [...rows.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    ordered.forEach((r, i) => {
      if (body.children[i] !== r.tr) body.insertBefore(r.tr, body.children[i] || null);
    });
    updated = new Date();
    problem.replaceChildren();
    applyFilter();
  }

  search.addEventListener('input', applyFilter);
  main.replaceChildren(
    h(
      'div',
      { class: 'page-head' },
      h('h1', { tabindex: '-1' }, 'Stations'),
      h('a', { class: 'button primary', href: '#/new' }, 'New station'),
    ),
    h(
      'div',
      { class: 'toolbar' },
      h('label', { for: 'search' }, 'Search stations'),
      search,
      status,
    ),
    problem,
    table,
    empty,
  );
  document.title = 'Stations';
  try {
    await refresh();
  } catch (err) {
    if (err?.status === 401 || ctx.signal.aborted) return;
    problem.replaceChildren(alertBox(err));
  }
  ctx.every(2000, () =>
    refresh().catch((err) => {
      if (err?.status !== 401 && !ctx.signal.aborted) problem.replaceChildren(staleBox(err, updated));
    }),
  );
}
