/**
 * The API key lives in this tab's sessionStorage only: never localStorage, a cookie or a URL.
 * Closing the tab forgets it; other tabs never see it.
 */
const KEY = 'arbiter.console.apiKey';

export const session = {
  get(): string | null {
    try {
      return sessionStorage.getItem(KEY);
    } catch {
      return null;
    }
  },
  set(key: string): void {
    sessionStorage.setItem(KEY, key);
  },
  clear(): void {
    sessionStorage.removeItem(KEY);
  },
};
