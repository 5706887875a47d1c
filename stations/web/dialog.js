// An in-page, accessible confirmation: a modal <dialog> with the question, Cancel and Confirm.

/**
 * Resolves true when the person confirms, false on Cancel or Escape, or when `signal` aborts
 * (the page it was asked for is gone: the dialog closes, its question no longer stands).
 */
export function confirmAction({ title, message, confirmLabel = 'Confirm', danger = false, signal = null }) {
  if (signal?.aborted) return Promise.resolve(false);
  const dialog = document.getElementById('confirm');
  const ok = dialog.querySelector('[data-ok]');
  const cancel = dialog.querySelector('[data-cancel]');
  dialog.querySelector('#confirm-title').textContent = title;
  dialog.querySelector('#confirm-message').textContent = message;
  ok.textContent = confirmLabel;
  ok.className = danger ? 'danger' : 'primary';
  const opener = document.activeElement;
  return new Promise((resolve) => {
    const done = (answer) => {
      ok.removeEventListener('click', onOk);
      cancel.removeEventListener('click', onCancel);
      dialog.removeEventListener('cancel', onCancel);
      signal?.removeEventListener('abort', onAbort);
      if (dialog.open) dialog.close();
      if (opener && opener.isConnected) opener.focus();
      resolve(answer);
    };
    const onOk = () => done(true);
    const onCancel = (event) => {
      event.preventDefault();
      done(false);
    };
    const onAbort = () => done(false);
    ok.addEventListener('click', onOk);
    cancel.addEventListener('click', onCancel);
    dialog.addEventListener('cancel', onCancel);
    signal?.addEventListener('abort', onAbort);
    dialog.showModal();
    cancel.focus();
  });
}
