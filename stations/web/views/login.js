// Sign in with a bearer token; it is kept in sessionStorage for this tab only. On a first visit
// the sign-in is the page; when the server stops taking the token (revoked by a SIGHUP reload)
// it comes as a dialog over the page, which keeps the view and what was typed in it.

import { request, token } from '../api.js';
import { errorText, field, h, setFieldError } from '../dom.js';

/**
 * Why `secret` cannot be a token, or null. An Authorization header carries printable ASCII
 * only: a character beyond it made fetch throw (said as "The server cannot be reached"), or went
 * as its Latin-1 byte, not the UTF-8 the tokens file means ("That token was not accepted").
 */
function tokenProblem(secret) {
  const chars = [...secret];
  const at = chars.findIndex((c) => c < ' ' || c > '~');
  if (at < 0) return null;
  const code = chars[at].codePointAt(0).toString(16).toUpperCase().padStart(4, '0');
  return (
    'A token is printable ASCII only (letters, digits, punctuation and spaces): ' +
    `character ${at + 1} is U+${code}, which no Authorization header carries. Check what was pasted.`
  );
}

/** The token form: checks the token with the server, keeps it, then calls onSignedIn. */
function signInForm({ id, onSignedIn, extra = [] }) {
  const input = h('input', {
    type: 'password',
    name: 'token',
    // Not a password to remember: the token stays in this tab (sessionStorage), never on disk.
    autocomplete: 'off',
    required: true,
    spellcheck: 'false',
  });
  const button = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
  const form = h(
    'form',
    { class: 'card login', novalidate: true },
    field({
      id,
      label: 'Token',
      control: input,
      hint: 'The server asks for a bearer token. It is kept for this browser tab only.',
    }),
    h('div', { class: 'actions' }, button, extra),
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const secret = input.value.trim();
    if (!secret) {
      setFieldError(form, id, 'Enter a token.');
      input.focus();
      return;
    }
    const problem = tokenProblem(secret);
    if (problem) {
      setFieldError(form, id, problem);
      input.focus();
      return;
    }
    button.disabled = true;
    try {
      // Any role may list stations: a cheap check that the server accepts this token.
      await request('GET', '/api/stations?limit=1', undefined, { bearer: secret });
      token.set(secret);
      onSignedIn();
    } catch (err) {
      const message = err?.status === 401 ? 'That token was not accepted.' : errorText(err);
      setFieldError(form, id, message);
      input.focus();
    } finally {
      button.disabled = false;
    }
  });
  return { form, input };
}

export function renderLogin(main, ctx, { reason, onSignedIn }) {
  const { form, input } = signInForm({ id: 'token', onSignedIn });
  main.replaceChildren(
    h('h1', { tabindex: '-1' }, 'Sign in'),
    reason ? h('p', { class: 'notice', role: 'status' }, reason) : '',
    form,
  );
  input.focus();
}

/**
 * The sign-in as a modal dialog over the current page. `onSignedIn()` once a new token is
 * accepted, `onSignOut()` for the person who would rather sign out. Escape closes the dialog
 * (the page stays readable, say to copy what was typed); `open()` shows it again. Returns
 * { open, remove }.
 */
export function signInDialog({ reason, onSignedIn, onSignOut }) {
  const signOut = h('button', { type: 'button', class: 'quiet' }, 'Sign out');
  const { form, input } = signInForm({ id: 'signin-token', onSignedIn: () => done(onSignedIn), extra: signOut });
  const dialog = h(
    'dialog',
    { id: 'signin', 'aria-labelledby': 'signin-title', 'aria-describedby': 'signin-reason' },
    h('h2', { id: 'signin-title' }, 'Sign in again'),
    h('p', { id: 'signin-reason' }, reason),
    form,
  );
  signOut.addEventListener('click', () => done(onSignOut));
  document.body.append(dialog);
  let opener = null;
  function open() {
    if (dialog.open) return;
    opener = document.activeElement;
    dialog.showModal();
    input.focus();
  }
  function remove() {
    if (dialog.open) dialog.close();
    dialog.remove();
  }
  function done(then) {
    remove();
    // Back to where the person was (the Save button, the payload being typed).
    if (opener && opener.isConnected && opener !== document.body) opener.focus();
    then();
  }
  open();
  return { open, remove };
}
