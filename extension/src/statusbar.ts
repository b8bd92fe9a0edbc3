import { Widget } from '@lumino/widgets';

import { esc, money, rate } from './format';
import { JobsModel } from './model';

/** "Spot: 2 running · $1.80/h" in the status bar; a click opens the Spot jobs panel. */
export class SpotStatus extends Widget {
  constructor(
    private readonly model: JobsModel,
    onClick: () => void
  ) {
    super();
    this.addClass('spotnb-statusbar');
    this.addClass('jp-StatusBar-TextItem');
    this.node.textContent = 'Spot: …';
    this.node.title = 'Spot jobs';
    this.node.addEventListener('click', onClick);
    model.changed.connect(this._render, this);
  }

  dispose(): void {
    this.model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const d = this.model.data;
    if (!d) {
      this.node.textContent = 'Spot: ?';
      this.node.title = `spotnb server extension unreachable: ${this.model.error ?? ''}`;
      return;
    }
    this.node.dataset.running = String(d.running);
    this.node.innerHTML =
      `Spot: <span class="spotnb-sb-running">${d.running}</span> running` +
      ` · <span class="spotnb-sb-rate">${esc(rate(d.burn_rate))}</span>`;
    this.node.title =
      `${d.running} spot job(s) running, ${d.active} active, burning ${rate(d.burn_rate)}; ` +
      `all jobs: ${money(d.spent)} spent, ${money(d.saved)} saved against on-demand. Click for the list.`;
  }
}
