// The dead-letter store of a station: entries with reason, deliveries, redrives and error; the
// station's redrive policy; replay (optionally after a delay) or drop the selected ones, or
// replay them all, each after an in-page confirmation. It follows the store on a poll every
// DLS_POLL_MS: the count (one small request), then, when every entry is shown, the entries after
// the last one shown (none, mostly). An entry never changes (a redrive writes a new one) and ids
// only grow, so the rows shown plus those after them make the count exactly when nothing was
// removed: only then are the new ones added, else the rows shown are read again.
//
// The Group filter offers a page of the station's groups the server reads (the first 100 by
// name, or those holding the text searched for: GET .../groups?contains&limit), and the count of
// a group chosen is a page of that one group (prefix, limit=1): the tab never reads the whole
// list of groups (855 KB at 5,000 groups), whatever their number.

import { api } from '../api.js';
import { confirmAction } from '../dialog.js';
import { alertBox, duration, errorText, h, isJsonType, marked, num, parseDuration, payload, staleBox, when } from '../dom.js';

const REASONS = {
  max_deliveries: 'Max deliveries reached',
  dead_letter: 'Dead-lettered by a consumer',
  max_redrives: 'Max redrives reached',
};

/** The station's `dls.redrive` policy in words. */
export function redrivePolicyText(policy) {
  if (!policy) return 'off';
  const times = policy.maxRedrives === 1 ? 'once' : `up to ${num(policy.maxRedrives)} times`;
  const growth = policy.backoff && policy.backoff !== 1 ? `, ×${policy.backoff} after each` : '';
  return `${times}, ${duration(policy.delayMs)} after dead-lettering${growth}`;
}

const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;

const DLS_POLL_MS = 2000;
const PAGE_LIMIT = 100;
const MAX_LIMIT = 1000;
// With more entries than are shown (a "Load more" page left), a removal among the rows shown
// that an addition after them hid from the count is caught by reading them again this often.
const WINDOW_POLLS = 15;
// The groups (for the Group filter) are read again when the count moves, else this often.
const GROUP_POLLS = 5;
// Groups the filter offers: a page of them by name (a search finds the others).
const FILTER_LIMIT = 100;
// Typing a search asks once it pauses, not at every key.
const SEARCH_MS = 300;
// What a row shows that may change while its entry stays in the store.
const signature = (e) => JSON.stringify([e.group, e.reason, e.error, e.deliveryCount, e.redrives, e.redriveAt]);

/**
 * `changed()`: entries were replayed or dropped (the station page updates its DLS count).
 * `seen(view)`: the station was read again (by the poll), for the page's DLS badge; false when
 * it is not the station shown (deleted and created again: the page says so and stops).
 * `lost(err)`: a read answered 404: the station may be gone (the page says so, and stops).
 */
export async function renderDls(panel, ctx, station, params = {}, changed = () => {}, seen = () => true, lost = () => {}) {
  const name = station.name;
  // The redrive policy follows the station as the polls read it (changed elsewhere, it showed
  // what it was when the tab opened).
  const policy = h('p', { class: 'hint', id: 'dls-policy' });
  let policyShown;
  const showPolicy = (redrive) => {
    const text = redrivePolicyText(redrive);
    if (text === policyShown) return;
    policyShown = text;
    policy.replaceChildren(
      'Redrive policy: ',
      h('strong', {}, text),
      redrive ? '' : ' (set one under Settings to resend dead letters by themselves).',
    );
  };
  showPolicy(station.dls?.redrive);
  /** `seen`, and the policy shown follows the station read (if it is the one shown). */
  const saw = (s) => {
    if (s.createdAt === station.createdAt) showPolicy(s.dls?.redrive);
    return seen(s);
  };
  const json = isJsonType(station.contentType);
  const groupSelect = h(
    'select',
    { id: 'dls-group', 'aria-describedby': 'dls-group-hint' },
    h('option', { value: '' }, 'All groups'),
  );
  const search = h('input', {
    type: 'search',
    id: 'dls-group-search',
    autocomplete: 'off',
    spellcheck: 'false',
    placeholder: 'Filter by name',
    'aria-describedby': 'dls-group-hint',
  });
  // Says when the filter offers only part of the groups, or none matches the search.
  const filterHint = h('p', { class: 'hint', id: 'dls-group-hint', 'aria-live': 'polite' });
  const selectAll = h('input', { type: 'checkbox', id: 'dls-select-all' });
  const replay = h('button', { type: 'button', class: 'primary' }, 'Replay');
  const drop = h('button', { type: 'button', class: 'danger' }, 'Drop');
  const replayAll = h('button', { type: 'button' }, 'Replay all');
  const refreshButton = h('button', { type: 'button', class: 'quiet' }, 'Refresh');
  const more = h('button', { type: 'button', hidden: true }, 'Load more');
  const delay = h('input', {
    type: 'text',
    id: 'dls-delay',
    size: '6',
    spellcheck: 'false',
    placeholder: 'now',
    'aria-describedby': 'dls-delay-hint',
  });
  const selection = h('p', { class: 'hint', 'aria-live': 'polite' });
  const actions = h(
    'div',
    { class: 'toolbar actions-bar', hidden: true },
    h('span', { class: 'switch' }, selectAll, h('label', { for: 'dls-select-all' }, 'Select all')),
    h('label', { for: 'dls-delay' }, 'Replay after'),
    delay,
    h('span', { class: 'visually-hidden', id: 'dls-delay-hint' }, 'A duration such as 30s; empty replays at once.'),
    replay,
    drop,
    replayAll,
    selection,
  );
  // What the last replay or drop did, kept on screen (the toast goes after 5 s): above all
  // why fewer entries were handled than were selected.
  const outcome = h('p', { class: 'result', role: 'status', hidden: true });
  const problem = h('div');
  // Where a failed poll says how old the entries shown are (apart from `problem`, which holds
  // what a replay or drop ran into until the next action).
  const stale = h('div');
  const body = h('tbody');
  const table = h(
    'table',
    { class: 'dls responsive' },
    h('caption', { class: 'visually-hidden' }, 'Dead-letter entries, oldest first'),
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        h('th', { scope: 'col' }, 'Entry'),
        ['Group', 'Message', 'Reason', 'Error', 'Deliveries', 'Redrives', 'Dead-lettered at', 'Payload'].map((label) =>
          h('th', { scope: 'col' }, label),
        ),
      ),
    ),
    body,
  );
  const empty = h('p', { class: 'empty', hidden: true }, 'The dead-letter store is empty.');
  const loading = h('p', { class: 'hint', role: 'status' }, 'Loading the dead letters…');
  let entries = [];
  let next = null;
  // Whether the entries shown were read (for the group shown): until then nothing is said of
  // the store (not "empty"), and there is nothing to act on.
  let loaded = false;
  // A 403: the token may not read the DLS. Nothing is asked again until the person acts.
  let refused = false;
  // A replay or drop under way: the actions wait for its answer (a second click sent it again).
  let busy = false;
  // The rows shown, by entry id: a reload keeps the row (its checkbox, and focus) of an entry
  // that did not change, so a poll does not undo a selection under way.
  let rows = new Map();

  const boxes = () => [...body.querySelectorAll('input[type=checkbox]')];
  const selected = () => boxes().filter((b) => b.checked).map((b) => b.value);

  function update() {
    const ids = selected();
    replay.disabled = busy || ids.length === 0;
    drop.disabled = busy || ids.length === 0;
    replayAll.disabled = busy || entries.length === 0;
    const all = boxes();
    selectAll.checked = all.length > 0 && ids.length === all.length;
    selectAll.indeterminate = ids.length > 0 && ids.length < all.length;
    selectAll.disabled = all.length === 0;
    selection.textContent = entries.length
      ? `${plural(entries.length, 'entry', 'entries')} shown, ${ids.length} selected.`
      : '';
    table.hidden = !loaded || entries.length === 0;
    empty.hidden = !loaded || entries.length > 0;
    actions.hidden = !loaded;
    loading.hidden = loaded || refused || problem.childElementCount > 0;
    more.hidden = !loaded || !next;
  }

  function row(e) {
    const id = `dls-entry-${e.id}`;
    return h(
      'tr',
      {},
      h(
        'td',
        { class: 'select' },
        h(
          'span',
          { class: 'switch' },
          h('input', { type: 'checkbox', id, value: e.id, onchange: update }),
          h('label', { for: id }, h('span', { class: 'visually-hidden' }, 'Select '), `Entry ${e.id}`),
        ),
      ),
      h('td', { 'data-label': 'Group' }, e.group),
      h(
        'td',
        { 'data-label': 'Message', class: 'message-cell' },
        h(
          'div',
          {},
          h('span', {}, 'Id ', e.msgId === null ? '—' : h('code', {}, e.msgId)),
          h('span', { class: 'offset' }, 'Offset ', h('code', {}, e.offset)),
        ),
      ),
      h('td', { 'data-label': 'Reason' }, REASONS[e.reason] || marked(e.reason)),
      // A consumer's own words (its dead-letter reason): bidirectional controls as marks.
      h('td', { 'data-label': 'Error' }, e.error === null || e.error === undefined ? '—' : marked(e.error)),
      h('td', { 'data-label': 'Deliveries', class: 'n' }, num(e.deliveryCount)),
      h(
        'td',
        { 'data-label': 'Redrives', class: 'n redrives' },
        num(e.redrives ?? 0),
        e.redriveAt ? h('span', { class: 'hint' }, ' next ', h('time', { datetime: e.redriveAt }, when(e.redriveAt))) : null,
      ),
      h('td', { 'data-label': 'Dead-lettered at' }, h('time', { datetime: e.deadLetteredAt }, when(e.deadLetteredAt))),
      h('td', { 'data-label': 'Payload', class: 'payload-cell' }, payload(e, json)),
    );
  }

  // Bumped by every load: only the latest one's page is shown (a replay's reload may overtake
  // a "Load more" still under way, whose page would then follow the wrong rows).
  let loads = 0;
  async function load(append = false) {
    const mine = ++loads;
    const group = groupSelect.value;
    let page;
    if (append) {
      page = await api.dls(name, { group, after: next, limit: PAGE_LIMIT }, { signal: ctx.signal });
    } else {
      // Read again as far as the rows shown went (after "Load more"), up to the API's limit:
      // the server's byte bound may answer fewer a page (8 MiB), so page on until there.
      const want = Math.min(MAX_LIMIT, Math.max(PAGE_LIMIT, entries.length));
      const until = loaded && entries.length ? BigInt(entries.at(-1).id) : null;
      page = { entries: [], next: null };
      let after;
      for (;;) {
        const more = await api.dls(name, { group, after, limit: want - page.entries.length }, { signal: ctx.signal });
        if (mine !== loads) return;
        page.entries.push(...more.entries);
        page.next = more.next;
        after = more.next;
        const reached = page.entries.length >= want || until === null || BigInt(page.entries.at(-1)?.id ?? 0) >= until;
        if (!more.next || reached) break;
      }
    }
    if (mine !== loads) return;
    const fresh = append ? page.entries.filter((e) => !rows.has(String(e.id))) : page.entries;
    entries = append ? entries.concat(fresh) : fresh;
    next = page.next;
    place(fresh, append);
    if (!append) {
      windowPolls = 0;
      windowCount = null;
    }
    loaded = true;
    refused = false;
    problem.replaceChildren();
    update();
  }

  /**
   * Follow the store from the count `n` just read: add the entries after the last one shown
   * when they alone make up the change; else read the rows shown again.
   */
  async function follow(n) {
    if (next === null) {
      const mine = ++loads;
      const last = entries.at(-1)?.id;
      const tail = await api.dls(name, { group: groupSelect.value, after: last, limit: PAGE_LIMIT }, { signal: ctx.signal });
      if (mine !== loads) return;
      const fresh = tail.entries.filter((e) => !rows.has(String(e.id)));
      if (!tail.next && entries.length + fresh.length === n) {
        if (fresh.length && entries.length + fresh.length > MAX_LIMIT) {
          // As many rows as a reload would read: the rest wait for "Load more".
          next = last ?? null;
        } else if (fresh.length) {
          entries = entries.concat(fresh);
          place(fresh, true);
        }
        update();
        lastCount = n;
        return;
      }
    } else {
      windowPolls += 1;
      const removed = lastCount !== null && n < lastCount;
      lastCount = n;
      // The rows shown were just read (a load does not know the count): the first count after
      // is theirs. (Unknown, it was always "changed": the window was read again for nothing.)
      if (windowCount === null) windowCount = n;
      if (!removed && (windowPolls < WINDOW_POLLS || n === windowCount)) return;
    }
    await load();
    lastCount = n;
    windowCount = n;
  }

  /** Show `list` (after the rows shown, with `append`), moving only what is out of place. */
  function place(list, append) {
    const old = rows;
    const kept = append ? rows : new Map();
    const focused = document.activeElement;
    let refocus = null;
    const trs = list.map((e) => {
      const id = String(e.id);
      const sig = signature(e);
      const had = old.get(id);
      if (had && had.sig === sig) {
        kept.set(id, had);
        return had.tr;
      }
      const tr = row(e);
      if (had) {
        // Changed (a redrive, say): a new row, still selected if it was.
        const box = tr.querySelector('input[type=checkbox]');
        box.checked = had.tr.querySelector('input[type=checkbox]').checked;
        if (had.tr.contains(focused)) refocus = box;
      }
      kept.set(id, { tr, sig });
      return tr;
    });
    if (append) {
      body.append(...trs);
      return;
    }
    for (const [id, r] of old) if (kept.get(id) !== r) r.tr.remove();
    trs.forEach((tr, i) => {
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    });
    rows = kept;
    refocus?.focus();
  }

  /** The replay delay in ms, or undefined after showing why it is not one. */
  function replayDelay() {
    const ms = parseDuration(delay.value);
    if (Number.isNaN(ms) || ms > 604_800_000) {
      problem.replaceChildren(alertBox(new Error('Replay after must be a duration such as 30s or 5min (at most 7d), or empty.')));
      delay.setAttribute('aria-invalid', 'true');
      delay.focus();
      return undefined;
    }
    delay.removeAttribute('aria-invalid');
    return ms || 0;
  }
  const after = (ms) => (ms ? ` They fall due ${duration(ms)} after the replay.` : '');

  /**
   * Say what a replay or drop of `ids` did (`done` of them; the page already reloaded). The API
   * answers a count only: of the others, those still listed stayed on purpose (a replay keeps
   * an entry whose message retention removed: nothing is left to put back in the queue), and
   * the rest had left the DLS already, handled by someone else (or their group was deleted).
   */
  function tell(text, ids, done, replaying) {
    const still = new Set(entries.map((e) => String(e.id)));
    const kept = replaying ? ids.filter((id) => still.has(String(id))).length : 0;
    const elsewhere = ids.length - done - kept;
    const parts = [text];
    if (kept) {
      parts.push(
        `${plural(kept, 'entry stays', 'entries stay')} in the DLS: ${kept === 1 ? 'its message was' : 'their messages were'} ` +
          'removed by retention, so there is nothing to put back in the queue (drop them, or read their copies here).',
      );
    }
    if (elsewhere > 0) {
      parts.push(
        `${plural(elsewhere, 'of the selected entries was', 'of the selected entries were')} no longer in the DLS ` +
          `(replayed, dropped or redriven elsewhere${replaying ? ', or their group was deleted' : ''}).`,
      );
    }
    // A status region: read out as it changes, no toast needed.
    outcome.textContent = parts.join(' ');
    outcome.hidden = false;
  }

  // The Group filter's options follow the groups (a group created after the tab opened could
  // not be chosen): "All groups" and the page the server answered (the first FILTER_LIMIT by
  // name holding the search's text). The group chosen stays chosen when it is not on the page
  // (another search, or it came from the Groups tab's link), and is marked once a read of its
  // count finds it deleted.
  let offered = { names: [], more: false, contains: '' };
  let goneGroup = null; // the group chosen, found deleted by its last count
  let filterShown = '';
  function setOptions(pick = groupSelect.value) {
    const { names, more, contains } = offered;
    const kept = pick && !names.includes(pick) ? pick : null;
    const hint = more
      ? contains
        ? `The first ${FILTER_LIMIT} groups holding “${contains}” are offered: search for more of the name.`
        : `The first ${FILTER_LIMIT} groups by name are offered: search for the others.`
      : contains && !names.length
        ? `No group matches “${contains}”.`
        : '';
    if (filterHint.textContent !== hint) filterHint.textContent = hint;
    const signature = JSON.stringify([names, kept, kept !== null && kept === goneGroup]);
    if (signature === filterShown && groupSelect.value === pick) return;
    filterShown = signature;
    const options = [h('option', { value: '' }, 'All groups'), ...names.map((n) => h('option', { value: n }, n))];
    if (kept) options.push(h('option', { value: kept }, kept === goneGroup ? `${kept} (deleted)` : kept));
    groupSelect.replaceChildren(...options);
    groupSelect.value = pick;
  }
  // Bumped by every read of the filter's page: only the latest one's answer is shown (a search
  // overtakes a poll's read under way).
  let filterReads = 0;
  async function readFilter() {
    const mine = ++filterReads;
    const contains = search.value.trim();
    const page = await api.groupPage(name, { contains, limit: FILTER_LIMIT }, { signal: ctx.signal });
    if (mine !== filterReads) return;
    offered = { names: page.groups.map((g) => g.name), more: (page.next ?? null) !== null, contains };
    setOptions();
  }
  let searchTimer = null;
  search.addEventListener('input', () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      if (search.value.trim() === offered.contains) return;
      readFilter().catch((err) => {
        if (ctx.signal.aborted || err?.status === 401) return;
        filterHint.textContent = errorText(err);
        lost(err);
      });
    }, SEARCH_MS);
  });
  ctx.signal.addEventListener('abort', () => clearTimeout(searchTimer));

  /** The figures of `group` (a page of the one group: the first by name starting with it), or
   * null when it no longer stands. */
  async function groupFigures(group) {
    const { groups } = await api.groupPage(name, { prefix: group, limit: 1 }, { signal: ctx.signal });
    const figures = groups.find((g) => g.name === group) ?? null;
    if (group === groupSelect.value) {
      const gone = figures ? null : group;
      if (gone !== goneGroup) {
        goneGroup = gone;
        setOptions();
      }
    }
    return figures;
  }

  /** How many dead letters the store holds (of `group`, if given), or null if unsaid. */
  async function count(group) {
    if (group) return (await groupFigures(group))?.deadLettered ?? null;
    const s = await api.station(name, { signal: ctx.signal });
    saw(s);
    return s.stats?.deadLettered ?? null;
  }

  /**
   * How many dead letters "Replay all" concerns now (the page shows at most 100), or null. The
   * station is read first: deleted, or created again (its dead letters are another station's),
   * the page says so and ends (`ctx.signal` aborted), and nothing is to be asked.
   */
  async function total(group) {
    try {
      const s = await api.station(name, { signal: ctx.signal });
      saw(s);
      if (ctx.signal.aborted) return null;
      if (!group) return s.stats?.deadLettered ?? null;
      return (await groupFigures(group))?.deadLettered ?? null;
    } catch (err) {
      await lost(err);
      return null;
    }
  }

  // The count at the last poll, and with more entries than shown, the count when the rows
  // shown were read and the polls since.
  let lastCount = null;
  let windowCount = null;
  let windowPolls = 0;
  let groupPolls = 0;
  let polled = new Date(); // when the last poll got an answer

  /** A read failed: why (a 403 stops the polls until the person acts). */
  function failed(err) {
    if (err?.status === 401 || ctx.signal.aborted) return;
    lost(err);
    if (err?.status === 403) {
      refused = true;
      stale.replaceChildren();
      problem.replaceChildren(
        h('p', { class: 'alert', role: 'alert' }, errorText(err), ' This page asks no more; Refresh tries again.'),
      );
    } else if (loaded) {
      stale.replaceChildren(staleBox(err, polled));
    } else {
      problem.replaceChildren(alertBox(err));
    }
    update();
  }

  async function poll() {
    if (refused || loadingMore) return;
    const group = groupSelect.value;
    let n;
    try {
      n = await count(group);
      // The badge counts the whole station's store, whichever group is shown.
      if (group) saw(await api.station(name, { signal: ctx.signal }));
      if (n !== lastCount || ++groupPolls >= GROUP_POLLS) {
        // For the filter only (a page of groups): when the count moved, else now and then.
        groupPolls = 0;
        await readFilter().catch(() => {});
      }
    } catch (err) {
      failed(err);
      return;
    }
    if (ctx.signal.aborted) return;
    polled = new Date();
    // A "Load more" under way would have its page dropped by a reload: the next poll does it.
    // So would a replay's or drop's reload, whose outcome is told from the rows it reads: a
    // poll yields to the action (its count may be of before it, too).
    if (group !== groupSelect.value || loadingMore || refused || busy) return;
    try {
      if (!loaded || n === null) await load();
      else await follow(n);
      stale.replaceChildren();
    } catch (err) {
      failed(err);
    }
  }

  /** Read the entries again, from the start (a Refresh, another group): a 403 may be over. */
  async function reload() {
    refused = false;
    stale.replaceChildren();
    try {
      await load();
    } catch (err) {
      failed(err);
    }
  }

  /** Run the action `fn`, saying `doing` in place of the last action's outcome meanwhile. */
  async function acting(doing, fn) {
    busy = true;
    const focused = document.activeElement;
    outcome.textContent = doing;
    outcome.hidden = false;
    problem.replaceChildren();
    update();
    try {
      await guarded(fn);
      if (outcome.textContent === doing) outcome.hidden = true;
    } finally {
      busy = false;
      update();
      // Disabled, the button lost the focus it had got back from the dialog.
      if (document.activeElement === document.body && focused?.isConnected && !focused.disabled) focused.focus();
    }
  }

  async function guarded(fn) {
    try {
      await fn();
    } catch (err) {
      if (ctx.signal.aborted) return;
      // A 401 too: the sign-in comes over the page, and this says the action is still to do.
      problem.replaceChildren(alertBox(err));
    }
  }

  replay.addEventListener('click', async () => {
    const ids = selected();
    const delayMs = replayDelay();
    if (delayMs === undefined) return;
    const ok = await confirmAction({
      title: `Replay ${plural(ids.length, 'entry', 'entries')}?`,
      message: "Each goes back to its group's queue with a fresh delivery count and leaves the DLS." + after(delayMs),
      signal: ctx.signal,
    });
    // The page ended under the dialog (the station deleted or created again): nothing is done.
    if (!ok || busy || ctx.signal.aborted) return;
    await acting(`Replaying ${plural(ids.length, 'entry', 'entries')}…`, async () => {
      const { replayed } = await api.replay(name, delayMs ? { ids, delayMs } : { ids });
      changed();
      await load();
      tell(`Replayed ${plural(replayed, 'entry', 'entries')}.`, ids, replayed, true);
    });
  });
  drop.addEventListener('click', async () => {
    const ids = selected();
    const ok = await confirmAction({
      title: `Drop ${plural(ids.length, 'entry', 'entries')}?`,
      message: 'Dropped dead letters are deleted for good.',
      confirmLabel: 'Drop',
      danger: true,
      signal: ctx.signal,
    });
    // The page ended under the dialog (the station deleted or created again): nothing is done.
    if (!ok || busy || ctx.signal.aborted) return;
    await acting(`Dropping ${plural(ids.length, 'entry', 'entries')}…`, async () => {
      const { dropped } = await api.drop(name, { ids });
      changed();
      await load();
      tell(`Dropped ${plural(dropped, 'entry', 'entries')}.`, ids, dropped, false);
    });
  });
  replayAll.addEventListener('click', async () => {
    const group = groupSelect.value;
    const delayMs = replayDelay();
    if (delayMs === undefined) return;
    const count = await total(group);
    if (ctx.signal.aborted) return;
    const every = count === null ? 'every dead letter' : `all ${plural(count, 'dead letter', 'dead letters')}`;
    const ok = await confirmAction({
      title: group ? `Replay ${every} of group ${group}?` : `Replay ${every}?`,
      message: "All of them go back to their group's queue with a fresh delivery count." + after(delayMs),
      signal: ctx.signal,
    });
    // The page ended under the dialog (the station deleted or created again): nothing is done.
    if (!ok || busy || ctx.signal.aborted) return;
    await acting(group ? `Replaying the dead letters of group ${group}…` : 'Replaying every dead letter…', async () => {
      const selection = group ? { all: true, group } : { all: true };
      const { replayed } = await api.replay(name, delayMs ? { ...selection, delayMs } : selection);
      changed();
      await load();
      // Left behind: entries whose messages retention removed (or dead letters newer than the replay).
      const left = entries.length
        ? ` ${next ? 'Some entries stay' : `${plural(entries.length, 'entry stays', 'entries stay')}`} in the DLS: ` +
          'their messages were removed by retention (or they arrived since).'
        : '';
      outcome.textContent = `Replayed ${plural(replayed, 'entry', 'entries')}.${left}`;
      outcome.hidden = false;
    });
  });
  selectAll.addEventListener('change', () => {
    for (const b of boxes()) b.checked = selectAll.checked;
    update();
  });
  groupSelect.addEventListener('change', () => {
    // The rows of another group are not this one's: nothing is said until it is read.
    loaded = false;
    entries = [];
    next = null;
    place([], false);
    problem.replaceChildren();
    update();
    reload();
  });
  refreshButton.addEventListener('click', () => {
    if (!loaded) problem.replaceChildren();
    update();
    reload();
  });
  // One page at a time: a second click before the first page came would ask for it again.
  // (aria-disabled, not disabled: a disabled button would drop keyboard focus to the page.)
  let loadingMore = false;
  more.addEventListener('click', async () => {
    if (loadingMore) return;
    loadingMore = true;
    more.setAttribute('aria-disabled', 'true');
    try {
      await guarded(() => load(true));
    } finally {
      loadingMore = false;
      more.removeAttribute('aria-disabled');
    }
  });

  panel.replaceChildren(
    h('h2', {}, 'Dead-letter store'),
    policy,
    h(
      'div',
      { class: 'toolbar' },
      h('label', { for: 'dls-group-search' }, 'Search groups'),
      search,
      h('label', { for: 'dls-group' }, 'Group'),
      groupSelect,
      refreshButton,
    ),
    filterHint,
    actions,
    outcome,
    problem,
    stale,
    loading,
    table,
    empty,
    more,
  );
  update();
  try {
    // A group named by the link (the Groups tab's "Dead letters") is chosen if it stands, on
    // the page offered or not.
    const [, asked] = await Promise.all([readFilter(), params.group ? groupFigures(params.group) : null]);
    if (asked) setOptions(params.group);
    await load();
  } catch (err) {
    // Said, and tried again by the poll (a 403: when the person acts).
    failed(err);
  }
  ctx.every(DLS_POLL_MS, poll);
}
