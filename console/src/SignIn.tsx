import { useEffect, useRef, useState } from 'preact/hooks';
import { BusyButton } from './components.js';

export function SignIn({
  onSignIn,
  error,
  checking,
}: {
  onSignIn: (key: string) => Promise<string | null>;
  error: string | null;
  checking: boolean;
}) {
  const [key, setKey] = useState('');
  const [busy, setBusy] = useState(false);
  const [message, setMessage] = useState<string | null>(error);
  const input = useRef<HTMLInputElement>(null);

  useEffect(() => setMessage(error), [error]);
  useEffect(() => input.current?.focus(), [checking]);

  const submit = async (e: Event) => {
    e.preventDefault();
    if (busy) return;
    const k = key.trim();
    if (k === '') {
      setMessage('Enter an API key.');
      return;
    }
    setBusy(true);
    setMessage(null);
    const err = await onSignIn(k);
    setBusy(false);
    if (err !== null) {
      setMessage(err);
      input.current?.select();
    }
  };

  return (
    <main class="signin-page">
      <div class="signin-card">
        <div class="brand brand-dark">
          <img src="favicon.svg" alt="" width={28} height={28} />
          <span class="brand-name">Arbiter</span>
        </div>
        <h1>Review console</h1>
        {checking ? (
          <p role="status">Checking your key…</p>
        ) : (
          <form onSubmit={submit} noValidate>
            <p class="muted">
              Sign in with an API key that has <code>queue:read</code>, and <code>queue:review</code> to
              approve or deny.
            </p>
            <label for="api-key">API key</label>
            <input
              ref={input}
              id="api-key"
              name="api-key"
              type="password"
              autoComplete="off"
              spellcheck={false}
              value={key}
              onInput={(e) => setKey(e.currentTarget.value)}
              aria-describedby={message === null ? 'key-help' : 'key-error key-help'}
              aria-invalid={message !== null}
              readOnly={busy}
            />
            <p id="key-help" class="hint">
              Kept in this browser tab only (session storage) and sent only to this server. Closing the tab
              forgets it.
            </p>
            <div role="alert" id="key-error" class="form-error">
              {message}
            </div>
            <BusyButton type="submit" class="btn btn-primary btn-block" busy={busy}>
              {busy ? 'Signing in…' : 'Sign in'}
            </BusyButton>
          </form>
        )}
      </div>
    </main>
  );
}
