// One station: a heading, tabs (Overview, Messages, Groups, DLS, Settings) and the chosen panel.

import { api, isRecreated, notFound } from '../api.js';
import { LiveChart, MAX_SERIES, RateMeter, position } from '../charts.js';
import { confirmAction } from '../dialog.js';
import { alertBox, announce, bytes, duration, errorText, h, num, refusablePoll, staleBox, when } from '../dom.js';
import { renderForm } from './form.js';
import { renderMessages } from './messages.js';
import { renderGroups } from './groups.js';
import { redrivePolicyText, renderDls } from './dls.js';
import { TABS, stationHref } from '../routes.js';

const BADGE_POLL_MS = 5000;

/** The DLS tab's count of entries: shown while there are any, updated in place. */
function setBadge(tab, count) {
  const old = tab.querySelector('.badge');
  if (!count) {
    old?.remove();
    return;
  }
  const badge = old || tab.appendChild(h('span', { class: 'badge' }));
  badge.setAttribute('aria-label', `, ${count} entries`);
  if (badge.textContent !== num(count)) badge.textContent = num(count);
}

function tabList(name, active) {
  const list = h('div', { class: 'tabs', role: 'tablist', 'aria-label': 'Station sections' });
  for (const tab of TABS) {
    const selected = tab.id === active;
    list.append(
      h(
        'a',
        {
          role: 'tab',
          id: `tab-${tab.id}`,
          href: stationHref(name, tab.id),
          'aria-selected': String(selected),
          'aria-controls': 'panel',
          tabindex: selected ? '0' : '-1',
        },
        tab.label,
      ),
    );
  }
  // Arrow keys move between tabs (the ARIA tabs pattern); Enter / click opens one.
  list.addEventListener('keydown', (event) => {
    const tabs = [...list.querySelectorAll('[role=tab]')];
    const i = tabs.indexOf(document.activeElement);
    if (i < 0) return;
    let next = null;
    if (event.key === 'ArrowRight') next = tabs[(i + 1) % tabs.length];
    else if (event.key === 'ArrowLeft') next = tabs[(i - 1 + tabs.length) % tabs.length];
    else if (event.key === 'Home') next = tabs[0];
    else if (event.key === 'End') next = tabs[tabs.length - 1];
    else if (event.key === ' ') next = tabs[i];
    if (!next) return;
    event.preventDefault();
    next.focus();
    location.hash = next.getAttribute('href');
  });
  return list;
}

export async function renderStation(main, ctx, name, tab, params = {}) {
  document.title = `${name} · Stations`;
  let station;
  try {
    station = await api.station(name, { signal: ctx.signal });
  } catch (err) {
    if (err?.status === 401 || ctx.signal.aborted) return;
    main.replaceChildren(
      h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'All stations')),
      h('h1', { tabindex: '-1' }, name),
      alertBox(err?.status === 404 ? new Error(`There is no station named “${name}”.`) : err),
    );
    return;
  }
  if (ctx.signal.aborted) return;
  const panel = h('section', {
    id: 'panel',
    role: 'tabpanel',
    'aria-labelledby': `tab-${tab}`,
    class: 'panel',
  });
  const tabs = tabList(name, tab);
  // Figures that change under the page: the DLS count on its tab, and whether it is closed.
  const closedPill = h('span', { class: 'pill closed', title: 'Closed: it takes no more messages.' });
  const marks = {
    deadLettered: (count) => setBadge(tabs.querySelector('#tab-dls'), count),
    closed: (closed) => {
      closedPill.hidden = !closed;
      closedPill.textContent = closed ? 'closed' : '';
    },
    update(s) {
      this.deadLettered(s.stats?.deadLettered);
      this.closed(Boolean(s.closed));
    },
  };
  marks.update(station);
  main.replaceChildren(
    h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'All stations')),
    h(
      'div',
      { class: 'page-head' },
      h('h1', { tabindex: '-1' }, h('span', { class: 'visually-hidden' }, 'Station '), name),
      closedPill,
      h('span', { class: 'pill' }, station.contentType),
    ),
    tabs,
    panel,
  );
  // Deleted elsewhere (another tab, the CLI), or deleted and created again under the same name:
  // what the tab shows is of a station that is no more, and its controls would act on the new
  // one. On the Groups and DLS tabs, said in place of the panel, and nothing is asked any more.
  // The Messages and Settings tabs keep what they show (the messages read, perhaps their last
  // copy; an edit being typed) under the notice: a live tail stops and says so by itself, and
  // Settings can no longer be saved.
  let ended = false;
  /** `before`: what to say first (what the action that found it out did not do). */
  const gone = (recreated, before = '') => {
    if (ctx.signal.aborted || ended) return;
    const text =
      before +
      (recreated
        ? `Station “${name}” was deleted and created again: what was shown here was the old station’s.`
        : `Station “${name}” no longer exists: it was deleted.`);
    if (tab === 'messages' || tab === 'settings') {
      ended = true;
      // A status, not a second alert: the live tail's own may say the same.
      panel.prepend(h('p', { class: 'alert', role: 'status' }, text));
      for (const button of panel.querySelectorAll('button[type=submit]')) button.disabled = true;
      return;
    }
    ctx.abort();
    panel.replaceChildren(alertBox(new Error(text)), h('p', {}, h('a', { href: '#/' }, 'All stations')));
  };
  /** The station read again: false (and said) if it is not the one this page shows. */
  const same = (s) => {
    if (s.createdAt === station.createdAt) return true;
    gone(true);
    return false;
  };
  /**
   * A read of the tab answered the server's 404: is the station gone? (A group or entry may be,
   * alone.) Another 404 (a proxy's page during a redeploy) is a failure the polls get over.
   */
  const lost = async (err) => {
    if (!notFound(err) || ctx.signal.aborted) return;
    try {
      same(await api.station(name, { signal: ctx.signal }));
    } catch (again) {
      if (notFound(again)) gone(false);
    }
  };
  // After a replay or drop: the count on the DLS tab follows (best effort).
  // (Nothing more once the station is gone: a tab that keeps its content keeps its polls.)
  // Refused (403: the token's stations no longer cover this one), the badge's poll asks no
  // more with that token; the tab's own reads say why.
  const badge = refusablePoll({
    read: () => api.station(name, { signal: ctx.signal }).then((s) => same(s) && marks.update(s)),
    signal: ctx.signal,
    onFailed: (err) => notFound(err) && gone(false),
  });
  const recount = async () => {
    if (!ended) await badge.poll();
  };
  // Dead letters come from consumers at any time, so the badge follows on a poll: the Overview
  // reads the station every 2 s anyway and the DLS tab with its own poll; the others read it here.
  if (tab !== 'overview' && tab !== 'dls') ctx.every(BADGE_POLL_MS, recount);
  if (tab === 'overview') renderOverview(panel, ctx, station, marks, gone, same);
  else if (tab === 'messages') await renderMessages(panel, ctx, station);
  else if (tab === 'groups') await renderGroups(panel, ctx, station, lost);
  else if (tab === 'dls') await renderDls(panel, ctx, station, params, recount, (s) => same(s) && marks.update(s), lost);
  else if (tab === 'settings') await renderForm(panel, ctx, station);
}

function stat(label, value, cls) {
  return h('div', { class: `stat ${cls || ''}` }, h('dt', {}, label), h('dd', {}, value));
}

/**
 * `ended(recreated, before)`: the station shown is no more (the page says so, and stops).
 * `same(view)`: whether a view read again is of the station shown (if not, said and stopped).
 */
function renderOverview(panel, ctx, station, marks, ended, same) {
  const stats = h('dl', { class: 'stats' });
  const problem = h('div');
  const closedNote = h(
    'p',
    { class: 'notice' },
    'This station is closed: it takes no more messages. What it holds can still be read and consumed.',
  );
  // The settings, read again with the figures every 2 s: changed elsewhere (another tab, the
  // CLI), they showed what they were when the page loaded, beside live figures.
  const config = h('dl', { class: 'config' });
  let configShown = '';
  const showConfig = (s) => {
    const r = s.retention || {};
    const d = s.dls || {};
    const c = s.consumerDefaults || {};
    const items = [
      ['Content type', s.contentType],
      ['Idempotency window', duration(s.idempotencyWindowMs)],
      ['Max age', r.maxAgeMs ? duration(r.maxAgeMs) : 'no limit'],
      ['Max messages', r.maxMessages ? num(r.maxMessages) : 'no limit'],
      ['Max bytes', r.maxBytes ? bytes(r.maxBytes) : 'no limit'],
      ['Poison messages to the DLS', d.poison ? 'on' : 'off'],
      ['Forward dead letters to', d.forwardTo || '—'],
      ['Keep dead letters', d.retentionMs ? duration(d.retentionMs) : 'until replayed or dropped'],
      ['Redrive dead letters', redrivePolicyText(d.redrive)],
      ['Max message deliveries', num(c.maxMsgDeliveries)],
      ['Max ack time', duration(c.maxAckTimeMs)],
      ['Created', when(s.createdAt)],
    ];
    // Laid out again only when changed: a screen reader's place in the list stays.
    const text = JSON.stringify(items);
    if (text === configShown) return;
    configShown = text;
    config.replaceChildren(...items.map(([k, v]) => h('div', {}, h('dt', {}, k), h('dd', {}, v))));
  };
  const fill = (s) => {
    marks.update(s);
    closedNote.hidden = !s.closed;
    const st = s.stats || {};
    stats.replaceChildren(
      stat('Messages', num(st.messages)),
      stat('Size', bytes(st.bytes)),
      stat('Ids in window', num(st.idsInWindow)),
      stat('Groups', num(st.groups)),
      stat('Dead-lettered', num(st.deadLettered), st.deadLettered ? 'warn' : ''),
      stat('Tail offset', h('code', {}, st.tailOffset || '—')),
    );
    showConfig(s);
  };
  fill(station);
  let updated = new Date(); // when the figures were last refreshed
  const remove = h('button', { type: 'button', class: 'danger' }, 'Delete station');
  // Why a delete was refused (a consumer's token: 403), kept on the page until the next try:
  // a toast alone went after 5 s.
  const removeProblem = h('div');
  remove.addEventListener('click', async () => {
    const yes = await confirmAction({
      title: `Delete station ${station.name}?`,
      message: 'Its messages, message ids, consumer groups and dead letters are deleted for good.',
      confirmLabel: 'Delete',
      danger: true,
      signal: ctx.signal,
    });
    if (!yes || ctx.signal.aborted) return;
    removeProblem.replaceChildren();
    try {
      // The station this page shows, not whichever has its name now: one deleted and created
      // again since (elsewhere) answers 409 and stays.
      await api.remove(station.name, station.createdAt);
      announce(`Station ${station.name} deleted.`);
      location.hash = '#/';
    } catch (err) {
      if (isRecreated(err)) {
        const nothing = 'Nothing was deleted. ';
        announce(nothing + `Station ${station.name} was deleted and created again since this page was loaded.`);
        ended(true, nothing);
        return;
      }
      if (!ctx.signal.aborted) removeProblem.replaceChildren(alertBox(new Error(`Not deleted: ${errorText(err)}`)));
    }
  });
  const rate = new LiveChart({ title: 'Message rate (messages/s)', unit: '/s' });
  const lag = new LiveChart({ title: 'Consumer group lag (messages)' });
  const meter = new RateMeter();
  const sample = (s, groups) => {
    const t = Date.now() / 1000;
    const perSecond = meter.sample(t, position(s.stats?.tailOffset));
    if (perSecond !== null) rate.push(t, { [s.name]: perSecond });
    if (groups) lag.push(t, Object.fromEntries(groups.map((g) => [g.name, g.lag])));
  };
  // A token that may not read groups (a producer's: 403) has no lag to chart: said once, and
  // the groups are not asked for again every 2 s (until another token, or Try again). Any
  // failed read has no lag to chart (undefined); the station's own figures still refresh.
  const lagNote = h('div', { class: 'lag-refused' });
  // The groups charted are the six furthest behind (the server picks them: order=lag), not
  // every group of the station read to chart six; laid out by name, so a series keeps its
  // colour while the six stay the same.
  const lagGroups = refusablePoll({
    read: () =>
      api
        .groupPage(station.name, { order: 'lag', limit: MAX_SERIES }, { signal: ctx.signal })
        .then((g) => (g.groups || []).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))),
    signal: ctx.signal,
    box: lagNote,
    what: 'consumer groups: their lag is not shown',
    // The next refresh (within 2 s) asks again, with the station's figures.
    retry: () => lagNote.replaceChildren(),
  });
  ctx.signal.addEventListener('abort', () => {
    rate.destroy();
    lag.destroy();
  });
  panel.replaceChildren(
    closedNote,
    h('h2', {}, 'Live stats'),
    problem,
    stats,
    lagNote,
    h('div', { class: 'charts' }, rate.el, lag.el),
    h('h2', {}, 'Settings'),
    config,
    h('p', {}, h('a', { href: stationHref(station.name, 'settings') }, 'Change settings')),
    h('h2', {}, 'Danger zone'),
    h('p', {}, remove),
    removeProblem,
  );
  const gone = () => {
    // Deleted from elsewhere (another tab, the CLI): its last figures must not stay on screen
    // as if it were live, and there is nothing left to refresh.
    panel.replaceChildren(
      alertBox(new Error(`Station “${station.name}” no longer exists: it was deleted.`)),
      h('p', {}, h('a', { href: '#/' }, 'All stations')),
    );
    ctx.abort();
  };
  const refresh = async () => {
    const [s, g] = await Promise.all([
      api.station(station.name, { signal: ctx.signal }).catch((err) => {
        if (notFound(err) && !ctx.signal.aborted) gone();
        throw err;
      }),
      lagGroups.poll(),
    ]);
    // Created again elsewhere: its figures are another station's, under the old settings.
    if (!same(s)) return;
    fill(s);
    sample(s, g);
    updated = new Date();
    problem.replaceChildren();
  };
  // A failed refresh leaves the last figures on screen: say they are not current.
  const refreshOrSay = () =>
    refresh().catch((err) => {
      if (err?.status !== 401 && !notFound(err) && !ctx.signal.aborted) problem.replaceChildren(staleBox(err, updated));
    });
  refreshOrSay();
  ctx.every(2000, refreshOrSay);
}
