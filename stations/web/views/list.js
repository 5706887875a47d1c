// All stations with live stats, a search box and the way to create one.
//
// The server pages the list (GET /api/stations?limit&after&contains, by name): each refresh
// reads the page on screen, and only it, so a refresh costs the same at 10 or 10,000 stations
// (the whole list was about 450 bytes a station, 4.5 MB every 2 s at 10,000). The search is the
// server's too, so it finds stations on any page, those created since included.

import { api, signInPending } from '../api.js';
import { alertBox, h, num, staleBox } from '../dom.js';
import { stationHref } from '../routes.js';

const COLUMNS = [
  ['messages', 'Messages'],
  ['idsInWindow', 'Ids in window'],
  ['groups', 'Groups'],
  ['deadLettered', 'Dead-lettered'],
];

const PAGE_ROWS = 100;
const TICK_MS = 2000;
// Typing a search asks once it pauses, not at every key.
const SEARCH_MS = 300;

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
  const previous = h('button', { type: 'button' }, 'Previous page');
  const next = h('button', { type: 'button' }, 'Next page');
  const range = h('p', { class: 'hint' });
  const pager = h('nav', { class: 'toolbar pager', 'aria-label': 'Pages of stations', hidden: true }, previous, next, range);

  // The page asked for: the name it starts after (null: the first page), the starts of the
  // pages before it (Previous goes back through them: the server knows no page numbers) and
  // the search. `nextStart` is the start of the page after it (null: none, or not known yet).
  let start = null;
  let starts = [];
  let contains = '';
  let nextStart = null;
  // The page on screen: the last answer (the page asked for once it has answered).
  let shown = { stations: [], index: 0, contains: '', next: null };
  const rows = new Map();
  // Numbers the requests: only the latest one's answer is shown (a page turn or a search
  // overtakes a refresh under way).
  let asked = 0;
  let inflight = null;
  let askedAt = -Infinity;
  let searchTimer = null;
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
    return { tr, cells };
  }

  function fill(r, view) {
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

  /** The page buttons, for the page asked for (they change at a click, before its answer). */
  function renderPager() {
    const focused = document.activeElement;
    pager.hidden = starts.length === 0 && nextStart === null;
    previous.disabled = starts.length === 0;
    next.disabled = nextStart === null && !inflight;
    // A button that just went disabled would drop the keyboard's focus: the other one takes it.
    if (focused === previous && previous.disabled && !next.disabled) next.focus();
    if (focused === next && next.disabled && !previous.disabled) previous.focus();
  }

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
    // The server counts nothing: the pages before this one were full, so the count is known
    // on the last page only (give or take stations created or deleted meanwhile).
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
    const from = last === index + 1 ? num(last) : `${num(index + 1)}–${num(last)}`;
    setText(range, stations.length ? `${from}${more === null ? ` of ${num(last)}` : ''}` : '');
    renderPager();
  }

  /** Read the page asked for (one request) and show it. */
  async function load() {
    const mine = ++asked;
    inflight?.abort();
    const ctrl = new AbortController();
    inflight = ctrl;
    askedAt = performance.now();
    const index = starts.length * PAGE_ROWS;
    let answer;
    try {
      answer = await api.stations(
        { limit: PAGE_ROWS, after: start, contains },
        { signal: AbortSignal.any([ctx.signal, ctrl.signal]) },
      );
    } catch (err) {
      if (mine !== asked) return; // overtaken (and aborted): the newer request says how it went
      throw err;
    } finally {
      if (inflight === ctrl) inflight = null;
    }
    if (mine !== asked) return;
    if (!answer.stations.length && start !== null) {
      // The page emptied (its stations deleted): back to the first one.
      start = null;
      starts = [];
      nextStart = null;
      await load();
      return;
    }
    nextStart = answer.next ?? null;
    shown = { stations: answer.stations, index, contains, next: nextStart };
    updated = new Date();
    problem.replaceChildren();
    render();
  }

  const report = (err) => {
    if (err?.status !== 401 && !ctx.signal.aborted) problem.replaceChildren(staleBox(err, updated));
    renderPager(); // a Next left waiting for the failed page's answer
  };
  /** Ask for another page now (a click or a search), and meanwhile set the buttons for it. */
  function go() {
    clearTimeout(searchTimer);
    // While a new token is awaited the refused one is not sent again: the refresh after the
    // sign-in reads the page asked for.
    if (signInPending()) askedAt = -Infinity;
    else load().catch(report);
    renderPager();
  }

  previous.addEventListener('click', () => {
    if (!starts.length) return;
    // The page left is the next one of the page gone back to.
    nextStart = start;
    start = starts.pop();
    go();
  });
  next.addEventListener('click', () => {
    if (nextStart === null) return; // its start not known yet: the page before is still loading
    starts.push(start);
    start = nextStart;
    nextStart = null;
    go();
  });
  search.addEventListener('input', () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      const text = search.value.trim();
      if (text === contains) return;
      contains = text;
      start = null;
      starts = [];
      nextStart = null;
      go();
    }, SEARCH_MS);
  });
  ctx.signal.addEventListener('abort', () => clearTimeout(searchTimer));
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
    await load();
  } catch (err) {
    if (err?.status === 401 || ctx.signal.aborted) return;
    problem.replaceChildren(alertBox(err));
  }
  ctx.every(TICK_MS, async () => {
    // A page or a search read less than a tick ago is fresh enough: one request per 2 s.
    if (performance.now() - askedAt < TICK_MS / 2) return;
    try {
      await load();
    } catch (err) {
      report(err);
    }
  });
}
