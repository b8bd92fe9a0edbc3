import { Dialog, showDialog } from '@jupyterlab/apputils';
import { IRenderMimeRegistry, MimeModel } from '@jupyterlab/rendermime';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { Message } from '@lumino/messaging';
import { Panel, Widget } from '@lumino/widgets';

import { IBreakdown, IJobDetail, IPlotlyFigure, ISeries, isTerminal, requestAPI } from './api';
import { clock, duration, esc, money, percent, progress, rate } from './format';
import { PALETTE, SpotEvent, UnknownEvent } from './protocol.gen';

const PLOTLY_MIME = 'application/vnd.plotly.v1+json';
/** Where the time went: the widget's categories, labels and colours (spotnb/views/palette.py). */
const CATEGORIES: Array<[keyof IBreakdown, string, string]> = PALETTE.categories.map(c => [
  c.key,
  c.label,
  c.color
]);

/** One figure slot: the widget's plotly figure through JupyterLab's plotly renderer when one
 * is installed (jupyterlab-plotly ships with plotly), else a small SVG of our own. */
class FigureSlot extends Panel {
  constructor(
    readonly name: string,
    private readonly rendermime: IRenderMimeRegistry | null
  ) {
    super();
    this.addClass('spotnb-figure');
    this.node.dataset.figure = name;
  }

  get canPlot(): boolean {
    return !!this.rendermime && !!this.rendermime.preferredMimeType({ [PLOTLY_MIME]: {} }, 'any');
  }

  async draw(figure: IPlotlyFigure | null | undefined, fallback: () => string): Promise<void> {
    if (figure && this.canPlot) {
      const json = JSON.stringify(figure);
      if (json === this._json) {
        return;
      }
      this._json = json;
      // a new renderer each time (the plotly renderer draws once); the old one goes after
      // the new one is drawn, so the figure does not flicker
      const renderer = this.rendermime!.createRenderer(PLOTLY_MIME);
      const model = new MimeModel({
        data: { [PLOTLY_MIME]: tidy(figure) as ReadonlyPartialJSONObject },
        metadata: {},
        trusted: true
      });
      this.addWidget(renderer);
      try {
        await renderer.renderModel(model as IRenderMime.IMimeModel);
      } catch {
        renderer.dispose();
        this._json = '';
        this._fallback(fallback);
        return;
      }
      this._static?.dispose();
      this._static = null;
      this._plot?.dispose();
      this._plot = renderer;
      return;
    }
    this._fallback(fallback);
  }

  private _fallback(fallback: () => string): void {
    if (!this._static) {
      this._static = new Widget();
      this._static.addClass('spotnb-figure-static');
      this.addWidget(this._static);
    }
    this._static.node.innerHTML = fallback();
  }

  private _json = '';
  private _plot: Widget | null = null;
  private _static: Widget | null = null;
}

/** Display-only adjustments of the widget's figures for this view: a short figure's bottom
 * legend (placed in paper coordinates) collides with its x-axis title, so the axis title moves
 * into the figure title; the plotly logo goes. The data are not changed. */
function tidy(figure: IPlotlyFigure): IPlotlyFigure {
  const fig = JSON.parse(JSON.stringify(figure)) as IPlotlyFigure;
  const layout = (fig.layout = fig.layout ?? {});
  const axis = layout.xaxis?.title?.text;
  const title = layout.title?.text;
  if (axis && title && layout.title && layout.xaxis && (layout.height ?? 450) < 350) {
    layout.title.text = title.includes('(') ? title : `${title} (${axis})`;
    delete layout.xaxis.title;
  }
  fig.config = { displaylogo: false, ...(fig.config ?? {}) };
  return fig;
}

/** The main-area view of one job: status, cost, progress, the widget's figures, the
 * breakdown table, recent events, and Stop. Polls GET /spotnb/api/jobs/<id> while shown. */
export class JobView extends Panel {
  constructor(
    readonly jobId: string,
    rendermime: IRenderMimeRegistry | null,
    private readonly interval = 2000
  ) {
    super();
    this.addClass('spotnb-jobview');
    this.node.dataset.jobId = jobId;
    this.title.label = jobId;
    this._head = new Widget();
    this._head.addClass('spotnb-jobview-head');
    this._head.node.innerHTML =
      '<div class="spotnb-jobview-title"><h1></h1><code></code>' +
      '<span class="spotnb-status spotnb-badge" data-status="pending">loading…</span>' +
      '<button class="jp-mod-styled jp-mod-warn spotnb-stop" disabled>Stop</button></div>' +
      '<div class="spotnb-jobview-meta"></div>' +
      '<div class="spotnb-jobview-error" hidden></div>' +
      '<div class="spotnb-jobview-failure"></div>' +
      '<div class="spotnb-cards"></div>';
    this._head.node
      .querySelector('.spotnb-stop')!
      .addEventListener('click', () => void this.stop());
    this.addWidget(this._head);
    const figures = new Panel();
    figures.addClass('spotnb-figures');
    for (const name of ['metrics', 'timeline', 'breakdown']) {
      const slot = new FigureSlot(name, rendermime);
      this._slots[name] = slot;
      figures.addWidget(slot);
    }
    this.addWidget(figures);
    this._tail = new Widget();
    this._tail.addClass('spotnb-jobview-tail');
    this.addWidget(this._tail);
  }

  get detail(): IJobDetail | null {
    return this._detail;
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    void this.refresh();
  }

  protected onBeforeDetach(msg: Message): void {
    this._clear();
    super.onBeforeDetach(msg);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.refresh();
  }

  dispose(): void {
    this._clear();
    super.dispose();
  }

  private _clear(): void {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
  }

  /** Fetch and draw now, then every `interval` ms while shown and the job is not over.
   * Concurrent calls share one request, so there is only ever one timer. */
  refresh(): Promise<void> {
    if (!this._inflight) {
      this._inflight = this._refresh().finally(() => {
        this._inflight = null;
      });
    }
    return this._inflight;
  }

  private async _refresh(): Promise<void> {
    this._clear();
    if (this.isDisposed) {
      return;
    }
    let delay = this.interval;
    try {
      this._detail = await requestAPI<IJobDetail>(`jobs/${encodeURIComponent(this.jobId)}`);
      this._error = null;
      await this._render();
    } catch (error) {
      this._error = String((error as Error).message ?? error);
      delay = this.interval * 3;
      this._renderError();
    }
    const terminal = isTerminal(this._detail?.status);
    if (!this.isDisposed && this.isAttached && !terminal) {
      this._timer = window.setTimeout(
        () => void (this.isVisible ? this.refresh() : this._clear()),
        delay
      );
    }
  }

  async stop(): Promise<void> {
    const d = this._detail;
    const result = await showDialog({
      title: 'Stop this spot job?',
      body:
        `${d?.name || this.jobId}: its instance is terminated and the job ends as "stopped". ` +
        'Its last checkpoint stays in the store.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop job' })]
    });
    if (!result.button.accept) {
      return;
    }
    const button = this._head.node.querySelector('.spotnb-stop') as HTMLButtonElement;
    button.disabled = true;
    button.textContent = 'Stopping…';
    try {
      await requestAPI(`jobs/${encodeURIComponent(this.jobId)}/stop`, { method: 'POST' });
    } catch (error) {
      this._error = `stop failed: ${(error as Error).message ?? error}`;
      this._renderError();
    }
    void this.refresh();
  }

  private _renderError(): void {
    const box = this._head.node.querySelector('.spotnb-jobview-error') as HTMLElement;
    const message = this._error || this._detail?.error || '';
    box.hidden = !message;
    box.textContent = message;
  }

  private async _render(): Promise<void> {
    const d = this._detail!;
    const job = d.job;
    const status = d.status ?? job.status;
    const name = d.name || job.name || job.id;
    this.title.label = name;
    this.title.caption = `${name} (${job.id}): ${status}`;
    const head = this._head.node;
    head.querySelector('h1')!.textContent = name;
    head.querySelector('code')!.textContent = job.id;
    const badge = head.querySelector('.spotnb-status') as HTMLElement;
    badge.dataset.status = status;
    badge.textContent = job.orphaned ? `${status} (controller gone)` : status;
    if (d.status_reason) {
      badge.title = d.status_reason;
    }
    const button = head.querySelector('.spotnb-stop') as HTMLButtonElement;
    const terminal = isTerminal(status);
    button.disabled = terminal || button.textContent === 'Stopping…';
    button.hidden = terminal;
    if (terminal) {
      button.textContent = 'Stop';
    }
    head.querySelector('.spotnb-jobview-meta')!.innerHTML =
      `${esc(d.provider ?? job.provider)} · ${esc(d.instance_type ?? job.instance_type)}` +
      `${job.region ? ` · ${esc(job.region)}` : ''} · started ${esc(clock(d.job_start ?? job.created))}` +
      ` · ${d.events?.count ?? 0} events`;
    this._renderError();
    const b = d.breakdown;
    const c = d.cost;
    const card = (cls: string, label: string, value: string, sub = ''): string =>
      `<div class="spotnb-card ${cls}"><div class="spotnb-card-label">${esc(label)}</div>` +
      `<div class="spotnb-card-value">${esc(value)}</div>` +
      `<div class="spotnb-card-sub">${esc(sub)}</div></div>`;
    const total = d.total ?? job.total_steps;
    const step = d.step ?? job.step;
    // a job on several instances: the prices are each instance's, said so, with what all the
    // instances it holds cost now
    const each = (b?.lanes ?? 1) > 1 ? ' per instance' : '';
    const now =
      !terminal && (c?.instances_now ?? 0) > 1
        ? `; now ${rate(c?.hourly ?? 0)} for ${c?.instances_now}`
        : '';
    head.querySelector('.spotnb-cards')!.innerHTML =
      card(
        'spotnb-cost-spot',
        'Spot cost',
        money(c?.spot ?? job.spot_cost),
        c?.spot_price ? `at ${rate(c.spot_price)}${each}${now}` : ''
      ) +
      (c?.coordinator_price
        ? card(
            'spotnb-cost-coordinator',
            'Coordinator (on demand)',
            money(c.coordinator ?? 0),
            `at ${rate(c.coordinator_price)}; total ${money(c.total ?? c.spot)}`
          )
        : '') +
      card(
        'spotnb-cost-ondemand',
        'On-demand equivalent',
        money(c?.on_demand ?? job.on_demand_cost),
        c?.on_demand_price ? `at ${rate(c.on_demand_price)}${each}` : ''
      ) +
      card(
        `spotnb-cost-saved spotnb-tone-${c?.savings_tone ?? job.savings_tone}`,
        'Against on demand',
        c?.savings_text ?? job.savings_text,
        c?.savings_baseline ?? job.savings_baseline
      ) +
      card(
        'spotnb-cost-projected',
        terminal ? 'Final cost' : 'Projected total',
        money(c?.projected ?? null),
        !terminal && job.burn_rate ? `burning ${rate(job.burn_rate)}` : ''
      ) +
      card(
        'spotnb-progress-card',
        'Progress',
        `step ${progress(step, total)}`,
        d.step_time ? `${(d.step_time * 1000).toFixed(1)} ms/step` : ''
      ) +
      card(
        'spotnb-preempt-card',
        'Preemptions',
        String(b?.preemptions ?? job.preemptions),
        b ? `${b.incarnations} instance${b.incarnations === 1 ? '' : 's'}` : ''
      );
    await Promise.all([
      this._slots.metrics.draw(d.figures?.metrics, () => metricsSvg(d)),
      this._slots.timeline.draw(d.figures?.timeline, () => timelineHtml(d)),
      this._slots.breakdown.draw(d.figures?.breakdown, () => breakdownSvg(b))
    ]);
    // a failed job's error comes first, above the charts, and once
    this._head.node.querySelector('.spotnb-jobview-failure')!.innerHTML = failureHtml(d);
    this._tail.node.innerHTML = breakdownTable(b) + eventsHtml(d);
  }

  private _head: Widget;
  private _tail: Widget;
  private _slots: { [name: string]: FigureSlot } = {};
  private _detail: IJobDetail | null = null;
  private _error: string | null = null;
  private _timer: number | null = null;
  private _inflight: Promise<void> | null = null;
}

// -- fallbacks and tables (no plotting library) -------------------------------------------

function metricsSvg(d: IJobDetail): string {
  const names = Object.keys(d.metrics ?? {});
  if (!names.length) {
    return '<div class="spotnb-empty">No metrics logged yet.</div>';
  }
  const W = 640;
  const H = 180;
  const all: ISeries[] = names.map(n => d.metrics![n]);
  const xs = all.flatMap(s => s.x);
  const ys = all.flatMap(s => s.y);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs) || 1];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const sx = (x: number) => 40 + ((x - x0) / (x1 - x0 || 1)) * (W - 50);
  const sy = (y: number) => H - 20 - ((y - y0) / (y1 - y0 || 1)) * (H - 30);
  const colors = PALETTE.metrics;
  const lines = all
    .map(
      (s, i) =>
        `<polyline fill="none" stroke="${colors[i % colors.length]}" stroke-width="1.5" points="` +
        s.x.map((x, j) => `${sx(x).toFixed(1)},${sy(s.y[j]).toFixed(1)}`).join(' ') +
        '"/>'
    )
    .join('');
  const legend = names
    .map((n, i) => `<tspan fill="${colors[i % colors.length]}">${esc(n)} </tspan>`)
    .join('');
  return (
    `<svg viewBox="0 0 ${W} ${H}" class="spotnb-svg" role="img" aria-label="metrics">` +
    `<text x="40" y="12" font-size="11">${legend}</text>${lines}` +
    `<text x="40" y="${H - 4}" font-size="10">step ${x0}</text>` +
    `<text x="${W - 10}" y="${H - 4}" font-size="10" text-anchor="end">${x1}</text></svg>`
  );
}

function timelineHtml(d: IJobDetail): string {
  const rows = (d.timeline ?? [])
    .map(
      i =>
        `<tr><td>#${i.n}</td><td>${esc(i.instance_id ?? '')}</td><td>${esc(i.region ?? '')}</td>` +
        `<td>${esc(clock(i.allocated))}</td><td>${esc(clock(i.ready))}</td>` +
        `<td>${esc(clock(i.end))}</td><td>${esc(i.end_how ?? (i.end ? '' : 'running'))}</td></tr>`
    )
    .join('');
  return (
    '<table class="spotnb-table"><caption>Instances</caption><tr><th>#</th><th>instance</th>' +
    '<th>region</th><th>allocated</th><th>ready</th><th>ended</th><th>how</th></tr>' +
    `${rows}</table>`
  );
}

function breakdownSvg(b: IBreakdown | undefined): string {
  if (!b || !b.total) {
    return '<div class="spotnb-empty">No time spent yet.</div>';
  }
  let x = 0;
  const bars = CATEGORIES.map(([key, label, color]) => {
    const w = ((b[key] as number) / b.total) * 600;
    const rect =
      `<rect x="${x.toFixed(1)}" y="0" width="${w.toFixed(1)}" height="24" fill="${color}">` +
      `<title>${esc(label)}: ${duration(b[key] as number)}</title></rect>`;
    x += w;
    return rect;
  }).join('');
  return `<svg viewBox="0 0 600 24" class="spotnb-svg" role="img" aria-label="breakdown">${bars}</svg>`;
}

function breakdownTable(b: IBreakdown | undefined): string {
  if (!b) {
    return '';
  }
  const rows = CATEGORIES.map(
    ([key, label, color]) =>
      `<tr><td><span class="spotnb-swatch" style="background:${color}"></span>${esc(label)}</td>` +
      `<td>${esc(duration(b[key] as number))}</td>` +
      `<td>${b.total ? percent((b[key] as number) / b.total) : '—'}</td></tr>`
  ).join('');
  return (
    '<table class="spotnb-table spotnb-breakdown"><caption>Where the time went</caption>' +
    `<tr><th>category</th><th>time</th><th>share</th></tr>${rows}` +
    `<tr class="spotnb-total"><td>total</td><td>${esc(duration(b.total))}</td><td></td></tr></table>`
  );
}

function failureHtml(d: IJobDetail): string {
  const f = d.failure;
  if (!f) {
    return '';
  }
  // the agent's message already starts with the exception's type ("ValueError: ...")
  const title = f.message.startsWith(`${f.exc_type}:`) ? f.message : `${f.exc_type}: ${f.message}`;
  return (
    `<div class="spotnb-failure"><b>${esc(title)}</b>` + `<pre>${esc(f.traceback)}</pre></div>`
  );
}

function eventsHtml(d: IJobDetail): string {
  const recent = (d.events?.recent ?? []).slice(-12).reverse();
  if (!recent.length) {
    return '';
  }
  const describe = (e: SpotEvent | UnknownEvent): string => {
    if (typeof e.text === 'string') {
      return e.text; // the widget's own sentence for it (spotnb/views/widget/text.py)
    }
    const skip = new Set(['t', 'kind', 'incarnation']);
    return Object.entries(e)
      .filter(([k, v]) => !skip.has(k) && v !== null && typeof v !== 'object')
      .slice(0, 6)
      .map(([k, v]) => `${k}=${typeof v === 'number' ? +v.toFixed(3) : String(v)}`)
      .join(', ');
  };
  const rows = recent
    .map(
      e =>
        `<tr data-kind="${esc(e.kind)}"><td>${esc(clock(e.t))}</td><td>#${e.incarnation}</td>` +
        `<td><b>${esc(e.kind)}</b></td><td>${esc(describe(e))}</td></tr>`
    )
    .join('');
  return (
    `<table class="spotnb-table spotnb-events"><caption>Recent events</caption>` +
    `<tr><th>time</th><th>inst.</th><th>event</th><th>details</th></tr>${rows}</table>`
  );
}
