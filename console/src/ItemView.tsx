import type { ComponentChildren } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { isReservedKind } from '../../src/audit/kinds.js';
import { api, ApiError, cannotReview, type AuditEvent, type QueueItem, type Whoami } from './api.js';
import {
  BusyButton,
  Json,
  StatusBadge,
  Subject,
  Time,
  TimeLeft,
  Verbatim,
  ViewHeading,
} from './components.js';
import {
  EVENT_LABEL,
  formatConfidence,
  formatResource,
  formatTime,
  STATUS_LABEL,
  visible,
} from './format.js';

const NOTE_MAX = 2000;
/** How long each wait on a pending item is held by the server (it answers at once on a change). */
const WAIT_SECONDS = 25;
/** Pause before waiting again after a failed wait. */
const RETRY_MS = 3000;

type Outcome = { tone: 'success' | 'conflict' | 'error'; text: ComponentChildren } | null;

export function ItemView({
  apiKey,
  id,
  now,
  me,
  onDecided,
  onUnauthorized,
}: {
  apiKey: string;
  id: string;
  now: number;
  me: Whoami;
  onDecided: (id: string) => void;
  onUnauthorized: (message: string) => void;
}) {
  const [item, setItem] = useState<QueueItem | null>(null);
  const [events, setEvents] = useState<AuditEvent[] | null>(null);
  /** Why the trail could not be read the last time, or null: an empty trail is not a failed read. */
  const [eventsError, setEventsError] = useState<string | null>(null);
  const [loadError, setLoadError] = useState<string | null>(null);
  const [note, setNote] = useState('');
  // The note as it is now, for the wait loop below (its closure holds the first render's).
  const noteNow = useRef(note);
  noteNow.current = note;
  const [busy, setBusy] = useState<'approve' | 'deny' | null>(null);
  const [outcome, setOutcome] = useState<Outcome>(null);
  const outcomeRef = useRef<HTMLDivElement>(null);
  /** The Note and the buttons: gone once the item is decided, taking the focus with them. */
  const decisionForm = useRef<HTMLFormElement>(null);
  /** Set once this reviewer sends a decision: from then on the answer to it tells what happened. */
  const deciding = useRef(false);
  /** Bumped after a decision fails without an answer, to wait on the item again. */
  const [watch, setWatch] = useState(0);

  const fail = (e: unknown): string => {
    if (e instanceof ApiError && e.status === 401) onUnauthorized(e.message);
    return e instanceof Error ? e.message : String(e);
  };

  const loadEvents = () =>
    api.events(apiKey, id).then(
      (r) => {
        setEvents(r.events);
        setEventsError(null);
      },
      (e: unknown) => {
        // Keep what was read before (a failed re-read after a decision must not wipe the reasons
        // and the trail); with nothing read yet, the view goes on without them and says so.
        setEventsError(fail(e));
        setEvents((prev) => prev ?? []);
      },
    );

  useEffect(() => {
    api.item(apiKey, id).then(
      (it) => setItem(it),
      (e: unknown) => setLoadError(fail(e)),
    );
    void loadEvents();
    // Loaded once: the view is keyed by the item id, so another item is another view.
  }, []);

  // While the item is pending, wait on it (GET ?wait=): another reviewer's decision, or its
  // expiry, shows here at once, instead of Approve and Deny staying on screen until a click
  // answers 409.
  const pendingNow = item?.status === 'pending';
  useEffect(() => {
    if (!pendingNow) return;
    const stop = new AbortController();
    void (async () => {
      while (!stop.signal.aborted && !deciding.current) {
        let current: QueueItem;
        const sent = Date.now();
        try {
          current = await api.waitItem(apiKey, id, WAIT_SECONDS, stop.signal);
        } catch (e) {
          if (stop.signal.aborted) return;
          if (e instanceof ApiError && e.status === 401) return void onUnauthorized(e.message);
          // A busy or unreachable server: try again a little later (a decision still answers 409).
          await new Promise((r) => setTimeout(r, RETRY_MS));
          continue;
        }
        if (stop.signal.aborted || deciding.current) return;
        if (current.status !== 'pending') {
          // A reviewer writing a note or about to press a button is taken to what happened
          // (the form goes away); one reading elsewhere in the item keeps their place.
          const wasDeciding = decisionForm.current?.contains(document.activeElement) === true;
          setItem(current);
          setOutcome({ tone: 'conflict', text: decidedMeanwhile(current, me.name, noteNow.current) });
          onDecided(id);
          void loadEvents();
          if (wasDeciding) requestAnimationFrame(() => outcomeRef.current?.focus());
          return;
        }
        // Still pending, answered well before its wait was up (a server shutting down answers
        // waits at once): pause before the next, rather than asking again at once in a loop.
        if (Date.now() - sent < (WAIT_SECONDS * 1000) / 2) await new Promise((r) => setTimeout(r, RETRY_MS));
      }
    })();
    return () => stop.abort();
  }, [pendingNow, watch]);

  const decide = async (verb: 'approve' | 'deny') => {
    // A second press before the first has re-rendered the buttons (two clicks in one task) is
    // ignored here, not sent as a second decision that would answer 409.
    if (item === null || deciding.current) return;
    deciding.current = true;
    setBusy(verb);
    setOutcome(null);
    try {
      const decided = await api.decide(apiKey, id, verb, note);
      setItem(decided);
      setOutcome({
        tone: 'success',
        text: `${verb === 'approve' ? 'Approved' : 'Denied'} as ${decided.decided_by ?? 'you'}${decided.note ? ', with your note' : ''}. Recorded in the audit trail.`,
      });
      onDecided(id);
    } catch (e) {
      if (e instanceof ApiError && e.status === 409) {
        // Someone else was first: show who, when and why, from the item as it is now.
        let current: QueueItem | null = null;
        try {
          current = await api.item(apiKey, id);
          setItem(current);
        } catch {
          /* the conflict message below still stands */
        }
        setOutcome({ tone: 'conflict', text: conflictText(verb, current, e.message, note) });
        onDecided(id);
      } else {
        setOutcome({ tone: 'error', text: fail(e) });
        // No answer, or an error: the decision may or may not have been recorded (a connection
        // lost after sending). Waiting on the item again tells which, once the server answers.
        deciding.current = false;
        setWatch((w) => w + 1);
      }
    } finally {
      setBusy(null);
      void loadEvents();
      requestAnimationFrame(() => outcomeRef.current?.focus());
    }
  };

  const back = item !== null && item.status !== 'pending' && outcome === null ? 'history' : 'pending';
  const decision = events?.find((e) => e.kind === 'decision');
  const reasons = Array.isArray(decision?.details.reasons) ? (decision.details.reasons as unknown[]) : null;
  // An AuthZEN request's properties (subject, action, resource) decide as much as its context, but
  // the item keeps only the mapped call: the decision's event holds the evaluation as the policy
  // read it (input.authzen, masked as everywhere else).
  const authzen = authzenOf(decision?.details.input);
  // Approve and Deny only where they could succeed. The key that made a request cannot decide it:
  // an item does not say which key asked, its decision's audit event does (actor: the key's
  // name, unique among keys), so the buttons wait for the trail.
  const never = cannotReview(me);
  const refusal: ComponentChildren =
    never === 'scope' ? (
      <>
        Your key can read the queue but not decide: it lacks <code>queue:review</code>.
      </>
    ) : never === 'agent' ? (
      <>
        Your key is bound to agent <Verbatim class="mono" value={me.agent ?? ''} />, and a key bound to an
        agent cannot decide requests.
      </>
    ) : decision !== undefined && decision.actor === me.name ? (
      'Your key made this request, and the key that made a request cannot decide it.'
    ) : null;

  return (
    <section aria-labelledby="item-title" class="item-view">
      <p class="crumbs">
        <a href={back === 'history' ? '#/history' : '#/pending'}>
          ← {back === 'history' ? 'History' : 'Pending requests'}
        </a>
      </p>
      {loadError !== null && (
        <div class="notice notice-error" role="alert">
          Cannot show request <Verbatim class="mono" value={id} />: {loadError}
        </div>
      )}
      {item === null && loadError === null && <p role="status">Loading request…</p>}
      {item !== null && (
        <>
          <div class="item-head">
            <ViewHeading
              id="item-title"
              title={`${visible(item.action, '', 'identifier')} on ${visible(formatResource(item.resource), '', 'identifier')}`}
            >
              <Verbatim class="mono" value={item.action} /> <span class="muted">on</span>{' '}
              <Verbatim class="mono" value={formatResource(item.resource)} />
            </ViewHeading>
            <StatusBadge status={item.status} />
          </div>
          <p class="item-sub" title={visible(item.message, '\n')}>
            <Subject item={item} /> · <Verbatim prose value={item.message} />
          </p>
          <div class="item-grid">
            <div class="item-main">
              <section class="panel" aria-labelledby="reasons-title">
                <h2 id="reasons-title">Policy reasons</h2>
                {events === null ? (
                  <p class="muted">Loading…</p>
                ) : decision === undefined && eventsError !== null ? (
                  <p class="text-error">Cannot read the policy decision: {eventsError}</p>
                ) : reasons === null || reasons.length === 0 ? (
                  <p class="muted">No reasons were recorded with the decision.</p>
                ) : (
                  <ul class="reasons">
                    {reasons.map((r, i) => (
                      <li key={i}>
                        <Verbatim prose value={String(r)} />
                      </li>
                    ))}
                  </ul>
                )}
                {decision?.policy_revision != null && (
                  <p class="hint">Decided by policy revision {decision.policy_revision}.</p>
                )}
              </section>
              <section class="panel" aria-labelledby="context-title">
                <h2 id="context-title">Context</h2>
                {Object.keys(item.context).length === 0 ? (
                  <p class="muted">The request carried no context.</p>
                ) : (
                  <pre class="json" tabIndex={0} role="group" aria-label="Context as JSON">
                    <Json value={item.context} />
                  </pre>
                )}
              </section>
              {authzen !== null && (
                <section class="panel" aria-labelledby="authzen-title">
                  <h2 id="authzen-title">AuthZEN request</h2>
                  <p class="hint">
                    Subject, action, resource and context with their properties, as the policy read them.
                  </p>
                  <pre class="json" tabIndex={0} role="group" aria-label="AuthZEN request as JSON">
                    <Json value={authzen} />
                  </pre>
                </section>
              )}
              <section class="panel" aria-labelledby="fields-title">
                <h2 id="fields-title">Request</h2>
                <dl class="fields">
                  <dt>Request id</dt>
                  <dd class="mono">{item.id}</dd>
                  <dt>Status</dt>
                  <dd>
                    <StatusBadge status={item.status} />
                  </dd>
                  <dt>{item.kind === 'agent' ? 'Agent' : 'User'}</dt>
                  <dd>
                    <Verbatim
                      class="mono"
                      value={(item.kind === 'agent' ? item.agent_id : item.user_id) ?? ''}
                    />
                  </dd>
                  {item.on_behalf_of != null && (
                    <>
                      <dt>On behalf of</dt>
                      <dd>
                        user <Verbatim class="mono" value={item.on_behalf_of.user_id} /> of tenant{' '}
                        <Verbatim class="mono" value={item.on_behalf_of.tenant_id} />
                        <span class="hint obo-hint">
                          As the asking key claims it: approving lets the agent act in this user’s name.
                        </span>
                      </dd>
                    </>
                  )}
                  <dt>Tenant</dt>
                  <dd>
                    {item.tenant_id === null ? (
                      <span class="muted">none</span>
                    ) : (
                      <Verbatim class="mono" value={item.tenant_id} />
                    )}
                  </dd>
                  <dt>Action</dt>
                  <dd>
                    <Verbatim class="mono" value={item.action} />
                  </dd>
                  <dt>Resource</dt>
                  <dd>
                    <Verbatim class="mono" value={formatResource(item.resource)} />
                  </dd>
                  {item.kind === 'agent' && (
                    <>
                      <dt>Confidence</dt>
                      <dd class="mono">{formatConfidence(item.confidence)}</dd>
                    </>
                  )}
                  <dt>Message</dt>
                  <dd>
                    <Verbatim prose value={item.message} />
                  </dd>
                  <dt>Received</dt>
                  <dd>
                    <Time iso={item.created_at} now={now} />
                  </dd>
                  <dt>Expires</dt>
                  <dd>
                    <Time iso={item.expires_at} now={now} />
                    {item.status === 'pending' && (
                      <>
                        {' '}
                        (<TimeLeft item={item} now={now} /> left)
                      </>
                    )}
                  </dd>
                  <dt>Trace id</dt>
                  <dd class="mono">{item.trace_id}</dd>
                  {item.status !== 'pending' && (
                    <>
                      <dt>Decided by</dt>
                      <dd>
                        {item.decided_by === null ? (
                          <span class="muted">nobody (expired)</span>
                        ) : (
                          <Verbatim value={item.decided_by} />
                        )}
                      </dd>
                      <dt>Decided at</dt>
                      <dd>
                        <Time iso={item.decided_at} now={now} />
                      </dd>
                      <dt>Note</dt>
                      <dd class="note-text">
                        {item.note === null ? (
                          <span class="muted">none</span>
                        ) : (
                          <Verbatim prose value={item.note} />
                        )}
                      </dd>
                    </>
                  )}
                </dl>
              </section>
            </div>
            <aside class="item-side" aria-label="Decision and audit trail">
              <section class="panel decision-panel" aria-labelledby="decision-title">
                <h2 id="decision-title">Decision</h2>
                <div role="status" aria-live="polite">
                  {outcome?.tone === 'success' && (
                    <div class="notice notice-success" tabIndex={-1} ref={outcomeRef}>
                      {outcome.text}
                    </div>
                  )}
                </div>
                <div role="alert">
                  {outcome !== null && outcome.tone !== 'success' && (
                    <div
                      class={`notice ${outcome.tone === 'conflict' ? 'notice-warning' : 'notice-error'}`}
                      tabIndex={-1}
                      ref={outcomeRef}
                    >
                      {outcome.text}
                    </div>
                  )}
                </div>
                {item.status === 'pending' ? (
                  refusal !== null ? (
                    <p class="muted">{refusal}</p>
                  ) : events === null ? (
                    <p class="muted">Loading…</p>
                  ) : (
                    <form
                      ref={decisionForm}
                      onSubmit={(e) => {
                        e.preventDefault();
                      }}
                    >
                      <p class="countdown">
                        Time left <TimeLeft item={item} now={now} />
                      </p>
                      <label for="note">Note</label>
                      <textarea
                        id="note"
                        rows={4}
                        maxLength={NOTE_MAX}
                        value={note}
                        onInput={(e) => setNote(e.currentTarget.value)}
                        aria-describedby="note-help"
                        readOnly={busy !== null}
                      />
                      <p id="note-help" class="hint">
                        Why you decide as you do (a ticket, a check you made). Stored with the decision and in
                        the audit trail. {note.length}/{NOTE_MAX}
                      </p>
                      <div class="actions">
                        <BusyButton
                          class="btn btn-approve"
                          busy={busy !== null}
                          onClick={() => void decide('approve')}
                        >
                          {busy === 'approve' ? 'Approving…' : 'Approve'}
                        </BusyButton>
                        <BusyButton
                          class="btn btn-deny"
                          busy={busy !== null}
                          onClick={() => void decide('deny')}
                        >
                          {busy === 'deny' ? 'Denying…' : 'Deny'}
                        </BusyButton>
                      </div>
                    </form>
                  )
                ) : (
                  <p class="decided-summary">
                    <StatusBadge status={item.status} />{' '}
                    {item.status === 'expired' ? (
                      `Nobody decided before ${formatTime(item.expires_at, now)}.`
                    ) : (
                      <>
                        by <Verbatim value={item.decided_by ?? '?'} /> at {formatTime(item.decided_at, now)}
                      </>
                    )}
                  </p>
                )}
              </section>
              <section class="panel" aria-labelledby="trail-title">
                <h2 id="trail-title">Audit trail</h2>
                {eventsError !== null && (
                  <p class="text-error">
                    {events !== null && events.length > 0 ? 'Cannot refresh' : 'Cannot read'} the audit trail:{' '}
                    {eventsError}
                  </p>
                )}
                {events === null ? (
                  <p class="muted">Loading…</p>
                ) : events.length === 0 ? (
                  eventsError === null && <p class="muted">No audit events found for this request.</p>
                ) : (
                  <ol class="trail">
                    {events.map((e) =>
                      isReservedKind(e.kind) ? (
                        <TrailEvent key={e.id} event={e} now={now} />
                      ) : (
                        <ReportedEvent key={e.id} event={e} now={now} />
                      ),
                    )}
                  </ol>
                )}
              </section>
            </aside>
          </div>
        </>
      )}
    </section>
  );
}

/**
 * The note this reviewer had written when the item was decided without it (the form goes away
 * with the pending item): shown so that it is not lost, to be copied elsewhere (a ticket).
 */
function UnsentNote({ note }: { note: string }) {
  if (note.trim() === '') return null;
  return (
    <span class="unsent-note">
      {' '}
      Your note was not sent; here it is to copy: “<Verbatim prose value={note} />
      ”.
    </span>
  );
}

/** The item left pending while this reviewer had it open, by someone else's hand or by expiry. */
function decidedMeanwhile(current: QueueItem, myName: string, note: string): ComponentChildren {
  if (current.status === 'expired') {
    return (
      <>
        This request expired at {formatTime(current.expires_at)} while you had it open. It can no longer be
        decided.
        <UnsentNote note={note} />
      </>
    );
  }
  if (current.decided_by === myName) {
    return `Your key ${current.status === 'approved' ? 'approved' : 'denied'} this request at ${formatTime(current.decided_at)}: a decision sent from here was recorded, although its answer did not arrive.`;
  }
  return (
    <>
      While you had this request open, <Verbatim value={current.decided_by ?? 'another reviewer'} />{' '}
      {current.status === 'approved' ? 'approved' : 'denied'} it at {formatTime(current.decided_at)}.
      {current.note ? (
        <>
          {' '}
          Their note: “<Verbatim prose value={current.note} />
          ”.
        </>
      ) : null}{' '}
      It can no longer be decided here.
      <UnsentNote note={note} />
    </>
  );
}

function conflictText(
  verb: 'approve' | 'deny',
  current: QueueItem | null,
  serverMessage: string,
  note: string,
): ComponentChildren {
  const mine = verb === 'approve' ? 'approval' : 'denial';
  if (current === null || current.status === 'pending')
    return `${serverMessage}. Your ${mine} was not recorded.`;
  if (current.status === 'expired') {
    return (
      <>
        This request expired at {formatTime(current.expires_at)} before anyone decided it. Your {mine} was not
        recorded.
        <UnsentNote note={note} />
      </>
    );
  }
  return (
    <>
      Already {STATUS_LABEL[current.status]?.toLowerCase() ?? current.status} by{' '}
      <Verbatim value={current.decided_by ?? 'another reviewer'} /> at {formatTime(current.decided_at)}.
      {current.note ? (
        <>
          {' '}
          Their note: “<Verbatim prose value={current.note} />
          ”.
        </>
      ) : null}{' '}
      Your {mine} was not recorded.
      <UnsentNote note={note} />
    </>
  );
}

/** One event Arbiter recorded itself (a reserved kind): a decision, a transition, a token. */
function TrailEvent({ event: e, now }: { event: AuditEvent; now: number }) {
  return (
    <li class={`trail-${e.kind.replace('.', '-')}`}>
      <div class="trail-head">
        <strong>{EVENT_LABEL[e.kind] ?? e.kind}</strong>
        <Time iso={e.time} now={now} />
      </div>
      <div class="trail-body">
        {e.actor !== null && (
          <span>
            {e.kind === 'decision' ? 'asked by' : 'by'} <Verbatim class="mono" value={e.actor} />
          </span>
        )}
        {e.outcome !== null && <span class="trail-outcome">{e.outcome}</span>}
      </div>
      {e.message !== null && e.message !== '' && (
        <p class="trail-msg">
          <Verbatim prose value={e.message} />
        </p>
      )}
    </li>
  );
}

/**
 * An event some key sent to the audit ingest API with this request's id. Its kind, outcome and
 * message are whatever that key wrote, so it is shown as that key's report, set apart, and never
 * with the label of one of Arbiter's own kinds: "Approved" from a report is not an approval.
 */
function ReportedEvent({ event: e, now }: { event: AuditEvent; now: number }) {
  return (
    <li class="trail-reported">
      <div class="trail-head">
        <span>
          <span class="tag-reported">Reported</span> by <Verbatim class="mono" value={e.actor ?? '?'} />:{' '}
          <Verbatim class="mono" value={e.kind} />
        </span>
        <Time iso={e.time} now={now} />
      </div>
      <div class="trail-body">
        {e.outcome !== null && (
          <span>
            reported outcome <span class="trail-outcome">{e.outcome}</span>
          </span>
        )}
      </div>
      {e.message !== null && e.message !== '' && (
        <p class="trail-msg">
          <Verbatim prose value={e.message} />
        </p>
      )}
      <p class="hint">Sent to the audit ingest API by this key, not recorded by Arbiter.</p>
    </li>
  );
}

/** The AuthZEN evaluation in a decision's recorded policy input, if it was one. */
function authzenOf(input: unknown): Record<string, unknown> | null {
  if (input === null || typeof input !== 'object') return null;
  const authzen = (input as Record<string, unknown>).authzen;
  return authzen !== null && typeof authzen === 'object' && !Array.isArray(authzen)
    ? (authzen as Record<string, unknown>)
    : null;
}
