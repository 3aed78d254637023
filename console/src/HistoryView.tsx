import { useEffect, useRef, useState } from 'preact/hooks';
import { api, ApiError, type QueueItem } from './api.js';
import {
  BusyButton,
  RequestLink,
  StatusBadge,
  Time,
  Verbatim,
  ViewHeading,
  WhatCells,
} from './components.js';
import { visible } from './format.js';

const PAGE = 50;
/**
 * The most pages one load reads while they come back empty, before it stops and says so. A page
 * may be empty and still not be the last (the server examines a bounded number of items a page:
 * a tenant-bound reviewer's Approved list, say, among many denials), so a load reads on until a
 * page has rows or the list ends; this bounds the requests one click makes.
 */
const MAX_EMPTY_PAGES = 10;

const FILTERS = [
  { status: 'approved,denied,expired', label: 'All decided' },
  { status: 'approved', label: 'Approved' },
  { status: 'denied', label: 'Denied' },
  { status: 'expired', label: 'Expired' },
] as const;

export function HistoryView({
  apiKey,
  now,
  onUnauthorized,
}: {
  apiKey: string;
  now: number;
  onUnauthorized: (message: string) => void;
}) {
  const [status, setStatus] = useState<string>(FILTERS[0].status);
  const [items, setItems] = useState<QueueItem[]>([]);
  const [cursor, setCursor] = useState<string | null>(null);
  const [loading, setLoading] = useState(true);
  const [error, setError] = useState<string | null>(null);
  /** Pages the last load read without a match before it stopped (0: it did not stop early). */
  const [searched, setSearched] = useState(0);
  const generation = useRef(0);
  const table = useRef<HTMLTableSectionElement>(null);

  const load = async (from: string | null) => {
    const mine = ++generation.current;
    const before = from === null ? 0 : items.length;
    setLoading(true);
    setError(null);
    setSearched(0);
    try {
      let page = await api.list(apiKey, status, PAGE, from);
      let read = 1;
      while (page.items.length === 0 && page.next_cursor !== null && read < MAX_EMPTY_PAGES) {
        if (mine !== generation.current) return;
        page = await api.list(apiKey, status, PAGE, page.next_cursor);
        read++;
      }
      if (mine !== generation.current) return;
      const added = page.items;
      setItems((prev) => (from === null ? added : [...prev, ...added]));
      setCursor(page.next_cursor);
      // Stopped on an empty page that is not the last: said in the pager, and Load more reads on.
      setSearched(added.length === 0 && page.next_cursor !== null ? read : 0);
      // "Load more" takes the keyboard to the first row it added (the button may be gone: that
      // was the last page), so the reviewer reads on from there rather than from the top.
      if (from !== null && added.length > 0) {
        requestAnimationFrame(() =>
          table.current?.querySelectorAll<HTMLElement>('.id-link')[before]?.focus(),
        );
      }
    } catch (e) {
      if (mine !== generation.current) return;
      if (e instanceof ApiError && e.status === 401) return onUnauthorized(e.message);
      setError(e instanceof Error ? e.message : String(e));
    } finally {
      if (mine === generation.current) setLoading(false);
    }
  };

  useEffect(() => {
    setItems([]);
    setCursor(null);
    setSearched(0);
    void load(null);
    // Reloaded whenever the status filter changes.
  }, [status]);

  return (
    <section aria-labelledby="history-title">
      <div class="view-head">
        <ViewHeading id="history-title">History</ViewHeading>
        <div class="toolbar">
          <div class="segmented" role="group" aria-label="Status">
            {FILTERS.map((f) => (
              <button
                key={f.status}
                type="button"
                class="seg"
                aria-pressed={status === f.status}
                onClick={() => setStatus(f.status)}
              >
                {f.label}
              </button>
            ))}
          </div>
          <BusyButton class="btn btn-quiet-dark" busy={loading} onClick={() => void load(null)}>
            Refresh
          </BusyButton>
        </div>
      </div>
      <div role="alert">
        {error !== null && <div class="notice notice-error">Cannot load history: {error}</div>}
      </div>
      <div class="table-wrap">
        <table class="grid">
          <caption class="visually-hidden">Decided requests, newest decision first.</caption>
          <thead>
            <tr>
              <th scope="col">Decided</th>
              <th scope="col">Status</th>
              <th scope="col">Request</th>
              <th scope="col">Agent or user</th>
              <th scope="col">Tenant</th>
              <th scope="col">Action</th>
              <th scope="col">Resource</th>
              <th scope="col">Decided by</th>
              <th scope="col" class="col-fill">
                Note
              </th>
            </tr>
          </thead>
          <tbody ref={table}>
            {items.map((item) => (
              <tr
                key={item.id}
                class="clickable"
                onClick={() => {
                  location.hash = `#/item/${encodeURIComponent(item.id)}`;
                }}
              >
                <td>
                  <Time iso={item.decided_at} now={now} />
                </td>
                <td>
                  <StatusBadge status={item.status} />
                </td>
                <td>
                  <RequestLink id={item.id} />
                </td>
                <WhatCells item={item} />
                <td class="cell-subject">
                  {item.decided_by === null ? (
                    <span class="muted">— (expired)</span>
                  ) : (
                    <Verbatim clip value={item.decided_by} />
                  )}
                </td>
                <td class="col-fill" title={item.note === null ? undefined : visible(item.note, '\n')}>
                  {item.note === null ? <span class="muted">—</span> : <Verbatim prose value={item.note} />}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
        {!loading && items.length === 0 && error === null && (
          <div class="empty">
            <p class="empty-title">{cursor === null ? 'No decided requests yet.' : 'None found yet.'}</p>
          </div>
        )}
      </div>
      <div class="pager">
        <span class="muted" role="status">
          {loading
            ? 'Loading…'
            : searched > 0
              ? `${items.length} shown; ${searched} more pages searched without a match. Load more searches further back.`
              : `${items.length} shown${cursor === null ? '' : ', more available'}`}
        </span>
        {cursor !== null && (
          <BusyButton class="btn btn-secondary" busy={loading} onClick={() => void load(cursor)}>
            Load more
          </BusyButton>
        )}
      </div>
    </section>
  );
}
