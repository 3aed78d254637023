import { pino, type Logger } from 'pino';
import type { LogLevel } from '../config.js';

export type { Logger };

/**
 * Structured JSON logs on stdout. Authorization headers and keys are redacted wherever they
 * appear in a logged object; handlers never log request bodies.
 */
export function createLogger(level: LogLevel): Logger {
  return pino({
    level,
    base: { pid: process.pid },
    redact: {
      paths: [
        'req.headers.authorization',
        'headers.authorization',
        'key',
        'apiKey',
        'adminKey',
        '*.key',
        'token',
      ],
      censor: '[redacted]',
    },
    formatters: { level: (label) => ({ level: label }) },
    timestamp: pino.stdTimeFunctions.isoTime,
  });
}
