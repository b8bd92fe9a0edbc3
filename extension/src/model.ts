import { ISignal, Signal } from '@lumino/signaling';

import { IJobList, requestAPI } from './api';

/** Polls GET /spotnb/api/jobs and tells the panel and the status bar when it changed. */
export class JobsModel {
  constructor(readonly interval = 2000) {}

  get changed(): ISignal<this, IJobList> {
    return this._changed;
  }

  /** The last answer (null before the first one). */
  get data(): IJobList | null {
    return this._data;
  }

  /** The last error, or null when the last poll worked. */
  get error(): string | null {
    return this._error;
  }

  start(): void {
    if (this._timer === null && !this._disposed) {
      void this.refresh();
    }
  }

  /** Poll now (then every `interval` ms); concurrent calls share one request. */
  refresh(): Promise<void> {
    if (!this._inflight) {
      this._inflight = this._refresh().finally(() => {
        this._inflight = null;
      });
    }
    return this._inflight;
  }

  private async _refresh(): Promise<void> {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
    let delay = this.interval;
    try {
      this._data = await requestAPI<IJobList>('jobs');
      this._error = null;
      this._failures = 0;
    } catch (error) {
      this._error = String((error as Error).message ?? error);
      this._failures += 1;
      delay = Math.min(30000, this.interval * 2 ** Math.min(this._failures, 4));
    }
    if (this._disposed) {
      return;
    }
    this._changed.emit(this._data as IJobList);
    this._timer = window.setTimeout(() => void this.refresh(), delay);
  }

  dispose(): void {
    this._disposed = true;
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
    }
    Signal.clearData(this);
  }

  private _data: IJobList | null = null;
  private _error: string | null = null;
  private _failures = 0;
  private _timer: number | null = null;
  private _disposed = false;
  private _inflight: Promise<void> | null = null;
  private _changed = new Signal<this, IJobList>(this);
}
