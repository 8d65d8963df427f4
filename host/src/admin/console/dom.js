// Building the page. Every value from the API goes in as a text node, never as
// HTML, so a payload or a reason cannot become markup.

const SVG = 'http://www.w3.org/2000/svg';

function build(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** An HTML element: h('a', { href: '#/' }, 'Overview'). */
export const h = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);

/** An SVG element. */
export const s = (tag, attrs, ...children) => build(document.createElementNS(SVG, tag), attrs, children);

const number = new Intl.NumberFormat('en', { maximumFractionDigits: 1 });

export const fmt = {
  count: (n) => (n === undefined || n === null ? '–' : number.format(n)),
  rate: (n) => (n === undefined || n === null ? '–' : `${number.format(n)}/s`),
  ms: (n) => {
    if (n === undefined || n === null) return '–';
    return n < 10 ? `${n.toFixed(2)} ms` : `${number.format(n)} ms`;
  },
  age: (ms) => {
    if (ms === undefined || ms === null) return 'none waiting';
    if (ms < 1000) return `${ms} ms`;
    if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
    return `${Math.round(ms / 60000)} min`;
  },
  time: (ms) => (ms ? new Date(ms).toLocaleString('en-GB', { hour12: false }) : '–'),
};

/** A term and its value for a <dl>; `field` names the value for scripts and tests. */
export function stat(term, value, field, { alert = false, link } = {}) {
  const shown = link ? h('a', { href: link }, value) : value;
  return h('div', {}, h('dt', {}, term), h('dd', { 'data-field': field, class: alert ? 'alert' : null }, shown));
}

/** Replaces what `parent` shows. */
export function show(parent, ...children) {
  parent.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}
