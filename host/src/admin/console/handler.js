// One handler: its versions, what runs, its settings and limits, and the
// lifecycle actions (activate, roll back, pause, resume), each confirmed.

import { api } from './api.js';
import { fmt, h } from './dom.js';
import { act } from './ui.js';

function facts(pairs) {
  return h('dl', { class: 'facts' }, pairs.map(([term, value]) => [h('dt', {}, term), h('dd', {}, value)]));
}

function settings(running) {
  if (!running) return h('p', { class: 'muted' }, 'Not loaded on this host, so its settings are not shown here.');
  const set = running.settings;
  const table = (title, values) => [h('h3', {}, title), facts(Object.entries(values).map(([k, v]) => [k, String(v)]))];
  return [
    facts([
      ['Topics', set.topics.join(', ')],
      ['Consumer group', set.group_id],
      ['Outbox topics', Object.entries(set.outbox_topics).map(([k, v]) => `${k} → ${v}`).join(', ') || 'none'],
      ['Version label', running.version],
    ]),
    table('Batching', set.batch),
    table('Retries', set.retry),
    table('Limits', set.limits),
    table('Instances', set.instances),
  ];
}

export async function handlerPage(name, rerender) {
  const view = await api('GET', `/v1/handlers/${encodeURIComponent(name)}`);
  const path = `/v1/handlers/${encodeURIComponent(name)}`;
  const uploaded = view.source === 'api' && view.deployment;
  const deployment = view.deployment;
  const after = async (result) => {
    await rerender();
    return result;
  };
  const lifecycle = uploaded
    ? h('div', { class: 'actions' },
      deployment.paused
        ? h('button', { class: 'primary', onclick: () => act(`Resume handler ${name} on every host?`, 'Resume',
          () => api('POST', `${path}/resume`).then(after), () => `Handler ${name} resumed.`) }, 'Resume')
        : h('button', { class: 'danger', onclick: () => act(`Pause handler ${name} on every host? Its partitions wait until it resumes.`, 'Pause',
          () => api('POST', `${path}/pause`).then(after), () => `Handler ${name} paused.`) }, 'Pause'),
      h('button', { disabled: deployment.previous_version ? null : true,
        onclick: () => act(`Roll handler ${name} back to version ${deployment.previous_version}?`, 'Roll back',
          () => api('POST', `${path}/rollback`).then(after), () => `Handler ${name} rolled back to version ${deployment.previous_version}.`) },
      deployment.previous_version ? `Roll back to version ${deployment.previous_version}` : 'No earlier version to roll back to'))
    : h('p', { class: 'muted' }, 'This handler is defined in the configuration file: change it there.');

  const versions = view.versions.length
    ? h('div', { class: 'scroll' }, h('table', {},
      h('thead', {}, h('tr', {}, ['Version', 'SHA-256', 'Uploaded by', 'When', 'Migrations', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, view.versions.map((v) => {
        const active = deployment && deployment.active_version === v.version;
        return h('tr', { 'data-version': v.version },
          h('td', {}, String(v.version), active ? ' (active)' : ''),
          h('td', { class: 'mono', title: v.sha256 }, v.sha256.slice(0, 16), '…'),
          h('td', {}, v.uploaded_by),
          h('td', {}, fmt.time(v.uploaded_at)),
          h('td', {}, v.migrations.join(', ') || 'none'),
          h('td', {}, active || !uploaded ? null : h('button', {
            onclick: () => act(`Activate version ${v.version} of ${name} on every host?`, 'Activate',
              () => api('POST', `${path}/activate`, { version: v.version }).then(after),
              () => `Version ${v.version} of ${name} is active.`),
          }, `Activate ${v.version}`)));
      }))))
    : h('p', { class: 'muted' }, 'No uploaded versions (a configuration-file handler).');

  const running = view.running;
  return [
    h('p', {}, h('a', { href: '#/' }, '← Overview')),
    h('h1', {}, `Handler ${name}`),
    facts([
      ['Source', view.source === 'api' ? 'uploaded through the API' : 'configuration file'],
      ['State', deployment && deployment.paused ? 'paused' : running && running.consuming ? 'running' : 'not consuming on this host'],
      ['Active version', deployment ? String(deployment.active_version) : running ? running.version : '–'],
    ]),
    lifecycle,
    h('h2', {}, 'Versions'),
    versions,
    h('h2', {}, 'Settings of the running version'),
    settings(running),
    h('p', {}, h('a', { href: `#/dead-letters?handler=${encodeURIComponent(name)}` }, `Dead letters of ${name}`)),
  ];
}
