// What every view shares: the error banner, the result notice and the
// confirmation dialog.

import { ApiError } from './api.js';

/** Shows an error (an ApiError, an Error, or the words to show) in the banner. */
export function showError(error) {
  const banner = document.getElementById('error');
  if (typeof error === 'string') banner.textContent = error;
  else banner.textContent = error instanceof ApiError ? error.describe() : `Error: ${error.message}`;
  banner.hidden = false;
}

export function clearMessages() {
  const banner = document.getElementById('error');
  banner.hidden = true;
  banner.textContent = '';
  document.getElementById('notice').textContent = '';
}

/** Says what an action did, in the live region (read out by screen readers). */
export function notify(text) {
  document.getElementById('notice').textContent = text;
}

/** Asks before an action; resolves true on Confirm, false on Cancel or Escape. */
export function confirmAction(text, label = 'Confirm') {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = label;
  dialog.returnValue = '';
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    dialog.showModal();
  });
}

/** Runs an action after confirmation; shows its result or its error. */
export async function act(question, label, run, done) {
  if (!(await confirmAction(question, label))) return;
  clearMessages();
  try {
    const result = await run();
    notify(done(result));
    return result;
  } catch (error) {
    showError(error);
    return undefined;
  }
}
