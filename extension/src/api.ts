import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { JobStatus, SpotEvent, TERMINAL, UnknownEvent } from './protocol.gen';

/** One row of GET /spotnb/api/jobs (the job DB row plus derived fields). */
export interface IJobRow {
  id: string;
  name: string | null;
  provider: string;
  region: string | null;
  instance_type: string;
  status: JobStatus;
  created: number;
  updated: number;
  step: number;
  total_steps: number | null;
  preemptions: number;
  spot_cost: number;
  on_demand_cost: number;
  burn_rate: number;
  saved: number;
  savings: number | null; // withheld (null) until it means something; none for a failed job
  savings_text: string;
  savings_tone: 'good' | 'bad' | 'none';
  savings_baseline: string;
  age: number;
  active: boolean;
  orphaned: boolean;
}

export interface IJobList {
  now: number;
  db: string;
  jobs: IJobRow[];
  running: number;
  active: number;
  burn_rate: number;
  spent: number;
  saved: number;
}

export interface ISeries {
  x: number[];
  y: number[];
}

export interface IBreakdown {
  compute: number;
  recompute: number;
  save: number;
  alloc: number;
  prep: number;
  other: number;
  total: number;
  preemptions: number;
  incarnations: number;
  step: number;
  total_steps: number | null;
  spot_cost: number;
  on_demand_cost: number;
  spot_price: number | null;
  on_demand_price: number | null;
  savings: number;
  /** instances side by side: above 1 the seconds are instance-seconds, the prices per instance */
  lanes?: number;
}

export interface IIncarnation {
  n: number;
  allocating: number | null;
  allocated: number | null;
  ready: number | null;
  end: number | null;
  end_how: string | null;
  instance_id: string | null;
  region: string | null;
  instance_type: string | null;
  spot_price: number | null;
}

export interface IJobDetail {
  job: IJobRow;
  now: number;
  error?: string;
  status?: JobStatus;
  status_reason?: string | null;
  name?: string | null;
  provider?: string | null;
  instance_type?: string | null;
  job_start?: number | null;
  step?: number;
  total?: number | null;
  step_time?: number | null;
  last_metrics?: { [name: string]: number };
  breakdown?: IBreakdown;
  cost?: {
    spot: number;
    /** the on-demand coordinator of a job on several instances on a cloud (0 without one) */
    coordinator?: number;
    coordinator_price?: number | null;
    /** spot + coordinator: what the savings are measured from */
    total?: number;
    on_demand: number;
    savings: number | null;
    savings_text: string;
    savings_tone: 'good' | 'bad' | 'none';
    savings_baseline: string;
    projected: number | null;
    spot_price: number | null;
    on_demand_price: number | null;
    /** $/h of every instance the job holds now (and its coordinator) */
    hourly?: number;
    instances_now?: number;
  };
  metrics?: { [name: string]: ISeries };
  redo?: { [name: string]: Array<ISeries & { incarnation: number }> };
  timeline?: IIncarnation[];
  events?: {
    count: number;
    kinds: { [kind: string]: number };
    /** the latest events, without tracebacks, configs and metric rows */
    recent: Array<SpotEvent | UnknownEvent>;
  };
  figures?: { [name: string]: IPlotlyFigure } | null;
  failure?: { message: string; exc_type: string; traceback: string } | null;
}

/** The notebook widget's plotly figures as the server sends them (what this view touches). */
export interface IPlotlyFigure {
  data?: unknown[];
  layout?: {
    height?: number;
    title?: { text?: string };
    xaxis?: { title?: { text?: string } };
    [key: string]: unknown;
  };
  config?: { [key: string]: unknown };
}

/** A request to the spotnb server extension, with Jupyter's auth (token / XSRF) attached. */
export async function requestAPI<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'spotnb', 'api', path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: unknown = text;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    // not JSON (an HTML error page): keep the text
  }
  if (!response.ok) {
    const reply = data as { message?: string } | null;
    const message = reply?.message || text || response.statusText;
    throw new ServerConnection.ResponseError(response, message);
  }
  return data as T;
}

/** Whether a job with this status has ended (`JobStatus.is_terminal` in Python). */
export function isTerminal(status: string | null | undefined): boolean {
  return (TERMINAL as readonly string[]).includes(status ?? '');
}
