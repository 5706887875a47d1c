// Sign in with a bearer token; it is kept in sessionStorage for this tab only.

import { request, token } from '../api.js';
import { errorText, field, h, setFieldError } from '../dom.js';

export function renderLogin(main, ctx, { reason, onSignedIn }) {
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
      id: 'token',
      label: 'Token',
      control: input,
      hint: 'The server asks for a bearer token. It is kept for this browser tab only.',
    }),
    h('div', { class: 'actions' }, button),
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const secret = input.value.trim();
    if (!secret) {
      setFieldError(form, 'token', 'Enter a token.');
      input.focus();
      return;
    }
    button.disabled = true;
    try {
      // Any role may list stations: a cheap check that the server accepts this token.
      await request('GET', '/api/stations', undefined, { bearer: secret });
      token.set(secret);
      onSignedIn();
    } catch (err) {
      const message = err?.status === 401 ? 'That token was not accepted.' : errorText(err);
      setFieldError(form, 'token', message);
      input.focus();
    } finally {
      button.disabled = false;
    }
  });
  main.replaceChildren(
    h('h1', { tabindex: '-1' }, 'Sign in'),
    reason ? h('p', { class: 'notice', role: 'status' }, reason) : '',
    form,
  );
  input.focus();
}
