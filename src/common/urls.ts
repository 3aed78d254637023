import { createHash } from 'node:crypto';

/**
 * A URL as it may be shown (API answers, start-up errors): the password of its user-info, and the
 * query parameter `param` if named (PostgreSQL connection strings may carry `password=`), replaced
 * by `***`. A string that is not a URL is shown as such, never as it is.
 */
export function maskPassword(url: string, param?: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return 'not a URL';
  }
  const inParam = param !== undefined && u.searchParams.has(param);
  if (u.password === '' && !inParam) return url;
  if (u.password !== '') u.password = '***';
  if (inParam) u.searchParams.set(param, '***');
  return u.toString();
}

/**
 * `text` (an error message, say) with the password of every URL in it replaced by `***`: for text
 * that may quote a URL it was not handed as one (Node's fetch errors quote the URL they refused).
 */
export const maskPasswordsIn = (text: string): string => text.replace(/(\/\/[^/\s@:]*:)[^/\s@]*@/g, '$1***@');

/**
 * A URL as the audit trail records it: its origin (scheme, host, port) and the SHA-256 (hex) of the
 * whole URL, never its path, query or user-info. A webhook URL is often a bearer credential
 * (a Slack incoming webhook's path, a `?token=`), and `audit:read` keys, which are not `admin`,
 * read the trail, whose hash chain keeps every event forever. The hash still tells an auditor
 * whether two events name the same URL, and confirms a URL one already holds.
 */
export function urlForAudit(url: string): { url_origin: string; url_sha256: string } {
  let origin: string;
  try {
    origin = new URL(url).origin;
  } catch {
    origin = 'not a URL';
  }
  return { url_origin: origin, url_sha256: createHash('sha256').update(url, 'utf8').digest('hex') };
}
