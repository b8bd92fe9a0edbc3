/** Small formatting helpers shared by the panel, the job view and the status bar. */

export function esc(value: unknown): string {
  return String(value ?? '').replace(
    /[&<>"']/g,
    c => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c] as string
  );
}

/** Dollars with enough digits to see a local or short job move ($0.0123, $1.23, $123). */
export function money(value: number | null | undefined): string {
  if (value === null || value === undefined || !isFinite(value)) {
    return '—';
  }
  const abs = Math.abs(value);
  const digits = abs >= 100 ? 0 : abs >= 1 ? 2 : 4;
  return `$${value.toFixed(digits)}`;
}

export function rate(value: number | null | undefined): string {
  if (value === null || value === undefined || !isFinite(value)) {
    return '—';
  }
  return `$${value.toFixed(value >= 10 ? 1 : 2)}/h`;
}

export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return '—';
  }
  const s = Math.max(0, seconds);
  if (s < 60) {
    return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  }
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function age(seconds: number): string {
  if (seconds < 60) {
    return `${Math.floor(seconds)}s ago`;
  }
  if (seconds < 3600) {
    return `${Math.floor(seconds / 60)}m ago`;
  }
  if (seconds < 86400) {
    return `${Math.floor(seconds / 3600)}h ago`;
  }
  return `${Math.floor(seconds / 86400)}d ago`;
}

export function percent(fraction: number | null | undefined): string {
  if (fraction === null || fraction === undefined || !isFinite(fraction)) {
    return '—';
  }
  return `${Math.round(fraction * 100)}%`;
}

export function progress(step: number, total: number | null | undefined): string {
  return total
    ? `${step.toLocaleString()} / ${total.toLocaleString()}`
    : `${step.toLocaleString()}`;
}

export function clock(t: number | null | undefined): string {
  if (!t) {
    return '';
  }
  return new Date(t * 1000).toLocaleTimeString();
}
