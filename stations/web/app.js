// The Stations console: hash routes → views. Each view renders into <main> and gets a context
// whose signal aborts (stopping its polls and live tails) when the route changes.

import { setUnauthorizedHandler, token } from './api.js';
import { renderLogin } from './views/login.js';
import { renderList } from './views/list.js';
import { renderForm } from './views/form.js';
import { renderStation } from './views/station.js';
import { parseHash } from './routes.js';

const main = document.getElementById('main');
let current = null;

function context() {
  const ctrl = new AbortController();
  return {
    signal: ctrl.signal,
    abort: () => ctrl.abort(),
    /** Run fn every `ms` while this view is shown (and the tab is visible). */
    every(ms, fn) {
      let timer = null;
      const tick = async () => {
        if (ctrl.signal.aborted) return;
        if (!document.hidden) {
          try {
            await fn();
          } catch {
            // A failed refresh keeps the last good state on screen; the next one may succeed.
          }
        }
        if (!ctrl.signal.aborted) timer = setTimeout(tick, ms);
      };
      timer = setTimeout(tick, ms);
      ctrl.signal.addEventListener('abort', () => clearTimeout(timer));
    },
  };
}

async function route() {
  if (!location.hash.startsWith('#/') && location.hash !== '') return; // e.g. #main
  const focusedId = main.contains(document.activeElement) ? document.activeElement.id : null;
  current?.abort();
  const ctx = context();
  current = ctx;
  const where = parseHash(location.hash);
  updateChrome();
  if (where.view === 'list') await renderList(main, ctx);
  else if (where.view === 'new') await renderForm(main, ctx, null);
  else if (where.view === 'station') await renderStation(main, ctx, where.name, where.tab, where.params);
  else {
    main.replaceChildren();
    const h1 = document.createElement('h1');
    h1.textContent = 'Page not found';
    const back = document.createElement('a');
    back.href = '#/';
    back.textContent = 'All stations';
    main.append(h1, back);
  }
  if (ctx.signal.aborted) return;
  // Focus already on something of the new page (the reader reached a link while the rest was
  // still loading): it stays there, rather than being taken back to the heading.
  const active = document.activeElement;
  if (active && active !== main && main.contains(active)) return;
  // Keep focus on the control that caused the change (e.g. a tab); else start at the heading.
  const again = focusedId && document.getElementById(focusedId);
  if (again && main.contains(again)) again.focus();
  else main.querySelector('h1')?.focus();
}

function updateChrome() {
  const signed = Boolean(token.get());
  document.getElementById('signout').hidden = !signed;
}

function showLogin(reason) {
  current?.abort();
  const ctx = context();
  current = ctx;
  updateChrome();
  renderLogin(main, ctx, {
    reason,
    onSignedIn: () => route(),
  });
}

setUnauthorizedHandler(() => {
  // Called for every 401; show the login once per route.
  if (current?.login) return;
  const hadToken = Boolean(token.get());
  token.clear();
  showLogin(hadToken ? 'That token is no longer accepted. Sign in again.' : null);
  current.login = true;
});

document.getElementById('signout').addEventListener('click', () => {
  token.clear();
  showLogin('Signed out.');
  current.login = true;
});

document.getElementById('skip').addEventListener('click', (event) => {
  event.preventDefault();
  (main.querySelector('h1') || main).focus();
});

window.addEventListener('hashchange', route);
route();
