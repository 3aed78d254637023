import type { QueueItem, QueueStatus } from './api.js';
import {
  formatResource,
  formatTime,
  isUrgent,
  shortId,
  STATUS_LABEL,
  subjectOf,
  timeLeft,
} from './format.js';

export function StatusBadge({ status }: { status: QueueStatus | string }) {
  return <span class={`badge badge-${status}`}>{STATUS_LABEL[status] ?? status}</span>;
}

/** A request id, shortened, with the whole id in its title and its accessible name. */
export function RequestLink({ id }: { id: string }) {
  return (
    <a class="mono id-link" href={`#/item/${encodeURIComponent(id)}`} title={id} aria-label={`Request ${id}`}>
      {shortId(id)}
    </a>
  );
}

export function Subject({ item }: { item: QueueItem }) {
  const s = subjectOf(item);
  return (
    <span class="subject">
      <span class="subject-kind">{s.kind}</span> <span class="mono">{s.id}</span>
    </span>
  );
}

export function Resource({ item }: { item: QueueItem }) {
  const r = formatResource(item.resource);
  return (
    <span class="mono truncate" title={r}>
      {r}
    </span>
  );
}

export function Time({ iso, now }: { iso: string | null; now: number }) {
  if (iso === null) return <span class="muted">—</span>;
  return (
    <time dateTime={iso} title={iso}>
      {formatTime(iso, now)}
    </time>
  );
}

export function TimeLeft({ item, now }: { item: QueueItem; now: number }) {
  const left = timeLeft(item.expires_at, now);
  return (
    <time
      class={`time-left${isUrgent(item.expires_at, now) ? ' urgent' : ''}`}
      dateTime={item.expires_at}
      title={`expires at ${item.expires_at}`}
    >
      {left}
    </time>
  );
}
