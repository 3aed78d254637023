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
