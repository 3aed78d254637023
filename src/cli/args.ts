import { parseArgs, type ParseArgsConfig } from 'node:util';

/**
 * node:util's parseArgs, refusing an option given more than once: parseArgs keeps the last value
 * silently, so `keys create --tenant acme --tenant globex` bound the key to globex. Throws what
 * parseArgs throws for a bad command line (a TypeError with an ERR_PARSE_ARGS code).
 */
export function parseArgsOnce<T extends ParseArgsConfig>(config: T): ReturnType<typeof parseArgs<T>> {
  const parsed = parseArgs({ ...config, tokens: true });
  const seen = new Set<string>();
  for (const t of parsed.tokens ?? []) {
    if (t.kind !== 'option') continue;
    if (seen.has(t.name)) {
      throw Object.assign(new TypeError(`option --${t.name} is given more than once`), {
        code: 'ERR_PARSE_ARGS_REPEATED_OPTION',
      });
    }
    seen.add(t.name);
  }
  // One parse: the tokens are what parseArgs gives on top of the result it gives without them.
  return parsed as unknown as ReturnType<typeof parseArgs<T>>;
}
