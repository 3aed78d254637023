import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { api, ApiError, cannotReview, holds, serverNow, type QueueItem, type Whoami } from './api.js';
import { Verbatim, ViewHeading } from './components.js';
import { HistoryView } from './HistoryView.js';
import { ItemView } from './ItemView.js';
import { PendingView } from './PendingView.js';
import { session } from './session.js';
import { SignIn } from './SignIn.js';

/** The pending list is re-read this often, so a new item shows within 2 s (SPEC §12). */
const POLL_MS = 1000;
/** Pending items fetched per poll; the oldest come first, and the view says when there are more. */
export const PENDING_LIMIT = 200;

export type Route =
  | { view: 'pending' }
  | { view: 'history' }
  | { view: 'item'; id: string }
  | { view: 'not-found'; hash: string };

/**
 * The view a location hash names. Anyone can send a reviewer a link, so a hash that names no
 * view, or an item id whose percent-encoding does not decode (`#/item/%E0%A4%A`), is a view of
 * its own that says so: never an exception, which would leave the page blank.
 */
function parseRoute(hash: string): Route {
  if (hash === '' || hash === '#' || hash === '#/' || hash === '#/pending') return { view: 'pending' };
  if (hash === '#/history') return { view: 'history' };
  const m = /^#\/item\/([^/]+)$/.exec(hash);
  if (m) {
    try {
      return { view: 'item', id: decodeURIComponent(m[1] as string) };
    } catch {
      // A malformed escape (URIError): not an id anything could have linked to.
    }
  }
  return { view: 'not-found', hash };
}

function useRoute(): Route {
  const [route, setRoute] = useState(() => parseRoute(location.hash));
  useEffect(() => {
    const on = () => setRoute(parseRoute(location.hash));
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  return route;
}

/** The server's clock, ticking once a second (time left counts down without a reload). */
function useNow(): number {
  const [now, setNow] = useState(serverNow);
  useEffect(() => {
    const t = setInterval(() => setNow(serverNow()), 1000);
    return () => clearInterval(t);
  }, []);
  return now;
}

export interface Pending {
  items: QueueItem[];
  more: boolean;
  /** When the list was last read successfully (server time), or null before the first read. */
  at: number | null;
  error: string | null;
}

/** Polls GET /v1/queue?status=pending while signed in; 401 signs out. */
function usePending(key: string, onUnauthorized: (message: string) => void) {
  const [pending, setPending] = useState<Pending>({ items: [], more: false, at: null, error: null });
  const generation = useRef(0);
  const refresh = useCallback(async () => {
    const mine = generation.current;
    try {
      const page = await api.list(key, 'pending', PENDING_LIMIT);
      if (mine !== generation.current) return;
      setPending({ items: page.items, more: page.next_cursor !== null, at: serverNow(), error: null });
    } catch (e) {
      if (mine !== generation.current) return;
      if (e instanceof ApiError && e.status === 401) return onUnauthorized(e.message);
      setPending((p) => ({ ...p, error: e instanceof Error ? e.message : String(e) }));
    }
  }, [key, onUnauthorized]);
  useEffect(() => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    let stopped = false;
    const loop = async () => {
      await refresh();
      if (!stopped) timer = setTimeout(() => void loop(), POLL_MS);
    };
    void loop();
    return () => {
      stopped = true;
      generation.current++;
      clearTimeout(timer);
    };
  }, [refresh]);
  /** Drops an item at once after this reviewer decided it (the next poll agrees). */
  const drop = useCallback((id: string) => {
    setPending((p) => ({ ...p, items: p.items.filter((i) => i.id !== id) }));
  }, []);
  return { pending, refresh, drop };
}

export function App() {
  const [key, setKey] = useState<string | null>(() => session.get());
  const [me, setMe] = useState<Whoami | null>(null);
  const [signInError, setSignInError] = useState<string | null>(null);

  const signOut = useCallback((message: string | null = null) => {
    session.clear();
    setKey(null);
    setMe(null);
    setSignInError(message);
  }, []);

  // A key kept from earlier in this tab is checked again before it is used.
  useEffect(() => {
    if (key === null || me !== null) return;
    api
      .whoami(key)
      .then(setMe)
      .catch((e: unknown) => signOut(e instanceof Error ? e.message : String(e)));
  }, [key, me, signOut]);

  const signIn = async (candidate: string): Promise<string | null> => {
    try {
      const who = await api.whoami(candidate);
      if (!holds(who, 'queue:read')) return 'API key lacks scope queue:read';
      session.set(candidate);
      setKey(candidate);
      setMe(who);
      setSignInError(null);
      // A deep link (#/item/<id>, e.g. from a notification) opens once signed in.
      return null;
    } catch (e) {
      return e instanceof Error ? e.message : String(e);
    }
  };

  if (key === null || me === null) {
    return <SignIn onSignIn={signIn} error={signInError} checking={key !== null} />;
  }
  return <Console apiKey={key} me={me} onSignOut={() => signOut()} onUnauthorized={signOut} />;
}

function Console({
  apiKey,
  me,
  onSignOut,
  onUnauthorized,
}: {
  apiKey: string;
  me: Whoami;
  onSignOut: () => void;
  onUnauthorized: (message: string) => void;
}) {
  const route = useRoute();
  const now = useNow();
  const { pending, drop } = usePending(apiKey, onUnauthorized);
  const readOnly = cannotReview(me);

  useEffect(() => {
    document.title =
      route.view === 'history'
        ? 'History · Arbiter'
        : route.view === 'item'
          ? 'Request · Arbiter'
          : route.view === 'not-found'
            ? 'Not found · Arbiter'
            : `(${pending.items.length}${pending.more ? '+' : ''}) Pending · Arbiter`;
  }, [route, pending.items.length, pending.more]);

  return (
    <div class="shell">
      {/* Moves focus without touching the hash: the hash is the route (#main names no view). */}
      <a
        class="skip-link"
        href="#main"
        onClick={(e) => {
          e.preventDefault();
          document.getElementById('main')?.focus();
        }}
      >
        Skip to content
      </a>
      <header class="topbar">
        <div class="brand">
          <img src="favicon.svg" alt="" width={22} height={22} />
          <span class="brand-name">Arbiter</span>
          <span class="brand-sub">Review console</span>
        </div>
        <nav class="tabs" aria-label="Views">
          <a class="tab" href="#/pending" aria-current={route.view === 'pending' ? 'page' : undefined}>
            Pending{' '}
            <span class="count">
              {pending.items.length}
              {pending.more ? '+' : ''}
            </span>
          </a>
          <a class="tab" href="#/history" aria-current={route.view === 'history' ? 'page' : undefined}>
            History
          </a>
        </nav>
        <div class="identity">
          <span class="who" title="The API key you signed in with">
            <span class="muted-inverse">Signed in as</span>{' '}
            <strong>
              <Verbatim value={me.name} />
            </strong>
          </span>
          <span
            class="chip"
            title={me.tenant === null ? 'This key is not bound to a tenant' : 'This key is bound to a tenant'}
          >
            {me.tenant === null ? (
              'all tenants'
            ) : (
              <>
                tenant <Verbatim value={me.tenant} />
              </>
            )}
          </span>
          {me.agent !== null && (
            <span class="chip">
              agent <Verbatim value={me.agent} />
            </span>
          )}
          {readOnly !== null && (
            <span
              class="chip chip-warn"
              title={
                readOnly === 'scope'
                  ? 'This key lacks scope queue:review'
                  : 'This key is bound to an agent: it cannot decide requests'
              }
            >
              read-only
            </span>
          )}
          <button type="button" class="btn btn-quiet" onClick={onSignOut}>
            Sign out
          </button>
        </div>
      </header>
      <main id="main" class="main" tabIndex={-1}>
        {route.view === 'pending' && <PendingView pending={pending} now={now} />}
        {route.view === 'not-found' && <NotFound hash={route.hash} />}
        {route.view === 'history' && (
          <HistoryView apiKey={apiKey} now={now} onUnauthorized={onUnauthorized} />
        )}
        {route.view === 'item' && (
          <ItemView
            key={route.id}
            apiKey={apiKey}
            id={route.id}
            now={now}
            me={me}
            onDecided={drop}
            onUnauthorized={onUnauthorized}
          />
        )}
      </main>
    </div>
  );
}

/** A link that names no view of the console: what it was, and the way back to the list. */
function NotFound({ hash }: { hash: string }) {
  return (
    <section aria-labelledby="not-found-title" class="not-found">
      <ViewHeading key={hash} id="not-found-title">
        Page not found
      </ViewHeading>
      <p>
        The link <Verbatim class="mono" value={hash} /> does not name a view of the console or a request it
        could show. It may have been cut short or altered.
      </p>
      <p>
        <a href="#/pending">← Pending requests</a>
      </p>
    </section>
  );
}
