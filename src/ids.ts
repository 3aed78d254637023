import { uuidv7 } from 'uuidv7';
import { randomBytes } from 'node:crypto';

/** Request, queue, token and audit ids: UUIDv7, so unique, URL-safe and time-ordered. */
export const newId = (): string => uuidv7();

/** A W3C trace id (32 lowercase hex, not all zero). */
export const newTraceId = (): string => randomBytes(16).toString('hex');

export const newSpanId = (): string => randomBytes(8).toString('hex');
