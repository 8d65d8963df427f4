// Dead letters: groups first (one row per handler, kind and reason pattern,
// with counts, first and last seen, replay or discard of the whole group),
// then a list filtered by handler and reason kind, a detail view (payload as
// text, JSON or hex; headers; reason; history), and replay or discard of one
// or of the selected ones, each confirmed. Every id gets its own outcome:
// what worked in the notice, what did not in the error banner.

import { ApiError, api } from './api.js';
import { fmt, h } from './dom.js';
import { clearMessages, confirmAction, notify, showError } from './ui.js';

// The reason kinds the host writes (db::dead_letters::ReasonKind).
const KINDS = ['event-id', 'rejected', 'retries-exhausted', 'limit', 'cut', 'sandbox-violation', 'host-error', 'held'];

/** The API's answer for one id, in words, and whether it did what was asked. */
const ACTIONS = {
  replay: (r) => [`Dead letter ${r.id}: ${r.outcome.replaceAll('-', ' ')}${r.detail ? `: ${r.detail}` : ''}`,
    ['replayed', 'already-applied', 'duplicate-by-key'].includes(r.outcome)],
  discard: (r) => [`Dead letter ${r.id}: ${r.discarded ? 'discarded' : 'already replayed or discarded'}`, r.discarded],
};

/** What became of the letters held behind one (ordering = "key"), a line each. */
function heldLines(result) {
  return (result.held ?? []).map((r) => `  held behind it, dead letter ${r.id}: ${r.outcome.replaceAll('-', ' ')}${r.detail ? `: ${r.detail}` : ''}`);
}

/**
 * Replays or discards `ids` one by one after a confirmation, then shows every
 * outcome. `held` (replay or discard): what becomes of the letters held behind each.
 */
async function actOn(action, ids, rerender, held) {
  const verb = action === 'replay' ? 'Replay' : 'Discard';
  const consequence = action === 'replay' ? 'Each runs through the handler version active on this host.' : 'They will not be applied.';
  if (!(await confirmAction(`${verb} dead letter(s) ${ids.join(', ')}? ${consequence}`, verb))) return;
  clearMessages();
  const done = [];
  const failed = [];
  for (const id of ids) {
    try {
      const suffix = held ? `?held=${encodeURIComponent(held)}` : '';
      const result = await api('POST', `/v1/dead-letters/${id}/${action}${suffix}`);
      const [line, ok] = ACTIONS[action](result);
      (ok ? done : failed).push([line, ...heldLines(result)].join('\n'));
    } catch (error) {
      failed.push(`Dead letter ${id}: ${error instanceof ApiError ? error.describe() : error.message}`);
    }
  }
  await rerender();
  if (done.length) notify(done.join('\n'));
  if (failed.length) showError(failed.join('\n'));
}

/**
 * Replays or discards every member of a group after a confirmation (one
 * request: the host walks the members), then reports each member: the ids
 * per outcome in the notice, each failure with its reason in the banner.
 */
async function actOnGroup(action, group, rerender) {
  const verb = action === 'replay' ? 'Replay' : 'Discard';
  const consequence = action === 'replay' ? 'Each runs through the handler version active on this host.' : 'They will not be applied.';
  const question = `${verb} all ${group.count} dead letters of ${group.handler} like “${group.pattern}”? ${consequence}`;
  if (!(await confirmAction(question, `${verb} ${group.count}`))) return;
  clearMessages();
  let results;
  try {
    results = await api('POST', `/v1/dead-letters/groups/${encodeURIComponent(group.id)}/${action}`);
  } catch (error) {
    await rerender();
    showError(error);
    return;
  }
  const byOutcome = new Map();
  const failed = [];
  for (const result of results) {
    const [line, ok] = ACTIONS[action](result);
    if (!ok) { failed.push(line); continue; }
    const outcome = action === 'replay' ? result.outcome.replaceAll('-', ' ') : 'discarded';
    byOutcome.set(outcome, [...(byOutcome.get(outcome) ?? []), result.id]);
  }
  await rerender();
  const done = [...byOutcome].map(([outcome, ids]) => `${ids.length} ${outcome}: dead letter(s) ${ids.join(', ')}`);
  notify(`Group ${group.id} (${results.length} dead letters)${done.length ? `\n${done.join('\n')}` : ''}`);
  if (failed.length) showError(failed.join('\n'));
}

/** The groups table: what failed, how often, since when, and one action per group. */
function groupTable(groups, rerender) {
  if (!groups.length) return null;
  return [
    h('h2', {}, 'Groups'),
    h('p', { class: 'muted' }, 'Parked dead letters of one handler and kind whose reasons differ only in numbers, ids and quoted values.'),
    h('div', { class: 'scroll' }, h('table', { 'aria-label': 'Dead letter groups' },
      h('thead', {}, h('tr', {}, ['Handler', 'Kind', 'Reason pattern', 'Count', 'First seen', 'Last seen', 'Example', 'Actions']
        .map((t) => h('th', { class: t === 'Count' ? 'num' : null }, t)))),
      h('tbody', {}, groups.map((group) => h('tr', { 'data-group': group.id },
        h('td', {}, group.handler),
        h('td', {}, group.kind),
        h('td', { class: 'mono', 'data-field': 'pattern' }, group.pattern),
        h('td', { class: 'num', 'data-field': 'count' }, String(group.count)),
        h('td', {}, fmt.time(group.first_failed_at)),
        h('td', {}, fmt.time(group.last_failed_at)),
        h('td', {}, h('a', { href: `#/dead-letters/${group.example_id}`, title: group.example_reason }, String(group.example_id))),
        h('td', { class: 'group-actions' },
          h('button', { class: 'primary', 'data-action': 'replay-group', onclick: () => actOnGroup('replay', group, rerender) }, 'Replay group'),
          ' ',
          h('button', { class: 'danger', 'data-action': 'discard-group', onclick: () => actOnGroup('discard', group, rerender) }, 'Discard group'))))))),
    h('h2', {}, 'Dead letters'),
  ];
}

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value) search.set(key, value);
  return search.toString();
}

export async function deadLetterList(params, rerender) {
  const [rows, groups, handlers] = await Promise.all([
    api('GET', `/v1/dead-letters?${query({ handler: params.get('handler'), kind: params.get('kind'), all: params.get('all') })}`),
    api('GET', `/v1/dead-letters/groups?${query({ handler: params.get('handler'), kind: params.get('kind') })}`),
    api('GET', '/v1/handlers'),
  ]);
  const chosen = new Set();
  const selectionButtons = [];
  const refreshButtons = () => selectionButtons.forEach((b) => { b.disabled = chosen.size === 0; });
  const filters = h('form', {
    class: 'filters', 'aria-label': 'Filter dead letters',
    onsubmit: (event) => {
      event.preventDefault();
      const form = new FormData(event.target);
      location.hash = `#/dead-letters?${query({ handler: form.get('handler'), kind: form.get('kind'), all: form.get('all') ? 'true' : '' })}`;
    },
  },
  h('label', {}, 'Handler', h('select', { name: 'handler' }, h('option', { value: '' }, 'All I may see'),
    handlers.map((x) => h('option', { value: x.name, selected: params.get('handler') === x.name }, x.name)))),
  h('label', {}, 'Reason kind', h('select', { name: 'kind' }, h('option', { value: '' }, 'Any'),
    KINDS.map((k) => h('option', { value: k, selected: params.get('kind') === k }, k)))),
  h('label', { class: 'inline' }, h('input', { type: 'checkbox', name: 'all', checked: params.get('all') === 'true' }), 'Include replayed and discarded'),
  h('button', { type: 'submit' }, 'Apply'));

  const selectionAction = (label, cls, action) => {
    const button = h('button', { class: cls, disabled: true, onclick: () => actOn(action, [...chosen], rerender) }, label);
    selectionButtons.push(button);
    return button;
  };

  const table = rows.length
    ? h('div', { class: 'scroll' }, h('table', {},
      h('thead', {}, h('tr', {},
        h('th', {}, h('span', { class: 'skip' }, 'Select')),
        ['Id', 'Handler', 'Event id', 'Topic / partition / offset', 'Kind', 'Reason', 'Attempts', 'Last failed', 'Resolution']
          .map((t) => h('th', {}, t)))),
      h('tbody', {}, rows.map((row) => h('tr', { 'data-dead-letter': row.id },
        h('td', {}, row.resolution ? null : h('input', {
          type: 'checkbox', 'aria-label': `Select dead letter ${row.id}`,
          onchange: (event) => { if (event.target.checked) chosen.add(row.id); else chosen.delete(row.id); refreshButtons(); },
        })),
        h('td', {}, h('a', { href: `#/dead-letters/${row.id}` }, String(row.id))),
        h('td', {}, row.handler),
        h('td', { class: 'mono' }, row.event_id ?? 'none'),
        h('td', {}, `${row.topic} / ${row.partition} / ${row.offset}`),
        h('td', {}, row.kind),
        h('td', {}, row.reason.length > 140 ? `${row.reason.slice(0, 140)}…` : row.reason),
        h('td', { class: 'num' }, String(row.attempts)),
        h('td', {}, fmt.time(row.last_failed_at)),
        h('td', {}, row.resolution ?? 'parked'))))))
    : h('p', { 'data-field': 'no-dead-letters' }, 'No dead letters match.');

  return [
    h('h1', {}, 'Dead letters'),
    filters,
    groupTable(groups, rerender),
    h('div', { class: 'actions' },
      selectionAction('Replay selected', 'primary', 'replay'),
      selectionAction('Discard selected', 'danger', 'discard')),
    table,
    rows.length >= 1000 ? h('p', { class: 'muted' }, 'The first 1000 are shown: narrow the filter to see the rest.') : null,
  ];
}

function payloadView(letter) {
  const out = h('pre', { 'data-field': 'payload' }, letter.payload);
  const render = (mode) => {
    if (mode === 'hex') out.textContent = letter.payload_hex.replace(/(.{2})/g, '$1 ').trim();
    else if (mode === 'json') {
      try {
        out.textContent = JSON.stringify(JSON.parse(letter.payload), null, 2);
      } catch (error) {
        out.textContent = `Not JSON (${error.message}). Text:\n${letter.payload}`;
      }
    } else out.textContent = letter.payload;
  };
  const modes = [['text', 'Text'], ['json', 'JSON'], ['hex', 'Hex']];
  return [
    h('fieldset', {}, h('legend', {}, 'Show the payload as'),
      modes.map(([value, label]) => h('label', { class: 'inline' },
        h('input', { type: 'radio', name: 'payload-mode', value, checked: value === 'text', onchange: () => render(value) }), ` ${label} `))),
    out,
  ];
}

/**
 * Replay and discard of one parked letter; with a key (ordering = "key"), the
 * choice of what becomes of the records held behind it.
 */
function actions(letter, rerender) {
  const holds = letter.key != null && letter.kind !== 'held';
  const choice = holds
    ? h('select', { name: 'held', 'data-field': 'held-choice' },
      h('option', { value: 'replay' }, 'replay the records held behind it, in order'),
      h('option', { value: 'discard' }, 'discard the records held behind it'))
    : null;
  const held = () => (choice ? choice.value : undefined);
  return h('div', { class: 'actions' },
    h('button', { class: 'primary', onclick: () => actOn('replay', [letter.id], rerender, held()) }, 'Replay'),
    h('button', { class: 'danger', onclick: () => actOn('discard', [letter.id], rerender, held()) }, 'Discard'),
    choice ? h('label', {}, 'Then ', choice) : null);
}

export async function deadLetterDetail(id, rerender) {
  const letter = await api('GET', `/v1/dead-letters/${encodeURIComponent(id)}`);
  const parked = !letter.resolution;
  return [
    h('p', {}, h('a', { href: `#/dead-letters?handler=${encodeURIComponent(letter.handler)}` }, `← Dead letters of ${letter.handler}`)),
    h('h1', {}, `Dead letter ${letter.id}`),
    h('dl', { class: 'facts' },
      [['Handler', letter.handler], ['Event id', letter.event_id ?? 'none (cannot be replayed)'],
        ['Record', `${letter.topic} / partition ${letter.partition} / offset ${letter.offset}`],
        ['Key', letter.key ?? 'none'], ['Reason kind', letter.kind], ['Reason', letter.reason],
        ['Attempts', String(letter.attempts)], ['Handler version', letter.handler_version ?? '–'],
        ['First failed', fmt.time(letter.first_failed_at)], ['Last failed', fmt.time(letter.last_failed_at)],
        ['Resolution', letter.resolution ? `${letter.resolution} at ${fmt.time(letter.resolved_at)}` : 'parked']]
        .map(([term, value]) => [h('dt', {}, term), h('dd', { 'data-field': term.toLowerCase().replaceAll(' ', '-') }, value)])),
    parked ? actions(letter, rerender) : null,
    h('h2', {}, 'Payload'),
    payloadView(letter),
    h('h2', {}, 'Headers'),
    letter.headers.length
      ? h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', {}, 'Value'))),
        h('tbody', {}, letter.headers.map((x) => h('tr', {}, h('td', { class: 'mono' }, x.name), h('td', { class: 'mono' }, x.value)))))
      : h('p', { class: 'muted' }, 'No headers.'),
  ];
}
