// The overview: one card per handler the token may manage, refreshed every
// two seconds from /v1/overview.

import { api } from './api.js';
import { chart } from './chart.js';
import { fmt, h, stat } from './dom.js';

export const REFRESH_MS = 2000;

function state(handler) {
  if (handler.paused) return ['paused', 'Paused'];
  if (handler.consuming) return ['running', 'Running'];
  if (handler.running_version) return ['absent', 'Loaded, not consuming'];
  return ['absent', 'Not loaded on this host'];
}

function percentiles(p) {
  if (!p || !p.count) return 'no samples';
  return `${fmt.ms(p.p50_ms)} / ${fmt.ms(p.p99_ms)}`;
}

function lag(handler) {
  const partitions = handler.live ? handler.live.lag : [];
  if (!partitions.length) return h('p', { class: 'muted' }, 'Consumer lag: not reported yet by the broker.');
  const total = partitions.reduce((sum, p) => sum + p.lag, 0);
  return h('details', {},
    h('summary', {}, `Consumer lag: ${fmt.count(total)} records over ${partitions.length} partition(s) on this host`),
    h('table', {},
      h('thead', {}, h('tr', {}, h('th', {}, 'Topic'), h('th', { class: 'num' }, 'Partition'), h('th', { class: 'num' }, 'Lag'))),
      h('tbody', {}, partitions.map((p) => h('tr', {},
        h('td', {}, p.topic), h('td', { class: 'num' }, p.partition), h('td', { class: 'num', 'data-field': `lag-${p.topic}-${p.partition}` }, fmt.count(p.lag)))))));
}

function card(handler, nowMs) {
  const [cls, label] = state(handler);
  const live = handler.live;
  const rate = live ? live.per_second : {};
  const totals = live ? live.totals : {};
  const version = handler.active_version ? `version ${handler.active_version}` : handler.running_version ?? '';
  const hosts = handler.hosts.map((host) => `${host.host}${host.consuming ? '' : ' (idle)'}`).join(', ');
  const id = `handler-${handler.name}`;
  return h('section', { class: 'card', 'data-handler': handler.name, 'aria-labelledby': id },
    h('header', {},
      h('h2', { id }, h('a', { href: `#/handlers/${encodeURIComponent(handler.name)}` }, handler.name)),
      h('span', { class: `badge ${cls}`, 'data-field': 'state' }, label),
      h('span', { class: 'muted' }, `${handler.source === 'api' ? 'uploaded' : 'config file'} · ${version}`)),
    h('dl', { class: 'stats' },
      stat('Consumed', fmt.rate(rate.consumed), 'consumed-rate'),
      stat('Applied', fmt.rate(rate.applied), 'applied-rate'),
      stat('Duplicates skipped', fmt.rate(rate.duplicates), 'duplicates-rate'),
      stat('Failures', fmt.rate(rate.failures), 'failures-rate', { alert: rate.failures > 0 }),
      stat('Applied (total here)', fmt.count(totals.applied), 'applied-total'),
      stat('Duplicates (total here)', fmt.count(totals.duplicates), 'duplicates-total'),
      stat('Failures (total here)', fmt.count(totals.failures), 'failures-total'),
      stat('Host errors (total here)', fmt.count(totals.host_errors), 'host-errors-total',
        { alert: totals.host_errors > 0 }),
      stat('Batch p50 / p99', percentiles(live && live.batch), 'batch-latency'),
      stat('Guest p50 / p99', percentiles(live && live.guest), 'guest-latency'),
      stat('Dead letters parked', fmt.count(handler.dead_letters_parked), 'dead-letters',
        { alert: handler.dead_letters_parked > 0, link: `#/dead-letters?handler=${encodeURIComponent(handler.name)}` }),
      // Held behind a parked record of their key (ordering = "key"): lag only an operator releases.
      stat('Held behind dead letters', fmt.count(handler.held_records), 'held-records',
        { alert: handler.held_records > 0, link: `#/dead-letters?handler=${encodeURIComponent(handler.name)}` }),
      stat('Outbox backlog', fmt.count(handler.outbox_backlog), 'outbox-backlog'),
      stat('Relay lag', fmt.age(handler.relay_lag_ms), 'relay-lag'),
      stat('Outbox parked', fmt.count(handler.outbox_parked), 'outbox-parked', { alert: handler.outbox_parked > 0 }),
      stat('Hosts', hosts || 'none seen', 'hosts')),
    live ? chart(handler.name, live.series, nowMs) : null,
    lag(handler));
}

/** The overview's nodes, and the data they show. */
export async function overview() {
  const data = await api('GET', '/v1/overview');
  const cards = data.handlers.map((handler) => card(handler, data.at_ms));
  const nodes = [
    h('h1', {}, 'Handlers'),
    h('p', { class: 'muted' },
      'Rates are over the last minute and, like durations, the chart and lag, come from host ',
      h('span', { 'data-field': 'host' }, data.host), `. Updated ${fmt.time(data.at_ms)}.`),
    cards.length ? h('div', { class: 'cards' }, cards) : h('p', { 'data-field': 'no-handlers' }, 'This token manages no handler that this host knows of.'),
  ];
  return { data, nodes };
}
