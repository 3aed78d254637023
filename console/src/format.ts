import type { QueueItem } from './api.js';

/** "12:04:05" today, else "2026-11-23 12:04:05" (local time; the title carries the ISO instant). */
export function formatTime(iso: string | null, now = Date.now()): string {
  if (iso === null) return '—';
  const d = new Date(iso);
  const pad = (n: number) => String(n).padStart(2, '0');
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  const today = new Date(now);
  const sameDay =
    d.getFullYear() === today.getFullYear() &&
    d.getMonth() === today.getMonth() &&
    d.getDate() === today.getDate();
  return sameDay ? time : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
}

/** Time left until `iso`: "59:07", "1 h 02 min", "2 d 3 h"; "expired" once past. */
export function timeLeft(iso: string, now: number): string {
  const ms = Date.parse(iso) - now;
  if (ms <= 0) return 'expired';
  const s = Math.floor(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
  const h = Math.floor(s / 3600);
  if (h < 48) return `${h} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

/** Under five minutes left: shown as urgent. */
export function isUrgent(iso: string, now: number): boolean {
  return Date.parse(iso) - now < 5 * 60_000;
}

/** An agent's resource is a string; a human's is {type, id}. */
export function formatResource(resource: unknown): string {
  if (typeof resource === 'string') return resource;
  if (resource && typeof resource === 'object' && 'type' in resource && 'id' in resource) {
    const r = resource as { type: unknown; id: unknown };
    return `${String(r.type)}/${String(r.id)}`;
  }
  return JSON.stringify(resource);
}

/** UUIDv7 ids share their leading (time) digits: the tail tells neighbours apart. */
export function shortId(id: string): string {
  return id.length > 8 ? `…${id.slice(-8)}` : id;
}

export function subjectOf(item: QueueItem): { kind: 'agent' | 'user'; id: string } {
  return item.kind === 'agent'
    ? { kind: 'agent', id: item.agent_id ?? '?' }
    : { kind: 'user', id: item.user_id ?? '?' };
}

export function formatConfidence(c: number | null): string {
  return c === null ? '—' : c.toFixed(2);
}

export const STATUS_LABEL: Record<string, string> = {
  pending: 'Pending',
  approved: 'Approved',
  denied: 'Denied',
  expired: 'Expired',
};

/** Audit event kinds as a reviewer reads them. */
export const EVENT_LABEL: Record<string, string> = {
  decision: 'Policy decision',
  'queue.approve': 'Approved',
  'queue.deny': 'Denied',
  'queue.expire': 'Expired',
  'token.mint': 'Token minted',
  'token.revoke': 'Token revoked',
};
