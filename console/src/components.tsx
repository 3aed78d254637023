import type { ComponentChild, ComponentChildren } from 'preact';
import { useEffect, useRef } from 'preact/hooks';
import type { QueueItem, QueueStatus } from './api.js';
import {
  formatResource,
  formatTime,
  isUrgent,
  pieces,
  shortId,
  STATUS_LABEL,
  subjectOf,
  timeLeft,
  timeLeftSpoken,
  visible,
  type Marking,
} from './format.js';

/**
 * Every string an agent, a policy or another key chose (ids, actions, resources, context,
 * messages, notes, ingested kinds) is shown through this: isolated in its own direction, so it
 * cannot reorder the text around it, and with each invisible or reordering character shown as a
 * marked ⟨U+XXXX⟩ token, so a reviewer sees exactly what was asked; outside prose, so is each
 * character that could pass for another (a Cyrillic "а" among Latin letters, a fullwidth "ａ":
 * format.ts lookalike). `prose` (messages, notes)
 * takes its direction from its first strong character and keeps its line breaks; anything else
 * (an identifier) reads left to right, as it is compared. `clip` keeps it to one line, cut with an
 * ellipsis where its place ends (a table cell), with the whole value as its title.
 */
export function Verbatim({
  value,
  prose = false,
  data = false,
  clip = false,
  class: className,
}: {
  value: string;
  prose?: boolean;
  /** A string of the context (JSON), not an identifier: signs and phonetic letters are text there. */
  data?: boolean;
  clip?: boolean;
  class?: string;
}) {
  const marking: Marking = prose ? 'prose' : data ? 'data' : 'identifier';
  const classes = ['verbatim', ...(clip ? ['clip'] : []), ...(className === undefined ? [] : [className])];
  return (
    <bdi
      dir={prose ? 'auto' : 'ltr'}
      class={classes.join(' ')}
      title={clip ? visible(value, prose ? '\n' : '', marking) : undefined}
    >
      {pieces(value, prose ? '\n' : '', marking).map((p) =>
        'text' in p ? (
          p.text
        ) : p.lookalike ? (
          <span
            class="invisible-char lookalike-char"
            title={`${p.code} ${p.name}: it may read as a character it is not`}
          >
            ⟨{p.code}⟩
          </span>
        ) : (
          <span class="invisible-char" title={`${p.code} ${p.name}: in the value as sent, normally unseen`}>
            ⟨{p.code}⟩
          </span>
        ),
      )}
    </bdi>
  );
}

/**
 * A JSON value laid out as JSON.stringify(value, null, 2) lays it out, with every key and string
 * shown by Verbatim: each isolated, so a right-to-left value cannot pull a key's punctuation or
 * its neighbour into its run.
 */
export function Json({ value }: { value: unknown }) {
  const out: ComponentChild[] = [];
  jsonInto(value, '', out);
  return <>{out}</>;
}

function jsonInto(v: unknown, indent: string, out: ComponentChild[]): void {
  if (typeof v === 'string') {
    out.push(<Verbatim data value={JSON.stringify(v)} />);
    return;
  }
  if (v === null || typeof v !== 'object') {
    out.push(JSON.stringify(v) ?? 'null');
    return;
  }
  const inner = `${indent}  `;
  const entries: [string | null, unknown][] = Array.isArray(v)
    ? v.map((x) => [null, x])
    : Object.entries(v as Record<string, unknown>);
  const [open, close] = Array.isArray(v) ? ['[', ']'] : ['{', '}'];
  if (entries.length === 0) {
    out.push(open + close);
    return;
  }
  out.push(`${open}\n`);
  entries.forEach(([k, x], i) => {
    out.push(inner);
    if (k !== null) out.push(<Verbatim value={JSON.stringify(k)} />, ': ');
    jsonInto(x, inner, out);
    out.push(i < entries.length - 1 ? ',\n' : '\n');
  });
  out.push(indent + close);
}

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

/**
 * Who asked, and the user an agent acts for (SPEC §13): an approval of a delegated request acts
 * in that user's name and spends that user's budgets, so the reviewer must see it wherever the
 * agent is named.
 */
export function Subject({ item }: { item: QueueItem }) {
  const s = subjectOf(item);
  const obo = item.on_behalf_of ?? null;
  return (
    <span class="subject">
      <span class="subject-kind">{s.kind}</span> <Verbatim class="mono" clip value={s.id} />
      {obo !== null && (
        <span class="subject-obo">
          {' '}
          <span class="subject-kind">for user</span> <Verbatim class="mono" clip value={obo.user_id} />
        </span>
      )}
    </span>
  );
}

export function Resource({ item }: { item: QueueItem }) {
  return <Verbatim class="mono" clip value={formatResource(item.resource)} />;
}

/** The cells every list shows of an item: who asked, in which tenant, to do what, to what. */
export function WhatCells({ item }: { item: QueueItem }) {
  return (
    <>
      <td class="cell-subject">
        <Subject item={item} />
      </td>
      <td class="cell-tenant">
        {item.tenant_id === null ? (
          <span class="muted">—</span>
        ) : (
          <Verbatim class="mono" clip value={item.tenant_id} />
        )}
      </td>
      <td class="cell-action">
        <Verbatim class="mono" clip value={item.action} />
      </td>
      <td class="cell-resource">
        <Resource item={item} />
      </td>
    </>
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
  // Shown as "59:07", said in words: a screen reader reads "59:07" as a time or a ratio.
  // The span holds the hidden words in place: positioned against the page instead, they would sit
  // far right of a table scrolled in its own box and widen the page (a phone's, by 400 px).
  return (
    <span class="time-left-words">
      <time
        class={`time-left${isUrgent(item.expires_at, now) ? ' urgent' : ''}`}
        dateTime={item.expires_at}
        title={`expires at ${item.expires_at}`}
        aria-hidden="true"
      >
        {left}
      </time>
      <span class="visually-hidden">{timeLeftSpoken(item.expires_at, now)}</span>
    </span>
  );
}

/**
 * The heading of a view, focused when the view appears (signed in, a link followed, a tab
 * chosen, an item loaded): a keyboard or screen-reader user is taken to the new content and hears
 * its name, instead of being left on the body when the link or form they used is gone.
 */
export function ViewHeading({
  id,
  title,
  children,
}: {
  id: string;
  title?: string;
  children: ComponentChildren;
}) {
  const heading = useRef<HTMLHeadingElement>(null);
  useEffect(() => heading.current?.focus(), []);
  return (
    <h1 id={id} ref={heading} tabIndex={-1} title={title}>
      {children}
    </h1>
  );
}

/**
 * A button whose action is in flight is aria-disabled, not disabled: a disabled button drops the
 * keyboard focus to the page's body (and a screen reader's place with it), while this one keeps
 * it, says it is unavailable, and ignores activation until the action is done (a key held down).
 * Two presses within one task come before it has re-rendered as busy: an action that must never
 * run twice guards itself as well (ItemView's decide).
 */
export function BusyButton({
  busy,
  onClick,
  class: className,
  type = 'button',
  children,
}: {
  busy: boolean;
  onClick?: () => void;
  class: string;
  type?: 'button' | 'submit';
  children: ComponentChildren;
}) {
  return (
    <button
      type={type}
      class={className}
      aria-disabled={busy ? 'true' : undefined}
      onClick={(e) => {
        if (busy) {
          e.preventDefault();
          return;
        }
        onClick?.();
      }}
    >
      {children}
    </button>
  );
}
