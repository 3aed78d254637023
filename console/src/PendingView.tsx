import { useRef } from 'preact/hooks';
import type { Pending } from './App.js';
import { RequestLink, Time, TimeLeft, Verbatim, ViewHeading, WhatCells } from './components.js';
import { formatConfidence, visible } from './format.js';

/** How long a newly arrived row stays highlighted. */
const FRESH_MS = 4000;

export function PendingView({ pending, now }: { pending: Pending; now: number }) {
  // Rows that arrive after the first read are marked for a few seconds, so a reviewer notices them:
  // a tint that fades, and the word "New" (the tint alone is colour only, and still under reduced
  // motion or forced colours).
  const arrived = useRef<Map<string, number> | null>(null);
  if (pending.at !== null) {
    if (arrived.current === null) arrived.current = new Map(pending.items.map((i) => [i.id, 0]));
    const current = new Set(pending.items.map((i) => i.id));
    for (const id of current) if (!arrived.current.has(id)) arrived.current.set(id, Date.now());
    for (const id of arrived.current.keys()) if (!current.has(id)) arrived.current.delete(id);
  }
  const isFresh = (id: string) => Date.now() - (arrived.current?.get(id) ?? 0) < FRESH_MS;

  const open = (id: string) => {
    location.hash = `#/item/${encodeURIComponent(id)}`;
  };

  return (
    <section aria-labelledby="pending-title">
      <div class="view-head">
        <ViewHeading id="pending-title">Pending requests</ViewHeading>
        <p class="live-status" role="status" aria-live="polite" aria-atomic="true">
          {pending.error !== null ? (
            <span class="text-error">Cannot refresh: {pending.error}. Retrying…</span>
          ) : pending.at === null ? (
            'Loading…'
          ) : (
            <>
              <span class="live-dot" aria-hidden="true" />
              {pending.items.length === 1 ? '1 request' : `${pending.items.length} requests`} waiting · live
            </>
          )}
        </p>
      </div>
      {pending.more && (
        <p class="notice notice-info">
          Showing the {pending.items.length} oldest pending requests; decide these to see the rest.
        </p>
      )}
      <div class="table-wrap">
        <table class="grid">
          <caption class="visually-hidden">
            Requests waiting for a human decision, oldest first. Select a request to review it.
          </caption>
          <thead>
            <tr>
              <th scope="col">Request</th>
              <th scope="col">Agent or user</th>
              <th scope="col">Tenant</th>
              <th scope="col">Action</th>
              <th scope="col">Resource</th>
              <th scope="col" class="num">
                Confidence
              </th>
              <th scope="col">Received</th>
              <th scope="col" class="num">
                Time left
              </th>
              <th scope="col" class="col-fill">
                Message
              </th>
            </tr>
          </thead>
          <tbody>
            {pending.items.map((item) => (
              <tr
                key={item.id}
                class={`clickable${isFresh(item.id) ? ' fresh' : ''}`}
                onClick={() => open(item.id)}
              >
                <td>
                  <RequestLink id={item.id} />
                  {isFresh(item.id) && <span class="tag-new">New</span>}
                </td>
                <WhatCells item={item} />
                <td class="num mono">{formatConfidence(item.confidence)}</td>
                <td>
                  <Time iso={item.created_at} now={now} />
                </td>
                <td class="num">
                  <TimeLeft item={item} now={now} />
                </td>
                <td class="col-fill" title={visible(item.message)}>
                  <Verbatim prose value={item.message} />
                </td>
              </tr>
            ))}
          </tbody>
        </table>
        {pending.at !== null && pending.items.length === 0 && (
          <div class="empty">
            <p class="empty-title">Nothing waiting for review.</p>
            <p class="muted">New requests appear here by themselves within a second or two.</p>
          </div>
        )}
      </div>
    </section>
  );
}
