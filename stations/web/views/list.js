// All stations with live stats, a search box and the way to create one.
//
// The server pages the list (GET /api/stations?limit&after&contains, by name): each refresh
// reads the page on screen, and only it, so a refresh costs the same at 10 or 10,000 stations
// (the whole list was about 450 bytes a station, 4.5 MB every 2 s at 10,000). The search is the
// server's too, so it finds stations on any page, those created since included.

import { api, signInPending } from '../api.js';
import { alertBox, h, num, serverPages, staleBox } from '../dom.js';
import { stationHref } from '../routes.js';

const COLUMNS = [
  ['messages', 'Messages'],
  ['idsInWindow', 'Ids in window'],
  ['groups', 'Groups'],
  ['deadLettered', 'Dead-lettered'],
];

const TICK_MS = 2000;

const stationsText = (n) => (n === 1 ? '1 station' : `${num(n)} stations`);
const matchText = (n) => (n === 1 ? '1 station matches' : `${num(n)} stations match`);

export async function renderList(main, ctx) {
  const search = h('input', {
    type: 'search',
    id: 'search',
    autocomplete: 'off',
    // The search is the server's (contains, ignoring case).
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

  // The page on screen: the last answer (the page asked for once it has answered).
  let shown = { stations: [], index: 0, contains: '', next: null };
  const rows = new Map();
  // When the figures on screen were last refreshed (said when a refresh fails).
  let updated = null;
  const pages = serverPages({
    label: 'Pages of stations',
    read: (query, signal) => api.stations(query, { signal: AbortSignal.any([ctx.signal, signal]) }),
    rows: (answer) => answer.stations,
    turned: go,
    search,
    signal: ctx.signal,
  });

  function row(view) {
    const cells = {};
    const tr = h(
      'tr',
      {},
      h('th', { scope: 'row', 'data-label': 'Name' }, h('a', { href: stationHref(view.name) }, view.name)),
      (cells.contentType = h('td', { 'data-label': 'Content type' })),
      COLUMNS.map(([key, label]) => (cells[key] = h('td', { class: 'n', 'data-label': label }))),
    );
    return { tr, cells };
  }

  function fill(r, view) {
    // A station deleted and created again elsewhere keeps its row (its name) with another type.
    if (r.cells.contentType.textContent !== view.contentType) r.cells.contentType.textContent = view.contentType;
    for (const [key] of COLUMNS) {
      const text = num(view.stats?.[key]);
      if (r.cells[key].textContent !== text) r.cells[key].textContent = text;
    }
    r.cells.deadLettered.classList.toggle('warn', (view.stats?.deadLettered || 0) > 0);
  }

  const setText = (el, text) => {
    // The status is a live region: said again only when it changes, not every refresh.
    if (el.textContent !== text) el.textContent = text;
  };

  /** Lay out the page on screen, moving only what is out of place (focus stays). */
  function render() {
    const { stations, index, next: more } = shown;
    const keep = new Set(stations.map((v) => v.name));
    for (const [name, r] of rows) {
      if (keep.has(name)) continue;
      r.tr.remove();
      rows.delete(name);
    }
    stations.forEach((view, i) => {
      let r = rows.get(view.name);
      if (!r) {
        r = row(view);
        rows.set(view.name, r);
      }
      fill(r, view);
      if (body.children[i] !== r.tr) body.insertBefore(r.tr, body.children[i] || null);
    });
    // The count is known on the last page only (see serverPages).
    const last = index + stations.length;
    const count = more === null ? null : last;
    table.hidden = stations.length === 0 && !shown.contains;
    empty.hidden = stations.length > 0;
    if (!shown.contains) {
      empty.replaceChildren('No stations yet. ', h('a', { href: '#/new' }, 'Create the first one'), '.');
      setText(status, count === null ? stationsText(last) : `More than ${stationsText(last)}`);
    } else {
      empty.textContent = `No station matches “${shown.contains}”.`;
      setText(status, `${count === null ? matchText(last) : `More than ${matchText(last)}`} “${shown.contains}”`);
    }
  }

  /** Read the page asked for (one request) and show it. */
  async function load() {
    const page = await pages.load();
    if (!page) return; // overtaken by a newer request
    shown = { stations: page.rows, index: page.index, contains: page.contains, next: page.next };
    updated = new Date();
    problem.replaceChildren();
    render();
  }

  const report = (err) => {
    if (err?.status !== 401 && !ctx.signal.aborted) problem.replaceChildren(staleBox(err, updated));
  };
  /** Ask for another page now (a click or a search). */
  function go() {
    // While a new token is awaited the refused one is not sent again: the refresh after the
    // sign-in reads the page asked for.
    if (signInPending()) pages.stale();
    else load().catch(report);
  }

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
    pages.element,
  );
  document.title = 'Stations';
  try {
    await load();
  } catch (err) {
    if (err?.status === 401 || ctx.signal.aborted) return;
    problem.replaceChildren(alertBox(err));
  }
  ctx.every(TICK_MS, async () => {
    // A page or a search read less than a tick ago is fresh enough: one request per 2 s.
    if (pages.fresh(TICK_MS / 2)) return;
    try {
      await load();
    } catch (err) {
      report(err);
    }
  });
}
