// The console's entry point: sign-in, the routes (#/, #/handlers/NAME,
// #/dead-letters, #/dead-letters/ID) and the overview's live refresh.

import { ApiError, api, session } from './api.js';
import { deadLetterDetail, deadLetterList } from './dead_letters.js';
import { h, show } from './dom.js';
import { handlerPage } from './handler.js';
import { REFRESH_MS, overview } from './overview.js';
import { clearMessages, showError } from './ui.js';

const main = document.getElementById('main');
/** Bumped by every navigation, so a slow answer or timer of an old page does nothing. */
let generation = 0;
let timer;

function signedIn() {
  const bar = document.getElementById('session');
  if (!session.token()) {
    show(bar);
    return;
  }
  show(bar, h('span', {}, 'Signed in (this tab only)'),
    h('button', { type: 'button', onclick: signOut }, 'Sign out'));
}

/** Forgets the token; whoever signs in next starts at the overview, not on this page. */
function signOut() {
  session.clear();
  if (location.hash === '#/' || location.hash === '') route();
  else location.hash = '#/';
}

function login(message) {
  signedIn();
  if (message) showError(message);
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true });
  show(main, h('form', {
    class: 'login', 'aria-labelledby': 'login-title',
    onsubmit: async (event) => {
      event.preventDefault();
      session.set(input.value.trim());
      try {
        await api('GET', '/v1/handlers');
        clearMessages();
        route();
      } catch (error) {
        session.clear();
        showError(error);
        input.focus();
      }
    },
  },
  h('h1', { id: 'login-title' }, 'Sign in'),
  h('p', {}, 'Use an admin token or a team token from the host\'s [admin.tokens]. It is kept for this tab only.'),
  h('label', { for: 'token' }, 'Token'), input,
  h('p', {}, h('button', { type: 'submit', class: 'primary' }, 'Sign in'))));
  input.focus();
}

function markNavigation(path) {
  for (const link of document.querySelectorAll('.top nav a')) {
    const target = link.getAttribute('href').slice(1);
    const current = target === '/' ? path === '/' : path.startsWith(target);
    if (current) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
}

/** A selector that finds the focused element again after a re-render, if it can. */
function focusKey(element) {
  if (!element || !main.contains(element)) return null;
  const href = element.getAttribute('href');
  if (href) return `a[href="${CSS.escape(href)}"]`;
  const card = element.closest('[data-handler]');
  if (element.tagName === 'SUMMARY' && card) return `[data-handler="${CSS.escape(card.dataset.handler)}"] summary`;
  if (element.id) return `#${CSS.escape(element.id)}`;
  return null;
}

/**
 * Shows what `load` built, unless the operator has gone elsewhere meanwhile
 * (an old answer never paints over a newer page). Keeps focus and open details.
 */
async function render(mine, load) {
  const nodes = await load();
  if (mine !== generation) return false;
  const focused = focusKey(document.activeElement);
  const focusWasHere = main.contains(document.activeElement);
  const open = [...main.querySelectorAll('[data-handler] details[open]')].map((d) => d.closest('[data-handler]').dataset.handler);
  show(main, nodes);
  for (const name of open) {
    const details = main.querySelector(`[data-handler="${CSS.escape(name)}"] details`);
    if (details) details.open = true;
  }
  const again = focused && main.querySelector(focused);
  // Focus stays where it was, or at least on the page's content, never lost to <body>.
  if (again) again.focus();
  else if (focusWasHere) main.focus();
  return true;
}

/** A failed load: a 401 signs out; anything else is shown. */
function failed(mine, error, blank) {
  if (mine !== generation) return;
  if (error instanceof ApiError && error.status === 401) {
    session.clear();
    login(error);
    return;
  }
  if (blank) show(main, h('h1', {}, 'This page could not be loaded'), h('p', {}, h('a', { href: '#/' }, 'Back to the overview')));
  showError(error);
}

/** The overview, again every REFRESH_MS while it is the page shown; a failed refresh is retried. */
async function refresh(mine) {
  try {
    if (await render(mine, async () => (await overview()).nodes)) document.getElementById('error').hidden = true;
  } catch (error) {
    failed(mine, error, false);
  }
  if (mine === generation && session.token()) timer = setTimeout(() => refresh(mine), REFRESH_MS);
}

async function route({ quiet = false } = {}) {
  const mine = ++generation;
  clearTimeout(timer);
  const [path, search] = (location.hash.slice(1) || '/').split('?');
  markNavigation(path);
  if (!session.token()) {
    login();
    return;
  }
  signedIn();
  if (!quiet) clearMessages();
  const rerender = () => route({ quiet: true });
  if (path === '/') {
    await refresh(mine);
    return;
  }
  let match;
  try {
    if ((match = path.match(/^\/handlers\/([^/]+)$/))) {
      await render(mine, () => handlerPage(decodeURIComponent(match[1]), rerender));
    } else if (path === '/dead-letters') {
      await render(mine, () => deadLetterList(new URLSearchParams(search ?? ''), rerender));
    } else if ((match = path.match(/^\/dead-letters\/(\d+)$/))) {
      await render(mine, () => deadLetterDetail(match[1], rerender));
    } else {
      show(main, h('h1', {}, 'Not found'), h('p', {}, h('a', { href: '#/' }, 'Back to the overview')));
    }
  } catch (error) {
    failed(mine, error, true);
  }
}

window.addEventListener('hashchange', () => route());
route();
