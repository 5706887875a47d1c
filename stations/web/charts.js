// Small live charts on uPlot (vendored in ./vendor, pinned by vendor/package-lock.json): a
// rolling window of samples, one line per series, redrawn as samples arrive. Each chart also
// says its latest figures in words, for screen readers and for a glance.

import uPlot from './vendor/uPlot.esm.js';
import { h, num } from './dom.js';

const WINDOW = 90; // samples kept: 3 minutes at one sample every 2 s
const HEIGHT = 150;
const PALETTE = ['--accent', '#c2410c', '#15803d', '#9333ea', '#0e7490', '#a16207'];
export const MAX_SERIES = PALETTE.length; // lines a chart draws at most

function color(i) {
  const value = PALETTE[i % PALETTE.length];
  if (!value.startsWith('--')) return value;
  return getComputedStyle(document.documentElement).getPropertyValue(value).trim() || '#2f54c9';
}

export class LiveChart {
  /** title: the caption; unit: appended to figures ("msg/s"); empty: said before any sample. */
  constructor({ title, unit = '', empty = 'Waiting for the first samples…' }) {
    this.unit = unit;
    this.names = [];
    this.xs = [];
    this.ys = new Map();
    this.plot = null;
    this.box = h('div', { class: 'chart-plot' });
    this.now = h('p', { class: 'chart-now' }, empty);
    this.el = h('figure', { class: 'chart' }, h('figcaption', {}, title), this.box, this.now);
    this.resizer = new ResizeObserver(() => this.plot?.setSize(this.size()));
    this.resizer.observe(this.box);
  }

  size() {
    return { width: Math.max(200, Math.floor(this.box.clientWidth || 320)), height: HEIGHT };
  }

  /** One sample at time `t` (seconds): {series name: value}; at most MAX_SERIES series. */
  push(t, values) {
    const names = Object.keys(values).slice(0, MAX_SERIES);
    const changed = names.length !== this.names.length || names.some((n, i) => n !== this.names[i]);
    if (changed) {
      // Series that appear start with gaps; those that go are forgotten.
      const fresh = new Map(names.map((n) => [n, this.ys.get(n) || this.xs.map(() => null)]));
      this.ys = fresh;
      this.names = names;
    }
    this.xs.push(t);
    for (const n of names) this.ys.get(n).push(values[n] ?? null);
    if (this.xs.length > WINDOW) {
      this.xs.shift();
      for (const ys of this.ys.values()) ys.shift();
    }
    const data = [this.xs, ...names.map((n) => this.ys.get(n))];
    if (changed || !this.plot) this.build(data);
    else this.plot.setData(data);
    this.now.textContent = names.length
      ? 'Now: ' + names.map((n) => `${n} ${num(round(values[n]))}${this.unit}`).join(', ')
      : 'Nothing to show.';
    this.el.dataset.latest = JSON.stringify(Object.fromEntries(names.map((n) => [n, values[n]])));
  }

  build(data) {
    this.plot?.destroy();
    const opts = {
      ...this.size(),
      legend: { show: this.names.length > 1, live: false },
      cursor: { drag: { x: false, y: false } },
      scales: { y: { range: (_u, _min, max) => [0, Math.max(1, max * 1.1)] } },
      axes: [
        { stroke: getComputedStyle(document.body).color },
        { stroke: getComputedStyle(document.body).color, size: 56 },
      ],
      series: [
        {},
        ...this.names.map((n, i) => ({ label: n, stroke: color(i), width: 2, points: { show: false } })),
      ],
    };
    this.plot = new uPlot(opts, data, this.box);
  }

  destroy() {
    this.resizer.disconnect();
    this.plot?.destroy();
    this.plot = null;
  }
}

function round(v) {
  return v === null || v === undefined ? v : Math.round(v * 10) / 10;
}

/** The tail position of an offset token ("0000000000000042_0000000000000000" → 42). */
export function position(offset) {
  const n = Number.parseInt(String(offset || '0').split('_')[0], 10);
  return Number.isFinite(n) ? n : 0;
}

/**
 * Message rate from successive tail positions: appended messages per second since the last
 * sample (retention may drop messages, so the count of stored ones would mislead).
 */
export class RateMeter {
  constructor() {
    this.last = null;
  }

  sample(t, tail) {
    const prev = this.last;
    this.last = { t, tail };
    if (!prev || t <= prev.t) return null;
    return Math.max(0, (tail - prev.tail) / (t - prev.t));
  }
}
