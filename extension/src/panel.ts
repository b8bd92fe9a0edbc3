import { Widget } from '@lumino/widgets';

import { IJobList, IJobRow } from './api';
import { age, clock, esc, money, progress } from './format';
import { JobsModel } from './model';

/** The "Spot jobs" side panel: one card per job, running jobs first, refreshed by the model. */
export class JobsPanel extends Widget {
  constructor(
    private readonly model: JobsModel,
    private readonly open: (id: string) => void
  ) {
    super();
    this.id = 'spotnb-jobs-panel';
    this.addClass('spotnb-panel');
    this.title.caption = 'Spot jobs';
    this.node.innerHTML =
      '<div class="spotnb-panel-header"><h2>Spot jobs</h2>' +
      '<span class="spotnb-panel-totals"></span></div>' +
      '<div class="spotnb-panel-error" hidden></div>' +
      '<ul class="spotnb-job-list" role="list"></ul>' +
      '<div class="spotnb-panel-empty" hidden>No spot jobs yet. Start one from a notebook:' +
      '<pre>job = spot.train(fit, spot.Config(...))</pre></div>';
    this.node.addEventListener('click', this._onClick);
    this.node.addEventListener('keydown', this._onKey);
    model.changed.connect(this._render, this);
    if (model.data) {
      this._render();
    }
  }

  dispose(): void {
    this.model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const data = this.model.data;
    const error = this.node.querySelector('.spotnb-panel-error') as HTMLElement;
    error.hidden = !this.model.error;
    error.textContent = this.model.error
      ? `Cannot reach the spotnb server extension: ${this.model.error}`
      : '';
    if (!data) {
      return;
    }
    (this.node.querySelector('.spotnb-panel-empty') as HTMLElement).hidden = data.jobs.length > 0;
    (this.node.querySelector('.spotnb-panel-totals') as HTMLElement).textContent = totals(data);
    const list = this.node.querySelector('.spotnb-job-list') as HTMLElement;
    list.innerHTML = data.jobs.map(card).join('');
  }

  private _onClick = (event: MouseEvent): void => {
    const row = (event.target as HTMLElement).closest('.spotnb-job-row') as HTMLElement | null;
    if (row?.dataset.jobId) {
      this.open(row.dataset.jobId);
    }
  };

  private _onKey = (event: KeyboardEvent): void => {
    if (event.key !== 'Enter' && event.key !== ' ') {
      return;
    }
    const row = (event.target as HTMLElement).closest('.spotnb-job-row') as HTMLElement | null;
    if (row?.dataset.jobId) {
      event.preventDefault();
      this.open(row.dataset.jobId);
    }
  };
}

function totals(data: IJobList): string {
  return `${data.jobs.length} job${data.jobs.length === 1 ? '' : 's'}, ${data.running} running`;
}

function card(job: IJobRow): string {
  const status = job.orphaned ? `${job.status}?` : job.status;
  const frac = job.total_steps ? Math.min(1, job.step / job.total_steps) : null;
  const bar =
    frac === null
      ? ''
      : `<div class="spotnb-bar" title="${(frac * 100).toFixed(1)}%">` +
        `<div style="width:${(frac * 100).toFixed(1)}%"></div></div>`;
  const orphan = job.orphaned
    ? '<div class="spotnb-row-note">its controller (the kernel that started it) is gone; ' +
      'attach to it to resume control</div>'
    : '';
  return (
    `<li class="spotnb-job-row" role="button" tabindex="0" data-job-id="${esc(job.id)}" ` +
    `data-status="${esc(job.status)}" title="Open ${esc(job.id)}">` +
    '<div class="spotnb-row-top">' +
    `<span class="spotnb-row-name">${esc(job.name || job.id)}</span>` +
    `<span class="spotnb-badge" data-status="${esc(job.status)}">${esc(status)}</span></div>` +
    `<div class="spotnb-row-meta">${job.name ? `<code>${esc(job.id)}</code> · ` : ''}` +
    `${esc(job.provider)} · ${esc(job.instance_type)} · started ${esc(clock(job.created))} ` +
    `(${esc(age(job.age))})</div>` +
    `<div class="spotnb-row-progress"><span>step ${esc(progress(job.step, job.total_steps))}</span>${bar}</div>` +
    '<div class="spotnb-row-cost">' +
    `<span title="preemptions">⚡ ${job.preemptions}</span>` +
    `<span title="spent on spot instances" class="spotnb-row-spent">${esc(money(job.spot_cost))} spent</span>` +
    `<span title="${esc(job.savings_baseline)}" class="spotnb-row-saved" data-tone="${esc(job.savings_tone)}">` +
    `${esc(job.savings_text)}</span>` +
    '</div>' +
    orphan +
    '</li>'
  );
}
