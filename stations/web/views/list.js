// All stations with live stats, a search box and the way to create one.
//
// GET /api/stations answers every station at once (no paging, about 450 bytes a station), and
// reading it every 2 s cost 4.5 MB a refresh at 10,000 stations. So the list shows a page at a
// time; the whole list is read again at a pace that slows with its size (new and deleted
// stations show then), and in between only the stations whose rows are on screen are read,
// one small request each.

import { api } from '../api.js';
import { alertBox, duration, h, num, staleBox } from '../dom.js';
import { stationHref } from '../routes.js';

const COLUMNS = [
  ['messages', 'Messages'],
  ['idsInWindow', 'Ids in window'],
  ['groups', 'Groups'],
  ['deadLettered', 'Dead-lettered'],
];

const PAGE_ROWS = 100;
const TICK_MS = 2000;
// The whole list is read at most once per 20 ms per station it holds (every 2 s up to 100
// stations, every minute at 3,000): about 20 KB/s on average whatever its size.
const LIST_MS_PER_STATION = 20;
const LIST_MAX_MS = 300_000;
// The rows on screen, between two reads of the whole list.
const ROWS_MS = 4000;

const listMs = (count) => Math.min(Math.max(TICK_MS, count * LIST_MS_PER_STATION), LIST_MAX_MS);
const byName = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
const stationsText = (n) => (n === 1 ? '1 station' : `${num(n)} stations`);

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
  const previous = h('button', { type: 'button' }, 'Previous page');
  const next = h('button', { type: 'button' }, 'Next page');
  const range = h('p', { class: 'hint' });
  const pager = h('nav', { class: 'toolbar pager', 'aria-label': 'Pages of stations', hidden: true }, previous, next, range);
  // Every station's latest view, by name, and the names in order.
  let views = new Map();
  let names = [];
  let page = 0;
  // The rows of the page shown, by name (only those are built), and those now on screen.
  const rows = new Map();
  const onScreen = new Set();
  const rowName = new WeakMap();
  // When the whole list, and the rows on screen, are next read (ms since the epoch).
  let listDue = 0;
  let rowsDue = 0;
  // When the figures on screen were last refreshed (said when a refresh fails).
  let updated = null;

  const observer = new IntersectionObserver((seen) => {
    for (const e of seen) {
      const name = rowName.get(e.target);
      if (e.isIntersecting) onScreen.add(name);
      else onScreen.delete(name);
    }
  });
  ctx.signal.addEventListener('abort', () => observer.disconnect());

  function row(view) {
    const cells = {};
    const tr = h(
      'tr',
      {},
      h('th', { scope: 'row', 'data-label': 'Name' }, h('a', { href: stationHref(view.name) }, view.name)),
      h('td', { 'data-label': 'Content type' }, view.contentType),
      COLUMNS.map(([key, label]) => (cells[key] = h('td', { class: 'n', 'data-label': label }))),
    );
    rowName.set(tr, view.name);
    return { tr, cells };
  }

  function fill(r, view) {
    for (const [key] of COLUMNS) {
      const text = num(view.stats?.[key]);
      if (r.cells[key].textContent !== text) r.cells[key].textContent = text;
    }
    r.cells.deadLettered.classList.toggle('warn', (view.stats?.deadLettered || 0) > 0);
  }

  /** Lay out the page shown from `views`, moving only what is out of place (focus stays). */
  function render() {
    const needle = search.value.trim().toLowerCase();
    const matching = needle ? names.filter((n) => n.toLowerCase().includes(needle)) : names;
    const pages = Math.max(1, Math.ceil(matching.length / PAGE_ROWS));
    page = Math.min(page, pages - 1);
    const start = page * PAGE_ROWS;
    const shown = matching.slice(start, start + PAGE_ROWS);
    const keep = new Set(shown);
    for (const [name, r] of rows) {
      if (keep.has(name)) continue;
      observer.unobserve(r.tr);
      r.tr.remove();
      rows.delete(name);
      onScreen.delete(name);
    }
    shown.forEach((name, i) => {
      let r = rows.get(name);
      if (!r) {
        r = row(views.get(name));
        rows.set(name, r);
        observer.observe(r.tr);
      }
      fill(r, views.get(name));
      if (body.children[i] !== r.tr) body.insertBefore(r.tr, body.children[i] || null);
    });
    table.hidden = names.length === 0;
    empty.hidden = shown.length > 0;
    if (names.length === 0) {
      empty.replaceChildren('No stations yet. ', h('a', { href: '#/new' }, 'Create the first one'), '.');
    } else {
      empty.textContent = `No station matches “${search.value.trim()}”.`;
    }
    status.textContent = needle ? `${num(matching.length)} of ${stationsText(names.length)} shown` : stationsText(names.length);
    pager.hidden = pages <= 1;
    previous.disabled = page === 0;
    next.disabled = page >= pages - 1;
    range.textContent = pages <= 1
      ? ''
      : `${num(start + 1)}–${num(start + shown.length)} of ${num(matching.length)}. The list is read again every ` +
        `${duration(Math.round(listMs(names.length) / 1000) * 1000)} at this size, the figures on screen every ${duration(ROWS_MS)}.`;
  }

  async function refreshList() {
    const { stations } = await api.stations({ signal: ctx.signal });
    views = new Map(stations.map((v) => [v.name, v]));
    names = [...views.keys()].sort(byName);
    const now = Date.now();
    listDue = now + listMs(names.length);
    rowsDue = now + ROWS_MS;
    updated = new Date();
    problem.replaceChildren();
    render();
  }

  /** Read again the stations whose rows are on screen (a deleted one leaves the list). */
  async function refreshRows() {
    rowsDue = Date.now() + ROWS_MS;
    const wanted = [...onScreen].filter((name) => views.has(name));
    if (!wanted.length) return;
    const answers = await Promise.all(
      wanted.map((name) =>
        api.station(name, { signal: ctx.signal }).catch((err) => {
          if (err?.status === 404) return null;
          throw err;
        }),
      ),
    );
    wanted.forEach((name, i) => {
      if (answers[i]) views.set(name, answers[i]);
      else views.delete(name);
    });
    if (views.size !== names.length) names = names.filter((name) => views.has(name));
    updated = new Date();
    problem.replaceChildren();
    render();
  }

  function tick() {
    const now = Date.now();
    if (now >= listDue) return refreshList();
    if (now >= rowsDue) return refreshRows();
    return undefined;
  }

  // Rows newly shown carry the figures of the last read of the whole list: read them soon.
  const turn = (by) => {
    page += by;
    rowsDue = 0;
    render();
  };
  previous.addEventListener('click', () => turn(-1));
  next.addEventListener('click', () => turn(1));
  search.addEventListener('input', () => {
    page = 0;
    rowsDue = 0;
    render();
  });
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
    pager,
  );
  document.title = 'Stations';
  try {
    await refreshList();
  } catch (err) {
    if (err?.status === 401 || ctx.signal.aborted) return;
    problem.replaceChildren(alertBox(err));
  }
  ctx.every(TICK_MS, async () => {
    try {
      await tick();
    } catch (err) {
      if (err?.status !== 401 && !ctx.signal.aborted) problem.replaceChildren(staleBox(err, updated));
    }
  });
}
