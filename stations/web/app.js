// The Stations console: hash routes → views. Each view renders into <main> and gets a context
// whose signal aborts (stopping its polls and live tails) when the route changes.

import { holdForSignIn, releaseAfterSignIn, setUnauthorizedHandler, signInPending, token } from './api.js';
import { h } from './dom.js';
import { renderLogin, signInDialog } from './views/login.js';
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
    /** Run fn every `ms` while this view is shown (the tab visible, and no sign-in awaited). */
    every(ms, fn) {
      let timer = null;
      const tick = async () => {
        if (ctrl.signal.aborted) return;
        if (!document.hidden && !signInPending()) {
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
  ctx.rendered = false;
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
  ctx.rendered = true;
  shown = true;
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
  current.login = true;
  updateChrome();
  renderLogin(main, ctx, {
    reason,
    onSignedIn: () => route(),
  });
}

// Whether a view has been on screen since the page loaded: a first visit (or a reload with a
// token no longer taken) has nothing to keep, and signs in on a page of its own.
let shown = false;
// The sign-in dialog while the server refuses this tab's token, and the notice shown when
// that dialog is put aside (Escape) with the page still waiting for a new token.
let reauth = null;
const waitingNotice = h(
  'div',
  { class: 'notice reauth', role: 'status' },
  'The server no longer accepts this tab’s token: nothing is refreshed or saved until you sign in again. ',
  h('button', { type: 'button', onclick: () => reauth?.open() }, 'Sign in'),
);

/**
 * A token revoked while a page is open (a SIGHUP reload of the tokens file is routine): ask for
 * another over the page rather than replacing it, which lost whatever had been typed and
 * stopped the live tail. Polls and tails wait meanwhile (holdForSignIn); once signed in they go
 * on, and the page stays as it was: a save that was refused says so, to be submitted again. A
 * view refused while it was still loading has nothing of the person's yet: it loads again.
 */
function askToSignInAgain() {
  if (reauth) {
    reauth.open();
    return;
  }
  holdForSignIn();
  const end = () => {
    reauth?.remove();
    reauth = null;
    waitingNotice.remove();
    releaseAfterSignIn();
  };
  reauth = signInDialog({
    reason:
      'The server no longer accepts this tab’s token (it may have been revoked). Sign in again to go on: ' +
      'this page and what you typed in it stay as they are.',
    onSignedIn: () => {
      end();
      updateChrome();
      if (current?.refusedWhileLoading) route();
    },
    onSignOut: () => {
      end();
      signOut();
    },
  });
  document.getElementById('signin').addEventListener('close', () => {
    if (reauth) main.before(waitingNotice);
  });
}

setUnauthorizedHandler(() => {
  // Called for every 401: once the login is shown or asked for, the others add nothing.
  if (current?.login) return;
  if (!current?.rendered && current) current.refusedWhileLoading = true;
  if (token.get() && shown) {
    askToSignInAgain();
    return;
  }
  const hadToken = Boolean(token.get());
  token.clear();
  showLogin(hadToken ? 'That token is no longer accepted. Sign in again.' : null);
});

function signOut() {
  if (reauth) {
    reauth.remove();
    reauth = null;
    waitingNotice.remove();
    releaseAfterSignIn();
  }
  token.clear();
  showLogin('Signed out.');
}

document.getElementById('signout').addEventListener('click', signOut);

document.getElementById('skip').addEventListener('click', (event) => {
  event.preventDefault();
  (main.querySelector('h1') || main).focus();
});

window.addEventListener('hashchange', route);
route();
