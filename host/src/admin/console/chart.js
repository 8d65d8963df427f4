// One handler's applied, duplicates and failures per second over the last 15
// minutes, as an SVG drawn from the host's in-memory history. Lines differ in
// colour and dash pattern; the caption says the latest values in words. A host
// that started recently has less history: the chart then spans what there is
// (at least 2 minutes), so a young host's first minutes are not a sliver.

import { fmt, h, s } from './dom.js';

const WIDTH = 600;
const HEIGHT = 150;
const MAX_SPAN_MS = 15 * 60 * 1000;
const MIN_SPAN_MS = 2 * 60 * 1000;
const SERIES = [
  ['applied', 'Applied'],
  ['duplicates', 'Duplicates'],
  ['failures', 'Failures'],
];

/** A round number at or above `n`, for the top of the axis. */
function ceiling(n) {
  if (n <= 1) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(n));
  return [1, 2, 5, 10].map((m) => m * magnitude).find((m) => m >= n);
}

export function chart(name, series, nowMs) {
  const top = ceiling(Math.max(0, ...SERIES.flatMap(([key]) => series[key])));
  const oldest = series.at_ms.length ? series.at_ms[0] - series.step_ms : nowMs;
  const span = Math.min(MAX_SPAN_MS, Math.max(MIN_SPAN_MS, nowMs - oldest));
  const minutes = Math.round(span / 60000);
  const x = (at) => (WIDTH * (span - (nowMs - at))) / span;
  const y = (v) => HEIGHT - (HEIGHT * v) / top;
  const lines = SERIES.map(([key]) => {
    const points = series.at_ms.map((at, i) => `${x(at).toFixed(1)},${y(series[key][i]).toFixed(1)}`);
    return s('polyline', { class: `series s-${key}`, points: points.join(' ') });
  });
  const last = (key) => (series[key].length ? series[key][series[key].length - 1] : 0);
  const summary = SERIES.map(([key, label]) => `${label.toLowerCase()} ${fmt.rate(last(key))}`).join(', ');
  const svg = s('svg', {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`, preserveAspectRatio: 'none', role: 'img',
    'aria-label': `${name}: events per second over the last ${minutes} minutes; now ${summary}; axis top ${top}/s`,
  },
  [0.25, 0.5, 0.75].map((f) => s('line', { class: 'grid', x1: 0, x2: WIDTH, y1: HEIGHT * f, y2: HEIGHT * f })),
  lines);
  const keys = SERIES.map(([key, label]) => h('span', { class: 'key' },
    s('svg', { viewBox: '0 0 28 8', 'aria-hidden': 'true' },
      s('line', { class: `series s-${key}`, x1: 0, x2: 28, y1: 4, y2: 4 })),
    `${label} ${fmt.rate(last(key))}`));
  return h('figure', { class: 'chart' }, svg,
    h('figcaption', {}, h('span', {}, `Per second, last ${minutes} min (top of the chart ${top}/s):`), keys,
      series.at_ms.length ? null : h('span', {}, 'no samples yet')));
}
