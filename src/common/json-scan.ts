/**
 * One walk over the tokens of a JSON text that JSON.parse has accepted, for what JSON.parse does
 * not tell: the literal text of each number (before it becomes a double) and each member key as
 * written, in order (a key repeated in one object, which JSON.parse keeps the last of). Used by
 * the request check for numbers a policy would read as other numbers (validation.ts) and by the
 * policy directory's check for repeated keys in data.json (policy-dir.ts).
 */

/** An open object (its current key, as raw JSON text) or array (its current index). */
interface Open {
  key?: string;
  index?: number;
  /** An object's number, in the order objects open: tells sibling objects apart. */
  object?: number;
}

/** Where the scan stands: the open containers, outermost first. */
export interface JsonPlace {
  /** The dotted path of the current value: object keys decoded, array indexes as numbers. */
  path(): string;
  /** The path of the object that holds the current key (path() without its last segment). */
  parentPath(): string;
  /** The 1-based line of the token at `offset`. */
  lineAt(offset: number): number;
}

export interface JsonScanVisitor<T> {
  /**
   * A member key (decoded) at `offset` of the object numbered `object` (objects are numbered as
   * they open); a result other than undefined ends the scan with it.
   */
  key?(key: string, offset: number, place: JsonPlace, object: number): T | undefined;
  /** A number's literal text; a result other than undefined ends the scan with it. */
  number?(literal: string, place: JsonPlace): T | undefined;
}

const NUMBER = /-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/y;

const segment = (o: Open) =>
  o.index !== undefined ? String(o.index) : (JSON.parse(o.key ?? '""') as string);

/**
 * Walks valid JSON `text` token by token, calling `visit` for keys and numbers, and returns the
 * first result a callback gives (undefined when none does). Keys are decoded only when a key
 * callback is given or a path is asked for, so a scan for numbers alone stays cheap.
 */
export function scanJson<T>(text: string, visit: JsonScanVisitor<T>): T | undefined {
  const open: Open[] = [];
  const place: JsonPlace = {
    path: () => open.map(segment).join('.'),
    parentPath: () => open.slice(0, -1).map(segment).join('.'),
    lineAt: (offset) => text.slice(0, offset).split('\n').length,
  };
  let expectKey = false;
  let objects = 0;
  for (let i = 0; i < text.length;) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      const top = open[open.length - 1];
      if (expectKey && top) {
        top.key = text.slice(i, j + 1);
        if (visit.key) {
          const r = visit.key(JSON.parse(top.key) as string, i, place, top.object ?? 0);
          if (r !== undefined) return r;
        }
      }
      expectKey = false;
      i = j + 1;
    } else if (c === '-' || (c !== undefined && c >= '0' && c <= '9')) {
      NUMBER.lastIndex = i;
      const literal = (NUMBER.exec(text) as RegExpExecArray)[0];
      i += literal.length;
      if (visit.number) {
        const r = visit.number(literal, place);
        if (r !== undefined) return r;
      }
    } else {
      // Whitespace leaves expectKey as it is; a key follows `{` and, in an object, `,`.
      if (c === '{') open.push({ object: objects++ });
      else if (c === '[') open.push({ index: 0 });
      else if (c === '}' || c === ']') open.pop();
      const top = open[open.length - 1];
      if (c === ',' && top?.index !== undefined) top.index++;
      if (c === '{' || c === ',') expectKey = top !== undefined && top.index === undefined;
      else if (c === '[' || c === ']' || c === '}' || c === ':') expectKey = false;
      i++;
    }
  }
  return undefined;
}
